//! `cni_async::stale` on real namespaces: a record's namespace is judged
//! by the identity recorded at ADD (boot id, nsfs inode, the process's
//! start time), not by whether its path is a network namespace now. A
//! namespace re-created at the same path is not the recorded one; a
//! `/proc/PID/ns/net` path whose PID is another process now (another start
//! time, another namespace) is not either; a namespace no longer at its
//! path but held by a process or an open descriptor is kept; once nothing
//! holds it, it is stale, and its reap's DEL gets no netns path.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::stale::{Candidate, Kept, Reaped, StaleReason, StaleScanner, Verdict};
use cni_async::{CallOptions, Cni};
use cni_core::RuntimeConf;
use cni_test_support::netns::{ProcNs, TempNetns, ip};
use serde_json::json;

const NET: &str = "staleid";

fn rig() -> Rig {
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.79.0.5/24"}]}"#),
        ),
    );
    rig
}

async fn attach(cni: &Cni, cid: &str, netns: &str) {
    let list = conflist(json!({"cniVersion":"1.0.0","name": NET,"plugins":[{"type":"a"}]}));
    let rt = RuntimeConf::new(cid, netns, "eth0");
    cni.add_network_list(&list, &rt).await.expect("ADD");
}

async fn scan(cni: &Cni) -> Vec<Candidate> {
    StaleScanner::new(Some(Duration::ZERO))
        .scan(cni.cache())
        .await
        .unwrap()
}

fn verdict_of(found: &[Candidate], cid: &str) -> Verdict {
    found
        .iter()
        .find(|c| c.container_id == cid)
        .unwrap_or_else(|| panic!("{cid} not listed"))
        .verdict
}

/// A child process killed on drop (also when an assertion fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ino(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

/// The namespace at `/run/netns/NAME` deleted and made again under the
/// same name: the path is a network namespace, but not the recorded one,
/// which nothing holds: stale, and the reap's DEL does not enter the new
/// one.
#[tokio::test]
async fn a_namespace_re_created_at_the_same_path_is_not_the_recorded_one() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let ns = TempNetns::new();
    attach(&cni, "recreated", &ns.path()).await;
    let rec = rig.cache_json(NET, "recreated", "eth0").unwrap();
    assert_eq!(rec["netnsIdentity"]["ino"], ino(&ns.path()), "{rec}");
    // The old namespace held open until the new one exists: a namespace's
    // inode number is freed with it and may be handed to the next one (at
    // once on an idle machine), and a path whose inode is the recorded one
    // is kept as alive, rightly: the records cannot tell the two apart.
    let old_held = std::fs::File::open(ns.path()).unwrap();
    assert!(ip(&["netns", "del", ns.name()]).status.success());
    assert!(ip(&["netns", "add", ns.name()]).status.success());
    drop(old_held);
    assert_ne!(rec["netnsIdentity"]["ino"], ino(&ns.path()));

    let found = scan(&cni).await;
    assert_eq!(
        verdict_of(&found, "recreated"),
        Verdict::Stale(StaleReason::NamespaceGone)
    );
    rig.dir.clear_records();
    assert_eq!(
        cni.reap_stale(&found[0], &CallOptions::default())
            .await
            .unwrap(),
        Reaped::Deleted
    );
    let dels = rig.dir.invocations_of("DEL");
    assert_eq!(dels.len(), 1);
    assert_eq!(dels[0].var("CNI_NETNS"), Some(""));
}

