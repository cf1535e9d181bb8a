//! The conf-dir watcher and readiness (feature `watch`): a conf dir created
//! after start, files written in pieces and through an editor's temp file,
//! readiness by count and by plugin presence.
#![cfg(feature = "watch")]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::support::confwatch::{conflist_text, names, version_fake, wait_for};
use crate::support::fake::PluginDir;
use cni_async::Cni;
use cni_async::confwatch::NetworkSet;
use pretty_assertions::assert_eq;

/// How long a change may take to be seen.
const LIMIT: Duration = Duration::from_secs(30);

fn spawn_watch(set: &Arc<NetworkSet>) -> tokio::task::JoinHandle<std::io::Error> {
    let set = set.clone();
    tokio::spawn(async move { set.watch().await })
}

#[tokio::test]
async fn a_conf_dir_created_after_start_is_picked_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("net.d");
    let set = Arc::new(NetworkSet::new(&dir));
    let watcher = spawn_watch(&set);
    // The watcher's own first reload: the dir is missing, nothing loaded.
    wait_for(&set, LIMIT, "the first reload", |s| s.generation >= 1).await;
    assert!(set.snapshot().networks.is_empty());
    assert_eq!(set.snapshot().dir_error, None, "a missing dir is no error");

    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("10-late.conflist"), conflist_text("late", "p")).unwrap();
    wait_for(&set, LIMIT, "the late network", |s| names(s) == ["late"]).await;

    // Removed and recreated: followed.
    std::fs::remove_dir_all(&dir).unwrap();
    wait_for(&set, LIMIT, "the removal", |s| s.networks.is_empty()).await;
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("10-again.conflist"), conflist_text("again", "p")).unwrap();
    wait_for(&set, LIMIT, "the recreated dir", |s| names(s) == ["again"]).await;
    watcher.abort();
}

#[tokio::test]
async fn files_written_in_pieces_and_through_temp_files_end_up_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let set = Arc::new(NetworkSet::new(dir));
    let watcher = spawn_watch(&set);
    wait_for(&set, LIMIT, "the first reload", |s| s.generation >= 1).await;

    // In two pieces, each its own write (and close): the half is skipped
    // with a reason, the whole is loaded.
    let full = conflist_text("pieces", "p");
    let (head, tail) = full.split_at(full.len() / 2);
    let path = dir.join("10-pieces.conflist");
    std::fs::write(&path, head).unwrap();
    wait_for(&set, LIMIT, "the half file to be skipped", |s| {
        s.skipped.iter().any(|f| f.path == path)
    })
    .await;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut f, tail.as_bytes()).unwrap();
    drop(f);
    wait_for(&set, LIMIT, "the whole file", |s| {
        names(s) == ["pieces"] && s.skipped.is_empty()
    })
    .await;
    assert_eq!(
        set.snapshot().get("pieces").unwrap().list.bytes(),
        full.as_bytes()
    );

    // An editor: swap file and backup are not configuration files; the
    // save is a temp file renamed over the original.
    std::fs::write(dir.join(".10-pieces.conflist.swp"), "garbage").unwrap();
    std::fs::write(
        dir.join("10-pieces.conflist~"),
        conflist_text("backup", "p"),
    )
    .unwrap();
    let tmp_save = dir.join("10-pieces.conflist.tmp");
    std::fs::write(&tmp_save, conflist_text("pieces", "edited")).unwrap();
    std::fs::rename(&tmp_save, &path).unwrap();
    wait_for(&set, LIMIT, "the edited file", |s| {
        s.get("pieces")
            .is_some_and(|n| n.list.plugins()[0].plugin_type() == "edited")
    })
    .await;
    let snap = set.snapshot();
    assert_eq!(names(&snap), ["pieces"]);
    assert!(snap.skipped.is_empty(), "{:?}", snap.skipped);
    watcher.abort();
}

fn write(dir: &Path, file: &str, body: &str) {
    std::fs::write(dir.join(file), body).unwrap();
}

#[tokio::test]
async fn readiness_counts_networks_whose_plugins_answer_version() {
    let plugins = PluginDir::new();
    version_fake(&plugins, "good");
    let cni = Cni::builder().plugin_dirs(plugins.dirs()).build();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("net.d");
    let set = Arc::new(NetworkSet::new(&dir));

    let e = set.readiness(&cni, 1).await.unwrap_err();
    assert!(e.reason.contains("not been read"), "{e}");
    set.reload().await;
    // A conf dir that does not exist is said to be missing.
    let e = set.readiness(&cni, 1).await.unwrap_err();
    assert_eq!(
        e.reason,
        format!("the conf dir {} does not exist", dir.display())
    );
    assert!(set.snapshot().dir_missing);

    // Created and empty: no configuration.
    std::fs::create_dir(&dir).unwrap();
    set.reload().await;
    let e = set.readiness(&cni, 1).await.unwrap_err();
    assert!(e.reason.contains("no network configuration in"), "{e}");
    assert!(!set.snapshot().dir_missing);

    write(&dir, "10-a.conflist", &conflist_text("a", "good"));
    write(&dir, "20-b.conflist", &conflist_text("b", "missing"));
    write(&dir, "30-bad.conflist", "{");
    set.reload().await;
    let ready = set.readiness(&cni, 1).await.expect("one usable network");
    assert_eq!(ready.usable, ["a"]);
    // Two needed (containerd: loopback + one): b's plugin is missing.
    let e = set.readiness(&cni, 2).await.unwrap_err();
    assert!(
        e.reason.contains("1 usable") && e.reason.contains("\"b\"") && e.reason.contains("missing"),
        "{e}"
    );
    // The plugin appears; a reload (any change) makes the set ready.
    version_fake(&plugins, "missing");
    set.reload().await;
    let ready = set.readiness(&cni, 2).await.expect("two usable networks");
    assert_eq!(ready.usable, ["a", "b"]);
    assert_eq!(set.snapshot().skipped.len(), 1);
}
