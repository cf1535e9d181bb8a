//! Batch setup of many namespaces on a real bridge network: everything
//! attached and reachable, failures of some members reported while the
//! others succeed, and nothing left behind after teardown, explicit or on
//! drop. Needs root.
#![cfg(feature = "netns")]

use crate::support;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::fake::PluginDir;
use crate::support::gate::Gate;
use crate::support::netns::{
    REAL_PLUGINS, TestNet, bridge_ports, host_local_ips, ip_ok, links, ping, unique_id,
};
use crate::support::require_root;
use cni_async::batch::{Batch, BatchBuilder, BatchCounts, BatchEventKind};
use cni_async::multi::{MultiNetwork, Sandbox};
use cni_async::netns::Netns;
use cni_async::{Cni, Error};
use cni_core::NetworkConfigList;
use ipnet::IpNet;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// A unique prefix, and a cleanup on the TestNet that deletes any namespace
/// with it that is still there when the test ends (a safety net behind the
/// batch's own teardown, e.g. if an assertion fails inside a teardown).
fn prefix_for(net: &mut TestNet) -> String {
    let prefix = format!("cntb-{}-", unique_id());
    let p = prefix.clone();
    net.defer(move || {
        for name in leftover_namespaces(&p) {
            let _ = Netns::delete_named(&name);
        }
    });
    prefix
}

