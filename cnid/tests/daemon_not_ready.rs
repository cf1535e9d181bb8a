//! Regression: with `--plugin-dir` missing, cnid logged
//! `cnid ready` at info with no warning while `/v1/health/ready` answered
//! 503, and an ADD answered 500 (`kind=Internal`). Now it warns about the
//! missing plugin dir, logs "serving, not ready" with the reason, and a
//! plugin that is not installed is answered as the node not being ready
//! for the network (503, code 7), not as cnid's own failure.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, get, post};
use serde_json::json;

#[test]
fn a_missing_plugin_dir_is_warned_about_and_cnid_does_not_say_ready() {
    let dirs = Dirs::new();
    dirs.recording_network("10-net.conflist", "net", "1.0.0");
    std::fs::remove_dir_all(&dirs.bin).unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    eventually(Duration::from_secs(30), "the start's last line", || {
        daemon.log().contains("cnid serving, not ready") || daemon.log().contains("cnid ready")
    });
    let log = daemon.log();
    assert!(!log.contains("cnid ready"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("cnid serving, not ready"))
        .unwrap();
    assert!(line.contains("WARN") && line.contains("rec"), "{line}");
    let warned = log
        .lines()
        .find(|l| l.contains("plugin dir does not exist"))
        .unwrap_or_else(|| panic!("no warning about the plugin dir:\n{log}"));
    assert!(
        warned.contains("WARN") && warned.contains(&dirs.bin.display().to_string()),
        "{warned}"
    );
    assert_eq!(get(&daemon.socket, "/v1/health/ready").status, 503);

    let body = json!({"containerId": "c1", "netns": dirs.netns("c1"), "ifname": "eth0"});
    let answer = post(&daemon.socket, "/v1/networks/net/add", &body.to_string());
    assert_eq!(
        answer.status,
        503,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let e = answer.json();
    assert_eq!(e["code"], 7, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("not found"), "{e}");

    // The plugin arrives: the next probe says ready, and the log says so.
    std::fs::create_dir(&dirs.bin).unwrap();
    dirs.recording_network("10-net.conflist", "net", "1.0.0");
    eventually(Duration::from_secs(10), "ready", || {
        get(&daemon.socket, "/v1/health/ready").status == 200
    });
    assert!(daemon.log().contains("cnid is ready"), "{}", daemon.log());
}
