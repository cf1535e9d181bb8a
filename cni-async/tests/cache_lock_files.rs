//! Lock files do not outlive attachments that do not exist: a CHECK of an
//! unknown attachment, a failed or timed-out ADD, a DEL, a lock taken and
//! dropped without a record leave nothing in `<cache>/locks/`. Removing
//! them is safe: a locker that races with the removal never shares the
//! lock with another one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::fake::{Fake, GroupReaper, Response, Rig, conflist, dir_names, sh_quote};
use cni_async::{CallOptions, Error};
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.216.0.2/24"}]}"#;

fn locks(rig: &Rig) -> Vec<String> {
    dir_names(&rig.cache_dir.join("locks"))
}

/// `p`: ADD fails for containers named `fail-*`, hangs for `slow-*`
/// (writing its pid to `pids`), succeeds otherwise; DEL fails for `keep-*`
/// while the file `refuse-del` exists; everything else succeeds.
fn rig() -> (Rig, std::path::PathBuf) {
    let rig = Rig::new();
    let pids = rig.dir.scratch("pids");
    let refuse = rig.dir.scratch("refuse-del");
    let add = format!(
        "case \"$CNI_CONTAINERID\" in\n\
         fail-*) echo '{{\"cniVersion\":\"1.0.0\",\"code\":120,\"msg\":\"add refused\"}}'; exit 1;;\n\
         slow-*) echo $$ >> {pids}; sleep 1000;;\n\
         esac",
        pids = sh_quote(&pids.to_string_lossy()),
    );
    let del = format!(
        "case \"$CNI_CONTAINERID\" in\n\
         keep-*) if [ -e {refuse} ]; then echo '{{\"cniVersion\":\"1.0.0\",\"code\":121,\"msg\":\"del refused\"}}'; exit 1; fi;;\n\
         esac",
        refuse = sh_quote(&refuse.to_string_lossy()),
    );
    rig.fake(
        "p",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(RESULT).with_shell(&add))
            .on("DEL", Response::ok("").with_shell(&del))
            .without_recording(),
    );
    (rig, pids)
}

fn list() -> cni_core::NetworkConfigList {
    conflist(json!({"cniVersion":"1.0.0","name":"lf","plugins":[{"type":"p"}]}))
}

fn rt(cid: &str) -> RuntimeConf {
    RuntimeConf::new(cid, format!("/run/netns/{cid}"), "eth0")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_file_is_left_for_an_attachment_that_does_not_exist() {
    let (rig, pids) = rig();
    let _reaper = GroupReaper(pids.clone());
    let cni = rig.cni();
    let list = list();

    // CHECK of attachments that were never added.
    for i in 0..20 {
        let err = cni
            .check_network_list(&list, &rt(&format!("unknown-{i}")))
            .await
            .unwrap_err()
            .into_innermost();
        assert!(matches!(err, Error::NotAttached { .. }), "{err}");
    }
    assert_eq!(locks(&rig), Vec::<String>::new(), "after CHECKs of unknown");

    // Failed ADDs, with and without rollback.
    for i in 0..5 {
        for rollback in [false, true] {
            let opts = CallOptions {
                rollback,
                ..Default::default()
            };
            let err = cni
                .add_network_list(&list, &rt(&format!("fail-{i}-{rollback}")))
                .options(&opts)
                .await
                .unwrap_err()
                .into_innermost();
            assert!(err.is_plugin_code(120), "{err}");
        }
    }
    assert_eq!(locks(&rig), Vec::<String>::new(), "after failed ADDs");

    // Timed-out ADDs (rolled back with a fresh deadline).
    for i in 0..2 {
        let opts = CallOptions {
            timeout: Some(Duration::from_millis(300)),
            rollback: true,
        };
        let err = cni
            .add_network_list(&list, &rt(&format!("slow-{i}")))
            .options(&opts)
            .await
            .unwrap_err()
            .into_innermost();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }
    assert_eq!(locks(&rig), Vec::<String>::new(), "after timed-out ADDs");

    // ADD/DEL cycles: the lock file lives as long as the record, no longer.
    for i in 0..5 {
        let r = rt(&format!("cycle-{i}"));
        cni.add_network_list(&list, &r).await.expect("ADD");
        assert_eq!(locks(&rig), [format!("lf-cycle-{i}-eth0.lock")]);
        cni.check_network_list(&list, &r).await.expect("CHECK");
        assert_eq!(locks(&rig), [format!("lf-cycle-{i}-eth0.lock")]);
        cni.del_network_list(&list, &r).await.expect("DEL");
        assert_eq!(locks(&rig), Vec::<String>::new(), "after DEL {i}");
    }

    // DEL of an attachment that never existed succeeds and leaves nothing.
    cni.del_network_list(&list, &rt("never"))
        .await
        .expect("DEL of nothing");
    assert_eq!(locks(&rig), Vec::<String>::new(), "after DEL of nothing");

    // A failed DEL keeps the record, and so the lock file; the DEL that
    // then succeeds removes both.
    let keep = rt("keep-1");
    cni.add_network_list(&list, &keep).await.expect("ADD keep");
    std::fs::write(rig.dir.scratch("refuse-del"), b"").unwrap();
    let err = cni
        .del_network_list(&list, &keep)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(121), "{err}");
    assert_eq!(locks(&rig), ["lf-keep-1-eth0.lock"]);
    assert_eq!(rig.result_files(), ["lf-keep-1-eth0"]);
    std::fs::remove_file(rig.dir.scratch("refuse-del")).unwrap();
    cni.del_network_list(&list, &keep).await.expect("DEL keep");
    assert_eq!(locks(&rig), Vec::<String>::new(), "after the final DEL");
    assert!(rig.result_files().is_empty());
}

