//! The runtime model on the real reference plugins, in real namespaces:
//! two networks per sandbox with different options (a bridge network with a
//! static IP, a ptp network with its own interface name and `CNI_ARGS`), a
//! sandbox on the default network beside it, and a teardown that completes
//! after the ptp network's conf file and the sandbox's namespace were both
//! deleted. Needs root.
#![cfg(feature = "netns")]

use crate::support;
use crate::support::netns::{
    TestNet, addrs_v4, bridge_ports, host_local_ips, ping, unique_netns_name,
};
use crate::support::require_root;
use cni_async::multi::{MultiNetwork, NetworkRequest, Sandbox};
use cni_async::netns::NetnsGuard;
use cni_core::CapabilityArgs;
use ipnet::IpNet;
use pretty_assertions::assert_eq;
use serde_json::json;

fn caps(value: serde_json::Value) -> CapabilityArgs {
    CapabilityArgs(value.as_object().cloned().expect("an object"))
}

#[tokio::test]
async fn two_networks_with_their_own_options_and_a_teardown_after_file_and_netns_are_gone() {
    require_root!();
    let mut net = TestNet::new();
    net.precreate_bridge("02:cb:00:00:00:02");
    let id = net.id().to_owned();
    let (bridge_net, ptp_net) = (format!("rb-{id}"), format!("rp-{id}"));
    let bridge_subnet = net.subnet();
    let ptp_subnet = net.another_subnet();
    let data_dir = net.data_dir();
    let confs = net.dir().join("net.d");
    std::fs::create_dir_all(&confs).unwrap();
    let bridge_file = confs.join("10-bridge.conflist");
    let ptp_file = confs.join("20-ptp.conflist");
    std::fs::write(
        &bridge_file,
        json!({
            "cniVersion": "1.0.0",
            "name": bridge_net,
            "plugins": [{
                "type": "bridge",
                "bridge": net.bridge(),
                "capabilities": {"ips": true},
                "ipam": {"type": "host-local", "ranges": [[{"subnet": bridge_subnet.to_string()}]], "dataDir": data_dir}
            }]
        })
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        &ptp_file,
        json!({
            "cniVersion": "1.0.0",
            "name": ptp_net,
            "plugins": [{
                "type": "ptp",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": ptp_subnet.to_string()}]], "dataDir": data_dir}
            }]
        })
        .to_string(),
    )
    .unwrap();

    let cni = net.real_cni();
    // The default network (the bridge) for sandboxes that name none; ptp by name.
    let multi = MultiNetwork::builder(cni.clone())
        .conf_dir(&confs, 1)
        .build()
        .unwrap();

    // s1's namespace is ours alone (not the TestNet's, which would keep it
    // open), so that deleting it below really destroys it and its veths.
    let ns1 = NetnsGuard::create(&unique_netns_name()).expect("create s1's namespace");
    let ns2 = net.netns();
    let ns1_path = ns1.path().to_str().unwrap().to_owned();
    let static_ip: IpNet = format!("{}/24", bridge_subnet.hosts().nth(49).unwrap())
        .parse()
        .unwrap();
    let s1 = Sandbox::new(format!("mr1-{id}"), ns1_path.clone())
        .with_network(
            NetworkRequest::new(&bridge_net)
                .with_capabilities(caps(json!({"ips": [static_ip.to_string()]}))),
        )
        .with_network(
            NetworkRequest::new(&ptp_net)
                .with_ifname("net1")
                .with_arg("K8S_POD_NAME", "web"),
        );
    let s2 = Sandbox::new(format!("mr2-{id}"), ns2.path().to_str().unwrap());

    let r1 = multi.setup(&s1).await.expect("setup of s1");
    let r2 = multi.setup(&s2).await.expect("setup of s2");

    // s1: the static IP on eth0 (bridge), a ptp address on net1.
    assert_eq!(addrs_v4(&ns1, "eth0"), vec![static_ip]);
    assert_eq!(r1.addresses("eth0"), vec![static_ip]);
    let net1 = addrs_v4(&ns1, "net1");
    assert_eq!(net1.len(), 1, "{net1:?}");
    assert!(
        IpNet::V4(ptp_subnet).contains(&net1[0].addr()),
        "{net1:?} in {ptp_subnet}"
    );
    assert_eq!(r1.addresses("net1"), net1);
    // s2: only the default network, as eth0, with an address host-local chose.
    assert_eq!(r2.networks.len(), 1);
    let s2_eth0 = addrs_v4(&ns2, "eth0");
    assert_eq!(s2_eth0.len(), 1);
    assert!(IpNet::V4(bridge_subnet).contains(&s2_eth0[0].addr()));
    let ns2_name = ns2.name().unwrap().to_owned();
    assert!(
        !support::netns::ip(&["-n", &ns2_name, "link", "show", "net1"])
            .status
            .success(),
        "s2 has no net1"
    );
    assert!(
        ping(&ns2, static_ip.addr()),
        "s2 reaches s1's static IP over the bridge"
    );
    multi.check(&s1).await.expect("check s1");
    multi.check(&s2).await.expect("check s2");

    // The ptp network's file goes, the runtime rebuilds its set, and s1's
    // namespace is deleted before the runtime tears s1 down.
    std::fs::remove_file(&ptp_file).unwrap();
    let rebuilt = MultiNetwork::builder(cni.clone())
        .conf_dir(&confs, 1)
        .build()
        .unwrap();
    assert!(rebuilt.find(&ptp_net).is_none());
    ns1.delete().expect("delete s1's namespace");
    let s1_gone = Sandbox::new(s1.container_id.clone(), ns1_path);
    rebuilt.remove(&s1_gone).await.expect("remove of s1");

    // Both of s1's IPs are released; s2 keeps its own.
    let s2_ip = s2_eth0[0].addr().to_string();
    assert_eq!(host_local_ips(&data_dir, &bridge_net), vec![s2_ip.clone()]);
    assert!(host_local_ips(&data_dir, &ptp_net).is_empty());
    let cached: Vec<String> = cni
        .cached_attachments(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.container_id)
        .collect();
    assert_eq!(cached, vec![s2.container_id.clone()]);
    rebuilt.remove(&s2).await.expect("remove of s2");
    assert!(host_local_ips(&data_dir, &bridge_net).is_empty());
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
    assert!(
        bridge_ports(net.bridge()).is_empty(),
        "{:?}",
        bridge_ports(net.bridge())
    );
}
