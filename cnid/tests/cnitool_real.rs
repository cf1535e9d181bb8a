//! cnitool with the real reference plugins in `/usr/lib/cni`, as root:
//! loopback + bridge (host-local IPAM) + tuning on two namespaces of our
//! own, a ping between them, CHECK, DEL, and nothing left behind.
//!
//! Network rule: the only traffic is between the two namespaces over the
//! test's own bridge, in the test's own /24; no ipMasq, no gateway on the
//! bridge, no route other than the connected subnet.

use crate::support;
use std::path::Path;

use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, host_local_ips, ip_json, link_exists, unique_id,
};
use crate::support::require_root;
use crate::support::tool::{Sandbox, expected_container_id};
use serde_json::{Value, json};

const PLUGIN_DIR: &str = "/usr/lib/cni";

fn require_plugins() {
    for p in ["loopback", "bridge", "host-local", "tuning"] {
        assert!(
            Path::new(PLUGIN_DIR).join(p).is_file(),
            "this test needs the reference plugin {PLUGIN_DIR}/{p} (Debian: containernetworking-plugins)"
        );
    }
}

/// The host-side veth of each port of `bridge`.
fn bridge_ports(bridge: &str) -> Vec<String> {
    ip_json(&["link", "show", "master", bridge])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
        .collect()
}

/// The bridge plugin on `bridge`, host-local in `subnet`: no gateway, no
/// masquerading (the network rule).
fn bridge_plugin(bridge: &str, data_dir: &Path, subnet: &SubnetLease) -> Value {
    json!({
        "type": "bridge",
        "bridge": bridge,
        "isGateway": false,
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "dataDir": data_dir,
            "ranges": [[{"subnet": subnet.cidr()}]]
        }
    })
}

#[test]
fn bridge_network_between_two_namespaces() {
    require_root!();
    require_plugins();

    let sb = Sandbox::new();
    let subnet = SubnetLease::new();
    let bridge = LinkGuard::new();
    let ns1 = TempNetns::new();
    let ns2 = TempNetns::new();
    let network = format!("cnitool-real-{}", unique_id());
    let data_dir = sb.root().join("host-local");
    let tuning_dir = sb.root().join("tuning");
    let config = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {"type": "loopback"},
            bridge_plugin(bridge.name(), &data_dir, &subnet),
            {"type": "tuning", "mtu": 1400, "dataDir": tuning_dir}
        ]
    });
    sb.conf("10-real.conflist", &config);
    // The bridge is made up front with a fixed MAC. Otherwise Linux gives a
    // bridge the lowest MAC of its ports, so its MAC changes when the second
    // namespace joins, and the bridge plugin's CHECK of the first fails with
    // "Bridge interface ... Mac doesn't match" (the cached result holds the
    // old MAC). The plugin takes an existing bridge as it is.
    support::netns::ip_ok(&["link", "add", bridge.name(), "type", "bridge"]);
    support::netns::ip_ok(&["link", "set", bridge.name(), "address", "02:cc:00:00:00:01"]);
    let env = [("CNI_PATH", PLUGIN_DIR)];

    // ADD both.
    let mut ips = Vec::new();
    for ns in [&ns1, &ns2] {
        let run = sb.run_env(&["add", &network, &ns.path()], &env).ok();
        let result: Value = run.stdout_json();
        assert_eq!(result["cniVersion"], "1.0.0", "{result}");
        let addr = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address in {result}"))
            .to_owned();
        // The interface really has it.
        assert_eq!(
            ns.ipv4_addrs("eth0"),
            std::slice::from_ref(&addr),
            "in {}",
            ns.name()
        );
        assert_eq!(ns.mtu("eth0"), Some(1400), "tuning set the MTU");
        let lo = ns.ipv4_addrs("lo");
        assert_eq!(lo, ["127.0.0.1/8"], "loopback is up in {}", ns.name());
        ips.push(addr);
    }
    assert_ne!(ips[0], ips[1]);
    let ip_of = |a: &str| -> std::net::Ipv4Addr {
        a.split('/')
            .next()
            .unwrap()
            .parse()
            .expect("an IPv4 address")
    };
    for a in &ips {
        assert!(
            ip_of(a).octets()[..3] == subnet.host(0).octets()[..3],
            "{a} outside {}",
            subnet.cidr()
        );
    }
    assert_eq!(host_local_ips(&data_dir, &network).len(), 2);
    assert_eq!(bridge_ports(bridge.name()).len(), 2);
    assert_eq!(sb.cache_entries().len(), 2);
    // No default route was added in either namespace.
    for ns in [&ns1, &ns2] {
        let routes = ip_json(&["-n", ns.name(), "-4", "route", "show", "default"]);
        assert_eq!(routes, json!([]), "default route in {}", ns.name());
    }

    // Traffic between them, over our bridge.
    assert!(
        ns1.ping(ip_of(&ips[1]), 3),
        "{} cannot ping {}",
        ns1.name(),
        ips[1]
    );
    assert!(
        ns2.ping(ip_of(&ips[0]), 3),
        "{} cannot ping {}",
        ns2.name(),
        ips[0]
    );

    // CHECK both.
    for ns in [&ns1, &ns2] {
        let run = sb.run_env(&["check", &network, &ns.path()], &env).ok();
        assert_eq!(run.stdout, "");
    }

    // DEL both: addresses released, veths gone, cache empty.
    for ns in [&ns1, &ns2] {
        sb.run_env(&["del", &network, &ns.path()], &env).ok();
        assert!(
            sb.cache_record(&network, &expected_container_id(&ns.path()), "eth0")
                .is_none()
        );
    }
    assert_eq!(host_local_ips(&data_dir, &network), Vec::<String>::new());
    assert_eq!(bridge_ports(bridge.name()), Vec::<String>::new());
    for ns in [&ns1, &ns2] {
        let links = ip_json(&["-n", ns.name(), "link", "show"]);
        let names: Vec<&str> = links
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str())
            .collect();
        assert_eq!(names, ["lo"], "in {}", ns.name());
    }
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
    // A second DEL is fine (the spec requires it).
    sb.run_env(&["del", &network, &ns1.path()], &env).ok();

    // The bridge is ours to delete (the guard would do it on failure).
    assert!(link_exists(bridge.name()));
    support::netns::ip_ok(&["link", "del", bridge.name()]);
    assert!(!link_exists(bridge.name()));
}

