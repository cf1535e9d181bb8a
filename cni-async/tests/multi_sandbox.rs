//! The runtime model of the multi-network API against fake plugins: a
//! sandbox that names a subset of the networks with options of its own
//! (ocicni's `PodNetwork`, Podman's per-network settings), pod labels as
//! containerd passes them, STATUS of a sandbox's networks, and GC for a node
//! that never races an ADD on the same network.

use std::path::Path;
use std::time::Duration;

use crate::support::fake::{Fake, PluginDir, Response, sh_quote};
use cni_async::multi::{KubernetesPod, MultiNetwork, NetworkRequest, Sandbox};
use cni_async::{Cni, Error};
use cni_core::NetworkConfigList;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const NETNS: &str = "/run/netns/fake";

fn list(value: Value) -> NetworkConfigList {
    NetworkConfigList::from_value(&value).expect("valid list")
}

fn cni(dir: &PluginDir, cache: &Path) -> Cni {
    Cni::builder()
        .plugin_dirs(dir.dirs())
        // Fake plugins, stand-in netns paths: no namespace check.
        .check_netns(false)
        .cache_dir(cache)
        .build()
}

fn result_for(address: &str) -> String {
    json!({"cniVersion": "1.0.0", "ips": [{"address": address}]}).to_string()
}

/// A one-plugin network whose plugin declares the `ips` and `mac` capabilities.
fn net(name: &str, plugin: &str, version: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": name,
        "plugins": [{"type": plugin, "capabilities": {"ips": true, "mac": true}}]
    })
}

fn write_conf(dir: &Path, file: &str, value: &Value) {
    std::fs::write(dir.join(file), value.to_string()).unwrap();
}

