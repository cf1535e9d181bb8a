//! The operation set against the real reference plugins in real network
//! namespaces: loopback + bridge (host-local IPAM) + tuning + portmap.
#![cfg(feature = "netns")]

use crate::support;
use crate::support::netns::{
    REAL_PLUGINS, TestNet, addrs_v4, bridge_ports, host_local_ips, link_exists, link_exists_in,
    ping,
};
use crate::support::require_root;
use cni_core::{NetworkConfigList, RuntimeConf, Version};
use serde_json::json;

fn require_plugins() {
    for p in ["loopback", "bridge", "host-local", "tuning", "portmap"] {
        assert!(
            std::path::Path::new(REAL_PLUGINS).join(p).exists(),
            "the reference plugin {REAL_PLUGINS}/{p} is missing: run `make setup` (apt-get install containernetworking-plugins)"
        );
    }
}

fn chain(net: &TestNet) -> NetworkConfigList {
    let ipam = net.host_local_ipam();
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": format!("real-{}", net.id()),
        "plugins": [
            {"type": "loopback"},
            {"type": "bridge", "bridge": net.bridge(), "isGateway": false, "ipMasq": false,
             "ipam": ipam},
            {"type": "tuning", "sysctl": {"net.core.somaxconn": "777"}},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
        ]
    });
    NetworkConfigList::from_value(&conf).unwrap()
}

