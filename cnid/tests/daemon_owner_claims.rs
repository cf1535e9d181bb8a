//! Regressions: the netns owner check held only
//! for cnid's own, finished ADDs.
//!
//! - Two concurrent ADDs of different containers on one netns and ifname
//!   were both admitted (the check ran before `submit`, the owner was
//!   recorded after the commit): now the netns+ifname is claimed at
//!   admission, in the same critical section as the check, until the
//!   operation ends, so exactly one of racing requests proceeds and the
//!   others get 409 — ADDs, a DEL racing an ADD, a new ADD racing a
//!   rollback.
//! - An attachment written to the shared cache by another tool (cnitool)
//!   while cnid ran was invisible to the check: now each admission reads
//!   what changed in the cache.
//! - A rollback DELed in the netns although another container's attachment
//!   held that netns and ifname: now it runs without the netns.

use crate::support;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, recording_plugin, runs};
use crate::support::gate::Gate;
use serde_json::{Value, json};

const NET: &str = "claims";

/// POSTs to `/v1/networks/claims/{verb}`: the status and the JSON answer.
fn call(socket: &Path, verb: &str, body: &Value) -> (u16, Value) {
    crate::support::daemon::call(socket, NET, verb, body)
}

fn att(cid: &str, netns: &str) -> Value {
    json!({"containerId": cid, "netns": netns, "ifname": "eth0"})
}

/// A network of one recording plugin whose runs of `command` block on
/// `gate`; returns the records dir.
fn gated_network(dirs: &Dirs, gate: &Gate, command: &str) -> std::path::PathBuf {
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    let wait = format!(
        "if [ \"$CNI_COMMAND\" = {command} ]; then\n{}\nfi",
        gate.shell_wait()
    );
    dirs.plugin("rec", &recording_plugin(&records, &wait));
    dirs.conf(
        "10-claims.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    records
}

#[track_caller]
fn assert_in_use_by(answer: &(u16, Value), owner: &str) {
    let (status, e) = answer;
    assert_eq!(*status, 409, "{e}");
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&format!("container {owner:?}")), "{msg}");
}

#[test]
fn of_racing_adds_on_one_netns_and_ifname_exactly_one_is_admitted() {
    const N: usize = 8;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = gated_network(&dirs, &gate, "ADD");
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.netns("shared");
    let answers: Vec<_> = (0..N)
        .map(|i| {
            let (socket, body) = (daemon.socket.clone(), att(&format!("race-{i}"), &netns));
            thread::spawn(move || call(&socket, "add", &body))
        })
        .collect();
    // Every request answered but the one whose plugin waits at the gate,
    // or (the bug) a second plugin run started: then release.
    eventually(Duration::from_secs(60), "N-1 answers or 2 runs", || {
        answers.iter().filter(|t| t.is_finished()).count() == N - 1 || gate.started() >= 2
    });
    gate.release();
    let answers: Vec<(u16, Value)> = answers.into_iter().map(|t| t.join().unwrap()).collect();
    let admitted: Vec<usize> = (0..N).filter(|&i| answers[i].0 == 200).collect();
    assert_eq!(admitted.len(), 1, "{answers:?}");
    let winner = format!("race-{}", admitted[0]);
    for (i, a) in answers.iter().enumerate() {
        if i != admitted[0] {
            assert_in_use_by(a, &winner);
        }
    }
    let adds: Vec<String> = runs(&records).into_iter().map(|r| r.container).collect();
    assert_eq!(adds, vec![winner.clone()]);
    // Listed once; and, finished, it is the owner the others are told of.
    let list = support::daemon::get(&daemon.socket, "/v1/attachments").json();
    assert_eq!(list["attachments"].as_array().unwrap().len(), 1, "{list}");
    let (status, e) = call(&daemon.socket, "add", &att("late", &netns));
    assert_eq!(status, 409, "{e}");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains(&format!("belongs to container {winner:?}")),
        "{e}"
    );
}

#[test]
fn a_del_of_another_container_racing_an_add_is_refused() {
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = gated_network(&dirs, &gate, "ADD");
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.netns("shared");
    let add = {
        let (socket, body) = (daemon.socket.clone(), att("adder", &netns));
        thread::spawn(move || call(&socket, "add", &body))
    };
    gate.wait_started_blocking(1);
    // The DEL (ungated) would run at once and remove the interface the ADD
    // is making.
    let del = call(&daemon.socket, "del", &att("deleter", &netns));
    gate.release();
    assert_eq!(add.join().unwrap().0, 200);
    assert_in_use_by(&del, "adder");
    assert!(
        runs(&records).iter().all(|r| r.container != "deleter"),
        "{:?}",
        runs(&records)
    );
    // Same container: its own DEL goes on.
    assert_eq!(call(&daemon.socket, "del", &att("adder", &netns)).0, 204);
}

