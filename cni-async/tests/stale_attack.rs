//! Attacks on `cni_async::stale`'s reap: another reaper of the same
//! attachment at once; another tool's ADD of the same
//! container and ifname landing between the reap's checks and its DEL.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::stale::{Reaped, StaleScanner};
use cni_async::{CallOptions, Cni};
use cni_core::RuntimeConf;
use serde_json::json;

const NET: &str = "staleatk";

async fn attach(cni: &Cni, cid: &str, netns: &Path) {
    let list = conflist(json!({"cniVersion":"1.0.0","name": NET,"plugins":[{"type":"a"}]}));
    let rt = RuntimeConf::new(cid, netns.to_str().unwrap(), "eth0");
    cni.add_network_list(&list, &rt).await.expect("ADD");
}

/// Blocks until someone opens `path` (inotify `IN_OPEN`, watched from now).
struct OpenWatch(std::os::fd::OwnedFd);

impl OpenWatch {
    fn new(path: &Path) -> OpenWatch {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscalls; the fd is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let p = CString::new(path.as_os_str().as_bytes()).unwrap();
        use std::os::fd::AsRawFd;
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), p.as_ptr(), libc::IN_OPEN) };
        assert!(wd >= 0, "inotify_add_watch {}", path.display());
        OpenWatch(fd)
    }

    fn wait(self) {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a buffer of its size.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n > 0, "inotify read");
    }
}

/// A runtime (cnitool, another libcni user) re-ADDs the container on the
/// same ifname in a new namespace while the reap is between its checks
/// (record unchanged, namespace gone) and its DEL: the DEL must not take
/// the new attachment (its record, its `prevResult`'s addresses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_add_after_the_reaps_checks_is_not_deleted() {
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.78.0.5/24"}]}"#),
        ),
    );
    let cni = rig.cni();
    let gone = rig.dir.scratch("gone");
    attach(&cni, "c1", &gone).await;
    let found = StaleScanner::with_boot_time(None, Some(Duration::ZERO))
        .scan(cni.cache())
        .await
        .unwrap();
    let candidate = found[0].clone();
    assert!(candidate.verdict.stale().is_some());
    rig.dir.clear_records();

    // The other tool's ADD holds the attachment's lock.
    let lock = cni
        .cache()
        .lock(NET, "c1", "eth0", Duration::from_secs(5))
        .await
        .unwrap();
    let lock_file = rig.cache_dir.join(format!("locks/{NET}-c1-eth0.lock"));
    let watch = OpenWatch::new(&lock_file);
    let reap = {
        let cni = cni.clone();
        tokio::spawn(async move { cni.reap_stale(&candidate, &CallOptions::default()).await })
    };
    // The reap checked the record and the namespace, and now tries the lock.
    tokio::task::spawn_blocking(move || watch.wait())
        .await
        .unwrap();
    // The other tool's ADD ends: a new namespace, a new address.
    let alive = rig.dir.scratch("alive");
    std::os::unix::fs::symlink("/proc/self/ns/net", &alive).unwrap();
    let mut new = cni
        .cache()
        .read(NET, "c1", "eth0")
        .await
        .unwrap()
        .and_then(|e| match e {
            cni_core::cache::CacheEntry::Record(r) => Some(r),
            _ => None,
        })
        .unwrap();
    new.netns = alive.to_str().unwrap().to_owned();
    new.result = Some(json!({"cniVersion":"1.0.0","ips":[{"address":"10.78.0.9/24"}]}));
    cni.cache().write(&new).await.unwrap();
    drop(lock);

    let reaped = reap.await.unwrap().unwrap();
    assert_eq!(reaped, Reaped::Changed);
    assert!(
        rig.dir.invocations_of("DEL").is_empty(),
        "the new attachment was DELed: {:?}",
        rig.dir.invocations_of("DEL")
    );
    let left = cni.cache().list(None).await.unwrap();
    assert_eq!(left.len(), 1, "the new attachment's record is gone");
    assert_eq!(left[0].netns, alive.to_str().unwrap());
}

