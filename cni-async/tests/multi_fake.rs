//! The multi-network API against fake plugins (no namespaces, no root):
//! what each plugin receives (capability args, labels, interface names), how
//! results are aggregated, and how errors of several networks are reported.

use crate::support::fake::{Fake, PluginDir, Response};
use cni_async::multi::{MultiNetwork, Sandbox, SetupMode};
use cni_async::{Cni, Error};
use cni_core::NetworkConfigList;
use cni_core::caps::{Capabilities, PortMapping};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

fn list(value: Value) -> NetworkConfigList {
    NetworkConfigList::from_value(&value).expect("valid list")
}

fn cni(dir: &PluginDir, cache: &tempfile::TempDir) -> Cni {
    Cni::builder()
        .plugin_dirs(dir.dirs())
        // Fake plugins, stand-in netns paths: no namespace check.
        .check_netns(false)
        .cache_dir(cache.path())
        .build()
}

fn result_for(ifname: &str, address: &str) -> String {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": ifname, "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/fake"}],
        "ips": [{"interface": 0, "address": address}]
    })
    .to_string()
}

#[tokio::test]
async fn port_mappings_reach_the_plugin_that_declares_them_exactly() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake(
        "main",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("eth0", "10.99.0.2/24"))),
    );
    dir.fake(
        "pm",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("eth0", "10.99.0.2/24"))),
    );
    // The portmap plugin echoes its prevResult; our fake returns the same.
    let net = list(json!({
        "cniVersion": "1.0.0",
        "name": "pmnet",
        "plugins": [
            {"type": "main"},
            {"type": "pm", "capabilities": {"portMappings": true, "bandwidth": false}}
        ]
    }));
    let multi = MultiNetwork::builder(cni(&dir, &cache))
        .network(net)
        .build()
        .unwrap();
    let sandbox = Sandbox::new("c-pm", "/run/netns/fake")
        .with_label("K8S_POD_NAME", "web")
        .with_capabilities(
            Capabilities::new()
                .port_mappings([
                    PortMapping::tcp(8080, 80),
                    PortMapping::udp(5353, 53).with_host_ip("127.0.0.1".parse().unwrap()),
                ])
                .bandwidth(cni_core::caps::Bandwidth::symmetric(1000, 100)),
        );
    let result = multi.setup(&sandbox).await.expect("setup");
    assert_eq!(
        result.addresses("eth0"),
        vec!["10.99.0.2/24".parse().unwrap()]
    );

    let calls = dir.invocations();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    let main = calls.iter().find(|c| c.plugin == "main").unwrap();
    let pm = calls.iter().find(|c| c.plugin == "pm").unwrap();
    // Exactly the capabilities the plugin declares `true`, with the
    // conventional field names.
    assert_eq!(
        pm.stdin_json()["runtimeConfig"],
        json!({"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}
        ]})
    );
    assert_eq!(main.stdin_json().get("runtimeConfig"), None);
    for call in [main, pm] {
        assert_eq!(
            call.var("CNI_ARGS"),
            Some("IgnoreUnknown=1;K8S_POD_NAME=web")
        );
        assert_eq!(call.var("CNI_IFNAME"), Some("eth0"));
        assert_eq!(call.var("CNI_CONTAINERID"), Some("c-pm"));
        assert_eq!(call.var("CNI_NETNS"), Some("/run/netns/fake"));
    }
    multi.remove(&sandbox).await.expect("remove");
}

#[tokio::test]
async fn networks_get_their_own_ifnames_and_results_are_keyed_by_them() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    // One fake serves both networks and answers with the ifname it got.
    dir.script(
        "echoif",
        r#"case "$CNI_COMMAND" in
ADD) cat >/dev/null
     case "$CNI_IFNAME" in eth0) a=10.98.0.2/24 ;; *) a=10.97.0.2/24 ;; esac
     printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","sandbox":"%s"}],"ips":[{"interface":0,"address":"%s"}]}' "$CNI_IFNAME" "$CNI_NETNS" "$a" ;;
