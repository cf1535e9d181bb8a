//! The netns rule every `Cni` applies, also with `CniBuilder::check_netns(false)`:
//! ADD and CHECK need a non-empty absolute netns and are refused before
//! any plugin runs (as cnid refuses them); DEL may pass none. The
//! namespace check itself, on by default, is in `ops_netns_check.rs`.

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.218.0.2/24"}]}"#;

fn rig() -> (Rig, cni_core::NetworkConfigList) {
    let rig = Rig::new();
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    let list = conflist(json!({"cniVersion":"1.0.0","name":"nsrule","plugins":[{"type":"p"}]}));
    (rig, list)
}

#[tokio::test]
async fn add_and_check_refuse_an_empty_or_relative_netns_by_default() {
    let (rig, list) = rig();
    let cni = rig.cni();
    for (netns, reason) in [
        ("", "required for ADD and CHECK"),
        ("nu-c2", "must be an absolute path"),
        ("run/netns/x", "must be an absolute path"),
        ("./x", "must be an absolute path"),
    ] {
        let rt = RuntimeConf::new("c1", netns, "eth0");
        let want = format!("invalid netns path {netns:?}: {reason}");
        let e = cni.add_network_list(&list, &rt).await.unwrap_err();
        assert_eq!(e.to_string(), want);
        assert_eq!(e.code(), 4);
        assert_eq!(e.kind(), cni_async::ErrorKind::InvalidInput);
        let e = cni.check_network_list(&list, &rt).await.unwrap_err();
        assert_eq!(e.to_string(), want);
        // The single-network verbs follow the same rule.
        let plugin = cni_core::PluginConfig::from_bytes(
            br#"{"cniVersion":"1.0.0","name":"nsrule1","type":"p"}"#,
            None,
        )
        .unwrap();
        let e = cni.add_network(&plugin, &rt).await.unwrap_err();
        assert_eq!(e.to_string(), want);
    }
    assert!(
        rig.dir.invocations().is_empty(),
        "no plugin ran: {:?}",
        rig.dir.invocations()
    );
    assert!(rig.result_files().is_empty());
}

#[tokio::test]
async fn del_may_pass_no_netns_or_a_gone_one() {
    let (rig, list) = rig();
    let cni = rig.cni();
    let rt = RuntimeConf::new("c1", "/run/netns/nsrule-made-up", "eth0");
    cni.add_network_list(&list, &rt).await.unwrap();
    cni.check_network_list(&list, &rt).await.unwrap();
    // The namespace is gone: DEL without one.
    cni.del_network_list(&list, &RuntimeConf::new("c1", "", "eth0"))
        .await
        .unwrap();
    // And with a relative or stale one: DEL does not look.
    cni.del_network_list(&list, &RuntimeConf::new("c1", "gone", "eth0"))
        .await
        .unwrap();
    let dels = rig
        .dir
        .invocations()
        .into_iter()
        .filter(|i| i.command() == "DEL")
        .count();
    assert_eq!(dels, 2);
}

#[tokio::test]
async fn the_netns_may_be_given_as_a_path() {
    let (rig, list) = rig();
    let cni = rig.cni();
    let path = std::path::PathBuf::from("/run/netns/nsrule-path");
    let rt = RuntimeConf::new("c1", &path, "eth0");
    cni.add_network_list(&list, &rt).await.unwrap();
    let add = rig
        .dir
        .invocations()
        .into_iter()
        .find(|i| i.command() == "ADD")
        .unwrap();
    assert_eq!(add.var("CNI_NETNS"), Some("/run/netns/nsrule-path"));
}
