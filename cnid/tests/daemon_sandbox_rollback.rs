//! A sandbox ADD through cnid runs the library's one orchestration
//! (`cni_async::multi::setup_steps`): when a network fails and its own
//! rollback fails too, the network is DELed again with the others, as
//! `MultiNetwork::setup` does, so nothing is left (no cache record, no
//! intent) once that DEL works; and the undo of a sandbox ADD forced onto
//! another sandbox's netns leaves that sandbox's interface alone (DEL
//! without the netns). Fake plugins only.

use crate::support::daemon::{Daemon, Dirs};
use cnid::api::{SandboxNetwork, SandboxRequest};
use serde_json::json;

const OK_NET: &str = "sbrok";
const FLAKY_NET: &str = "sbrflaky";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_whose_own_rollback_failed_is_deleted_again() {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-ok.conflist", OK_NET, "1.0.0");
    // ADD always fails; the first DEL (the ADD's own rollback) fails, every
    // later one works. Each call is logged.
    let log = dirs.data.join("flaky.log");
    let marker = dirs.data.join("flaky.deleted-once");
    dirs.plugin(
        "flaky",
        &format!(
            r#"cat > /dev/null
echo "$CNI_COMMAND" >> "{log}"
case "$CNI_COMMAND" in
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
ADD) echo '{{"cniVersion":"1.0.0","code":100,"msg":"refused on purpose"}}'; exit 1;;
DEL) if [ -e "{marker}" ]; then exit 0; fi
     : > "{marker}"
     echo '{{"cniVersion":"1.0.0","code":101,"msg":"first DEL fails"}}'; exit 1;;
esac
exit 0"#,
            log = log.display(),
            marker = marker.display()
        ),
    );
    dirs.conf(
        "20-flaky.conflist",
        &json!({"cniVersion": "1.0.0", "name": FLAKY_NET, "plugins": [{"type": "flaky"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let request = SandboxRequest {
        container_id: "sb-drift".into(),
        netns: dirs.netns("sb-drift"),
        networks: vec![SandboxNetwork::new(OK_NET), SandboxNetwork::new(FLAKY_NET)],
        ..Default::default()
    };
    let err = client.sandbox_add(&request).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(FLAKY_NET) && text.contains("refused on purpose"),
        "{text}"
    );
    assert!(text.contains("deleted again"), "{text}");
    // The failing network: its ADD, its own rollback (failed), then the
    // orchestration's DEL of it.
    let calls: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| *l != "VERSION")
        .map(str::to_owned)
        .collect();
    assert_eq!(calls, ["ADD", "DEL", "DEL"]);
    // The network set up before it was deleted again.
    let ok: Vec<String> = crate::support::daemon::runs(&records)
        .into_iter()
        .filter(|r| r.container == "sb-drift")
        .map(|r| r.command)
        .collect();
    assert_eq!(ok, ["ADD", "DEL"]);
    assert!(dirs.cached().is_empty(), "cache: {:?}", dirs.cached());
    assert!(dirs.intents().is_empty(), "intents: {:?}", dirs.intents());
}

/// A sandbox ADD forced onto the netns of another attached sandbox: its
/// first network is set up (the plugin succeeds there), the second fails,
/// and the undo of the first runs without the netns, so that the other
/// sandbox's interface is left alone. The plugins log `CNI_NETNS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_sandbox_add_that_fails_undoes_its_networks_without_the_netns() {
    let dirs = Dirs::new();
    let log = dirs.data.join("nslog.log");
    dirs.plugin(
        "nslog",
        &format!(
            r#"cat > /dev/null
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME netns=$CNI_NETNS" >> "{log}"
case "$CNI_COMMAND" in
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
ADD) if [ "$CNI_IFNAME" = eth1 ]; then
       echo '{{"cniVersion":"1.0.0","code":100,"msg":"refused on purpose"}}'; exit 1
     fi
     printf '{{"cniVersion":"1.0.0","interfaces":[{{"name":"%s","sandbox":"%s"}}]}}' "$CNI_IFNAME" "$CNI_NETNS";;
esac
exit 0"#,
            log = log.display(),
        ),
    );
    dirs.conf(
        "10-first.conflist",
        &json!({"cniVersion": "1.0.0", "name": "nsfirst", "plugins": [{"type": "nslog"}]}),
    );
    dirs.conf(
        "20-second.conflist",
        &json!({"cniVersion": "1.0.0", "name": "nssecond", "plugins": [{"type": "nslog"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let netns = dirs.netns("shared");
    let first = SandboxRequest {
        container_id: "sb-first".into(),
        netns: netns.clone(),
        networks: vec![SandboxNetwork::new("nsfirst")],
        ..Default::default()
    };
    client.sandbox_add(&first).await.expect("first sandbox");
    let forced = SandboxRequest {
        container_id: "sb-forced".into(),
        netns: netns.clone(),
        networks: vec![
            SandboxNetwork::new("nsfirst"),
            SandboxNetwork::new("nssecond"),
        ],
        force: true,
        ..Default::default()
    };
    let err = client.sandbox_add(&forced).await.unwrap_err();
    assert!(err.to_string().contains("refused on purpose"), "{err}");

    let calls: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("VERSION"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        calls,
        [
            format!("ADD sb-first eth0 netns={netns}"),
            format!("ADD sb-forced eth0 netns={netns}"),
            format!("ADD sb-forced eth1 netns={netns}"),
            // The failed chain's own rollback: eth1 is nobody else's.
            format!("DEL sb-forced eth1 netns={netns}"),
            // The undo of eth0, which is sb-first's in that netns.
            "DEL sb-forced eth0 netns=".to_owned(),
        ]
    );
    assert_eq!(dirs.cached(), ["nsfirst-sb-first-eth0"]);
}
