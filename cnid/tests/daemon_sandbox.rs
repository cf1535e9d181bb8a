//! The sandbox API (`/v1/sandboxes/*`) on the real reference plugins in real
//! namespaces: two sandboxes on loopback + a bridge network + a ptp network
//! with their own options in one call each, the merged result, CHECK,
//! STATUS, a ping across the bridge, teardown that leaves nothing; the
//! default network when a sandbox names none; and a failure on the second
//! network that leaves nothing behind.

use crate::support::daemon::{Daemon, Dirs};
use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips, ip_ok,
};
use crate::support::require_root;
use cni_core::CapabilityArgs;
use cnid::api::{SandboxNetwork, SandboxRequest};
use serde_json::json;

const BRIDGE_NET: &str = "sbbridge";
const PTP_NET: &str = "sbptp";
const FAIL_NET: &str = "sbfail";

fn caps(v: serde_json::Value) -> CapabilityArgs {
    CapabilityArgs(v.as_object().cloned().unwrap())
}

struct World {
    dirs: Dirs,
    bridge: LinkGuard,
    bridge_subnet: SubnetLease,
    ptp_subnet: SubnetLease,
    data_dir: std::path::PathBuf,
}

/// cnid with three networks: the bridge (default, first file), ptp, and
/// ptp followed by a plugin that refuses every ADD (after ptp allocated).
fn world() -> (World, Daemon) {
    cni_test_support::assert_root("the sandbox World creates namespaces and bridges");
    crate::support::require_plugins(&["loopback", "bridge", "ptp", "host-local"]);
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let (bridge_subnet, ptp_subnet) = (SubnetLease::new(), SubnetLease::new());
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "address", "02:cd:00:00:00:02"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    let ipam = |subnet: &SubnetLease| json!({"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": subnet.cidr()}]]});
    dirs.conf(
        "10-bridge.conflist",
        &json!({"cniVersion": "1.0.0", "name": BRIDGE_NET, "plugins": [
            {"type": "bridge", "bridge": br, "capabilities": {"ips": true}, "ipam": ipam(&bridge_subnet)}]}),
    );
    dirs.conf(
        "20-ptp.conflist",
        &json!({"cniVersion": "1.0.0", "name": PTP_NET, "plugins": [
            {"type": "ptp", "ipam": ipam(&ptp_subnet)}]}),
    );
    dirs.plugin(
        "refuse",
        r#"case "$CNI_COMMAND" in ADD) echo '{"cniVersion":"1.0.0","code":100,"msg":"refused on purpose"}'; exit 1;; esac; exit 0"#,
    );
    dirs.conf(
        "30-fail.conflist",
        &json!({"cniVersion": "1.0.0", "name": FAIL_NET, "plugins": [
            {"type": "ptp", "ipam": ipam(&ptp_subnet)}, {"type": "refuse"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    (
        World {
            dirs,
            bridge,
            bridge_subnet,
            ptp_subnet,
            data_dir,
        },
        daemon,
    )
}

fn nothing_left(w: &World) {
    for net in [BRIDGE_NET, PTP_NET, FAIL_NET] {
        assert!(
            host_local_ips(&w.data_dir, net).is_empty(),
            "IPs left in {net}: {:?}",
            host_local_ips(&w.data_dir, net)
        );
    }
    assert!(
        bridge_ports(w.bridge.name()).is_empty(),
        "ports left on the bridge"
    );
    assert!(w.dirs.cached().is_empty(), "cache: {:?}", w.dirs.cached());
    assert!(
        w.dirs.intents().is_empty(),
        "intents: {:?}",
        w.dirs.intents()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sandboxes_on_three_networks_each_in_one_call() {
    require_root!();
    let (w, daemon) = world();
    let client = daemon.client().await;
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let static_ip = w.bridge_subnet.host(50);
    let sandbox = |cid: &str, ns: &TempNetns, bridge_caps: CapabilityArgs| SandboxRequest {
        container_id: cid.into(),
        netns: ns.path(),
        loopback: true,
        cni_args: "IgnoreUnknown=1;K8S_POD_NAME=web".into(),
        networks: vec![
            SandboxNetwork {
                capability_args: bridge_caps,
                ..SandboxNetwork::new(BRIDGE_NET)
            },
            SandboxNetwork {
                ifname: Some("net1".into()),
                cni_args: "K8S_POD_NAME=web-ptp".into(),
                ..SandboxNetwork::new(PTP_NET)
            },
        ],
        ..Default::default()
    };
    let req_a = sandbox(
        "sb-a",
        &ns_a,
        caps(json!({"ips": [format!("{static_ip}/24")]})),
    );
    let req_b = sandbox("sb-b", &ns_b, CapabilityArgs::new());

    let res_a = client.sandbox_add(&req_a).await.expect("sandbox ADD a");
    let res_b = client.sandbox_add(&req_b).await.expect("sandbox ADD b");
    let nets: Vec<(&str, &str)> = res_a
        .networks
        .iter()
        .map(|n| (n.network.as_str(), n.ifname.as_str()))
        .collect();
    assert_eq!(
        nets,
        [
            ("cni-loopback", "lo"),
            (BRIDGE_NET, "eth0"),
            (PTP_NET, "net1")
        ]
    );
    let ips = |r: &cnid::api::SandboxResult, ifname: &str| -> Vec<String> {
        r.interfaces
            .get(ifname)
            .map(|i| i.ips.iter().map(|ip| ip.address.clone()).collect())
            .unwrap_or_default()
    };
    // The static IP asked for on the bridge network only.
    assert_eq!(ips(&res_a, "eth0"), [format!("{static_ip}/24")]);
    assert_eq!(ns_a.ipv4_addrs("eth0"), [format!("{static_ip}/24")]);
    for (res, ns) in [(&res_a, &ns_a), (&res_b, &ns_b)] {
        assert_eq!(ns.ipv4_addrs("net1"), ips(res, "net1"));
        assert!(
            ips(res, "net1")[0].starts_with(&w.ptp_subnet.cidr()[..w.ptp_subnet.cidr().len() - 4])
        );
        assert_eq!(ns.ipv4_addrs("lo"), ["127.0.0.1/8"]);
    }
    assert!(
        ns_b.ping(static_ip, 3),
        "b cannot reach a's static IP over the bridge"
    );

    client.sandbox_check(&req_a).await.expect("sandbox CHECK a");
    client
        .sandbox_status(&req_a)
        .await
        .expect("sandbox STATUS a");
    let mine = client.attachments(Some("sb-a")).await.unwrap();
    assert_eq!(mine.len(), 3, "{mine:?}");
    // The per-network CNI_ARGS reached ptp's cache record only.
    let ptp = mine.iter().find(|a| a.network == PTP_NET).unwrap();
    assert_eq!(ptp.cni_args, "IgnoreUnknown=1;K8S_POD_NAME=web-ptp");

    client.sandbox_del(&req_a).await.expect("sandbox DEL a");
    client.sandbox_del(&req_b).await.expect("sandbox DEL b");
    client
        .sandbox_del(&req_b)
        .await
        .expect("sandbox DEL b again");
    nothing_left(&w);
    for ns in [&ns_a, &ns_b] {
        for ifname in ["eth0", "net1"] {
            assert!(!ns.exec("ip", &["link", "show", ifname]).status.success());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_network_when_none_is_named_and_a_failure_leaves_nothing() {
    require_root!();
    let (w, daemon) = world();
    let client = daemon.client().await;
    let ns = TempNetns::new();
    let plain = SandboxRequest {
        container_id: "sb-default".into(),
        netns: ns.path(),
        ..Default::default()
    };
    let res = client
        .sandbox_add(&plain)
        .await
        .expect("sandbox ADD default");
    assert_eq!(res.networks.len(), 1);
    assert_eq!(
        (
            res.networks[0].network.as_str(),
            res.networks[0].ifname.as_str()
        ),
        (BRIDGE_NET, "eth0")
    );
    client
        .sandbox_del(&plain)
        .await
        .expect("sandbox DEL default");
    nothing_left(&w);

    // The second network fails after ptp allocated: the first is deleted
    // again, the failing chain rolled back, and the error names it.
    let failing = SandboxRequest {
        container_id: "sb-fail".into(),
        netns: ns.path(),
        networks: vec![
            SandboxNetwork::new(BRIDGE_NET),
            SandboxNetwork::new(FAIL_NET),
        ],
        ..Default::default()
    };
    let err = client.sandbox_add(&failing).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(FAIL_NET) && text.contains("refused on purpose"),
        "{text}"
    );
    assert!(text.contains("deleted again"), "{text}");
    nothing_left(&w);
    assert!(!ns.exec("ip", &["link", "show", "eth0"]).status.success());
    assert!(!ns.exec("ip", &["link", "show", "eth1"]).status.success());
    // A network that does not exist is refused before anything runs.
    let unknown = SandboxRequest {
        networks: vec![SandboxNetwork::new("nope")],
        ..failing.clone()
    };
    let err = client.sandbox_add(&unknown).await.unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    nothing_left(&w);
}
