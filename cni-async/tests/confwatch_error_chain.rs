//! The conf-dir watcher keeps the cause of an error in the one-line forms
//! it stores and logs (`ConfSnapshot::dir_error`, the readiness reason):
//! messages no longer embed their `#[source]`, so these print the chain.
#![cfg(feature = "watch")]

use std::fs;

use cni_async::Cni;
use cni_async::confwatch::NetworkSet;

/// A conf dir path that is a regular file: the scan fails with "Not a
/// directory". Before, `dir_error` was only "cannot read <path>".
#[tokio::test]
async fn dir_error_and_readiness_keep_the_io_cause_once() {
    let tmp = tempfile::tempdir().unwrap();
    let not_a_dir = tmp.path().join("net.d");
    fs::write(&not_a_dir, b"").unwrap();

    let set = NetworkSet::new(&not_a_dir);
    set.reload_blocking();
    let snap = set.snapshot();
    let dir_error = snap.dir_error.as_deref().expect("a dir error");
    assert!(
        dir_error.contains(&not_a_dir.display().to_string()),
        "{dir_error}"
    );
    assert!(dir_error.contains("Not a directory"), "{dir_error}");
    assert_eq!(
        dir_error.matches("Not a directory").count(),
        1,
        "{dir_error}"
    );

    let cni = Cni::builder().plugin_dirs([tmp.path()]).build();
    let not_ready = set.readiness(&cni, 1).await.unwrap_err();
    let reason = not_ready.to_string();
    assert!(reason.contains("Not a directory"), "{reason}");
    assert_eq!(reason.matches("Not a directory").count(), 1, "{reason}");
}