#[tokio::test]
async fn each_requested_network_gets_its_own_ifname_args_and_capabilities() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake(
        "pa",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.1.0.2/24"))),
    );
    dir.fake(
        "pb",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.2.0.2/24"))),
    );
    dir.fake(
        "lo",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("127.0.0.1/8"))),
    );
    let multi = MultiNetwork::builder(cni(&dir, cache.path()))
        .network_with_ifname(
            list(
                json!({"cniVersion": "1.0.0", "name": "cni-loopback", "plugins": [{"type": "lo"}]}),
            ),
            "lo",
        )
        .network(list(net("neta", "pa", "1.0.0")))
        .network(list(net("netb", "pb", "1.0.0")))
        .build()
        .unwrap();
    let pod = KubernetesPod {
        namespace: "default".into(),
        name: "web".into(),
        infra_container_id: "abc123".into(),
        uid: "0000-1111".into(),
    };
    // netb first and explicitly net1; neta generated: eth0 (net1 is taken).
    let sandbox = Sandbox::new("pod-1", NETNS)
        .with_kubernetes_pod(&pod)
        .with_capabilities(
            json!({"mac": "02:00:00:00:00:aa"})
                .as_object()
                .cloned()
                .map(cni_core::CapabilityArgs)
                .unwrap(),
        )
        .with_network(
            NetworkRequest::new("netb")
                .with_ifname("net1")
                .with_arg("K8S_POD_NAME", "web-b")
                .with_arg("EXTRA", "1")
                .with_capabilities(
                    json!({"ips": ["10.2.0.50/24"], "mac": "02:00:00:00:00:bb"})
                        .as_object()
                        .cloned()
                        .map(cni_core::CapabilityArgs)
                        .unwrap(),
                ),
        )
        .with_network(NetworkRequest::new("neta"));
    let result = multi.setup(&sandbox).await.expect("setup");
    let ifnames: Vec<(&str, &str)> = result
        .networks
        .iter()
        .map(|n| (n.network.as_str(), n.ifname.as_str()))
        .collect();
    assert_eq!(
        ifnames,
        [("cni-loopback", "lo"), ("netb", "net1"), ("neta", "eth0")]
    );
    assert_eq!(
        result.addresses("net1"),
        vec!["10.2.0.2/24".parse().unwrap()]
    );

    let calls = dir.invocations();
    let by = |plugin: &str| calls.iter().find(|c| c.plugin == plugin).unwrap().clone();
    let (a, b) = (by("pa"), by("pb"));
    // containerd's pod labels, IgnoreUnknown in front; the request's own
    // pairs replace or follow them for its network only.
    assert_eq!(
        a.var("CNI_ARGS"),
        Some(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=0000-1111"
        )
    );
    assert_eq!(
        b.var("CNI_ARGS"),
        Some(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-b;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=0000-1111;EXTRA=1"
        )
    );
    assert_eq!(a.var("CNI_IFNAME"), Some("eth0"));
    assert_eq!(b.var("CNI_IFNAME"), Some("net1"));
    assert_eq!(
        a.stdin_json()["runtimeConfig"],
        json!({"mac": "02:00:00:00:00:aa"})
    );
    assert_eq!(
        b.stdin_json()["runtimeConfig"],
        json!({"mac": "02:00:00:00:00:bb", "ips": ["10.2.0.50/24"]})
    );

    // Remove and CHECK use the same plan: DEL last to first.
    multi.check(&sandbox).await.expect("check");
    multi.remove(&sandbox).await.expect("remove");
    let dels: Vec<(String, String)> = dir
        .invocations()
        .iter()
        .filter(|c| c.var("CNI_COMMAND") == Some("DEL"))
        .map(|c| (c.plugin.clone(), c.var("CNI_IFNAME").unwrap().to_owned()))
        .collect();
    assert_eq!(
        dels,
        [
            ("pa".into(), "eth0".into()),
            ("pb".into(), "net1".into()),
            ("lo".into(), "lo".into())
        ]
    );
    assert!(
        multi
            .cni()
            .cached_attachments(None)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn a_sandbox_naming_no_network_gets_the_default_and_may_name_the_others() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    let confs = tempfile::tempdir().unwrap();
    dir.fake(
        "pa",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.1.0.2/24"))),
    );
    dir.fake(
        "pb",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.2.0.2/24"))),
    );
    write_conf(confs.path(), "10-a.conflist", &net("neta", "pa", "1.0.0"));
    write_conf(confs.path(), "20-b.conflist", &net("netb", "pb", "1.0.0"));
    // The default network only; the second is available by name.
    let multi = MultiNetwork::builder(cni(&dir, cache.path()))
        .conf_dir(confs.path(), 1)
        .build()
        .unwrap();
    assert_eq!(multi.networks().len(), 1);
    assert_eq!(multi.find("netb").map(|n| n.name()), Some("netb"));

    let plain = Sandbox::new("c-default", NETNS);
    let r = multi.setup(&plain).await.expect("setup default");
    assert_eq!(r.networks.len(), 1);
    assert_eq!(
        (
            r.networks[0].network.as_str(),
            r.networks[0].ifname.as_str()
        ),
        ("neta", "eth0")
    );

    let named = Sandbox::new("c-named", NETNS).with_network(NetworkRequest::new("netb"));
    let r = multi.setup(&named).await.expect("setup named");
    assert_eq!(r.networks.len(), 1);
    assert_eq!(
        (
            r.networks[0].network.as_str(),
            r.networks[0].ifname.as_str()
        ),
        ("netb", "eth0")
    );

    // An unknown network is refused, naming it, before any plugin runs.
    let before = dir.invocations().len();
    let bad = Sandbox::new("c-bad", NETNS)
        .with_network(NetworkRequest::new("neta"))
        .with_network(NetworkRequest::new("nope"));
    let e = multi.setup(&bad).await.unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
    assert_eq!(dir.invocations().len(), before, "nothing ran");
    // Two requests with the same interface name are refused too.
    let twice = Sandbox::new("c-twice", NETNS)
        .with_network(NetworkRequest::new("neta").with_ifname("eth3"))
        .with_network(NetworkRequest::new("netb").with_ifname("eth3"));
    let e = multi.setup(&twice).await.unwrap_err();
    assert!(e.to_string().contains("eth3"), "{e}");
    assert_eq!(dir.invocations().len(), before, "nothing ran");

    multi.remove(&plain).await.unwrap();
    multi.remove(&named).await.unwrap();
    assert!(
        multi
            .cni()
            .cached_attachments(None)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn status_of_a_sandbox_is_ready_iff_all_its_networks_are() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    dir.fake("pa", &Fake::new(Response::ok("")));
    dir.fake(
        "pb",
        &Fake::new(Response::ok("")).on(
            "STATUS",
            Response::cni_error(50, "no IPs left", "pool empty"),
        ),
    );
    let multi = MultiNetwork::builder(cni(&dir, cache.path()))
        .network(list(net("neta", "pa", "1.1.0")))
        .network(list(net("netb", "pb", "1.1.0")))
        .build()
        .unwrap();
    let only_a = Sandbox::new("c1", NETNS).with_network(NetworkRequest::new("neta"));
    multi.status_of(&only_a).await.expect("neta is ready");
    let with_b = Sandbox::new("c1", NETNS)
        .with_network(NetworkRequest::new("neta"))
        .with_network(NetworkRequest::new("netb"));
    let e = multi.status_of(&with_b).await.unwrap_err();
    assert_eq!(e.code(), 50, "{e}");
    let text = cni_async::Chain(&e).to_string();
    assert!(
        text.contains("netb") && text.contains("no IPs left"),
        "{text}"
    );
    // The default set holds both: not ready either.
    assert_eq!(multi.status().await.unwrap_err().code(), 50);
    let statuses = dir
        .invocations()
        .iter()
        .filter(|c| c.var("CNI_COMMAND") == Some("STATUS"))
        .count();
    assert_eq!(statuses, 1 + 2 + 2);
}

/// GC for a node waits for an ADD running on the same network, so the ADD's
/// attachment is among the valid ones the plugins are told about (a GC that
/// read the cache mid-ADD would tell IPAM to free the new container's IP).
#[tokio::test]
async fn node_gc_deletes_dead_containers_and_never_races_an_add() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    let gate = dir.scratch("gate");
    std::fs::create_dir_all(&gate).unwrap();
    let (started, release) = (gate.join("started"), gate.join("release"));
    // The ADD of container "slow" blocks until the test releases it.
    let hold = format!(
        "if [ \"$CNI_CONTAINERID\" = slow ]; then : > {s}; while [ ! -e {r} ]; do sleep 0.01; done; fi",
        s = sh_quote(&started.to_string_lossy()),
        r = sh_quote(&release.to_string_lossy()),
    );
    dir.fake(
        "p",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(&result_for("10.1.0.2/24")).with_shell(&hold),
        ),
    );
    let multi = MultiNetwork::builder(cni(&dir, cache.path()))
        .network(list(net("gcnet", "p", "1.1.0")))
        .build()
        .unwrap();
    for c in ["live", "dead1", "dead2"] {
        multi.setup(&Sandbox::new(c, NETNS)).await.expect("setup");
    }

    let slow = {
        let multi = multi.clone();
        tokio::spawn(async move { multi.setup(&Sandbox::new("slow", NETNS)).await })
    };
    // The ADD is running (its plugin said so) when GC starts.
    let waited = std::time::Instant::now();
    while !started.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the slow ADD never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut gc = {
        let multi = multi.clone();
        tokio::spawn(async move { multi.gc(["live", "slow"]).await })
    };
    // GC cannot finish while the ADD on its network runs. (A window, not an
    // order: on a slow machine it can only make this check pass vacuously;
    // the valid-attachments check below still catches a racing GC.)
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut gc)
            .await
            .is_err(),
        "GC finished while an ADD on its network was running"
    );
    std::fs::write(&release, b"").unwrap();
    slow.await.unwrap().expect("slow ADD");
    let summaries = gc.await.unwrap().expect("gc");
    assert_eq!(summaries.len(), 1);
    let mut deleted: Vec<&str> = summaries[0]
        .summary
        .deleted
        .iter()
        .map(|a| a.container_id.as_str())
        .collect();
    deleted.sort();
    assert_eq!(deleted, ["dead1", "dead2"]);

    let calls = dir.invocations();
    let gc_call = calls
        .iter()
        .find(|c| c.var("CNI_COMMAND") == Some("GC"))
        .expect("the plugin got GC");
    let mut valid: Vec<String> = gc_call.stdin_json()["cni.dev/valid-attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["containerID"].as_str().unwrap().to_owned())
        .collect();
    valid.sort();
    assert_eq!(valid, ["live", "slow"]);
    let mut left: Vec<String> = multi
        .cni()
        .cached_attachments(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.container_id)
        .collect();
    left.sort();
    assert_eq!(left, ["live", "slow"]);
}

