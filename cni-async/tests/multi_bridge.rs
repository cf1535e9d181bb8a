//! The multi-network API on the real reference plugins: loopback plus two
//! bridge networks in a real namespace, and the rollback of the first
//! network when the second fails. Needs root.
#![cfg(feature = "netns")]

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::fake::{Fake, PluginDir, Response};
use crate::support::netns::{
    REAL_PLUGINS, TestNet, bridge_ports, host_local_ips, ip_ok, links, unique_link_name,
};
use crate::support::require_root;
use cni_async::multi::{MultiNetwork, Sandbox, SetupMode};
use cni_async::{Cni, Error};
use cni_core::NetworkConfigList;
use ipnet::IpNet;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// A bridge network on `bridge` with host-local in `subnet`: no gateway on
/// the bridge, no masquerading, no routes.
fn bridge_list(name: &str, bridge: &str, subnet: IpNet, data_dir: &Path) -> NetworkConfigList {
    NetworkConfigList::from_value(&json!({
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": subnet.to_string() }]],
                "dataDir": data_dir,
            }
        }]
    }))
    .expect("valid list")
}

/// `ip -n NS -j addr`: interface name -> addresses (without IPv6
/// link-local ones, which the kernel adds by itself).
fn ip_addrs(netns_name: &str) -> BTreeMap<String, Vec<IpNet>> {
    let out: Value = serde_json::from_str(&ip_ok(&["-n", netns_name, "-j", "addr"]))
        .expect("ip -j addr prints JSON");
    let mut map = BTreeMap::new();
    for link in out.as_array().expect("array") {
        let Some(name) = link.get("ifname").and_then(Value::as_str) else {
            continue;
        };
        let addrs: Vec<IpNet> = link["addr_info"]
            .as_array()
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|a| {
                let ip = a["local"].as_str().unwrap().parse().unwrap();
                let len = u8::try_from(a["prefixlen"].as_u64().unwrap()).unwrap();
                IpNet::new(ip, len).unwrap()
            })
            .filter(|n| !matches!(n, IpNet::V6(v6) if v6.addr().segments()[0] & 0xffc0 == 0xfe80))
            .collect();
        map.insert(name.to_owned(), addrs);
    }
    map
}

