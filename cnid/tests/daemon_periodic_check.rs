//! The opt-in periodic CHECK (`cnid --check-every`): an attachment on the
//! real bridge + host-local chain whose address is removed behind cnid's
//! back is reported drifted (listing, metric, one log line), and again
//! fine once the address is back; nothing is repaired. A network with
//! `disableCheck` is never CHECKed, nor an attachment with an operation
//! running.

use crate::support::daemon::{Daemon, Dirs, del_gated_plugin, eventually_async, runs};
use crate::support::gate::Gate;
use crate::support::netns::TempNetns;
use crate::support::reaper::{LIMIT, chain, metric};
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "dpcheck";
const OFF: &str = "dpcheckoff";
const BUSY: &str = "dpcheckbusy";

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

async fn checks(client: &cnid::client::Client, outcome: &str) -> u64 {
    let m = client.metrics().await.unwrap();
    metric(
        &m,
        &format!("cnid_periodic_checks_total{{outcome=\"{outcome}\"}} "),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_reported_once_and_cleared_and_nothing_else_is_checked() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let _c = chain(&dirs, NET, &[]);
    let gate = Gate::new(dirs.root());
    let records = del_gated_plugin(&dirs, "held", &gate);
    dirs.conf(
        "20-off.conflist",
        &json!({"cniVersion": "1.0.0", "name": OFF, "disableCheck": true, "plugins": [{"type": "held"}]}),
    );
    dirs.conf(
        "30-busy.conflist",
        &json!({"cniVersion": "1.0.0", "name": BUSY, "plugins": [{"type": "held"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--check-every", "1s"]);
    let client = daemon.client().await;
    let (ns, ns_off, ns_busy) = (TempNetns::new(), TempNetns::new(), TempNetns::new());
    let req = AttachmentRequest::new("pc-real", ns.path(), "eth0");
    let res = client.add(NET, &req).await.expect("ADD");
    let ip = crate::support::shim::ipv4_of(&res);
    client
        .add(
            OFF,
            &AttachmentRequest::new("pc-off", ns_off.path(), "eth0"),
        )
        .await
        .expect("ADD off");
    let busy = AttachmentRequest::new("pc-busy", ns_busy.path(), "eth0");
    client.add(BUSY, &busy).await.expect("ADD busy");
    // The busy container's DEL is held in its plugin for the whole test.
    let socket = dirs.socket.clone();
    let held = tokio::spawn(async move {
        let client = cnid::client::Client::connect(&socket).await.unwrap();
        client.del(BUSY, &busy).await
    });
    gate.wait_started(1).await;
    let held_at = now_ns();

    eventually_async(LIMIT, "two passing periodic CHECKs", || async {
        checks(&client, "ok").await >= 2
    })
    .await;
    let att = client.attachments(Some("pc-real")).await.unwrap();
    assert_eq!(att[0].state, None, "{att:?}");

    // Drift: the address goes behind cnid's back.
    ns.exec("ip", &["addr", "del", &ip, "dev", "eth0"]);
    assert!(ns.ipv4_addrs("eth0").is_empty());
    eventually_async(LIMIT, "listed as drifted", || async {
        client.attachments(Some("pc-real")).await.unwrap()[0]
            .state
            .as_deref()
            == Some("drifted")
    })
    .await;
    let att = client.attachments(Some("pc-real")).await.unwrap();
    let error = att[0].check_error.clone().unwrap_or_default();
    assert!(error.contains("bridge"), "{att:?}");
    let m = client.metrics().await.unwrap();
    assert_eq!(metric(&m, "cnid_drifted_attachments "), 1, "{m}");
    // Nothing repaired; one log line however many rounds fail.
    let drift_seen = checks(&client, "drift").await;
    eventually_async(LIMIT, "two more failing rounds", || async {
        checks(&client, "drift").await >= drift_seen + 2
    })
    .await;
    assert!(ns.ipv4_addrs("eth0").is_empty(), "repaired");
    assert_eq!(daemon.log().matches("attachment drifted").count(), 1);

    // Back as it was: no longer drifted.
    ns.exec("ip", &["addr", "add", &ip, "dev", "eth0"]);
    eventually_async(LIMIT, "drift cleared", || async {
        client.attachments(Some("pc-real")).await.unwrap()[0]
            .state
            .is_none()
    })
    .await;
    assert!(daemon.log().contains("attachment no longer drifted"));
    let m = client.metrics().await.unwrap();
    assert_eq!(metric(&m, "cnid_drifted_attachments "), 0, "{m}");

    // Neither the disableCheck network, ever, nor the busy container
    // while its DEL ran, was CHECKed.
    let checked: Vec<_> = runs(&records)
        .into_iter()
        .filter(|r| r.command == "CHECK")
        .filter(|r| r.container == "pc-off" || r.start > held_at)
        .collect();
    assert!(checked.is_empty(), "{checked:?}");
    // Nor queued behind that DEL: only the DEL is there.
    let ops = client.operations(Some("pc-busy")).await.unwrap();
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(ops[0].verb, "DEL", "{ops:?}");
    gate.release();
    held.await.unwrap().expect("held DEL");
    client.del(NET, &req).await.expect("DEL");
}
