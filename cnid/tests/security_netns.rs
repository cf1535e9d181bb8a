//! The netns of an ADD or CHECK must be a network namespace. An allowed
//! peer may name any path (root-equivalent, documented), but the answer
//! tells it only whether that path is a network namespace: one message for
//! a missing path, a regular file, a directory, a FIFO, a device, another
//! kind of namespace. No plugin runs for a refused request. DEL may name a
//! namespace that is gone, or none.

use std::os::unix::fs::symlink;
use std::path::Path;

use crate::support::daemon::{Daemon, Dirs, RawAnswer, post, runs};
use crate::support::netns::TempNetns;
use crate::support::require_root;
use serde_json::json;

fn body(netns: &str) -> String {
    json!({"containerId": "c1", "netns": netns}).to_string()
}

#[track_caller]
fn not_a_netns(what: &str, r: &RawAnswer, netns: &str) {
    assert_eq!(
        r.status,
        400,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.cni_error(), 4, "{what}");
    let v = r.json();
    // The same text for every kind of path, the path aside.
    assert_eq!(
        v["msg"].as_str().unwrap_or_default(),
        format!("invalid netns path {netns:?}: not a network namespace"),
        "{what}"
    );
    assert_eq!(v["details"].as_str(), Some(netns), "{what}");
}

#[test]
fn add_and_check_need_a_network_namespace_and_say_nothing_else() {
    require_root!();
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-ns.conflist", "ns", "1.0.0");
    let scratch = dirs.data.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let file = scratch.join("regular");
    std::fs::write(&file, b"").unwrap();
    let fifo = scratch.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let dangling = scratch.join("dangling");
    symlink(scratch.join("nothing-here"), &dangling).unwrap();
    let to_mnt = scratch.join("to-mnt-ns");
    symlink("/proc/self/ns/mnt", &to_mnt).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_owned();

    let daemon = Daemon::start(&dirs, &[]);
    let s = &daemon.socket;
    let refused = [
        ("missing", path(&scratch.join("missing"))),
        (
            "missing dir on the way",
            "/nonexistent/dir/netns".to_owned(),
        ),
        ("regular file", path(&file)),
        ("directory", "/etc".to_owned()),
        ("directory of namespaces", "/proc/self/ns".to_owned()),
        ("fifo", path(&fifo)),
        ("device", "/dev/null".to_owned()),
        ("dangling symlink", path(&dangling)),
        ("mount namespace", "/proc/self/ns/mnt".to_owned()),
        ("symlink to a mount namespace", path(&to_mnt)),
        ("pid namespace", "/proc/self/ns/pid".to_owned()),
    ];
    for (what, netns) in &refused {
        for verb in ["add", "check"] {
            let r = post(s, &format!("/v1/networks/ns/{verb}"), &body(netns));
            not_a_netns(&format!("{verb} {what}"), &r, netns);
        }
    }
    assert_eq!(
        runs(&records),
        vec![],
        "no plugin ran for a refused request"
    );

    // Network namespaces: a /proc link, a link to one, a real `ip netns`.
    let to_net = scratch.join("to-net-ns");
    symlink("/proc/self/ns/net", &to_net).unwrap();
    let named = TempNetns::new();
    for (cid, netns) in [
        ("proc", "/proc/self/ns/net".to_owned()),
        ("pid", format!("/proc/{}/ns/net", std::process::id())),
        ("link", path(&to_net)),
        ("named", named.path()),
    ] {
        let req = json!({"containerId": cid, "netns": netns}).to_string();
        let r = post(s, "/v1/networks/ns/add", &req);
        assert_eq!(
            r.status,
            200,
            "{netns}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let r = post(s, "/v1/networks/ns/check", &req);
        assert_eq!(
            r.status,
            204,
            "{netns}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let r = post(s, "/v1/networks/ns/del", &req);
        assert_eq!(
            r.status,
            204,
            "{netns}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }

    // DEL may name a namespace that is gone, or none.
    for netns in [path(&scratch.join("gone")), String::new()] {
        let r = post(s, "/v1/networks/ns/del", &body(&netns));
        assert_eq!(
            r.status,
            204,
            "DEL {netns:?}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// A namespace deleted between ADD and CHECK: CHECK says the same as for
/// any other path.
#[test]
fn check_after_the_namespace_is_gone_is_refused() {
    require_root!();
    let dirs = Dirs::new();
    dirs.recording_network("10-ns.conflist", "ns", "1.0.0");
    let daemon = Daemon::start(&dirs, &[]);
    let named = TempNetns::new();
    let netns = named.path();
    let r = post(&daemon.socket, "/v1/networks/ns/add", &body(&netns));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    drop(named);
    let r = post(&daemon.socket, "/v1/networks/ns/check", &body(&netns));
    not_a_netns("CHECK of a deleted namespace", &r, &netns);
    let r = post(&daemon.socket, "/v1/networks/ns/del", &body(&netns));
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
}
