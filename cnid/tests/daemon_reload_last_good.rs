//! Regression: breaking the default network's file while
//! cnid ran dropped the network; the default silently moved to the next
//! network, and an ADD got 404 "no network configuration with name ..."
//! without a word about the file. Chosen: as containerd's CRI keeps its
//! last loaded config, a file that loaded and no longer parses keeps its
//! network's last good version, in its place, listed under the errors; the
//! default moving (the file removed) is warned about; a 404 names the conf
//! dir's unusable files.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, call, eventually, get, post};
use serde_json::{Value, json};

fn names(daemon: &Daemon) -> (Vec<String>, Value) {
    let v = get(&daemon.socket, "/v1/networks").json();
    let names = v["networks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_owned())
        .collect();
    (names, v["errors"].clone())
}

fn add(daemon: &Daemon, dirs: &Dirs, network: &str, cid: &str) -> (u16, Value) {
    let body = json!({"containerId": cid, "netns": dirs.netns(cid), "ifname": "eth0"});
    call(&daemon.socket, network, "add", &body)
}

#[test]
fn a_broken_file_keeps_its_networks_last_good_version_and_the_default() {
    let dirs = Dirs::new();
    dirs.recording_network("10-first.conflist", "first", "1.0.0");
    dirs.conf(
        "20-second.conflist",
        &json!({"cniVersion": "1.0.0", "name": "second", "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--no-watch"]);
    assert_eq!(names(&daemon).0, ["first", "second"]);

    std::fs::write(dirs.conf.join("10-first.conflist"), "{").unwrap();
    daemon.signal(libc::SIGHUP);
    eventually(Duration::from_secs(10), "the reload", || {
        names(&daemon).1.as_array().is_some_and(|e| !e.is_empty())
    });
    let (now, errors) = names(&daemon);
    assert_eq!(now, ["first", "second"], "the default stays first");
    let reason = errors[0]["reason"].as_str().unwrap();
    assert!(
        errors[0]["file"]
            .as_str()
            .unwrap()
            .ends_with("10-first.conflist")
    );
    assert!(
        reason.contains("last good version of network \"first\""),
        "{reason}"
    );
    assert_eq!(add(&daemon, &dirs, "first", "c1").0, 200);
    let sandbox = post(
        &daemon.socket,
        "/v1/sandboxes/add",
        &json!({"containerId": "c2", "netns": dirs.netns("c2")}).to_string(),
    );
    assert_eq!(sandbox.status, 200);
    assert_eq!(sandbox.json()["networks"][0]["network"], "first");

    // Removed: the network goes, the default moves, with a warning.
    std::fs::remove_file(dirs.conf.join("10-first.conflist")).unwrap();
    daemon.signal(libc::SIGHUP);
    eventually(Duration::from_secs(10), "the removal", || {
        names(&daemon).0 == ["second"]
    });
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("the default network changed"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        line.contains("WARN") && line.contains("first") && line.contains("second"),
        "{line}"
    );
}

#[test]
fn a_network_whose_file_never_parsed_is_not_found_naming_the_file() {
    let dirs = Dirs::new();
    dirs.recording_network("20-other.conflist", "other", "1.0.0");
    std::fs::write(dirs.conf.join("10-broken.conflist"), "{").unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    let (status, e) = add(&daemon, &dirs, "broken", "c1");
    assert_eq!(status, 404, "{e}");
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("no network configuration with name \"broken\""),
        "{msg}"
    );
    assert!(msg.contains("10-broken.conflist"), "{msg}");
    assert!(
        e["details"]
            .as_str()
            .unwrap()
            .contains("10-broken.conflist"),
        "{e}"
    );
}
