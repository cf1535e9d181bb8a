//! Regression: a DEL with a wrong `containerId` but
//! another container's netns and ifname answered 204, and the plugins
//! removed that container's interface. cnid knows its attachments: by
//! default (`--no-check-netns-owner` turns it off), an ADD, CHECK or DEL
//! whose netns and ifname belong to another attached container (and to
//! none of the requester's own) is refused with 409 naming the owner,
//! before any plugin runs, unless the request sets `"force": true`. The
//! sandbox endpoints too.

use crate::support::daemon::{Daemon, Dirs, Run, post, runs};
use serde_json::{Value, json};

const NET: &str = "owners";
/// A network namespace the daemon can check (its own).
const NETNS: &str = "/proc/self/ns/net";

fn setup() -> (Dirs, std::path::PathBuf) {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-owners.conflist", NET, "1.0.0");
    (dirs, records)
}

/// POSTs `body` to `path`: the status and the JSON answer (null when empty).
fn post_json(daemon: &Daemon, path: &str, body: Value) -> (u16, Value) {
    let raw = post(&daemon.socket, path, &body.to_string());
    let v = if raw.body.is_empty() {
        Value::Null
    } else {
        raw.json()
    };
    (raw.status, v)
}

fn call(daemon: &Daemon, verb: &str, body: Value) -> (u16, Value) {
    post_json(daemon, &format!("/v1/networks/{NET}/{verb}"), body)
}

fn sandbox(daemon: &Daemon, verb: &str, body: Value) -> (u16, Value) {
    post_json(daemon, &format!("/v1/sandboxes/{verb}"), body)
}

fn plugin_runs_of(records: &std::path::Path, container: &str) -> Vec<Run> {
    runs(records)
        .into_iter()
        .filter(|r| r.container == container)
        .collect()
}

#[track_caller]
fn assert_refused_naming_owner(answer: &(u16, Value), owner: &str) {
    let (status, e) = answer;
    assert_eq!(*status, 409, "{e}");
    assert_eq!(e["code"], cnid::api::code::ALREADY_ATTACHED, "{e}");
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!(
            "belongs to container {owner:?} on network {NET:?}"
        )),
        "{msg}"
    );
    assert!(msg.contains("force"), "{msg}");
}

