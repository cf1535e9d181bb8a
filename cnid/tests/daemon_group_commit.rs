//! The journal's shared flushes (group commit) with a real cnid and
//! `kill -9`: many ADDs at once, some held in a gated plugin between
//! their `begin` and their `commit`, others answered meanwhile (their
//! records sharing `fdatasync`s with the held ones'), and a wave still in
//! flight (records appended, flushes running or waited for) when the
//! daemon is killed. The restart rolls back exactly the ADDs left open:
//! every answered ADD keeps its record and its allocation, every
//! allocation left has a record (none leaked), and DELs then free all.
//!
//! # Caveats
//!
//! A real disk loses nothing at a `kill -9`, and a real `fdatasync`
//! cannot be held at a gate: which records of the wave a flush covered
//! when the kill came is not chosen here. What a power loss keeps, and a
//! flush held while records arrive, are the simulated disk's tests
//! (`cnid/src/daemon/intents/tests/shared_flush.rs`, `crash_points.rs`).

use crate::support;
use crate::support::daemon::{Daemon, Dirs, eventually};
use crate::support::gate::Gate;
use cnid::api::AttachmentRequest;
use serde_json::json;
use std::time::Duration;

const NET: &str = "dgroup";

/// The plugin's allocations (a file per container ID).
fn allocations(dirs: &Dirs) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dirs.data.join("alloc"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The container IDs among `cids` whose result the cache holds.
fn cached_of(dirs: &Dirs, cids: &[String]) -> Vec<String> {
    let files = dirs.cached();
    cids.iter()
        .filter(|c| files.iter().any(|f| f.contains(&format!("-{c}-"))))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_amid_shared_flushes_rolls_back_exactly_the_open_adds() {
    support::require_root!();
    const HELD: usize = 8;
    const ANSWERED: usize = 24;
    const WAVE: usize = 16;
    let dirs = Dirs::new();
    let hold = Gate::new(dirs.root());
    let alloc = dirs.data.join("alloc");
    std::fs::create_dir_all(&alloc).unwrap();
    // Allocates first, then (the held ones) waits at the gate: an ADD
    // half done, its `begin` durable, no `commit`.
    dirs.plugin(
        "alloc",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) : > {alloc}/$CNI_CONTAINERID
     case "$CNI_CONTAINERID" in held-*)
{wait}
     ;; esac
     printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.97.0.7/24"}}]}}';;
DEL) rm -f {alloc}/$CNI_CONTAINERID;;
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac
exit 0"#,
            alloc = alloc.display(),
            wait = hold.shell_wait(),
        ),
    );
    dirs.conf(
        "10-group.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "alloc"}]}),
    );
    let req = |cid: &str| AttachmentRequest::new(cid, dirs.netns(cid), "eth0");
    let ids = |prefix: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
    };
    let (held, answered, wave) = (ids("held", HELD), ids("done", ANSWERED), ids("fly", WAVE));

    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let mut pending = Vec::new();
    for cid in held.iter().chain(&answered) {
        let (c, r) = (client.clone(), req(cid));
        pending.push((
            cid.clone(),
            tokio::spawn(async move { c.add(NET, &r).await }),
        ));
    }
    let held_tasks: Vec<_> = pending.drain(..HELD).collect();
    for (cid, t) in pending {
        t.await
            .unwrap()
            .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    }
    hold.wait_started(HELD).await;
    assert!(held_tasks.iter().all(|(_, t)| !t.is_finished()));
    // The wave: in flight when the kill comes.
    let wave_tasks: Vec<_> = wave
        .iter()
        .map(|cid| {
            let (c, r) = (client.clone(), req(cid));
            tokio::spawn(async move { c.add(NET, &r).await })
        })
        .collect();
    daemon.kill9();
    for (_, t) in held_tasks {
        t.abort();
    }
    // A wave ADD answered before the kill is an answered ADD too.
    let mut answered_all = answered.clone();
    for (cid, t) in wave.iter().zip(wave_tasks) {
        if let Ok(Ok(_)) = t.await {
            answered_all.push(cid.clone());
        }
    }
    answered_all.sort();

    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    hold.release();
    daemon.wait_ready(Duration::from_secs(60));
    let every: Vec<String> = held.iter().chain(&answered).chain(&wave).cloned().collect();
    eventually(Duration::from_secs(60), "the open ADDs rolled back", || {
        dirs.intents().is_empty() && cached_of(&dirs, &every) == allocations(&dirs)
    });
    let kept = allocations(&dirs);
    for cid in &answered_all {
        assert!(kept.contains(cid), "answered ADD {cid} lost: {kept:?}");
    }
    for cid in &held {
        assert!(
            !kept.contains(cid),
            "held ADD {cid} not rolled back: {kept:?}"
        );
    }
    println!(
        "group commit: after kill -9, {} answered ({} of the wave), {} kept, {} held rolled back",
        answered_all.len(),
        answered_all.len() - ANSWERED,
        kept.len(),
        HELD
    );
    let client = daemon.client().await;
    for cid in &kept {
        client.del(NET, &req(cid)).await.expect("DEL");
    }
    assert!(allocations(&dirs).is_empty(), "{:?}", allocations(&dirs));
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    assert!(dirs.intents().is_empty());
}
