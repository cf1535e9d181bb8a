//! Live and ready: `GET /v1/health` answers 200 while cnid serves and says
//! whether it is ready; `GET /v1/health/ready` answers 503 with the reason
//! until at least `--min-networks` networks are loaded whose plugins answer
//! VERSION, then 200. Nothing usable loaded is a WARN in the log.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, get, ready};
use serde_json::json;

const VERSION_OK: &str = r#"case "$CNI_COMMAND" in VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}';; esac"#;

#[test]
fn not_ready_until_a_network_whose_plugins_answer_is_loaded() {
    let dirs = Dirs::new();
    let daemon = Daemon::start(&dirs, &[]);
    // Live, not ready: the conf dir is empty.
    let live = get(&daemon.socket, "/v1/health");
    assert_eq!(live.status, 200);
    assert!(
        live.json().get("ready").is_none(),
        "liveness runs no plugin"
    );
    let (status, body) = ready(&daemon);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("no network configuration in"),
        "{body}"
    );
    assert!(
        daemon.log().contains("no usable network configuration"),
        "{}",
        daemon.log()
    );

    // A network whose plugin is not installed: still not ready, and why.
    dirs.conf(
        "10-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "pa"}]}),
    );
    eventually(
        Duration::from_secs(20),
        "the reason names the missing plugin",
        || {
            let (status, body) = ready(&daemon);
            status == 503 && body["reason"].as_str().is_some_and(|r| r.contains("pa"))
        },
    );
    // The plugin appears: ready (a not-ready answer is recomputed within
    // a second, no reload needed).
    dirs.plugin("pa", VERSION_OK);
    eventually(Duration::from_secs(20), "ready", || ready(&daemon).0 == 200);
    let (_, body) = ready(&daemon);
    assert_eq!(body["ready"], true);
    assert!(body.get("reason").is_none(), "{body}");
}

#[test]
fn min_networks_counts_usable_networks() {
    let dirs = Dirs::new();
    dirs.plugin("pa", VERSION_OK);
    dirs.conf(
        "10-a.conflist",
        &json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "pa"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--min-networks", "2"]);
    let (status, body) = ready(&daemon);
    assert_eq!(status, 503, "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("1 usable"),
        "{body}"
    );
    dirs.conf(
        "20-b.conflist",
        &json!({"cniVersion": "1.0.0", "name": "b", "plugins": [{"type": "pa"}]}),
    );
    eventually(Duration::from_secs(20), "ready with two networks", || {
        ready(&daemon).0 == 200
    });
}