*) cat >/dev/null ;;
esac"#,
    );
    let mk = |name: &str| {
        list(json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "echoif"}]}))
    };
    for mode in [SetupMode::Serial, SetupMode::Parallel] {
        let multi = MultiNetwork::builder(cni(&dir, &cache))
            .network(mk("first"))
            .network(mk("second"))
            .mode(mode)
            .build()
            .unwrap();
        let sandbox = Sandbox::new(format!("c-{mode:?}"), "/run/netns/fake");
        let result = multi.setup(&sandbox).await.expect("setup");
        assert_eq!(
            result.interfaces.keys().collect::<Vec<_>>(),
            vec!["eth0", "eth1"]
        );
        assert_eq!(
            result.addresses("eth0"),
            vec!["10.98.0.2/24".parse().unwrap()]
        );
        assert_eq!(
            result.addresses("eth1"),
            vec!["10.97.0.2/24".parse().unwrap()]
        );
        assert_eq!(
            result.interface("eth1").unwrap().sandbox.as_deref(),
            Some("/run/netns/fake")
        );
        assert_eq!(
            result
                .networks
                .iter()
                .map(|n| (n.network.as_str(), n.ifname.as_str()))
                .collect::<Vec<_>>(),
            vec![("first", "eth0"), ("second", "eth1")]
        );
        multi.check(&sandbox).await.expect("check");
        multi.remove(&sandbox).await.expect("remove");
        // CHECK after remove: no cached result, refused for both networks.
        match multi.check(&sandbox).await {
            Err(Error::Multiple { errors, .. }) => {
                assert_eq!(errors.len(), 2, "{errors:?}");
                assert!(
                    errors[0]
                        .to_string()
                        .contains("network \"first\" (ifname eth0) CHECK")
                );
                assert!(
                    errors[1]
                        .to_string()
                        .contains("network \"second\" (ifname eth1) CHECK")
                );
                assert_eq!(errors[0].code(), 3);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn remove_goes_on_past_errors_in_reverse_order_and_reports_them_all() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake(
        "okp",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("eth0", "10.96.0.2/24"))),
    );
    dir.fake(
        "delfails",
        &Fake::new(Response::cni_error(11, "busy", "try later"))
            .on("ADD", Response::ok(&result_for("eth1", "10.95.0.2/24"))),
    );
    let multi = MultiNetwork::builder(cni(&dir, &cache))
        .network(list(
            json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "okp"}]}),
        ))
        .network(list(
            json!({"cniVersion": "1.0.0", "name": "b", "plugins": [{"type": "delfails"}]}),
        ))
        .build()
        .unwrap();
    let sandbox = Sandbox::new("c-rm", "/run/netns/fake");
    multi.setup(&sandbox).await.expect("setup");
    let e = multi.remove(&sandbox).await.unwrap_err();
    let Error::Multiple { errors, operation } = &e else {
        panic!("{e:?}")
    };
    assert!(operation.contains("c-rm"), "{operation}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .to_string()
            .contains("network \"b\" (ifname eth1) DEL"),
        "{e}"
    );
    assert_eq!(e.code(), 11);
    let dels: Vec<String> = dir
        .invocations()
        .into_iter()
        .filter(|c| c.var("CNI_COMMAND") == Some("DEL"))
        .map(|c| c.plugin)
        .collect();
    // Last network first, and the first one still ran after the failure.
    assert_eq!(dels, vec!["delfails", "okp"]);
}

#[tokio::test]
async fn status_reports_every_network_that_is_not_ready_with_its_code() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake(
        "notready",
        &Fake::new(Response::ok("")).on("STATUS", Response::cni_error(50, "no IPs left", "")),
    );
    dir.fake("ready", &Fake::new(Response::ok("")));
    let multi = MultiNetwork::builder(cni(&dir, &cache))
        .network(list(
            json!({"cniVersion": "1.1.0", "name": "up", "plugins": [{"type": "ready"}]}),
        ))
        .network(list(
            json!({"cniVersion": "1.1.0", "name": "down", "plugins": [{"type": "notready"}]}),
        ))
        .build()
        .unwrap();
    let e = multi.status().await.unwrap_err();
    assert_eq!(e.code(), 50);
    let text = cni_async::Chain(&e).to_string();
    assert!(
        text.contains("network \"down\" (ifname eth1) STATUS"),
        "{text}"
    );
    assert!(text.contains("no IPs left"), "{text}");
    assert!(!text.contains("\"up\""), "{text}");
    let statuses = dir
        .invocations()
        .into_iter()
        .filter(|c| c.var("CNI_COMMAND") == Some("STATUS"))
        .count();
    assert_eq!(statuses, 2);
}

#[tokio::test]
async fn setup_refuses_bad_labels_before_running_anything() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake("never", &Fake::new(Response::ok("")));
    let multi = MultiNetwork::builder(cni(&dir, &cache))
        .network(list(
            json!({"cniVersion": "1.0.0", "name": "a", "plugins": [{"type": "never"}]}),
        ))
        .build()
        .unwrap();
    let sandbox = Sandbox::new("c1", "/run/netns/fake").with_label("app", "a;b=c");
    let e = multi.setup(&sandbox).await.unwrap_err();
    assert!(e.to_string().contains("invalid CNI_ARGS pair"), "{e}");
    assert_eq!(e.code(), 4);
    assert!(dir.invocations().is_empty());
}

/// Defect: `gc([])` (no container lives) did not compile (E0283:
/// the element type of `[]` cannot be inferred); `LiveContainers` takes it,
/// and the collections a runtime has.
#[tokio::test]
async fn gc_takes_an_empty_array_and_the_collections_a_runtime_has() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake(
        "main",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("eth0", "10.96.0.2/24"))),
    );
    let cni = cni(&dir, &cache);
    let multi = MultiNetwork::builder(cni.clone())
        .network(list(
            json!({"cniVersion": "1.0.0", "name": "gcnet", "plugins": [{"type": "main"}]}),
        ))
        .build()
        .unwrap();
    let attached = || async {
        let mut ids: Vec<String> = cni
            .cached_attachments(None)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.container_id)
            .collect();
        ids.sort();
        ids
    };
    for id in ["c1", "c2", "c3"] {
        multi
            .setup(&Sandbox::new(id, "/run/netns/fake"))
            .await
            .expect("setup");
    }
    let live: Vec<String> = vec!["c1".into(), "c2".into()];
    multi.gc(&live).await.expect("gc of a &Vec<String>");
    assert_eq!(attached().await, ["c1", "c2"]);
    multi.gc(["c1"]).await.expect("gc of an array");
    assert_eq!(attached().await, ["c1"]);
    let summaries = multi.gc([]).await.expect("gc of []");
    assert_eq!(summaries.len(), 1);
    assert!(attached().await.is_empty());
}
