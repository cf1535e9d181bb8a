//! Embeds the commit the binaries are built from, for `--version`
//! (`CNID_BUILD_VERSION`: `0.1.0 (commit 0123456789ab)`, or `(commit unknown)`
//! outside a git checkout). Re-runs only when `HEAD` moves. Shared by the
//! `cnitool` package (`build = "../build.rs"`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned()).filter(|t| !t.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=CNID_BUILD_VERSION={version} (commit {commit})");
    // HEAD, the branch it points to, and packed refs: what moves on a commit
    // or checkout. Only paths that exist: cargo re-runs a build script
    // whose watched path is missing on every build, which re-checked cnid
    // and everything above it on every cargo command of a checkout without
    // `packed-refs` (a worktree, a repository never packed). A branch ref not
    // yet loose is watched through its directory, where a commit creates it.
    let branch = git(&["symbolic-ref", "-q", "HEAD"])
        .and_then(|r| git(&["rev-parse", "--git-path", &r]))
        .map(std::path::PathBuf::from);
    let branch_dir = branch
        .as_ref()
        .filter(|b| !b.exists())
        .and_then(|b| b.parent().map(|d| d.to_path_buf()));
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]).map(std::path::PathBuf::from),
        branch,
        branch_dir,
        git(&["rev-parse", "--git-path", "packed-refs"]).map(std::path::PathBuf::from),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.exists())
    {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    // (No rerun-if-changed for this file: cnitool shares it as `../build.rs`,
    // and cargo re-runs a build script whose source changed anyway.)
}
