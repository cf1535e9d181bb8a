//! The batch options cnitool's `batch up` is built on: container IDs derived
//! from the namespace paths, failed members released at once, and setup and
//! teardown that a caller can stop (a signal). Fake plugins; needs root (the
//! namespaces are real).
#![cfg(feature = "netns")]

use crate::support::fake::{Fake, Response, Rig, conflist};
use crate::support::gate::Gate;
use crate::support::netns::BatchNamespaces;
use crate::support::require_root;
use cni_async::batch::{BatchBuilder, TeardownEnd};
use cni_async::multi::MultiNetwork;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}"#;

fn derive(path: &str) -> String {
    format!("id-{}", path.rsplit('/').next().unwrap_or_default())
}

fn multi(rig: &Rig, plugin: &str) -> MultiNetwork {
    let list =
        conflist(json!({"cniVersion": "1.0.0", "name": "bo", "plugins": [{"type": plugin}]}));
    MultiNetwork::builder(rig.cni())
        .network_with_ifname(list, "eth3")
        .build()
        .expect("valid networks")
}

#[tokio::test]
async fn derived_ids_and_failed_members_released_at_once() {
    require_root!();
    let rig = Rig::new();
    // ADD fails in the namespaces with an odd number.
    let odd = r#"case "$CNI_NETNS" in *[13579]) echo '{"cniVersion":"1.0.0","code":100,"msg":"odd"}'; exit 1;; esac"#;
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT).with_shell(odd)),
    );
    let ns = BatchNamespaces::new("cnbo");
    let batch = BatchBuilder::new(multi(&rig, "p"))
        .prefix(&ns.0)
        .count(4)
        .concurrency(2)
        .container_ids(derive)
        .release_failed(true)
        .setup()
        .await
        .expect("setup");
    assert!(!batch.stopped());
    for m in batch.members() {
        assert_eq!(m.container_id(), derive(&m.path().display().to_string()));
        assert_eq!(m.is_attached(), m.index() % 2 == 0, "{m:?}");
        // Released: the failed ones have no namespace left.
        assert_eq!(m.netns().is_some(), m.is_attached(), "{m:?}");
    }
    assert_eq!(ns.existing(), [format!("{}0", ns.0), format!("{}2", ns.0)]);
    assert_eq!(batch.pending_teardown(), 2);
    // Every plugin run had the derived ID and the interface asked for.
    let runs = rig.dir.invocations();
    assert!(!runs.is_empty());
    for run in &runs {
        let netns = run.var("CNI_NETNS").unwrap_or_default();
        assert_eq!(run.var("CNI_CONTAINERID"), Some(derive(netns).as_str()));
        assert_eq!(run.var("CNI_IFNAME"), Some("eth3"));
    }
    let dels_before = runs.iter().filter(|r| r.command() == "DEL").count();

    assert_eq!(
        batch
            .teardown_until(std::future::pending())
            .await
            .expect("teardown"),
        TeardownEnd::Done
    );
    assert_eq!(ns.existing(), Vec::<String>::new());
    // Teardown DELs only the attached members: the released ones owe nothing.
    let dels: Vec<String> = rig
        .dir
        .invocations()
        .iter()
        .filter(|r| r.command() == "DEL")
        .skip(dels_before)
        .map(|r| r.var("CNI_CONTAINERID").unwrap_or_default().to_owned())
        .collect();
    let mut dels = dels;
    dels.sort();
    assert_eq!(dels, [format!("id-{}0", ns.0), format!("id-{}2", ns.0)]);
}

#[tokio::test]
async fn a_stopped_setup_returns_what_it_set_up_and_a_stopped_teardown_leaves_it() {
    require_root!();
    let rig = Rig::new();
    let gate = Gate::new(rig.dir.root());
    rig.fake(
        "slow",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT).with_shell(&gate.shell_wait())),
    );
    let ns = BatchNamespaces::new("cnbo");
    // Stops once two ADDs (the concurrency) hold at the gate.
    let batch = BatchBuilder::new(multi(&rig, "slow"))
        .prefix(&ns.0)
        .count(4)
        .concurrency(2)
        .setup_until(gate.wait_started(2))
        .await
        .expect("setup");
    assert!(batch.stopped());
    assert_eq!(batch.counts().attached, 0);
    // The two in flight were killed; their namespaces and DELs are owed.
    assert_eq!(batch.pending_teardown(), 2);
    let held = ns.existing();
    assert_eq!(held.len(), 2, "{held:?}");

    // Stopped before it could finish: everything is left in place.
    match batch.teardown_until(std::future::ready(())).await {
        Ok(TeardownEnd::Stopped { mut left }) => {
            left.sort();
            assert_eq!(left, held);
        }
        other => panic!("teardown: {other:?}"),
    }
    assert_eq!(ns.existing(), held, "left in place");
}
