//! `--version` of every installed binary names the commit it was built from.

use std::process::Command;

/// Whether `commit` is a commit of the repository the sources are in
/// (`None` outside a git checkout).
fn is_commit_here(commit: &str) -> Option<bool> {
    let probe = Command::new("git")
        .args(["rev-parse", "--git-dir"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !probe.status.success() {
        return None;
    }
    let out = Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    Some(out.status.success())
}

#[test]
fn every_binary_prints_its_version_and_commit() {
    // What the build embedded (cnid/build.rs), the same for every target of
    // the package: `0.1.0 (commit 0123456789ab)`.
    let want = env!("CNID_BUILD_VERSION");
    let commit = want
        .strip_prefix(concat!(env!("CARGO_PKG_VERSION"), " (commit "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("build version {want:?}"));
    match is_commit_here(commit) {
        Some(true) => assert_eq!(commit.len(), 12, "{commit}"),
        Some(false) => panic!("{commit} is not a commit of this checkout"),
        None => assert_eq!(commit, "unknown"),
    }
    // cnitool is the `cnitool` package's, built with the same build script
    // (cnid/build.rs), in the same target dir.
    let cnitool = &*crate::support::tool::CNITOOL;
    for (name, path) in [
        ("cnid", env!("CARGO_BIN_EXE_cnid")),
        ("cnitool", cnitool.to_str().unwrap()),
        ("cnid-shim", crate::support::shim::SHIM.as_str()),
    ] {
        let out = Command::new(path).arg("--version").output().unwrap();
        assert!(out.status.success(), "{name} --version failed");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text.trim_end(),
            format!("{name} {want}"),
            "{name} --version"
        );
    }
}