#[test]
fn a_new_add_racing_a_rollback_waits_for_the_rollback_to_end() {
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    // `first` ADDs fine, `second` fails the ADD of container "failing":
    // the rollback DELs `first` (gated) and `second`.
    dirs.plugin(
        "first",
        &recording_plugin(
            &records,
            &format!(
                "if [ \"$CNI_COMMAND\" = DEL ]; then\n{}\nfi",
                gate.shell_wait()
            ),
        ),
    );
    dirs.plugin(
        "second",
        r#"cat >/dev/null
case "$CNI_COMMAND" in
ADD) if [ "$CNI_CONTAINERID" = failing ]; then echo '{"cniVersion":"1.0.0","code":11,"msg":"no"}'; exit 1; fi
     echo '{"cniVersion":"1.0.0"}';;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}';;
esac"#,
    );
    dirs.conf(
        "10-claims.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "first"}, {"type": "second"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.netns("shared");
    let failing = {
        let (socket, body) = (daemon.socket.clone(), att("failing", &netns));
        thread::spawn(move || call(&socket, "add", &body))
    };
    gate.wait_started_blocking(1); // the rollback's DEL of `first` runs
    let during = call(&daemon.socket, "add", &att("next", &netns));
    gate.release();
    let (status, e) = failing.join().unwrap();
    assert_eq!(status / 100, 5, "{e}");
    assert_in_use_by(&during, "failing");
    // The claim went with the rollback: the next one is admitted.
    assert_eq!(call(&daemon.socket, "add", &att("next", &netns)).0, 200);
}

/// cnitool on the daemon's conf dir, plugins and cache.
fn cnitool(dirs: &Dirs, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(&*support::tool::CNITOOL);
    for var in support::tool::CNITOOL_VARS {
        cmd.env_remove(var);
    }
    cmd.env("NETCONFPATH", &dirs.conf)
        .env("CNI_PATH", &dirs.bin)
        .env("CNI_CACHE_DIR", &dirs.cache)
        .args(args)
        .output()
        .expect("run cnitool")
}

#[test]
fn an_attachment_cnitool_made_while_cnid_runs_is_owned() {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-claims.conflist", NET, "1.0.0");
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.netns("m1");
    let out = cnitool(&dirs, &["add", NET, &netns]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = runs(&records)[0].container.clone();
    assert!(theirs.starts_with("cnitool-"), "{theirs}");

    for verb in ["add", "del", "check"] {
        let (status, e) = call(&daemon.socket, verb, &att("intruder", &netns));
        assert_eq!(status, 409, "{verb}: {e}");
        assert!(
            e["msg"]
                .as_str()
                .unwrap()
                .contains(&format!("belongs to container {theirs:?}")),
            "{e}"
        );
    }
    assert!(runs(&records).iter().all(|r| r.container != "intruder"));

    // cnitool's DEL frees it, seen at the next request.
    let out = cnitool(&dirs, &["del", NET, &netns]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(call(&daemon.socket, "add", &att("intruder", &netns)).0, 200);
}

#[test]
fn a_rollback_keeps_off_an_interface_another_tool_attached_meanwhile() {
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let log = dirs.data.join("netns.log");
    // ADD of "loser" waits at the gate, then fails as the bridge plugin does
    // when the interface exists; every DEL logs the netns it was given.
    dirs.plugin(
        "eth",
        &format!(
            r#"cat >/dev/null
case "$CNI_COMMAND" in
ADD) if [ "$CNI_CONTAINERID" = loser ]; then
{wait}
echo '{{"cniVersion":"1.0.0","code":999,"msg":"container veth name provided (eth0) already exists"}}'; exit 1; fi
     echo '{{"cniVersion":"1.0.0"}}';;
DEL) echo "DEL $CNI_CONTAINERID netns=$CNI_NETNS" >> '{log}';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            wait = gate.shell_wait(),
            log = log.display()
        ),
    );
    dirs.conf(
        "10-claims.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "eth"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.netns("m1");
    let add = {
        let (socket, body) = (daemon.socket.clone(), att("loser", &netns));
        thread::spawn(move || call(&socket, "add", &body))
    };
    gate.wait_started_blocking(1);
    // cnitool attaches the same netns and ifname while cnid's ADD runs.
    let out = cnitool(&dirs, &["add", NET, &netns]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    gate.release();
    let (status, e) = add.join().unwrap();
    assert_eq!(status, 502, "{e}");
    let dels = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(dels, "DEL loser netns=\n", "the rollback entered the netns");
    assert!(
        daemon.log().contains("rolling back without the netns"),
        "{}",
        daemon.log()
    );
}