#[test]
fn a_del_with_another_containers_netns_and_ifname_is_refused_and_the_owner_stays() {
    let (dirs, records) = setup();
    // The default: no option needed.
    let daemon = Daemon::start(&dirs, &[]);
    let owner = json!({"containerId": "owner-a", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", owner.clone()).0, 200);

    // The wrong container on the owner's netns and ifname: every verb.
    let intruder = json!({"containerId": "wrong-b", "netns": NETNS, "ifname": "eth0"});
    for verb in ["del", "check", "add"] {
        let answer = call(&daemon, verb, intruder.clone());
        assert_refused_naming_owner(&answer, "owner-a");
    }
    // No plugin ran for it, and the owner is intact: cached, and CHECK passes.
    assert!(plugin_runs_of(&records, "wrong-b").is_empty());
    assert_eq!(dirs.cached(), vec![format!("{NET}-owner-a-eth0")]);
    assert_eq!(call(&daemon, "check", owner.clone()).0, 204);

    // Another interface of the same netns, or no netns (DEL), is not the
    // owner's: allowed.
    let other_if = json!({"containerId": "wrong-b", "netns": NETNS, "ifname": "eth1"});
    assert_eq!(call(&daemon, "add", other_if.clone()).0, 200);
    assert_eq!(call(&daemon, "del", other_if).0, 204);
    let no_netns = json!({"containerId": "wrong-b", "ifname": "eth0"});
    assert_eq!(call(&daemon, "del", no_netns).0, 204);
    assert_eq!(dirs.cached(), vec![format!("{NET}-owner-a-eth0")]);

    // Known after a restart too (the index is loaded from the cache).
    drop(daemon);
    let daemon = Daemon::start(&dirs, &[]);
    assert_refused_naming_owner(&call(&daemon, "del", intruder.clone()), "owner-a");

    // The request says it means it: runs.
    let mut forced = intruder.clone();
    forced["force"] = json!(true);
    assert_eq!(call(&daemon, "del", forced).0, 204);
    let del_runs: Vec<Run> = plugin_runs_of(&records, "wrong-b")
        .into_iter()
        .filter(|r| r.command == "DEL" && r.ifname == "eth0")
        .collect();
    assert_eq!(del_runs.len(), 2, "{del_runs:?}"); // the netns-less DEL and the forced one
    // The owner's own record is untouched by someone else's DEL.
    assert_eq!(dirs.cached(), vec![format!("{NET}-owner-a-eth0")]);

    // Once the owner is gone, the netns and ifname are free.
    assert_eq!(call(&daemon, "del", owner).0, 204);
    assert_eq!(call(&daemon, "add", intruder.clone()).0, 200);
    assert_eq!(call(&daemon, "del", intruder).0, 204);
}

#[test]
fn an_owner_whose_cache_record_is_gone_no_longer_blocks() {
    let (dirs, _records) = setup();
    let daemon = Daemon::start(&dirs, &[]);
    let owner = json!({"containerId": "gone-a", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", owner).0, 200);
    // As cnitool's DEL or GC on the shared cache would leave it.
    std::fs::remove_file(
        dirs.cache
            .join("results")
            .join(format!("{NET}-gone-a-eth0")),
    )
    .unwrap();
    let next = json!({"containerId": "next-b", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", next.clone()).0, 200);
    assert_eq!(call(&daemon, "del", next).0, 204);
}

/// A record whose names read but whose `cniArgs` (or `config`, ...) the
/// cache's decoder refuses still owns its netns and ifname: the owner
/// table skipped it, admitted another container's ADD there, and that
/// ADD's rollback (its plugins failing on the taken interface) DELed the
/// interface in the netns. The intruder is refused, and no plugin runs.
#[test]
fn an_owner_whose_record_the_decoder_refuses_still_blocks() {
    let (dirs, records) = setup();
    let daemon = Daemon::start(&dirs, &[]);
    let owner = json!({"containerId": "corrupt-a", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", owner).0, 200);
    // Damaged in a field the owner table does not need; replaced by
    // rename, as a writer would.
    let results = dirs.cache.join("results");
    let path = results.join(format!("{NET}-corrupt-a-eth0"));
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    rec["cniArgs"] = json!("K=V");
    let tmp = results.join(".damaged");
    std::fs::write(&tmp, rec.to_string()).unwrap();
    std::fs::rename(&tmp, &path).unwrap();

    let intruder = json!({"containerId": "intruder-b", "netns": NETNS, "ifname": "eth0"});
    assert_refused_naming_owner(&call(&daemon, "add", intruder.clone()), "corrupt-a");
    assert!(plugin_runs_of(&records, "intruder-b").is_empty());
    // Known after a restart too (the first scan reads every record).
    drop(daemon);
    let daemon = Daemon::start(&dirs, &[]);
    assert_refused_naming_owner(&call(&daemon, "add", intruder), "corrupt-a");
    assert!(plugin_runs_of(&records, "intruder-b").is_empty());
}

#[test]
fn the_operator_can_turn_the_check_off() {
    let (dirs, _records) = setup();
    let daemon = Daemon::start(&dirs, &["--no-check-netns-owner"]);
    let owner = json!({"containerId": "plain-a", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", owner.clone()).0, 200);
    let other = json!({"containerId": "plain-b", "netns": NETNS, "ifname": "eth0"});
    assert_eq!(call(&daemon, "add", other.clone()).0, 200);
    assert_eq!(call(&daemon, "del", other.clone()).0, 204);

    // The last of the two options wins: on again.
    drop(daemon);
    let daemon = Daemon::start(&dirs, &["--no-check-netns-owner", "--check-netns-owner"]);
    assert_refused_naming_owner(&call(&daemon, "add", other), "plain-a");
    assert_eq!(call(&daemon, "del", owner).0, 204);
}

#[test]
fn sandboxes_on_another_containers_netns_are_refused_unless_forced() {
    let (dirs, records) = setup();
    let daemon = Daemon::start(&dirs, &["--check-netns-owner"]);
    let owner = json!({"containerId": "pod-a", "netns": NETNS, "networks": [{"name": NET}]});
    assert_eq!(sandbox(&daemon, "add", owner.clone()).0, 200);

    let intruder = json!({"containerId": "pod-b", "netns": NETNS, "networks": [{"name": NET}]});
    for verb in ["del", "check", "add"] {
        assert_refused_naming_owner(&sandbox(&daemon, verb, intruder.clone()), "pod-a");
    }
    // The default network (no `networks`) is checked too.
    let default = json!({"containerId": "pod-b", "netns": NETNS});
    assert_refused_naming_owner(&sandbox(&daemon, "del", default), "pod-a");
    assert!(plugin_runs_of(&records, "pod-b").is_empty());
    assert_eq!(sandbox(&daemon, "check", owner.clone()).0, 204);

    let mut forced = intruder;
    forced["force"] = json!(true);
    assert_eq!(sandbox(&daemon, "del", forced).0, 204);
    assert_eq!(plugin_runs_of(&records, "pod-b").len(), 1);
    assert_eq!(dirs.cached(), vec![format!("{NET}-pod-a-eth0")]);
    assert_eq!(sandbox(&daemon, "del", owner).0, 204);
}