#[tokio::test]
async fn remove_deletes_with_the_cached_config_a_network_that_is_gone() {
    let dir = PluginDir::new();
    let cache = tempfile::tempdir().unwrap();
    let confs = tempfile::tempdir().unwrap();
    dir.fake(
        "pa",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.1.0.2/24"))),
    );
    dir.fake(
        "pb",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_for("10.2.0.2/24"))),
    );
    write_conf(confs.path(), "10-a.conflist", &net("neta", "pa", "1.0.0"));
    write_conf(confs.path(), "20-b.conflist", &net("netb", "pb", "1.0.0"));
    let before = MultiNetwork::builder(cni(&dir, cache.path()))
        .conf_dir(confs.path(), 0)
        .build()
        .unwrap();
    let sandbox = Sandbox::new("c-gone", NETNS);
    before.setup(&sandbox).await.expect("setup");

    // netb's file goes; the runtime restarts and rebuilds from the conf dir.
    std::fs::remove_file(confs.path().join("20-b.conflist")).unwrap();
    let after = MultiNetwork::builder(cni(&dir, cache.path()))
        .conf_dir(confs.path(), 0)
        .build()
        .unwrap();
    assert!(after.find("netb").is_none());
    // The namespace is gone too: remove with no netns.
    let gone = Sandbox::new("c-gone", "");
    after.remove(&gone).await.expect("remove");
    let dels: Vec<(String, String)> = dir
        .invocations()
        .iter()
        .filter(|c| c.var("CNI_COMMAND") == Some("DEL"))
        .map(|c| (c.plugin.clone(), c.var("CNI_IFNAME").unwrap().to_owned()))
        .collect();
    assert_eq!(
        dels,
        [("pa".into(), "eth0".into()), ("pb".into(), "eth1".into())]
    );
    assert!(
        after
            .cni()
            .cached_attachments(None)
            .await
            .unwrap()
            .is_empty()
    );
    // A named request for the vanished network also works, and repeating is fine.
    after
        .remove(&Sandbox::new("c-gone", "").with_network(NetworkRequest::new("netb")))
        .await
        .expect("repeat remove");
    // Setup of a vanished network is refused, naming it.
    let e = after
        .setup(&Sandbox::new("c-new", NETNS).with_network(NetworkRequest::new("netb")))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::Core(_)) && e.to_string().contains("netb"),
        "{e}"
    );
}