/// A `/proc/PID/ns/net` path whose PID is another process now (another
/// start time, in another namespace): the path resolves to a network
/// namespace, but the recorded one is gone.
#[tokio::test]
async fn a_reused_pid_is_not_the_recorded_process() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let p = ProcNs::new();
    attach(&cni, "reused", &p.path()).await;
    let rec = rig.cache_json(NET, "reused", "eth0").unwrap();
    let start = rec["netnsIdentity"]["pidStartTime"]
        .as_u64()
        .expect("start time");
    // What the record of an earlier process with this PID holds: its
    // namespace (gone, nothing holds it) and its start time.
    let dead = TempNetns::new();
    attach(&cni, "dead", &dead.path()).await;
    let was = rig.cache_json(NET, "dead", "eth0").unwrap()["netnsIdentity"].clone();
    assert_eq!(was["ino"], ino(&dead.path()));
    drop(dead);
    rig.edit_record(NET, "reused", "eth0", |v| {
        let id = &mut v["netnsIdentity"];
        id["ino"] = was["ino"].clone();
        id["handle"] = was["handle"].clone();
        id["pidStartTime"] = (start - 1).into();
    });
    assert_eq!(
        verdict_of(&scan(&cni).await, "reused"),
        Verdict::Stale(StaleReason::NamespaceGone)
    );
    // The live process's own record: kept.
    attach(&cni, "live", &p.path()).await;
    assert_eq!(
        verdict_of(&scan(&cni).await, "live"),
        Verdict::Kept(Kept::NamespaceExists)
    );
}

/// A namespace whose name is gone but which a process is in, or which a
/// process holds open: kept (held); once nothing holds it, stale.
#[tokio::test]
async fn a_namespace_held_by_a_process_or_a_descriptor_is_kept() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    // In it: a process.
    let ns = TempNetns::new();
    let inside = Killed(
        std::process::Command::new("ip")
            .args(["netns", "exec", ns.name(), "sleep", "3600"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let want = ino(&ns.path());
    let link = format!("/proc/{}/ns/net", inside.0.id());
    while std::fs::metadata(&link).map(|m| m.ino()).ok() != Some(want) {
        std::thread::yield_now();
    }
    // Open: a descriptor (sleep's stdin).
    let ns2 = TempNetns::new();
    let open = Killed(
        std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::fs::File::open(ns2.path()).unwrap())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    attach(&cni, "inside", &ns.path()).await;
    attach(&cni, "open", &ns2.path()).await;
    drop(ns);
    drop(ns2);

    let found = scan(&cni).await;
    assert_eq!(verdict_of(&found, "inside"), Verdict::Kept(Kept::Held));
    assert_eq!(verdict_of(&found, "open"), Verdict::Kept(Kept::Held));
    drop(inside);
    drop(open);
    let found = scan(&cni).await;
    for cid in ["inside", "open"] {
        assert_eq!(
            verdict_of(&found, cid),
            Verdict::Stale(StaleReason::NamespaceGone),
            "{cid}"
        );
    }
}

/// A namespace no process is in, no mount names and no descriptor of its
/// nsfs file holds, but a socket made in it does (a tool that entered it,
/// opened a socket and left): it still exists, with its interfaces, and
/// is kept, whether the kernel is asked (its file handle) or `/proc` is
/// searched (a record without a handle, as written before Linux 6.18:
/// every socket's namespace is asked).
#[tokio::test]
async fn a_namespace_held_only_by_a_socket_is_kept() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let ns = TempNetns::new();
    attach(&cni, "socket", &ns.path()).await;
    attach(&cni, "nohandle", &ns.path()).await;
    rig.edit_record(NET, "nohandle", "eth0", |v| {
        v["netnsIdentity"].as_object_mut().unwrap().remove("handle");
    });
    let sock = cni_test_support::netns::socket_in(ns.path());
    drop(ns);
    let found = scan(&cni).await;
    for cid in ["socket", "nohandle"] {
        assert_eq!(verdict_of(&found, cid), Verdict::Kept(Kept::Held), "{cid}");
    }
    drop(sock);
}

/// A record whose file handle was damaged (its namespace's inode in it
/// changed) while the namespace is held elsewhere: the kernel refuses the
/// handle (`ESTALE`), which proves nothing about the recorded namespace.
#[tokio::test]
async fn a_damaged_handle_is_no_proof_that_a_held_namespace_is_gone() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let ns = TempNetns::new();
    attach(&cni, "damaged", &ns.path()).await;
    let open = Killed(
        std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::fs::File::open(ns.path()).unwrap())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    rig.edit_record(NET, "damaged", "eth0", |v| {
        let h = v["netnsIdentity"]["handle"].as_str().unwrap().to_owned();
        // The last hex digit flipped: another inode in the handle.
        let mut b = h.into_bytes();
        let last = b.last_mut().unwrap();
        *last = if *last == b'0' { b'1' } else { b'0' };
        v["netnsIdentity"]["handle"] = String::from_utf8(b).unwrap().into();
    });
    drop(ns);
    let v = verdict_of(&scan(&cni).await, "damaged");
    assert!(matches!(v, Verdict::Kept(_)), "{v:?}");
    drop(open);
}

