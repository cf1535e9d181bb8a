//! Per-attachment locks: operations on one attachment never overlap,
//! operations on different attachments do, a lock held too long is an error,
//! and the lock file goes away with the attachment.

use crate::support;
use std::fs;
use std::future::IntoFuture;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::support::fake::{Fake, Response, Rig, conflist, sh_quote};
use crate::support::gate::{Gate, LOAD_MARGIN, poll_once};
use cni_async::{CallOptions, Error};
use cni_core::RuntimeConf;
use serde_json::json;

/// A plugin `slow` that appends `start <ns>` and `end <ns>` (with its
/// container ID) around a wait at `gate` on ADD, and answers a result.
fn slow_rig() -> (Rig, std::path::PathBuf, Gate) {
    let rig = Rig::new();
    let gate = Gate::new(rig.dir.root());
    let times = rig.dir.scratch("times");
    let t = sh_quote(&times.to_string_lossy());
    let shell = format!(
        "echo \"start $CNI_CONTAINERID $(date +%s%N)\" >> {t}\n{}\necho \"end $CNI_CONTAINERID $(date +%s%N)\" >> {t}",
        gate.shell_wait()
    );
    let result = json!({"cniVersion":"1.0.0","ips":[{"address":"10.211.0.2/24"}]}).to_string();
    rig.fake(
        "slow",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result).with_shell(&shell)),
    );
    (rig, times, gate)
}

fn list() -> cni_core::NetworkConfigList {
    conflist(json!({"cniVersion":"1.0.0","name":"locked","plugins":[{"type":"slow"}]}))
}

/// The (start, end) times in ns of each run, in file order of their starts.
fn intervals(times: &std::path::Path) -> Vec<(String, u128, u128)> {
    let text = fs::read_to_string(times).unwrap();
    let mut starts = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (what, cid, t) = (f[0], f[1].to_owned(), f[2].parse::<u128>().unwrap());
        match what {
            "start" => starts.push((cid, t)),
            _ => {
                let i = starts
                    .iter()
                    .position(|(c, _)| *c == cid)
                    .expect("end after start");
                let (c, s) = starts.remove(i);
                out.push((c, s, t));
            }
        }
    }
    assert!(starts.is_empty(), "runs without an end: {starts:?}");
    out.sort_by_key(|(_, s, _)| *s);
    out
}

#[tokio::test]
async fn concurrent_adds_on_one_attachment_do_not_overlap() {
    let (rig, times, gate) = slow_rig();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let (a, b) = tokio::join!(cni.add_network_list(&list, &rt), async {
        // The first ADD runs its plugin (held at the gate): a second one
        // on the attachment cannot start it; it waits for the lock until
        // its own deadline.
        gate.wait_started(1).await;
        let refused = cni
            .add_network_list(&list, &rt)
            .timeout(Duration::from_secs(1))
            .await;
        assert!(
            matches!(
                refused.as_ref().map_err(Error::innermost),
                Err(Error::CacheLocked { .. })
            ),
            "{refused:?}"
        );
        assert_eq!(gate.started(), 1, "a plugin ran while the lock was held");
        // One that waits long enough runs once the first is done: started
        // (it finds the lock taken), then the first goes on.
        let second = cni.add_network_list(&list, &rt).into_future();
        tokio::pin!(second);
        let early = poll_once(&mut second).await;
        gate.release();
        match early {
            Poll::Ready(r) => r,
            Poll::Pending => second.await,
        }
    });
    a.expect("first ADD");
    b.expect("second ADD");
    let runs = intervals(&times);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].2 <= runs[1].1, "runs overlap: {runs:?}");
}

