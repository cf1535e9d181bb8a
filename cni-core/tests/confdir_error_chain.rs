//! A conf file skipped for an I/O error keeps the cause in its reason:
//! since messages no longer embed their `#[source]`, the reason is the
//! whole chain (`cni_core::error::Chain`), each part once.

use std::fs;

use cni_core::confdir;

/// `<confdir>/<network>` is a file, not the spec 1.1.0 plugin dir: reading
/// it fails with "Not a directory", and that cause must reach the reason
/// (before: only "cannot read <path>").
#[test]
fn skipped_file_reason_keeps_the_io_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("10-a.conflist"),
        br#"{"cniVersion":"1.0.0","name":"a","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    // Not a directory where the plugin files of network "a" would be.
    fs::write(dir.path().join("a"), b"").unwrap();

    let scan = confdir::scan(dir.path()).unwrap();
    assert!(scan.networks.is_empty(), "{scan:?}");
    let [skipped] = scan.skipped.as_slice() else {
        panic!("expected one skipped file: {scan:?}");
    };
    let reason = &skipped.reason;
    let plugin_dir = dir.path().join("a").display().to_string();
    assert!(reason.contains(&plugin_dir), "{reason}");
    assert!(reason.contains("Not a directory"), "{reason}");
    assert_eq!(reason.matches("Not a directory").count(), 1, "{reason}");

    // The "not found" error of a lookup names it the same way.
    let e = confdir::load_network(dir.path(), "a").unwrap_err();
    let text = cni_core::error::Chain(&e).to_string();
    assert!(text.contains("Not a directory"), "{text}");
    assert_eq!(text.matches("Not a directory").count(), 1, "{text}");
}