#[tokio::test]
async fn loopback_and_two_bridges_get_lo_eth0_eth1_and_come_off_again() {
    require_root!();
    let mut net = TestNet::new();
    let bridge_a = net.bridge().to_owned();
    let subnet_a = IpNet::V4(net.subnet());
    let bridge_b = unique_link_name();
    net.track_link(&bridge_b);
    let subnet_b = IpNet::V4(net.another_subnet());
    let data_dir = net.data_dir();
    let ns = net.netns();
    let ns_name = ns.name().expect("named").to_owned();
    let (name_a, name_b) = (format!("ma-{}", net.id()), format!("mb-{}", net.id()));

    let cni = net.real_cni();
    let multi = MultiNetwork::builder(cni.clone())
        .loopback()
        .network(bridge_list(&name_a, &bridge_a, subnet_a, &data_dir))
        .network(bridge_list(&name_b, &bridge_b, subnet_b, &data_dir))
        .mode(SetupMode::Parallel)
        .build()
        .unwrap();
    // A label: host-local parses CNI_ARGS and needs IgnoreUnknown=1.
    let sandbox = Sandbox::new(format!("multi-{}", net.id()), ns.path().to_str().unwrap())
        .with_label("app", "web");

    let result = multi.setup(&sandbox).await.expect("setup");

    // Aggregation: the sandbox interfaces, with the addresses the kernel has.
    let seen = ip_addrs(&ns_name);
    for ifname in ["lo", "eth0", "eth1"] {
        let iface = result
            .interface(ifname)
            .unwrap_or_else(|| panic!("{ifname} in {result:#?}"));
        assert_eq!(
            iface.sandbox.as_deref(),
            ns.path().to_str(),
            "{ifname} is in the sandbox"
        );
        let mut want = result.addresses(ifname);
        want.sort();
        let mut got = seen.get(ifname).cloned().unwrap_or_default();
        got.sort();
        assert_eq!(got, want, "addresses of {ifname}");
    }
    assert!(
        result
            .addresses("lo")
            .contains(&"127.0.0.1/8".parse().unwrap())
    );
    let eth0 = result.addresses("eth0");
    let eth1 = result.addresses("eth1");
    assert_eq!(eth0.len(), 1);
    assert_eq!(eth1.len(), 1);
    assert!(subnet_a.contains(&eth0[0].addr()), "{eth0:?} in {subnet_a}");
    assert!(subnet_b.contains(&eth1[0].addr()), "{eth1:?} in {subnet_b}");
    // Host-side interfaces are there too, without a sandbox.
    assert!(
        result
            .interface(&bridge_a)
            .is_some_and(|i| i.sandbox.is_none())
    );
    assert!(
        result
            .interface(&bridge_b)
            .is_some_and(|i| i.sandbox.is_none())
    );
    assert_eq!(
        result
            .networks
            .iter()
            .map(|n| (n.network.as_str(), n.ifname.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("cni-loopback", "lo"),
            (name_a.as_str(), "eth0"),
            (name_b.as_str(), "eth1")
        ]
    );
    assert_eq!(
        host_local_ips(&data_dir, &name_a),
        vec![eth0[0].addr().to_string()]
    );
    assert_eq!(
        host_local_ips(&data_dir, &name_b),
        vec![eth1[0].addr().to_string()]
    );
    assert_eq!(bridge_ports(&bridge_a).len(), 1);
    assert_eq!(bridge_ports(&bridge_b).len(), 1);

    multi.check(&sandbox).await.expect("check");
    // 1.0.0 lists: STATUS does not exist there and succeeds without a plugin run.
    multi.status().await.expect("status");

    multi.remove(&sandbox).await.expect("remove");
    assert_eq!(host_local_ips(&data_dir, &name_a), Vec::<String>::new());
    assert_eq!(host_local_ips(&data_dir, &name_b), Vec::<String>::new());
    assert_eq!(links(ns.path()), vec!["lo".to_owned()]);
    assert_eq!(bridge_ports(&bridge_a), Vec::<String>::new());
    assert_eq!(bridge_ports(&bridge_b), Vec::<String>::new());
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
    // Removing again is fine.
    multi.remove(&sandbox).await.expect("second remove");
}

#[tokio::test]
async fn when_the_second_network_fails_the_first_is_rolled_back() {
    require_root!();
    let net = TestNet::new();
    let data_dir = net.data_dir();
    let name_a = format!("rb-{}", net.id());
    let name_bad = format!("broken-{}", net.id());
    let fakes = PluginDir::new();
    fakes.fake(
        "refuser",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::cni_error(100, "refused by the test", "second network"),
        ),
    );
    let cni = Cni::builder()
        .plugin_dirs([fakes.bin(), Path::new(REAL_PLUGINS)])
        .cache_dir(net.cache_dir())
        .build();
    let broken = NetworkConfigList::from_value(
        &json!({"cniVersion": "1.0.0", "name": name_bad, "plugins": [{"type": "refuser"}]}),
    )
    .unwrap();

    let mut net = net;
    for (i, mode) in [SetupMode::Serial, SetupMode::Parallel]
        .into_iter()
        .enumerate()
    {
        let ns = net.netns();
        let multi = MultiNetwork::builder(cni.clone())
            .network(bridge_list(
                &name_a,
                net.bridge(),
                IpNet::V4(net.subnet()),
                &data_dir,
            ))
            .network(broken.clone())
            .mode(mode)
            .build()
            .unwrap();
        let sandbox = Sandbox::new(format!("rb{i}-{}", net.id()), ns.path().to_str().unwrap());

        let e = multi.setup(&sandbox).await.unwrap_err();
        let text = cni_core::error::Chain(&e).to_string();
        assert!(
            matches!(e, Error::Context { .. }),
            "{mode:?}: one network failed, rolled back cleanly: {e:?}"
        );
        assert!(
            text.contains(&format!("network {name_bad:?} (ifname eth1) ADD")),
            "{mode:?}: {text}"
        );
        assert!(text.contains("refused by the test"), "{text}");
        assert_eq!(e.code(), 100);

        // The bridge network was set up (an address was allocated) and
        // deleted again.
        assert!(
            data_dir.join(&name_a).join("last_reserved_ip.0").exists(),
            "{mode:?}: host-local allocated an address"
        );
        assert_eq!(
            host_local_ips(&data_dir, &name_a),
            Vec::<String>::new(),
            "{mode:?}: host-local holds no address"
        );
        assert_eq!(links(ns.path()), vec!["lo".to_owned()], "{mode:?}");
        assert_eq!(bridge_ports(net.bridge()), Vec::<String>::new(), "{mode:?}");
        assert!(cni.cached_attachments(None).await.unwrap().is_empty());
        let refuser_calls = fakes
            .invocations()
            .iter()
            .filter(|c| c.var("CNI_CONTAINERID") == Some(sandbox.container_id.as_str()))
            .map(|c| c.var("CNI_COMMAND").unwrap_or_default().to_owned())
            .collect::<Vec<_>>();
        // The failing chain was rolled back by itself (ADD, then DEL).
        assert_eq!(refuser_calls, vec!["ADD", "DEL"], "{mode:?}");
    }
}
