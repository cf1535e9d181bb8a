//! The errors of ADD, CHECK and DEL name the network, the interface and
//! the verb (`network "ctx" (ifname eth0) ADD: plugin p2 ADD failed ...`,
//! as the crate docs print them), say when a failed ADD left a DEL owed,
//! and keep the plugin's own error object; `MultiNetwork` names a network
//! once.

use crate::support::fake::{Fake, Response, Rig, conflist, runtime};
use cni_async::{CallOptions, Chain, Error, ErrorKind, MultiNetwork, NetworkRequest, Sandbox};
use cni_core::ErrorObject;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.0.2/24"}]}"#;
const REFUSAL: &str = r#"{"cniVersion":"1.0.0","code":11,"msg":"no leases","details":"pool full"}"#;

fn conf() -> serde_json::Value {
    json!({"cniVersion":"1.0.0","name":"ctx","plugins":[{"type":"p1"},{"type":"p2"}]})
}

/// p1 succeeds; p2 refuses ADD and CHECK with an error object, answers DEL.
fn rig() -> (Rig, cni_core::NetworkConfigList) {
    let rig = Rig::new();
    rig.fake(
        "p1",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    rig.fake(
        "p2",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::fail(1, REFUSAL, ""))
            .on("CHECK", Response::fail(1, REFUSAL, "")),
    );
    (rig, conflist(conf()))
}

const FAILED: &str = "plugin p2 ADD failed (exit status 1): no leases; pool full (CNI code 11)";

#[tokio::test]
async fn a_failed_add_names_its_network_and_says_a_del_is_owed() {
    let (rig, list) = rig();
    let cni = rig.cni();
    let rt = runtime("c1", "eth0");
    let e = cni.add_network_list(&list, &rt).await.unwrap_err();
    assert_eq!(
        Chain(&e).to_string(),
        format!(
            "network \"ctx\" (ifname eth0) ADD (not rolled back: what its plugins made, \
             such as an address, stays until this attachment is DELed): {FAILED}"
        )
    );
    assert!(e.del_owed());
    assert_eq!(e.kind(), ErrorKind::Plugin);
    assert_eq!(e.code(), 11);
    assert!(e.is_plugin_code(11));
    assert_eq!(e.failed_plugin(), Some(("p2", cni_core::Command::Add)));
    assert!(matches!(e.innermost(), Error::Plugin { .. }));
    // The error object is the plugin's, as it wrote it.
    assert_eq!(
        e.to_error_object("1.0.0"),
        ErrorObject::new("1.0.0", 11, "no leases", "pool full")
    );

    // With rollback the plugins were undone: nothing is owed.
    let rt = runtime("c2", "eth0");
    let e = cni
        .add_network_list(&list, &rt)
        .options(&CallOptions {
            rollback: true,
            ..CallOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        Chain(&e).to_string(),
        format!("network \"ctx\" (ifname eth0) ADD: {FAILED}")
    );
    assert!(!e.del_owed());
}

#[tokio::test]
async fn an_add_whose_first_plugin_never_started_owes_nothing() {
    let rig = Rig::new();
    let list = conflist(json!({"cniVersion":"1.0.0","name":"ctx",
                               "plugins":[{"type":"absent"}]}));
    let e = rig
        .cni()
        .add_network_list(&list, &runtime("c1", "eth0"))
        .await
        .unwrap_err();
    assert!(
        Chain(&e)
            .to_string()
            .starts_with("network \"ctx\" (ifname eth0) ADD: plugin \"absent\" not found in "),
        "{}",
        Chain(&e)
    );
    assert!(!e.del_owed());
    assert_eq!(e.kind(), ErrorKind::PluginNotFound);
}

#[tokio::test]
async fn check_and_del_name_their_network() {
    let (rig, list) = rig();
    let cni = rig.cni();
    let rt = runtime("c1", "eth0");
    let e = cni.check_network_list(&list, &rt).await.unwrap_err();
    assert_eq!(
        Chain(&e).to_string(),
        "network \"ctx\" (ifname eth0) CHECK: no cached ADD result for container \"c1\" \
         interface \"eth0\" on network \"ctx\""
    );
    assert_eq!(e.kind(), ErrorKind::NotAttached);
    assert!(!e.del_owed());

    rig.fake(
        "p1",
        &Fake::new(Response::fail(1, "", "cannot delete\n")).on("ADD", Response::ok(RESULT)),
    );
    let e = cni.del_network_list(&list, &rt).await.unwrap_err();
    assert_eq!(
        Chain(&e).to_string(),
        "network \"ctx\" (ifname eth0) DEL: plugin p1 DEL failed (exit status 1): cannot delete"
    );
}

/// MultiNetwork names the network itself; the operation's naming is not
/// repeated under it.
#[tokio::test]
async fn multi_network_names_the_network_once() {
    let (rig, _) = rig();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("10-ctx.conflist"),
        serde_json::to_vec(&conf()).unwrap(),
    )
    .unwrap();
    let networks = MultiNetwork::builder(rig.cni())
        .conf_dir(dir.path(), 1)
        .build()
        .unwrap();
    let sandbox = Sandbox::new("c1", "/proc/self/ns/net").with_network(NetworkRequest::new("ctx"));
    let e = networks.setup(&sandbox).await.unwrap_err();
    let text = Chain(&e).to_string();
    assert_eq!(text.matches("network \"ctx\"").count(), 1, "{text}");
    assert!(
        text.contains(&format!("network \"ctx\" (ifname eth0) ADD: {FAILED}")),
        "{text}"
    );
    assert!(!e.del_owed(), "rolled back: {text}");
}