fn leftover_namespaces(prefix: &str) -> Vec<String> {
    Netns::list_named()
        .expect("list /run/netns")
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Host links enslaved to `bridge` (`ip -j link show master BRIDGE`).
fn links_on(bridge: &str) -> Vec<String> {
    let out = ip_ok(&["-j", "link", "show", "master", bridge]);
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Array(vec![]));
    v.as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|l| l.get("ifname").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Everything the batch could leave behind, in one value for one assertion.
fn leftovers(prefix: &str, net: &TestNet, network: &str) -> Value {
    json!({
        "namespaces": leftover_namespaces(prefix),
        "bridge ports": bridge_ports(net.bridge()),
        "links on bridge": if support::netns::link_exists(net.bridge()) { links_on(net.bridge()) } else { vec![] },
        "host-local IPs": host_local_ips(&net.data_dir(), network),
    })
}

fn nothing_left() -> Value {
    json!({"namespaces": [], "bridge ports": [], "links on bridge": [], "host-local IPs": []})
}

fn cni_for(net: &TestNet, extra: Option<&Path>) -> Cni {
    let mut dirs = Vec::new();
    if let Some(d) = extra {
        dirs.push(d.to_owned());
    }
    dirs.push(REAL_PLUGINS.into());
    Cni::builder()
        .plugin_dirs(dirs)
        .cache_dir(net.cache_dir())
        .build()
}

fn ipv4_of(member: &cni_async::batch::BatchMember) -> IpAddr {
    let result = member.result().expect("attached");
    result
        .addresses("eth0")
        .into_iter()
        .find(|a| matches!(a, IpNet::V4(_)))
        .expect("an IPv4 address")
        .addr()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_namespaces_on_a_bridge_reach_each_other_and_leave_nothing_behind() {
    require_root!();
    let mut net = TestNet::new();
    let prefix = prefix_for(&mut net);
    let network = format!("bb-{}", net.id());
    let cni = cni_for(&net, None);
    let multi = MultiNetwork::builder(cni.clone())
        .network(net.bridge_list(&network))
        .build()
        .unwrap();

    let events: Arc<Mutex<Vec<(BatchEventKind, usize, BatchCounts)>>> = Arc::default();
    let sink = events.clone();
    let batch = BatchBuilder::new(multi)
        .prefix(&prefix)
        .count(50)
        .concurrency(8)
        .sandbox_template(Sandbox::new("", "").with_label("test", "batch"))
        .on_event(move |e| {
            sink.lock().unwrap().push((e.kind, e.index, e.counts));
        })
        .setup()
        .await
        .expect("setup");

    let counts = batch.counts();
    let failures: Vec<String> = batch
        .failed()
        .map(|m| format!("{}: {}", m.name(), m.error().unwrap()))
        .collect();
    assert_eq!(failures, Vec::<String>::new());
    assert_eq!(
        counts,
        BatchCounts {
            total: 50,
            created: 50,
            attached: 50,
            ..BatchCounts::default()
        }
    );
    {
        let events = events.lock().unwrap();
        assert_eq!(
            events.len(),
            100,
            "one created and one attached per namespace"
        );
        for index in 0..50 {
            let kinds: Vec<BatchEventKind> = events
                .iter()
                .filter(|(_, i, _)| *i == index)
                .map(|(k, _, _)| *k)
                .collect();
            assert_eq!(
                kinds,
                vec![BatchEventKind::Created, BatchEventKind::Attached]
            );
        }
        // Running totals only grow, and the last one is the final count.
        assert!(
            events
                .windows(2)
                .all(|w| w[0].2.attached <= w[1].2.attached)
        );
        assert_eq!(events.last().unwrap().2, counts);
    }
    let names: Vec<&str> = batch.members().iter().map(|m| m.name()).collect();
    assert_eq!(names[0], format!("{prefix}0"));
    assert_eq!(names[49], format!("{prefix}49"));
    let mut ips: Vec<IpAddr> = batch.members().iter().map(ipv4_of).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 50, "every namespace has its own address");
    assert_eq!(host_local_ips(&net.data_dir(), &network).len(), 50);
    assert_eq!(bridge_ports(net.bridge()).len(), 50);

    // One namespace reaches every other one over the bridge.
    let ping_start = Instant::now();
    let first = batch.members()[0].netns().expect("created");
    let unreachable: Vec<String> = batch.members()[1..]
        .iter()
        .filter(|m| !ping(first, ipv4_of(m)))
        .map(|m| m.name().to_owned())
        .collect();
    let ping_time = ping_start.elapsed();
    assert_eq!(unreachable, Vec::<String>::new());

    let setup_time = batch.setup_elapsed();
    let teardown_start = Instant::now();
    batch.teardown().await.expect("teardown");
    let teardown_time = teardown_start.elapsed();
    println!(
        "batch of 50 namespaces, concurrency 8: setup {setup_time:?}, 49 pings {ping_time:?}, teardown {teardown_time:?}"
    );

    let deleted = events
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _, _)| *k == BatchEventKind::Deleted)
        .count();
    assert_eq!(deleted, 50);
    assert_eq!(leftovers(&prefix, &net, &network), nothing_left());
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn members_whose_chain_fails_are_reported_the_others_succeed_and_teardown_cleans_all() {
    require_root!();
    let mut net = TestNet::new();
    let prefix = prefix_for(&mut net);
    let network = format!("bo-{}", net.id());
    // A second network whose plugin refuses containers whose ID ends in an
    // odd digit; DEL always succeeds.
    let fakes = PluginDir::new();
    fakes.script(
        "oddfail",
        r#"cat >/dev/null
case "$CNI_COMMAND" in
ADD)
  case "$CNI_CONTAINERID" in
    *[13579]) printf '{"cniVersion":"1.0.0","code":101,"msg":"odd container %s"}' "$CNI_CONTAINERID"; exit 1 ;;
  esac
  printf '{"cniVersion":"1.0.0"}' ;;
esac
exit 0"#,
    );
    let odd_network = format!("odd-{}", net.id());
    let multi = MultiNetwork::builder(cni_for(&net, Some(fakes.bin())))
        .network(net.bridge_list(&network))
        .network(
            NetworkConfigList::from_value(
                &json!({"cniVersion": "1.0.0", "name": odd_network, "plugins": [{"type": "oddfail"}]}),
            )
            .unwrap(),
        )
        .build()
        .unwrap();

    let batch = BatchBuilder::new(multi)
        .prefix(&prefix)
        .count(10)
        .concurrency(4)
        .setup()
        .await
        .expect("setup");

    let attached: Vec<usize> = batch.attached().map(|m| m.index()).collect();
    let failed: Vec<usize> = batch.failed().map(|m| m.index()).collect();
    assert_eq!(attached, vec![0, 2, 4, 6, 8]);
    assert_eq!(failed, vec![1, 3, 5, 7, 9]);
    for m in batch.failed() {
        let text = cni_core::error::Chain(m.error().unwrap()).to_string();
        assert!(
            text.contains(&format!("network {odd_network:?} (ifname eth1) ADD")),
            "{text}"
        );
        assert!(
            text.contains(&format!("odd container {}", m.name())),
            "{text}"
        );
        // Its bridge attachment was rolled back: only loopback is left.
        assert_eq!(
            links(m.netns().expect("created").path()),
            vec!["lo".to_owned()]
        );
    }
    for m in batch.attached() {
        let links = links(m.netns().unwrap().path());
        assert!(links.contains(&"eth0".to_owned()), "{links:?}");
    }
    let c = batch.counts();
    assert_eq!((c.created, c.attached, c.failed), (10, 5, 5));
    assert_eq!(host_local_ips(&net.data_dir(), &network).len(), 5);
    assert_eq!(bridge_ports(net.bridge()).len(), 5);

    batch.teardown().await.expect("teardown");
    assert_eq!(leftovers(&prefix, &net, &network), nothing_left());
}

