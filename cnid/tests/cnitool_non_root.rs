//! Regression (issue 22, item 10): non-root callers of cnitool. `del`
//! without access to the cache warned (twice) and ran the plugins anyway;
//! `--socket` without permission on the socket said only "cannot connect";
//! `batch up` tried every namespace and failed each with "make shared mount
//! failed". Now each is checked once, up front, and says "permission
//! denied" (with `--allow-uid` for the socket). Runs cnitool as uid/gid
//! 65534 (`nobody`), so it needs root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::support::fake::Fake;
use crate::support::require_root;
use crate::support::tool::{Run, Sandbox};
use serde_json::json;

const NOBODY: u32 = 65534;
const NETNS: &str = "/proc/self/ns/net";

fn open_up(path: &Path) {
    let meta = fs::metadata(path).unwrap();
    let mode = if meta.is_dir() {
        0o755
    } else {
        meta.permissions().mode() | 0o444
    };
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    if meta.is_dir() {
        for entry in fs::read_dir(path).unwrap() {
            open_up(&entry.unwrap().path());
        }
    }
}

/// A sandbox that `nobody` can read, with a cache dir only root may use.
fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("permnet", "1.0.0", &[json!({"type": "p"})]);
    open_up(sb.root());
    fs::create_dir(sb.cache_dir()).unwrap();
    fs::set_permissions(sb.cache_dir(), fs::Permissions::from_mode(0o700)).unwrap();
    sb
}

fn as_nobody(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = sb.cnitool(args);
    cmd.uid(NOBODY).gid(NOBODY);
    Run::of(cmd)
}

#[test]
fn del_without_access_to_the_cache_fails_up_front_and_runs_no_plugin() {
    require_root!();
    let sb = sandbox();
    let run = as_nobody(&sb, &["del", "permnet", NETNS]);
    let stderr = run.stderr.clone();
    let err = run.fails();
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains(&sb.cache_dir().display().to_string()), "{err}");
    assert!(err.contains("\nhint: cnitool needs root"), "{err}");
    assert!(!stderr.contains("WARN"), "no warnings first: {stderr}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");
}

#[test]
fn a_socket_without_permission_says_permission_denied_and_allow_uid() {
    require_root!();
    let sb = sandbox();
    // The socket's dir admits root only.
    let dir = sb.root().join("private");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let socket = dir.join("cnid.sock");
    let _listener = UnixListener::bind(&socket).unwrap();
    let err = as_nobody(
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
    let sb = sandbox();
    let prefix = format!("c22nr{}-", std::process::id());
    let run = as_nobody(
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
