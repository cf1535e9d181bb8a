//! Symbolic links planted in the conf dir and the cache dir, through the
//! daemon and cnitool: a conf file linking outside the conf dir is skipped
//! and named; a cache entry or lock file linking anywhere is refused (the
//! entry moved aside to `corrupt/`), never followed, its target untouched,
//! and a configuration stored in it never run.
//!
//! The same rules in the libraries: `cni-core/tests/confdir_lookup.rs`
//! (`symlinks_inside_are_followed_outside_refused`) and
//! `cni-async/tests/cache_layout.rs` (`symlinked_entry_is_refused`).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::support::daemon::{Daemon, Dirs, recording_plugin, runs};
use crate::support::fake::Fake;
use crate::support::tool::{Sandbox, expected_container_id};
use base64::Engine as _;
use cnid::api::AttachmentRequest;
use serde_json::{Value, json};

const NETNS: &str = "/proc/self/ns/net";

/// A file outside every dir the daemon or cnitool uses, with its bytes and
/// mtime, to prove it untouched.
struct Target {
    path: PathBuf,
    bytes: Vec<u8>,
    mtime: SystemTime,
}

impl Target {
    fn new(path: PathBuf, bytes: &[u8]) -> Target {
        std::fs::write(&path, bytes).unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        Target {
            path,
            bytes: bytes.to_vec(),
            mtime,
        }
    }

    #[track_caller]
    fn assert_untouched(&self) {
        let meta = std::fs::symlink_metadata(&self.path).expect("the target still exists");
        assert!(meta.is_file(), "the target is still a plain file");
        assert_eq!(
            std::fs::read(&self.path).unwrap(),
            self.bytes,
            "target bytes changed"
        );
        assert_eq!(meta.modified().unwrap(), self.mtime, "target was written");
    }
}

/// A cache record for `network`/`cid`/`eth0` whose stored configuration
/// runs the plugin `evil`: were it followed, a DEL from the cache or a GC
/// would run it.
fn tempting_record(network: &str, cid: &str) -> Vec<u8> {
    let config = json!({"cniVersion": "1.0.0", "name": network, "plugins": [{"type": "evil"}]});
    json!({
        "kind": "cniCacheV1",
        "containerId": cid,
        "config": base64::engine::general_purpose::STANDARD.encode(config.to_string()),
        "ifName": "eth0",
        "networkName": network,
        "netns": NETNS,
        "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.66.0.6/24"}]}
    })
    .to_string()
    .into_bytes()
}