/// The namespace at the path deleted and made again while the ADD's
/// plugins run (after the identity was taken, before a plugin entered
/// it): the attachment may be in the new namespace, so the record must
/// not name the old one, whose being gone would get the live attachment
/// reaped (its address released under it). Kept while the path is a
/// namespace.
#[tokio::test]
async fn a_namespace_re_created_during_the_add_is_not_recorded_as_the_old_one() {
    cni_test_support::require_root!();
    let rig = Rig::new();
    let gate = cni_test_support::gate::Gate::new(rig.dir.root());
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.79.0.6/24"}]}"#)
                .with_shell(&gate.shell_wait()),
        ),
    );
    let cni = rig.cni();
    let ns = TempNetns::new();
    let old = ino(&ns.path());
    let add = {
        let (cni, path) = (cni.clone(), ns.path());
        tokio::spawn(async move { attach(&cni, "swapped", &path).await })
    };
    gate.wait_started(1).await;
    // The old namespace held open through the swap: a namespace's inode
    // number is freed with it and the next namespace may get it again
    // (at once on an idle machine), which would make the two alike here.
    let _old_held = std::fs::File::open(ns.path()).unwrap();
    assert!(ip(&["netns", "del", ns.name()]).status.success());
    assert!(ip(&["netns", "add", ns.name()]).status.success());
    assert_ne!(ino(&ns.path()), old);
    gate.release();
    add.await.unwrap();
    let rec = rig.cache_json(NET, "swapped", "eth0").unwrap();
    assert_ne!(rec["netnsIdentity"]["ino"], old, "{rec}");
    assert_eq!(
        verdict_of(&scan(&cni).await, "swapped"),
        Verdict::Kept(Kept::NamespaceExists)
    );
}

/// A record whose `netnsIdentity` is there but unreadable (damaged,
/// forged: a number for the boot id, a bad handle) is no record without
/// identity: its path and mtime (here no namespace, written before the
/// boot, as after a clock step) prove nothing. Kept, and nothing panics.
#[tokio::test]
async fn a_malformed_identity_is_kept_whatever_the_path_and_the_clock() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let gone = rig.dir.scratch("gone");
    let gone = gone.to_str().unwrap();
    let bad = [
        json!({"bootId": 7}),
        json!({"bootId": "", "ino": 1}),
        json!({"bootId": "x", "dev": 4}),
        json!({"bootId": "x", "dev": 4, "ino": 5, "handle": "241:zz"}),
        json!({"bootId": "x", "dev": -1, "ino": 5}),
        json!("text"),
        json!([1, 2]),
    ];
    for (i, b) in bad.iter().enumerate() {
        let cid = format!("bad{i}");
        attach(&cni, &cid, gone).await;
        rig.edit_record(NET, &cid, "eth0", |v| v["netnsIdentity"] = b.clone());
        let f = std::fs::File::options()
            .write(true)
            .open(rig.cache_file(NET, &cid, "eth0"))
            .unwrap();
        f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(86_400))
            .unwrap();
    }
    let found = scan(&cni).await;
    for (i, b) in bad.iter().enumerate() {
        assert_eq!(
            verdict_of(&found, &format!("bad{i}")),
            Verdict::Kept(Kept::Unknown),
            "{b}"
        );
    }
    // A runtime's DEL still works from such a record.
    let rt = RuntimeConf::new("bad0", gone, "eth0");
    let list = conflist(json!({"cniVersion":"1.0.0","name": NET,"plugins":[{"type":"a"}]}));
    cni.del_network_list(&list, &rt).await.expect("DEL");
}