fn nat_rules_mentioning(needle: &str) -> Vec<String> {
    let out = std::process::Command::new("iptables")
        .args(["-w", "-t", "nat", "-S"])
        .output()
        .expect("iptables runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_chain_add_ping_check_del_releases_everything() {
    require_root!();
    let mut net = TestNet::new();
    require_plugins();
    let list = chain(&net);
    assert_eq!(list.version(), Version::V1_0_0);
    net.precreate_bridge("02:cb:00:00:00:01");
    let cni = net.real_cni();

    let ns_a = net.netns();
    let ns_b = net.netns();
    let cid_a = format!("ctr-a-{}", net.id());
    let cid_b = format!("ctr-b-{}", net.id());
    let mut rt_a = RuntimeConf::new(&cid_a, ns_a.path().to_str().unwrap(), "eth0");
    rt_a.capability_args.insert(
        "portMappings",
        json!([{"hostPort": 40000 + (std::process::id() % 20000), "containerPort": 80, "protocol": "tcp"}]),
    );
    let rt_b = RuntimeConf::new(&cid_b, ns_b.path().to_str().unwrap(), "eth0");

    // ADD both.
    let res_a = cni.add_network_list(&list, &rt_a).await.expect("ADD a");
    let res_b = cni.add_network_list(&list, &rt_b).await.expect("ADD b");
    assert_eq!(res_a.version(), Version::V1_0_0);

    // The result names the container interface and an address in our subnet.
    let cur_a = res_a.to_current();
    let cur_b = res_b.to_current();
    let v4 = |r: &cni_core::result::Result100| {
        r.ips
            .iter()
            .map(|i| i.address)
            .find(|a| matches!(a, ipnet::IpNet::V4(_)))
            .expect("an IPv4 address")
    };
    let (ip_a, ip_b) = (v4(&cur_a), v4(&cur_b));
    assert!(
        ipnet::IpNet::V4(net.subnet()).contains(&ip_a.addr()),
        "{ip_a} outside {}",
        net.subnet()
    );
    assert!(
        cur_a
            .interfaces
            .iter()
            .any(|i| i.name == "eth0" && i.sandbox.is_some())
    );

    // The namespaces really have those addresses (ip -n), and lo is up.
    let strings = |v: Vec<ipnet::IpNet>| v.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(strings(addrs_v4(&ns_a, "eth0")), [ip_a.to_string()]);
    assert_eq!(strings(addrs_v4(&ns_b, "eth0")), [ip_b.to_string()]);
    assert!(
        addrs_v4(&ns_a, "lo")
            .iter()
            .any(|n| n.addr().to_string() == "127.0.0.1")
    );

    // tuning applied its sysctl inside the namespace.
    let somaxconn = ns_a
        .run(|| std::fs::read_to_string("/proc/sys/net/core/somaxconn"))
        .expect("enter netns")
        .expect("read sysctl in netns");
    assert_eq!(somaxconn.trim(), "777");

    // No default route was installed (network rule: nothing leaves the test).
    let routes = support::netns::exec_ok(&ns_a, "ip", &["-4", "route", "show", "default"]);
    assert!(
        routes.trim().is_empty(),
        "unexpected default route: {routes}"
    );

    // Ping across the bridge, both ways.
    assert!(ping(&ns_a, ip_b.addr()), "a cannot ping b");
    assert!(ping(&ns_b, ip_a.addr()), "b cannot ping a");

    // portmap installed host NAT rules for a (and only while attached).
    assert!(
        !nat_rules_mentioning(&cid_a).is_empty(),
        "no portmap rule for {cid_a}"
    );

    // Both are cached; host-local holds both IPs; the bridge has two ports.
    assert_eq!(cni.cached_attachments(None).await.unwrap().len(), 2);
    let mut held = host_local_ips(&net.data_dir(), list.name());
    held.sort();
    let mut want = vec![ip_a.addr().to_string(), ip_b.addr().to_string()];
    want.sort();
    assert_eq!(held, want);
    assert_eq!(bridge_ports(net.bridge()).len(), 2);

    // CHECK passes for b. For a, which has a port mapping, the reference
    // portmap 1.1.1 fails CHECK whenever ip6tables exists: it looks for the
    // IPv4 DNAT rule in the IPv6 table (fixed upstream after 1.1.1). So a's
    // CHECK must pass every plugin before portmap, and may fail only there.
    cni.check_network_list(&list, &rt_b).await.expect("CHECK b");
    match cni
        .check_network_list(&list, &rt_a)
        .await
        .map_err(cni_async::Error::into_innermost)
    {
        Ok(()) => {}
        Err(cni_async::Error::Plugin { plugin_type, .. }) if plugin_type == "portmap" => {}
        Err(e) => panic!("CHECK a failed before portmap: {e}"),
    }

    // DEL both (and again: DEL is idempotent).
    cni.del_network_list(&list, &rt_a).await.expect("DEL a");
    cni.del_network_list(&list, &rt_b).await.expect("DEL b");
    cni.del_network_list(&list, &rt_a)
        .await
        .expect("second DEL a");

    // Everything released: IPs, veths (bridge ports), the interface in the
    // namespace, the cache entries, the NAT rules.
    assert!(
        host_local_ips(&net.data_dir(), list.name()).is_empty(),
        "host-local still holds IPs"
    );
    assert!(
        bridge_ports(net.bridge()).is_empty(),
        "veths left on the bridge"
    );
    assert!(!link_exists_in(ns_a.path(), "eth0"), "eth0 left in a");
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
    assert!(
        nat_rules_mentioning(&cid_a).is_empty(),
        "portmap rules left for {cid_a}"
    );
    assert!(
        link_exists(net.bridge()),
        "the bridge itself stays until the test removes it"
    );

    // CHECK after DEL is refused: no cached result.
    let e = cni
        .check_network_list(&list, &rt_a)
        .await
        .unwrap_err()
        .into_innermost();
    assert_eq!(e.code(), 3, "{e}");
    drop((ns_a, ns_b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_of_a_failed_real_chain_frees_the_ip() {
    require_root!();
    let mut net = TestNet::new();
    require_plugins();
    // bridge + host-local succeed, then tuning fails on an unknown sysctl.
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": format!("rb-{}", net.id()),
        "plugins": [
            {"type": "bridge", "bridge": net.bridge(), "ipam": net.host_local_ipam()},
            {"type": "tuning", "sysctl": {"net.core.no_such_sysctl_here": "1"}}
        ]
    });
    let list = NetworkConfigList::from_value(&conf).unwrap();
    let cni = net.real_cni();
    let ns = net.netns();
    let rt = RuntimeConf::new(
        format!("rb-{}", net.id()),
        ns.path().to_str().unwrap(),
        "eth0",
    );
    let opts = cni_async::CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = cni
        .add_network_list(&list, &rt)
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    let msg = err.to_string();
    assert!(
        msg.contains("tuning"),
        "the error names the failing plugin: {msg}"
    );
    // The bridge plugin's work was undone: no IP held, no veth, no cache entry.
    assert!(
        host_local_ips(&net.data_dir(), list.name()).is_empty(),
        "IP leaked after rollback"
    );
    assert!(
        bridge_ports(net.bridge()).is_empty(),
        "veth leaked after rollback"
    );
    assert!(!link_exists_in(ns.path(), "eth0"));
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
    drop(ns);
}
