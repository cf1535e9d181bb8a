//! Regression: non-root callers of cnitool. `del` without privilege warned
//! (twice) about the cache and ran the plugins anyway;
//! `--socket` without permission on the socket said only "cannot connect";
//! `batch up` tried every namespace and failed each with "make shared mount
//! failed". Now each is checked once, up front, and says "permission
//! denied" (with `--allow-uid` for the socket). Runs cnitool as uid/gid
//! 65534 (`nobody`), so it needs root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;

use crate::support::nobody::{self, NOBODY};
use crate::support::require_root;

const NETNS: &str = "/proc/self/ns/net";

/// Without the privilege the plugins need (CAP_NET_ADMIN), `del` is
/// refused before any plugin runs, on the privilege, not on the cache: a
/// cache it cannot use alone is a warning (see `cnitool_del_cache`).
#[test]
fn del_without_privilege_fails_up_front_and_runs_no_plugin() {
    require_root!();
    let sb = nobody::sandbox();
    let run = nobody::run(&sb, &["del", "permnet", NETNS]);
    let stderr = run.stderr.clone();
    let err = run.fails();
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("CAP_NET_ADMIN"), "{err}");
    assert!(!stderr.contains("WARN"), "no warnings first: {stderr}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");
}

#[test]
fn a_socket_without_permission_says_permission_denied_and_allow_uid() {
    require_root!();
    let sb = nobody::sandbox();
    // The socket's dir admits root only.
    let dir = sb.root().join("private");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.join("cnid.sock");
    let _listener = UnixListener::bind(&socket).unwrap();
    let err = nobody::run(
        &sb,
        &[
            "--socket",
            socket.to_str().unwrap(),
            "add",
            "permnet",
            NETNS,
        ],
    )
    .fails();
    assert!(err.contains("cannot connect to cnid at"), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains(&format!("--allow-uid {NOBODY}")), "{err}");
}

#[test]
fn batch_up_without_privilege_fails_once_up_front() {
    require_root!();
    let sb = nobody::sandbox();
    let prefix = format!("c22nr{}-", std::process::id());
    let run = nobody::run(
        &sb,
        &[
            "batch", "up", "permnet", "--count", "3", "--prefix", &prefix,
        ],
    );
    let err = run.fails();
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("needs root"), "{err}");
    assert_eq!(err.matches("error").count(), 1, "one error: {err}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");
}