fn corrupt_links(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("corrupt"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conf_files_linking_outside_the_conf_dir_are_skipped_and_named() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin("rec", &recording_plugin(&records, ""));
    let evil_marker = dirs.data.join("evil-ran");
    dirs.plugin(
        "evil",
        &format!("touch {}\ncat > /dev/null", evil_marker.display()),
    );
    let outside = tempfile::tempdir().unwrap();
    let evil =
        |name: &str| json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "evil"}]});
    // A conflist and a plugin file outside, linked in.
    let target = Target::new(
        outside.path().join("evil.conflist"),
        evil("evil").to_string().as_bytes(),
    );
    symlink(&target.path, dirs.conf.join("10-evil.conflist")).unwrap();
    let extra = Target::new(
        outside.path().join("extra.conf"),
        json!({"type": "evil"}).to_string().as_bytes(),
    );
    // Kubernetes ConfigMap style: a link to a file inside is fine.
    std::fs::create_dir_all(dirs.conf.join("..data")).unwrap();
    std::fs::write(
        dirs.conf.join("..data/20-ok.conflist"),
        json!({"cniVersion": "1.0.0", "name": "ok", "plugins": [{"type": "rec"}]}).to_string(),
    )
    .unwrap();
    symlink("..data/20-ok.conflist", dirs.conf.join("20-ok.conflist")).unwrap();
    // The spec's `<confdir>/<network>/*.conf` plugin files: a link out of it.
    std::fs::create_dir_all(dirs.conf.join("ok")).unwrap();
    symlink(&extra.path, dirs.conf.join("ok/50-extra.conf")).unwrap();

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let nets = client.networks().await.unwrap();
    let names: Vec<&str> = nets.networks.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["ok"], "{nets:?}");
    assert_eq!(
        nets.networks[0].plugins,
        ["rec"],
        "the outside plugin file was appended"
    );
    let err = nets
        .errors
        .iter()
        .find(|e| e.file.ends_with("10-evil.conflist"))
        .unwrap_or_else(|| panic!("the outside link is not named: {:?}", nets.errors));
    assert!(err.reason.contains("points outside"), "{err:?}");
    let req = AttachmentRequest::new("c1", NETNS, "eth0");
    let e = client.add("evil", &req).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    client.add("ok", &req).await.expect("the inside link works");
    client.del("ok", &req).await.unwrap();
    println!(
        "symlinks: daemon skipped {} ({}); the inside link served; the outside plugin file was not appended",
        err.file, err.reason
    );

    // cnitool: the same conf dir.
    let sb = Sandbox::new();
    sb.plugins
        .fake("evil", &Fake::plugin("1.0.0", "10.66.0.6/24"));
    symlink(&target.path, sb.net_dir().join("10-evil.conflist")).unwrap();
    let err = sb.run(&["add", "evil", &sb.netns("x")]).fails();
    assert!(
        err.contains("10-evil.conflist") && err.contains("points outside"),
        "{err}"
    );
    assert!(sb.plugins.invocations().is_empty());

    assert!(!evil_marker.exists(), "a configuration from outside ran");
    target.assert_untouched();
    extra.assert_untouched();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_entries_and_locks_linking_anywhere_are_refused_and_their_targets_untouched() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin("rec", &recording_plugin(&records, ""));
    let evil_marker = dirs.data.join("evil-ran");
    dirs.plugin(
        "evil",
        &format!("touch {}\ncat > /dev/null", evil_marker.display()),
    );
    dirs.conf(
        "10-sec.conflist",
        &json!({"cniVersion": "1.1.0", "name": "sec", "plugins": [{"type": "rec"}]}),
    );
    let outside = tempfile::tempdir().unwrap();
    let results = dirs.cache.join("results");
    let locks = dirs.cache.join("locks");
    std::fs::create_dir_all(&results).unwrap();
    std::fs::create_dir_all(&locks).unwrap();
    // Entries of a loaded network and of one that is not, and a stale one
    // GC would DEL: each a link to a tempting record outside.
    let mut targets = Vec::new();
    for (network, cid) in [("sec", "c1"), ("gone", "c2"), ("sec", "c3")] {
        let t = Target::new(
            outside.path().join(format!("{network}-{cid}")),
            &tempting_record(network, cid),
        );
        symlink(&t.path, results.join(format!("{network}-{cid}-eth0"))).unwrap();
        targets.push(t);
    }
    // A lock file linking to a file outside, and one to nowhere.
    let lock_target = Target::new(outside.path().join("lock"), b"not a lock");
    symlink(&lock_target.path, locks.join("sec-c4-eth0.lock")).unwrap();
    let nowhere = outside.path().join("created-by-lock");
    symlink(&nowhere, locks.join("sec-c5-eth0.lock")).unwrap();

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    // Listing reads nothing through a link.
    assert!(client.attachments(None).await.unwrap().is_empty());
    // DEL of the loaded network: no prevResult from outside, link moved.
    let req = |cid: &str| AttachmentRequest::new(cid, NETNS, "eth0");
    client.del("sec", &req("c1")).await.expect("DEL");
    // DEL of a network no longer loaded: the stored config is not used.
    client
        .del("gone", &req("c2"))
        .await
        .expect("DEL of a gone network");
    // GC: the linked stale entry is not an attachment to DEL with its config.
    let gc = client
        .gc(
            "sec",
            &cnid::api::GcRequest {
                valid_attachments: Vec::new(),
                timeout_ms: None,
            },
        )
        .await
        .expect("GC");
    // ADD over a link: moved aside, a real file written in its place.
    client.add("sec", &req("c3")).await.expect("ADD");
    let meta = std::fs::symlink_metadata(results.join("sec-c3-eth0")).unwrap();
    assert!(meta.is_file(), "the ADD wrote a plain file");
    client.del("sec", &req("c3")).await.unwrap();
    // Linked lock files: refused, nothing opened or created through them.
    for cid in ["c4", "c5"] {
        let e = client.add("sec", &req(cid)).await.unwrap_err();
        assert_eq!(e.status(), Some(500), "{e}");
        assert!(e.to_string().contains("lock"), "{e}");
    }
    assert!(!nowhere.exists(), "a lock file was created through a link");

    // What ran: DELs without prevResult, never the stored `evil` config.
    let ran = runs(&records);
    assert!(!evil_marker.exists(), "a configuration stored outside ran");
    for t in &targets {
        t.assert_untouched();
    }
    lock_target.assert_untouched();
    let moved = corrupt_links(&dirs.cache);
    println!(
        "symlinks: daemon moved {moved} linked cache entries aside, refused 2 linked lock files; \
         {} plugin runs, GC deleted {:?}; targets untouched",
        ran.len(),
        gc.deleted
    );
    assert!(gc.deleted.is_empty(), "GC deleted through a link: {gc:?}");
    assert_eq!(moved, 3, "every linked entry is moved aside (c1, c2, c3)");

    // cnitool on the same kind of cache.
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("sec", "1.0.0", &[json!({"type": "p"})]);
    let netns = &sb.netns("linktest");
    let cid = expected_container_id(netns);
    let sb_results = sb.cache_dir().join("results");
    std::fs::create_dir_all(&sb_results).unwrap();
    let t = Target::new(
        outside.path().join("cnitool-entry"),
        &tempting_record("sec", &cid),
    );
    let link = sb_results.join(format!("sec-{cid}-eth0"));
    symlink(&t.path, &link).unwrap();
    sb.run(&["del", "sec", netns]).ok();
    let del = sb.plugins.invocations_of("DEL");
    assert_eq!(del.len(), 1);
    assert!(
        del[0].stdin_json().get("prevResult").is_none(),
        "cnitool followed the link"
    );
    symlink(&t.path, &link).unwrap();
    sb.run(&["gc", "sec", netns]).ok();
    assert_eq!(
        sb.plugins.invocations_of("DEL").len(),
        1,
        "cnitool gc took a link for a cached attachment"
    );
    sb.run(&["add", "sec", netns]).ok();
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    sb.run(&["del", "sec", netns]).ok();
    t.assert_untouched();
    let v: Value = serde_json::from_slice(&t.bytes).unwrap();
    assert_eq!(v["containerId"], cid.as_str());
}