/// Through the public lock API: a lock dropped while the attachment has no
/// record removes its file; with a record, the file stays.
#[tokio::test]
async fn a_dropped_lock_removes_its_file_only_without_a_record() {
    let rig = Rig::new();
    let cache = rig.cni().cache().clone();
    let lock = cache
        .lock("lf", "c1", "eth0", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(lock.path().exists());
    drop(lock);
    assert!(!rig.lock_file("lf", "c1", "eth0").exists());

    let lock = cache
        .lock("lf", "c1", "eth0", Duration::from_secs(1))
        .await
        .unwrap();
    let rec = CacheRecord::new(
        "lf",
        &rt("c1"),
        br#"{"cniVersion":"1.0.0","name":"lf","plugins":[{"type":"p"}]}"#.to_vec(),
        Some(serde_json::from_str(RESULT).unwrap()),
    );
    cache.write(&rec).await.unwrap();
    drop(lock);
    assert!(rig.lock_file("lf", "c1", "eth0").exists());
    cache.remove("lf", "c1", "eth0").await.unwrap();
    drop(
        cache
            .lock("lf", "c1", "eth0", Duration::from_secs(1))
            .await
            .unwrap(),
    );
    assert_eq!(locks(&rig), Vec::<String>::new());
}

/// Every round, four lockers start together (a barrier) on one attachment
/// without a record; each holder removes the lock file as it releases it.
/// A locker that opened the old file, or locked it just as it was unlinked,
/// must notice and start over: at no point do two of them hold the lock,
/// and the file at the path is always there while someone holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lockers_racing_with_the_removal_never_share_the_lock() {
    const LOCKERS: usize = 4;
    const ROUNDS: usize = 150;
    let rig = Rig::new();
    let cache = rig.cni().cache().clone();
    let inside = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(LOCKERS));
    let mut tasks = Vec::new();
    for _ in 0..LOCKERS {
        let (cache, inside, held, barrier) =
            (cache.clone(), inside.clone(), held.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                barrier.wait().await;
                let lock = cache
                    .lock("race", "c1", "eth0", Duration::from_secs(30))
                    .await
                    .expect("lock");
                let before = inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(before, 0, "two lockers hold the lock at once");
                assert!(lock.path().exists(), "held lock file is gone");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                held.fetch_add(1, Ordering::SeqCst);
                drop(lock);
            }
        }));
    }
    for t in tasks {
        t.await.expect("locker");
    }
    assert_eq!(held.load(Ordering::SeqCst), LOCKERS * ROUNDS);
    assert_eq!(locks(&rig), Vec::<String>::new());
}
