//! The daemon driving the real reference plugins in real network
//! namespaces: loopback + bridge (host-local IPAM) + tuning. ADD two
//! namespaces, CHECK, ping across the bridge, DEL, and then nothing is left:
//! no IP in host-local, no veth, no interface, no cache entry, no intent.

use crate::support;

use crate::support::daemon::{Daemon, Dirs};
use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips, ip_ok, link_exists,
};
use crate::support::shim::ipv4_of;
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "dreal";

fn require_plugins() {
    crate::support::require_plugins(&["loopback", "bridge", "host-local", "tuning"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_chain_add_check_ping_del_through_the_daemon() {
    support::require_root!();
    require_plugins();
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    // A fixed bridge MAC: otherwise it changes when the second port joins
    // and the bridge plugin's CHECK of the first container fails.
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "address", "02:cd:00:00:00:01"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    dirs.conf(
        "10-real.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                {"type": "loopback"},
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1).to_string()}]]}},
                {"type": "tuning", "sysctl": {"net.core.somaxconn": "777"}}
            ]
        }),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let req_a = AttachmentRequest::new("real-a", ns_a.path(), "eth0");
    let mut req_b = AttachmentRequest::new("real-b", ns_b.path(), "eth0");
    req_b.cni_args = "IgnoreUnknown=1;K8S_POD_NAME=b".into();

    let res_a = client.add(NET, &req_a).await.expect("ADD a");
    let res_b = client.add(NET, &req_b).await.expect("ADD b");
    assert_eq!(res_a["cniVersion"], "1.0.0");
    let (ip_a, ip_b) = (ipv4_of(&res_a), ipv4_of(&res_b));
    assert_eq!(ns_a.ipv4_addrs("eth0"), std::slice::from_ref(&ip_a));
    assert_eq!(ns_b.ipv4_addrs("eth0"), std::slice::from_ref(&ip_b));
    let somaxconn = ns_a.exec("cat", &["/proc/sys/net/core/somaxconn"]);
    assert_eq!(String::from_utf8_lossy(&somaxconn.stdout).trim(), "777");

    client.check(NET, &req_a).await.expect("CHECK a");
    client.check(NET, &req_b).await.expect("CHECK b");
    let addr = |cidr: &str| cidr.split('/').next().unwrap().parse().unwrap();
    assert!(ns_a.ping(addr(&ip_b), 3), "a cannot ping b");
    assert!(ns_b.ping(addr(&ip_a), 3), "b cannot ping a");

    // What the daemon knows, and what is held on the host.
    let att = client.attachments(None).await.unwrap();
    assert_eq!(att.len(), 2);
    let b = client.attachments(Some("real-b")).await.unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].cni_args, "IgnoreUnknown=1;K8S_POD_NAME=b");
    assert_eq!(b[0].result.as_ref().map(ipv4_of), Some(ip_b.clone()));
    assert_eq!(host_local_ips(&data_dir, NET).len(), 2);
    let veths = bridge_ports(br);
    assert_eq!(veths.len(), 2, "{veths:?}");

    client.del(NET, &req_a).await.expect("DEL a");
    client.del(NET, &req_b).await.expect("DEL b");
    client.del(NET, &req_a).await.expect("DEL a again");

    assert!(host_local_ips(&data_dir, NET).is_empty(), "IPs left");
    assert!(bridge_ports(br).is_empty(), "ports left on the bridge");
    for v in &veths {
        assert!(!link_exists(v), "veth {v} left");
    }
    for ns in [&ns_a, &ns_b] {
        assert!(
            !ns.exec("ip", &["link", "show", "eth0"]).status.success(),
            "eth0 left in {}",
            ns.name()
        );
    }
    assert!(client.attachments(None).await.unwrap().is_empty());
    assert!(dirs.cached().is_empty());
    assert!(dirs.intents().is_empty());
    let m = client.metrics().await.unwrap();
    for line in [
        "cnid_plugin_exec_duration_seconds_count{plugin=\"bridge\",command=\"ADD\"} 2",
        "cnid_plugin_exec_duration_seconds_count{plugin=\"bridge\",command=\"DEL\"} 3",
        "cnid_plugin_exec_duration_seconds_count{plugin=\"tuning\",command=\"CHECK\"} 2",
        "cnid_operations_total{verb=\"ADD\",outcome=\"ok\"} 2",
    ] {
        assert!(m.contains(line), "missing {line:?} in\n{m}");
    }
}

/// An attachment whose cache record turned corrupt, then ADDed again
/// through cnid (a runtime's retries, twice): each ADD fails (the bridge
/// plugin refuses the eth0 that exists) and none takes the working
/// attachment down. cnid's own check before the ADD moved the corrupt file
/// aside, so the library's ADD saw no record and its rollback DELed eth0
/// and freed the address. The DEL that follows cleans up all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_over_a_corrupt_record_leave_the_attachment() {
    support::require_root!();
    require_plugins();
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    dirs.conf(
        "10-real.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1).to_string()}]]}}
            ]
        }),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let req_a = AttachmentRequest::new("corr-a", ns_a.path(), "eth0");
    let req_b = AttachmentRequest::new("corr-b", ns_b.path(), "eth0");
    let ip_a = ipv4_of(&client.add(NET, &req_a).await.expect("ADD a"));
    client.add(NET, &req_b).await.expect("ADD b");
    let reserved = host_local_ips(&data_dir, NET);
    let cached = dirs.cached();
    let file = cached
        .iter()
        .find(|n| n.contains("corr-a"))
        .map(|n| dirs.cache.join("results").join(n))
        .expect("a's record");
    std::fs::write(&file, b"{\"kind\":\"cniCacheV1\",").unwrap();
    let addr: std::net::Ipv4Addr = ip_a.split('/').next().unwrap().parse().unwrap();

    for attempt in 0..2 {
        let err = client.add(NET, &req_a).await.expect_err("ADD a again");
        let at = format!("#{attempt}: {err}");
        // In doubt, attached: refused as cnid refuses a recorded one.
        assert_eq!(err.status(), Some(409), "{at}");
        assert_eq!(
            ns_a.ipv4_addrs("eth0"),
            std::slice::from_ref(&ip_a),
            "{at}: a's eth0 and address kept"
        );
        assert_eq!(
            host_local_ips(&data_dir, NET),
            reserved,
            "{at}: reservations kept"
        );
        assert!(ns_b.ping(addr, 3), "{at}: b cannot reach a");
    }

    client.del(NET, &req_a).await.expect("DEL a");
    client.del(NET, &req_b).await.expect("DEL b");
    assert!(host_local_ips(&data_dir, NET).is_empty(), "IPs left");
    assert!(bridge_ports(br).is_empty(), "ports left on the bridge");
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    assert!(dirs.intents().is_empty());
}