#[tokio::test]
async fn a_batch_dropped_without_teardown_leaves_nothing_behind() {
    require_root!();
    let mut net = TestNet::new();
    let prefix = prefix_for(&mut net);
    let network = format!("bd-{}", net.id());
    let multi = MultiNetwork::builder(cni_for(&net, None))
        .network(net.bridge_list(&network))
        .build()
        .unwrap();
    let deleted = Arc::new(Mutex::new(0usize));
    let sink = deleted.clone();
    let batch: Batch = BatchBuilder::new(multi.clone())
        .prefix(&prefix)
        .count(6)
        .concurrency(3)
        .on_event(move |e| {
            if e.kind == BatchEventKind::Deleted {
                *sink.lock().unwrap() += 1;
            }
        })
        .setup()
        .await
        .expect("setup");
    assert_eq!(batch.attached().count(), 6);
    assert_eq!(leftover_namespaces(&prefix).len(), 6);
    assert_eq!(host_local_ips(&net.data_dir(), &network).len(), 6);

    drop(batch);
    assert_eq!(*deleted.lock().unwrap(), 6);
    assert_eq!(leftovers(&prefix, &net, &network), nothing_left());

    // A setup abandoned half way (its future dropped while every member is
    // attached to the bridge and waiting in a slow second network) cleans up
    // too: DEL of what was attached, then the namespaces.
    let fakes = PluginDir::new();
    // ADD holds at a gate that is never released while the setup runs.
    let gate = Gate::new(fakes.root());
    fakes.script(
        "sleeper",
        &format!(
            "cat >/dev/null\nif [ \"$CNI_COMMAND\" = ADD ]; then\n{}\nfi\nexit 0",
            gate.shell_wait()
        ),
    );
    let slow = MultiNetwork::builder(cni_for(&net, Some(fakes.bin())))
        .network(net.bridge_list(&network))
        .network(
            NetworkConfigList::from_value(
                &json!({"cniVersion": "1.0.0", "name": format!("slow-{}", net.id()), "plugins": [{"type": "sleeper"}]}),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let prefix2 = prefix_for(&mut net);
    let setup = BatchBuilder::new(slow)
        .prefix(&prefix2)
        .count(4)
        .concurrency(4)
        .setup();
    let data_dir = net.data_dir();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::select! {
            r = setup => r.map(|_| 0),
            // Until every member is attached to the bridge and in the
            // second network's ADD; the IPs its members hold then.
            n = async {
                gate.wait_started(4).await;
                host_local_ips(&data_dir, &network).len()
            } => Ok(n),
        }
    })
    .await;
    assert!(matches!(outcome, Ok(Ok(4))), "{outcome:?}");
    assert_eq!(leftovers(&prefix2, &net, &network), nothing_left());
}

#[tokio::test]
async fn bad_prefixes_are_refused_before_anything_is_created() {
    require_root!();
    let net = TestNet::new();
    let multi = MultiNetwork::builder(cni_for(&net, None))
        .network(net.bridge_list("unused"))
        .build()
        .unwrap();
    for prefix in ["bad/prefix-", "-leading-dash", "spa ce"] {
        let e = BatchBuilder::new(multi.clone())
            .prefix(prefix)
            .count(2)
            .setup()
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::Core(cni_core::Error::InvalidParameter { .. })),
            "{prefix}: {e:?}"
        );
        assert!(leftover_namespaces(prefix).is_empty());
    }
    let e = BatchBuilder::new(multi)
        .prefix("n".repeat(260))
        .count(1)
        .setup()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NetnsName { .. }), "{e:?}");
}
