//! Reloading networks while the daemon runs: inotify (files added, changed,
//! removed, a bad file, the conf dir removed and recreated, plugin files in
//! a network's subdir) and SIGHUP.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually_async};
use cnid::api::NetworksResponse;
use cnid::client::Client;
use serde_json::json;

/// How long a reload may take (generous: a busy machine).
const SOON: Duration = Duration::from_secs(20);

/// How many inotify instances process `pid` has open.
fn inotify_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the daemon's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
        .count()
}

async fn nets(client: &Client) -> NetworksResponse {
    client.networks().await.expect("networks")
}

async fn names(client: &Client) -> Vec<String> {
    nets(client)
        .await
        .networks
        .into_iter()
        .map(|n| n.name)
        .collect()
}

fn list(name: &str, plugins: &[&str]) -> serde_json::Value {
    json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": plugins.iter().map(|t| json!({"type": t})).collect::<Vec<_>>(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_dir_changes_are_picked_up_without_a_restart() {
    let dirs = Dirs::new();
    dirs.conf("10-a.conflist", &list("a", &["x"]));
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    assert_eq!(names(&client).await, ["a"]);
    assert!(inotify_fds(daemon.pid()) > 0, "the daemon watches nothing");

    // Added.
    dirs.conf("20-b.conflist", &list("b", &["y"]));
    eventually_async(SOON, "b loaded", || async {
        names(&client).await == ["a", "b"]
    })
    .await;
    // Changed.
    dirs.conf("20-b.conflist", &list("b", &["y", "z"]));
    eventually_async(SOON, "b changed", || async {
        client.network("b").await.unwrap().plugins == ["y", "z"]
    })
    .await;
    // Plugin files in <confdir>/<name>/ (spec 1.1.0), in a subdir created
    // after start.
    std::fs::create_dir(dirs.conf.join("b")).unwrap();
    std::fs::write(dirs.conf.join("b/50-extra.conf"), br#"{"type":"extra"}"#).unwrap();
    eventually_async(SOON, "b's plugin file appended", || async {
        client.network("b").await.unwrap().plugins == ["y", "z", "extra"]
    })
    .await;
    // A bad file is listed, not fatal.
    std::fs::write(dirs.conf.join("30-bad.conflist"), b"{ not json").unwrap();
    eventually_async(SOON, "bad file listed", || async {
        nets(&client)
            .await
            .errors
            .iter()
            .any(|e| e.file.ends_with("30-bad.conflist"))
    })
    .await;
    assert_eq!(names(&client).await, ["a", "b"]);
    // A duplicate name is shadowed (first file wins) and shown.
    dirs.conf("40-a-again.conflist", &list("a", &["other"]));
    eventually_async(SOON, "duplicate shown as shadowed", || async {
        let n = client.network("a").await.unwrap();
        n.plugins == ["x"]
            && n.shadowed
                .iter()
                .any(|f| f.ends_with("40-a-again.conflist"))
    })
    .await;
    // Removed.
    std::fs::remove_file(dirs.conf.join("10-a.conflist")).unwrap();
    eventually_async(SOON, "a now from the later file", || async {
        client.network("a").await.unwrap().plugins == ["other"]
    })
    .await;
    std::fs::remove_file(dirs.conf.join("40-a-again.conflist")).unwrap();
    eventually_async(SOON, "a removed", || async {
        names(&client).await == ["b"]
    })
    .await;
    assert_eq!(client.network("a").await.unwrap_err().status(), Some(404));

    // The whole dir removed, then recreated with other content.
    std::fs::remove_dir_all(&dirs.conf).unwrap();
    eventually_async(SOON, "no networks", || async {
        names(&client).await.is_empty()
    })
    .await;
    std::fs::create_dir(&dirs.conf).unwrap();
    dirs.conf("10-c.conflist", &list("c", &["x"]));
    eventually_async(SOON, "c loaded in the recreated dir", || async {
        names(&client).await == ["c"]
    })
    .await;
    // Replaced by a rename (as `kubectl`-style atomic updates do).
    let staging = dirs.root().join("staging");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(
        staging.join("10-d.conflist"),
        serde_json::to_vec(&list("d", &["x"])).unwrap(),
    )
    .unwrap();
    std::fs::remove_dir_all(&dirs.conf).unwrap();
    std::fs::rename(&staging, &dirs.conf).unwrap();
    eventually_async(SOON, "d loaded in the renamed-in dir", || async {
        names(&client).await == ["d"]
    })
    .await;
    // And it still watches the new dir.
    dirs.conf("20-e.conflist", &list("e", &["x"]));
    eventually_async(SOON, "e loaded", || async {
        names(&client).await == ["d", "e"]
    })
    .await;
    let m = client.metrics().await.unwrap();
    assert!(m.contains("cnid_networks 2"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads() {
    let dirs = Dirs::new();
    dirs.conf("10-a.conflist", &list("a", &["x"]));
    // No inotify: only SIGHUP reloads.
    let daemon = Daemon::start(&dirs, &["--no-watch"]);
    let client = daemon.client().await;
    let gen0 = nets(&client).await.generation;
    // Nothing that could notice a change by itself.
    assert_eq!(inotify_fds(daemon.pid()), 0, "--no-watch, yet watching");
    dirs.conf("20-b.conflist", &list("b", &["y"]));
    assert_eq!(names(&client).await, ["a"], "reloaded without SIGHUP");
    daemon.signal(libc::SIGHUP);
    eventually_async(SOON, "b loaded after SIGHUP", || async {
        names(&client).await == ["a", "b"]
    })
    .await;
    // Exactly one reload since the start: SIGHUP's, none on the change.
    assert_eq!(nets(&client).await.generation, gen0 + 1);
    std::fs::remove_file(dirs.conf.join("10-a.conflist")).unwrap();
    daemon.signal(libc::SIGHUP);
    eventually_async(SOON, "a gone after SIGHUP", || async {
        names(&client).await == ["b"]
    })
    .await;
}
