//! `--version` of every installed binary names the commit it was built from.

use std::process::Command;

fn head() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap().trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

#[test]
fn every_binary_prints_its_version_and_commit() {
    let want = format!("{} (commit {})", env!("CARGO_PKG_VERSION"), head());
    for (name, path) in [
        ("cnid", env!("CARGO_BIN_EXE_cnid")),
        ("cnitool", env!("CARGO_BIN_EXE_cnitool")),
        ("cnitool-batch", env!("CARGO_BIN_EXE_cnitool-batch")),
        ("cnitool-daemon", env!("CARGO_BIN_EXE_cnitool-daemon")),
        ("cnid-shim", env!("CARGO_BIN_EXE_cnid-shim")),
    ] {
        let out = Command::new(path).arg("--version").output().unwrap();
        assert!(out.status.success(), "{name} --version failed");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.trim_end().ends_with(&want),
            "{name} --version printed {text:?}, want it to end with {want:?}"
        );
    }
}
