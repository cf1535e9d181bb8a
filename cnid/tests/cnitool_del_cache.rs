//! `cnitool del` runs the plugins whenever they can run: with
//! `CNI_CACHE_DIR` a file (not a directory), so that no lock can be taken
//! and no record read, it DELs without prevResult (as libcni, decision D8)
//! and warns, instead of refusing up front. Real bridge and host-local in a
//! namespace, a bridge and a subnet of the test's own: host-local's
//! reservation is freed, the bridge port and eth0 are gone.

use std::path::Path;

use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips, link_exists_in, unique_id,
};
use crate::support::require_root;
use crate::support::tool::Sandbox;
use serde_json::json;

const PLUGIN_DIR: &str = "/usr/lib/cni";

#[test]
fn del_with_the_cache_dir_a_file_runs_the_plugins_and_warns() {
    require_root!();
    for p in ["bridge", "host-local"] {
        assert!(
            Path::new(PLUGIN_DIR).join(p).is_file(),
            "this test needs {PLUGIN_DIR}/{p}"
        );
    }
    let sb = Sandbox::new();
    let subnet = SubnetLease::new();
    let bridge = LinkGuard::new();
    let ns = TempNetns::new();
    let network = format!("delcache-{}", unique_id());
    let data_dir = sb.root().join("host-local");
    sb.conf(
        "10-delcache.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": network,
            "plugins": [{
                "type": "bridge",
                "bridge": bridge.name(),
                "ipam": {
                    "type": "host-local",
                    "dataDir": data_dir,
                    "ranges": [[{"subnet": subnet.cidr()}]]
                }
            }]
        }),
    );
    let env = [("CNI_PATH", PLUGIN_DIR)];
    sb.run_env(&["add", &network, &ns.path()], &env).ok();
    assert_eq!(host_local_ips(&data_dir, &network).len(), 1);
    assert_eq!(bridge_ports(bridge.name()).len(), 1);
    assert_eq!(ns.ipv4_addrs("eth0").len(), 1);

    let not_a_dir = sb.root().join("cache-is-a-file");
    std::fs::write(&not_a_dir, "not a directory\n").unwrap();
    let run = sb
        .run_env(
            &["del", &network, &ns.path()],
            &[
                ("CNI_PATH", PLUGIN_DIR),
                ("CNI_CACHE_DIR", not_a_dir.to_str().unwrap()),
            ],
        )
        .ok();

    assert_eq!(
        host_local_ips(&data_dir, &network),
        Vec::<String>::new(),
        "host-local's reservation freed"
    );
    assert_eq!(
        bridge_ports(bridge.name()),
        Vec::<String>::new(),
        "the bridge port gone"
    );
    assert!(!link_exists_in(ns.path(), "eth0"), "eth0 gone");
    let dir = not_a_dir.display().to_string();
    assert!(
        run.stderr.contains("WARN") && run.stderr.contains("without prevResult"),
        "warns that the DEL ran without prevResult: {}",
        run.stderr
    );
    assert!(run.stderr.contains(&dir), "names the cache: {}", run.stderr);

    // The record in the real cache is still there; a DEL with it is
    // harmless (the plugins find nothing) and removes it.
    assert_eq!(sb.cache_entries().len(), 1);
    sb.run_env(&["del", &network, &ns.path()], &env).ok();
    assert!(sb.cache_entries().is_empty());
}