#[tokio::test]
async fn adds_on_different_attachments_overlap() {
    let (rig, times, gate) = slow_rig();
    let cni = rig.cni();
    let list = list();
    let rt1 = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let rt2 = RuntimeConf::new("c2", "/run/netns/c2", "eth0");
    let (a, b, ()) = tokio::join!(
        cni.add_network_list(&list, &rt1),
        cni.add_network_list(&list, &rt2),
        async {
            // Both plugins run at once, or this never returns.
            gate.wait_started(2).await;
            gate.release();
        }
    );
    a.expect("ADD c1");
    b.expect("ADD c2");
    let runs = intervals(&times);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[1].1 < runs[0].2, "runs did not overlap: {runs:?}");
}

/// While someone holds the lock, ADD, DEL and CHECK wait for it until their
/// deadline, then fail with CacheLocked (code 11) without running a plugin.
#[tokio::test]
async fn lock_held_past_the_deadline_gives_cache_locked() {
    let (rig, _times, gate) = slow_rig();
    gate.release();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let held = cni
        .cache()
        .lock("locked", "c1", "eth0", Duration::from_secs(1))
        .await
        .expect("take the lock");
    assert_eq!(held.path(), rig.lock_file("locked", "c1", "eth0"));
    let opts = CallOptions::with_timeout(Duration::from_millis(300));

    let started = Instant::now();
    let err = cni
        .add_network_list(&list, &rt)
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    let waited = started.elapsed();
    match &err {
        Error::CacheLocked { path, waited } => {
            assert_eq!(path, &rig.lock_file("locked", "c1", "eth0"));
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected CacheLocked, got {other}"),
    }
    assert_eq!(err.code(), 11);
    // Its own 300 ms, not the Cni's 10 s default.
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(300) + LOAD_MARGIN,
        "{waited:?}"
    );

    let err = cni
        .del_network_list(&list, &rt)
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::CacheLocked { .. }), "DEL: {err}");
    let err = cni
        .check_network_list(&list, &rt)
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::CacheLocked { .. }), "CHECK: {err}");
    assert!(
        rig.dir.invocations().is_empty(),
        "a plugin ran while the lock was held"
    );

    // Released: the next ADD goes through.
    drop(held);
    cni.add_network_list(&list, &rt)
        .await
        .expect("ADD after release");
}

#[tokio::test]
async fn lock_file_is_removed_after_del_and_kept_after_add() {
    let (rig, _times, gate) = slow_rig();
    gate.release();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let lock = rig.lock_file("locked", "c1", "eth0");
    cni.add_network_list(&list, &rt).await.expect("ADD");
    assert!(lock.exists(), "lock file after ADD");
    cni.del_network_list(&list, &rt).await.expect("DEL");
    assert!(!lock.exists(), "lock file left after DEL");
    assert!(support::fake::dir_names(&rig.cache_dir.join("locks")).is_empty());
}

/// A waiter blocked on the lock while the holder finishes a DEL (and removes
/// the lock file) ends up holding a lock on the live file: a third party
/// cannot take it at the same time.
#[tokio::test]
async fn waiter_on_a_removed_lock_file_retries_on_the_new_one() {
    let rig = Rig::new();
    // Inline I/O: the first poll of a lock() tries the lock at once.
    let cache = rig.cni().cache().clone().with_inline_io(true);
    let first = cache
        .lock("n", "c1", "eth0", Duration::from_secs(1))
        .await
        .unwrap();
    let mut waiter = Box::pin(cache.lock("n", "c1", "eth0", Duration::from_secs(30)));
    assert!(
        poll_once(&mut waiter).await.is_pending(),
        "waiter got the lock while it was held"
    );
    first.release_and_remove();
    let second = waiter.await.expect("waiter gets the lock");
    assert!(
        second.path().exists(),
        "waiter holds a lock on a file that is gone"
    );
    let err = cache
        .lock("n", "c1", "eth0", Duration::from_millis(100))
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::CacheLocked { .. }), "{err}");
    drop(second);
    cache
        .lock("n", "c1", "eth0", Duration::from_millis(100))
        .await
        .expect("free again");
}
