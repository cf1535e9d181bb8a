//! Readiness tells the whole truth: a loaded network whose plugin binary
//! is gone is marked unusable in `/v1/networks`, in `cnitool networks`
//! and in the readiness reason, also while `--min-networks` is met (the
//! default network named as such); a conf dir that does not exist is said
//! to be missing; a list refused for the versions it asks for answers its
//! name with why.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cni_test_support::executable::copy_executable;
use serde_json::json;

use crate::support::daemon::{Daemon, Dirs, eventually, get, ready};
use crate::support::tool::CNITOOL;

fn networks(daemon: &Daemon) -> serde_json::Value {
    let r = get(&daemon.socket, "/v1/networks");
    assert_eq!(r.status, 200);
    r.json()
}

fn cnitool_networks(socket: &Path) -> String {
    let out = Command::new(&*CNITOOL)
        .env_remove("CNID_SOCKET")
        .args(["--socket", socket.to_str().unwrap(), "networks"])
        .stdin(Stdio::null())
        .output()
        .expect("run cnitool");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The reference bridge and loopback plugins, copied into the test's
/// plugin dir under names of their own (cnid also looks in /usr/lib/cni,
/// where the real names would still be found).
#[test]
fn a_default_network_whose_plugin_is_gone_is_flagged_while_min_networks_is_met() {
    let dirs = Dirs::new();
    let bridge = copy_executable(
        Path::new("/usr/lib/cni/bridge"),
        &dirs.bin.join("t-bridge"),
        0o755,
    );
    copy_executable(
        Path::new("/usr/lib/cni/loopback"),
        &dirs.bin.join("t-loopback"),
        0o755,
    );
    dirs.conf(
        "10-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "t-bridge", "bridge": "cniu0"}]}),
    );
    dirs.conf(
        "20-b.conflist",
        &json!({"cniVersion": "1.0.0", "name": "b", "plugins": [{"type": "t-loopback"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--min-networks", "1"]);
    eventually(Duration::from_secs(20), "ready", || ready(&daemon).0 == 200);
    let (_, body) = ready(&daemon);
    assert!(body.get("reason").is_none(), "{body}");
    assert!(networks(&daemon)["networks"][0].get("unusable").is_none());

    // The default network's plugin is removed: still ready (b is usable,
    // one is needed), but the reason, the listing and cnitool say so.
    std::fs::remove_file(&bridge).unwrap();
    eventually(
        Duration::from_secs(20),
        "the reason names the default network",
        || {
            let (status, body) = ready(&daemon);
            status == 200
                && body["reason"].as_str().is_some_and(|r| {
                    r.contains("network \"a\" (the default network)") && r.contains("t-bridge")
                })
        },
    );
    let nets = networks(&daemon);
    assert_eq!(nets["networks"][0]["name"], "a");
    assert!(
        nets["networks"][0]["unusable"]
            .as_str()
            .is_some_and(|r| r.contains("t-bridge")),
        "{nets}"
    );
    assert!(nets["networks"][1].get("unusable").is_none(), "{nets}");
    let one = get(&daemon.socket, "/v1/networks/a").json();
    assert!(
        one["unusable"]
            .as_str()
            .is_some_and(|r| r.contains("t-bridge")),
        "{one}"
    );
    let listed = cnitool_networks(&dirs.socket);
    assert!(listed.contains("a (default) (unusable)"), "{listed}");
    assert!(listed.contains("unusable: network \"a\": "), "{listed}");
    assert!(
        daemon.log().contains("network unusable"),
        "{}",
        daemon.log()
    );

    // Two needed: not ready, for the same reason.
    drop(daemon);
    let daemon = Daemon::start(&dirs, &["--min-networks", "2"]);
    eventually(Duration::from_secs(20), "not ready, naming a", || {
        let (status, body) = ready(&daemon);
        status == 503
            && body["reason"]
                .as_str()
                .is_some_and(|r| r.contains("t-bridge"))
    });

    // The binary is back: usable again.
    copy_executable(Path::new("/usr/lib/cni/bridge"), &bridge, 0o755);
    eventually(Duration::from_secs(20), "ready again", || {
        let (status, body) = ready(&daemon);
        status == 200 && body.get("reason").is_none()
    });
    assert!(networks(&daemon)["networks"][0].get("unusable").is_none());
}

#[test]
fn a_missing_conf_dir_is_reported_as_missing() {
    let dirs = Dirs::new();
    std::fs::remove_dir(&dirs.conf).unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    let (status, body) = ready(&daemon);
    assert_eq!(status, 503);
    assert_eq!(
        body["reason"].as_str().unwrap(),
        format!("the conf dir {} does not exist", dirs.conf.display())
    );
    assert_eq!(networks(&daemon)["confDirMissing"], true);
    let listed = cnitool_networks(&dirs.socket);
    assert_eq!(
        listed,
        format!("the conf dir {} does not exist\n", dirs.conf.display())
    );

    // Created: no longer missing, just empty.
    std::fs::create_dir(&dirs.conf).unwrap();
    eventually(Duration::from_secs(20), "the dir is seen", || {
        networks(&daemon).get("confDirMissing").is_none()
    });
    let (status, body) = ready(&daemon);
    assert_eq!(status, 503);
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("no network configuration in"),
        "{body}"
    );
}

#[test]
fn a_list_of_only_newer_versions_answers_its_name_with_why() {
    let dirs = Dirs::new();
    dirs.conf(
        "10-new.conflist",
        &json!({"cniVersions": ["2.0.0", "1.2.0"], "name": "newnet", "plugins": [{"type": "loopback"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let r = get(&daemon.socket, "/v1/networks/newnet");
    assert_eq!(r.status, 404);
    let msg = r.json()["msg"].as_str().unwrap().to_owned();
    assert!(
        msg.starts_with("network configuration with name \"newnet\"")
            && msg.contains("is not usable")
            && msg.contains("2.0.0, 1.2.0")
            && msg.contains("the highest supported is 1.1.0"),
        "{msg}"
    );
    // An operation on it says the same.
    let (status, body) = crate::support::daemon::call(
        &daemon.socket,
        "newnet",
        "add",
        &json!({"containerId": "c1", "netns": dirs.netns("c1"), "ifname": "eth0"}),
    );
    assert_eq!(status, 404, "{body}");
    assert!(
        body["msg"]
            .as_str()
            .unwrap()
            .contains("the highest supported is 1.1.0"),
        "{body}"
    );
}
