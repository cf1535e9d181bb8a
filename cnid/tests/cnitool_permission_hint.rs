//! A cnitool without access to the result cache (not root, cache dir owned
//! by root with mode 0700) fails with "Permission denied" on a file of the
//! cache: the message then says what to do about it (root, access to the
//! named dir, or `CNI_CACHE_DIR`), as text and in the error JSON's details.
//! Runs cnitool as uid/gid 65534 (`nobody`), so it needs root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::support::fake::Fake;
use crate::support::require_root;
use crate::support::tool::{Run, Sandbox};
use serde_json::json;

const NOBODY: u32 = 65534;
const NETNS: &str = "/proc/self/ns/net";

/// Makes `path` and everything under it readable (and dirs traversable)
/// by others, so that `nobody` can read the conf dir and run the plugins.
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
fn add_without_access_to_the_cache_dir_says_what_to_do() {
    require_root!();
    let sb = sandbox();
    let dir = sb.cache_dir().display().to_string();

    let err = as_nobody(&sb, &["add", "permnet", NETNS]).fails();
    assert!(err.contains("Permission denied"), "{err}");
    let hint = err
        .lines()
        .find(|l| l.starts_with("hint: "))
        .unwrap_or_else(|| panic!("no hint line: {err}"));
    assert!(hint.contains("needs root"), "{hint}");
    assert!(hint.contains(&format!("cache dir {dir} ")), "{hint}");
    assert!(hint.contains("CNI_CACHE_DIR"), "{hint}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");

    // The error JSON carries it in `details`.
    let json = as_nobody(&sb, &["add", "--json-errors", "permnet", NETNS]).fails_json();
    let details = json["details"].as_str().unwrap_or_default();
    assert!(details.contains("needs root"), "{json}");
    assert!(details.contains(&dir), "{json}");

    // GC reads the cache dir too.
    let err = as_nobody(&sb, &["gc", "permnet"]).fails();
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains("\nhint: cnitool needs root"), "{err}");
}

/// No hint when the failure has nothing to do with the cache dir.
#[test]
fn other_failures_get_no_cache_hint() {
    require_root!();
    let sb = sandbox();
    let err = as_nobody(&sb, &["add", "nosuchnet", NETNS]).fails();
    assert!(!err.contains("hint:"), "{err}");
}
