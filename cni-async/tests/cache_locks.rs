//! Per-attachment locks: operations on one attachment never overlap,
//! operations on different attachments do, a lock held too long is an error,
//! and the lock file goes away with the attachment.

mod support;

use std::fs;
use std::time::{Duration, Instant};

use cni_async::{CallOptions, Error};
use cni_core::RuntimeConf;
use serde_json::json;
use support::fake::{Fake, Response, Rig, conflist, sh_quote};

/// A plugin `slow` that appends `start <ns>` and `end <ns>` (with its
/// container ID) around a 300 ms sleep on ADD, and answers a result.
fn slow_rig() -> (Rig, std::path::PathBuf) {
    let rig = Rig::new();
    let times = rig.dir.scratch("times");
    let t = sh_quote(&times.to_string_lossy());
    let shell = format!(
        "echo \"start $CNI_CONTAINERID $(date +%s%N)\" >> {t}\nsleep 0.3\necho \"end $CNI_CONTAINERID $(date +%s%N)\" >> {t}"
    );
    let result = json!({"cniVersion":"1.0.0","ips":[{"address":"10.211.0.2/24"}]}).to_string();
    rig.fake(
        "slow",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result).with_shell(&shell)),
    );
    (rig, times)
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
    let (rig, times) = slow_rig();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let (a, b) = tokio::join!(
        cni.add_network_list(&list, &rt),
        cni.add_network_list(&list, &rt)
    );
    a.expect("first ADD");
    b.expect("second ADD");
    let runs = intervals(&times);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].2 <= runs[1].1, "runs overlap: {runs:?}");
}

#[tokio::test]
async fn adds_on_different_attachments_overlap() {
    let (rig, times) = slow_rig();
    let cni = rig.cni();
    let list = list();
    let rt1 = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let rt2 = RuntimeConf::new("c2", "/run/netns/c2", "eth0");
    let (a, b) = tokio::join!(
        cni.add_network_list(&list, &rt1),
        cni.add_network_list(&list, &rt2)
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
    let (rig, _times) = slow_rig();
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
        .add_network_list_with(&list, &rt, opts)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    match &err {
        Error::CacheLocked { path, waited } => {
            assert_eq!(path, &rig.lock_file("locked", "c1", "eth0"));
            assert!(*waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected CacheLocked, got {other}"),
    }
    assert_eq!(err.code(), 11);
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
        "{waited:?}"
    );

    let err = cni
        .del_network_list_with(&list, &rt, opts)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CacheLocked { .. }), "DEL: {err}");
    let err = cni
        .check_network_list_with(&list, &rt, opts)
        .await
        .unwrap_err();
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
    let (rig, _times) = slow_rig();
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
    let cache = rig.cni().cache().clone();
    let first = cache
        .lock("n", "c1", "eth0", Duration::from_secs(1))
        .await
        .unwrap();
    let waiter = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.lock("n", "c1", "eth0", Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "waiter got the lock while it was held"
    );
    first.release_and_remove();
    let second = waiter.await.unwrap().expect("waiter gets the lock");
    assert!(
        second.path().exists(),
        "waiter holds a lock on a file that is gone"
    );
    let err = cache
        .lock("n", "c1", "eth0", Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::CacheLocked { .. }), "{err}");
    drop(second);
    cache
        .lock("n", "c1", "eth0", Duration::from_millis(100))
        .await
        .expect("free again");
}
