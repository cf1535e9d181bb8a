//! cnitool run as `nobody` (uid/gid 65534) in a sandbox it can read, whose
//! cache dir only root may use: the non-root callers' tests. Needs root.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use super::fake::Fake;
use super::tool::{Run, Sandbox};
use serde_json::json;

/// The uid and gid cnitool runs as.
pub const NOBODY: u32 = 65534;

/// Makes `path` and everything under it readable (and dirs traversable)
/// by others, so that `nobody` can read the conf dir and run the plugins.
pub fn open_up(path: &Path) {
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

/// A sandbox that `nobody` can read, with network `permnet` (one fake
/// plugin `p`) and a cache dir only root may use.
pub fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("permnet", "1.0.0", &[json!({"type": "p"})]);
    open_up(sb.root());
    fs::create_dir(sb.cache_dir()).unwrap();
    fs::set_permissions(sb.cache_dir(), fs::Permissions::from_mode(0o700)).unwrap();
    sb
}

/// Runs cnitool `args` in `sb` as `nobody`.
pub fn run(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = sb.cnitool(args);
    cmd.uid(NOBODY).gid(NOBODY);
    Run::of(cmd)
}