/// A namespace held only by a thread of a process whose other threads
/// are elsewhere, or only by a bind mount in another mount namespace (a
/// runtime with a private `/run`): not at its path, still alive, kept,
/// by the kernel's word (its handle) and by the `/proc` search.
#[tokio::test]
async fn a_namespace_held_only_by_a_thread_or_a_mount_elsewhere_is_kept() {
    use std::io::BufRead;
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    // A thread of this process in it, until told to leave.
    let ns = TempNetns::new();
    attach(&cni, "thread", &ns.path()).await;
    attach(&cni, "thread-nohandle", &ns.path()).await;
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (leave, leave_rx) = std::sync::mpsc::channel::<()>();
    let file = std::fs::File::open(ns.path()).unwrap();
    let thread = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        drop(file);
        entered_tx.send(()).unwrap();
        let _ = leave_rx.recv();
    });
    entered.recv().unwrap();
    drop(ns);
    // A bind mount of it in a mount namespace of another process.
    let ns2 = TempNetns::new();
    attach(&cni, "mount", &ns2.path()).await;
    attach(&cni, "mount-nohandle", &ns2.path()).await;
    // Records as written before Linux 6.18: the /proc search decides.
    for cid in ["thread-nohandle", "mount-nohandle"] {
        rig.edit_record(NET, cid, "eth0", |v| {
            v["netnsIdentity"].as_object_mut().unwrap().remove("handle");
        });
    }
    let target = rig.dir.scratch("bound");
    std::fs::write(&target, b"").unwrap();
    let script = format!(
        "mount --bind '{}' '{}' && echo ok && exec sleep 3600",
        ns2.path(),
        target.display()
    );
    let mut child = Killed(
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ok");
    drop(ns2);

    let found = scan(&cni).await;
    for cid in ["thread", "mount", "thread-nohandle", "mount-nohandle"] {
        assert_eq!(verdict_of(&found, cid), Verdict::Kept(Kept::Held), "{cid}");
    }
    drop(leave);
    thread.join().unwrap();
    drop(child);
}

/// A namespace recorded through a symbolic link (`/proc/PID/ns/net`, a
/// runtime's link to its `/run/netns/NAME`) gets the nsfs file handle of
/// the namespace the link leads to, not of the link: the kernel's word
/// then decides, here that the namespace of a process gone is gone
/// (without a handle only the `/proc` search could, which cannot tell
/// where `/proc` cannot be read whole).
#[tokio::test]
async fn a_namespace_recorded_through_a_link_gets_its_own_handle() {
    cni_test_support::require_root!();
    let rig = rig();
    let cni = rig.cni();
    let p = ProcNs::new();
    attach(&cni, "proc", &p.path()).await;
    let ns = TempNetns::new();
    let link = rig.dir.scratch("link");
    std::os::unix::fs::symlink(ns.path(), &link).unwrap();
    attach(&cni, "link", link.to_str().unwrap()).await;
    for cid in ["proc", "link"] {
        let id = &rig.cache_json(NET, cid, "eth0").unwrap()["netnsIdentity"];
        // FILEID_NSFS (0xf1): an nsfs handle.
        assert!(
            id["handle"].as_str().is_some_and(|h| h.starts_with("241:")),
            "{cid}: {id}"
        );
    }
    drop(p);
    assert_eq!(
        verdict_of(&scan(&cni).await, "proc"),
        Verdict::Stale(StaleReason::NamespaceGone)
    );
}