/// The bridge plugin's CHECK compares the bridge's MAC with the one in
/// the cached result. A bridge without a fixed MAC takes the lowest MAC of
/// its ports, so it moves when a container with a lower veth MAC joins and
/// the CHECK of the earlier containers fails ("Bridge interface X Mac
/// doesn't match"). Which MAC a new veth gets is random: the test moves
/// the MAC itself, as such a join would, and cnitool's error carries the
/// hint (a fixed-MAC bridge, or disableCheck).
#[test]
fn a_check_after_the_bridge_mac_moved_says_how_to_avoid_it() {
    require_root!();
    require_plugins();

    let sb = Sandbox::new();
    let subnet = SubnetLease::new();
    let bridge = LinkGuard::new();
    let ns = TempNetns::new();
    let network = format!("cnitool-mac-{}", unique_id());
    let data_dir = sb.root().join("host-local");
    let config = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [bridge_plugin(bridge.name(), &data_dir, &subnet)]
    });
    sb.conf("10-mac.conflist", &config);
    let env = [("CNI_PATH", PLUGIN_DIR)];
    sb.run_env(&["add", &network, &ns.path()], &env).ok();
    sb.run_env(&["check", &network, &ns.path()], &env).ok();

    support::netns::ip_ok(&["link", "set", bridge.name(), "address", "02:cc:00:00:00:02"]);
    let err = sb.run_env(&["check", &network, &ns.path()], &env).fails();
    assert!(err.contains("Mac doesn't match"), "{err}");
    assert!(
        err.contains("\nhint: the bridge's MAC changed since the ADD")
            && err.contains("fixed MAC")
            && err.contains("disableCheck"),
        "{err}"
    );
    let obj = sb
        .run_env(&["--json-errors", "check", &network, &ns.path()], &env)
        .fails_json();
    assert!(
        obj["details"]
            .as_str()
            .is_some_and(|d| d.contains("fixed MAC")),
        "{obj}"
    );

    sb.run_env(&["del", &network, &ns.path()], &env).ok();
    assert!(host_local_ips(&data_dir, &network).is_empty());
    assert!(
        link_exists(bridge.name()),
        "the plugin never deletes the bridge"
    );
}
