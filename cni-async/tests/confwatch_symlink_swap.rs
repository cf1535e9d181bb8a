//! Regression: a conf dir that is a symlink to A,
//! repointed atomically to B (a new link renamed over it): the swap was
//! seen, but a network written into B later was not loaded (the watches
//! were keyed by path, so B's inode was never watched), while a write in
//! A still reloaded. Now a watch remembers the inode its path led to, and
//! a path that leads elsewhere is watched anew.
#![cfg(feature = "watch")]

use std::sync::Arc;
use std::time::Duration;

use crate::support::confwatch::{conflist_text, names, wait_for};
use cni_async::confwatch::NetworkSet;

/// Well over the watcher's debounce on a loaded machine.
const SEEN_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_conf_dir_symlink_swapped_to_another_dir_is_followed_into_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, link) = (
        tmp.path().join("A"),
        tmp.path().join("B"),
        tmp.path().join("net.d"),
    );
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(a.join("10-a.conflist"), conflist_text("in-a", "p")).unwrap();
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let set = Arc::new(NetworkSet::new(&link));
    let watcher = set.watcher().unwrap();
    let task = tokio::spawn(watcher.run());
    wait_for(&set, SEEN_WITHIN, "A's network", |s| names(s) == ["in-a"]).await;

    // The swap: a new link renamed over the old one.
    let tmp_link = tmp.path().join(".net.d.tmp");
    std::os::unix::fs::symlink(&b, &tmp_link).unwrap();
    std::fs::rename(&tmp_link, &link).unwrap();
    wait_for(&set, SEEN_WITHIN, "the swap to the empty B", |s| {
        s.networks.is_empty()
    })
    .await;

    // Written into B afterwards: loaded.
    std::fs::write(b.join("10-b.conflist"), conflist_text("in-b", "p")).unwrap();
    wait_for(&set, SEEN_WITHIN, "B's network", |s| names(s) == ["in-b"]).await;
    // And again (the watch on B stays).
    std::fs::write(b.join("20-b2.conflist"), conflist_text("in-b2", "p")).unwrap();
    wait_for(&set, SEEN_WITHIN, "B's second network", |s| {
        names(s) == ["in-b", "in-b2"]
    })
    .await;
    task.abort();
}