/// A namespace the checker cannot look at (permission denied, as an LSM
/// policy or a mount another user owns gives even root; out of file
/// descriptors) is not a namespace gone: its attachment is never reaped
/// for it. Here a thread whose filesystem uid is `nobody` (which drops
/// root's override of file permissions) checks a namespace behind a 0700
/// dir.
#[test]
fn a_namespace_that_cannot_be_looked_at_is_not_gone() {
    use cni_async::stale::{Netns, netns_state};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let ns = private.join("ns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &ns).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(netns_state(ns.to_str().unwrap(), true), Netns::Alive);
    let path = ns.to_str().unwrap().to_owned();
    let seen = std::thread::spawn(move || {
        // SAFETY: setfsuid changes this thread's filesystem uid only.
        unsafe { libc::setfsuid(65534) };
        let denied = std::fs::symlink_metadata(&path)
            .err()
            .map(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
        (denied, netns_state(&path, true))
    })
    .join()
    .unwrap();
    assert_eq!(seen.0, Some(true), "the thread can still look");
    assert_ne!(
        seen.1,
        Netns::Gone,
        "an unreadable namespace counts as gone"
    );
}

/// Another boot's `/proc/PID/ns/net` is gone (that PID is another process
/// now), and so is a file left where a namespace was bind-mounted, and a
/// path not there at all: the reap's DEL runs without a path (the spec
/// lets CNI_NETNS be empty when the namespace is gone), so no plugin
/// enters another process's namespace (here this test's own) or refuses
/// a file that is no namespace.
#[tokio::test]
async fn a_reap_never_hands_plugins_a_path_that_is_not_its_namespace() {
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.78.0.5/24"}]}"#),
        ),
    );
    let cni = rig.cni();
    let (file, missing) = (rig.dir.scratch("file"), rig.dir.scratch("missing"));
    attach(&cni, "proc", Path::new("/proc/self/ns/net")).await;
    attach(&cni, "file", &file).await;
    attach(&cni, "missing", &missing).await;
    std::fs::write(&file, "").unwrap();
    // All three written in another boot.
    for cid in ["proc", "file", "missing"] {
        rig.edit_record(NET, cid, "eth0", |v| {
            v["netnsIdentity"]["bootId"] = "another-boot".into()
        });
    }
    let boot = std::time::SystemTime::now() - Duration::from_secs(60);
    let found = StaleScanner::with_boot_time(Some(boot), None)
        .scan(cni.cache())
        .await
        .unwrap();
    assert!(
        found.iter().all(|c| c.verdict.stale().is_some()),
        "{found:?}"
    );
    rig.dir.clear_records();
    for c in &found {
        assert_eq!(
            cni.reap_stale(c, &CallOptions::default()).await.unwrap(),
            Reaped::Deleted
        );
    }
    let netns_of = |cid: &str| {
        rig.dir
            .invocations_of("DEL")
            .iter()
            .find(|i| i.var("CNI_CONTAINERID") == Some(cid))
            .map(|i| i.var("CNI_NETNS").unwrap_or("").to_owned())
            .unwrap()
    };
    assert_eq!(netns_of("proc"), "");
    assert_eq!(netns_of("file"), "");
    assert_eq!(netns_of("missing"), "");
    assert!(cni.cache().list(None).await.unwrap().is_empty());
}

/// Two reapers (two cnids, or cnid and `cnitool gc --stale`, each with its
/// own `Cni` on one cache) reap the same stale attachment at once: the
/// second waits for the attachment's lock while the first's DEL runs,
/// then finds the record gone. One DEL runs, the record is removed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reapers_of_one_attachment_run_one_del() {
    let rig = Rig::new();
    let gate = cni_test_support::gate::Gate::new(rig.dir.root());
    rig.fake(
        "a",
        &Fake::new(Response::ok(""))
            .on(
                "ADD",
                Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.78.0.6/24"}]}"#),
            )
            .on("DEL", Response::ok("").with_shell(&gate.shell_wait())),
    );
    let (first, second) = (rig.cni(), rig.cni());
    let gone = rig.dir.scratch("gone");
    attach(&first, "c2", &gone).await;
    let scan = || async {
        StaleScanner::with_boot_time(None, Some(Duration::ZERO))
            .scan(first.cache())
            .await
            .unwrap()
    };
    let (a, b) = (scan().await[0].clone(), scan().await[0].clone());
    assert!(a.verdict.stale().is_some() && a == b);
    rig.dir.clear_records();

    let one = {
        let cni = first.clone();
        tokio::spawn(async move { cni.reap_stale(&a, &CallOptions::default()).await })
    };
    gate.wait_started(1).await;
    let watch = OpenWatch::new(&rig.lock_file(NET, "c2", "eth0"));
    let two = {
        let cni = second.clone();
        tokio::spawn(async move { cni.reap_stale(&b, &CallOptions::default()).await })
    };
    tokio::task::spawn_blocking(move || watch.wait())
        .await
        .unwrap();
    gate.release();
    let mut got = [one.await.unwrap().unwrap(), two.await.unwrap().unwrap()];
    got.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(got, [Reaped::Changed, Reaped::Deleted]);
    assert_eq!(rig.dir.invocations_of("DEL").len(), 1);
    assert!(first.cache().list(None).await.unwrap().is_empty());
}
