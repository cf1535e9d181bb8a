//! The test-support module for real namespaces (`tests/support/netns.rs`)
//! does what the other tests rely on: unique names and subnets, and a
//! `TestNet` that cleans up even when a test panics. Needs root.
#![cfg(feature = "netns")]

use crate::support;
use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::netns::{
    SubnetLease, TestNet, addrs_v4, host_local_ips, host_uses, ip_ok, link_exists, ping, unique_id,
    unique_link_name, unique_netns_name,
};
use crate::support::require_root;
use cni_async::netns::NETNS_RUN_DIR;
use serde_json::{Value, json};

/// Polls `cond` for up to 10 s (namespace teardown in the kernel is
/// asynchronous: veths in a deleted namespace go away a moment later).
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still not true after 10s: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn testnet_removes_everything_it_made_when_the_test_panics() {
    require_root!();
    let deferred = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(Vec<PathBuf>, String, String, PathBuf, PathBuf)>();
    let flag = deferred.clone();
    let joined = std::thread::spawn(move || {
        let mut net = TestNet::new();
        let a = net.netns();
        let b = net.netns();
        ip_ok(&["link", "add", net.bridge(), "type", "bridge"]);
        let extra = unique_link_name();
        ip_ok(&["link", "add", &extra, "type", "bridge"]);
        net.track_link(&extra);
        net.defer(move || flag.store(true, Ordering::SeqCst));
        fs::create_dir_all(net.data_dir()).unwrap();
        let subnet_lock =
            Path::new(support::netns::SUBNET_LOCK_DIR).join(net.subnet().addr().to_string());
        tx.send((
            vec![a.path().to_owned(), b.path().to_owned()],
            net.bridge().to_owned(),
            extra,
            net.dir().to_owned(),
            subnet_lock,
        ))
        .unwrap();
        panic!("a failing test");
    })
    .join();
    assert!(joined.is_err());
    let (namespaces, bridge, extra, dir, subnet_lock) = rx.recv().unwrap();

    for ns in &namespaces {
        assert!(!ns.exists(), "{} left behind", ns.display());
    }
    assert!(!link_exists(&bridge), "bridge {bridge} left behind");
    assert!(!link_exists(&extra), "tracked link {extra} left behind");
    assert!(
        deferred.load(Ordering::SeqCst),
        "deferred cleanup did not run"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
    // The subnet's lock was released: we can take it now.
    let file = fs::File::open(&subnet_lock).unwrap();
    assert!(
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok(),
        "subnet lock {} still held",
        subnet_lock.display()
    );
}

#[test]
fn subnet_leases_are_exclusive_across_threads_and_processes() {
    require_root!();
    let leases: Vec<SubnetLease> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16).map(|_| s.spawn(SubnetLease::new)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let nets: HashSet<_> = leases.iter().map(|l| l.net()).collect();
    assert_eq!(nets.len(), leases.len(), "duplicate subnets: {nets:?}");
    for lease in &leases {
        let net = lease.net();
        assert_eq!(net.prefix_len(), 24);
        let [a, b, _, d] = net.addr().octets();
        assert!(a == 10 && (200..=254).contains(&b) && d == 0, "{net}");
        assert_eq!(lease.host(7).octets()[3], 7);
        // Another process (another test binary) cannot take it.
        let status = Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "42"])
            .arg(lease.lock_path())
            .arg("true")
            .status()
            .expect("run flock(1)");
        assert_eq!(
            status.code(),
            Some(42),
            "{net} is not locked against other processes"
        );
    }
    // Released on drop: checked in cni-test-support's own tests, in a lock
    // dir of their own. Here another test may take a freed subnet at once.
}

#[test]
fn held_subnets_and_subnets_in_use_on_the_host_are_skipped() {
    require_root!();
    let mut net = TestNet::new();
    // A subnet held by another lease is skipped.
    let held = SubnetLease::new();
    let next = SubnetLease::starting_at(held.net());
    assert_ne!(next.net(), held.net());

    // A subnet with an address on the host (as a killed run's bridge would
    // have) is skipped even when nobody holds its lock.
    let taken = next.net();
    drop(next);
    assert!(!host_uses(taken));
    let leftover = unique_link_name();
    net.track_link(&leftover);
    ip_ok(&["link", "add", &leftover, "type", "bridge"]);
    let gw = std::net::Ipv4Addr::from(u32::from(taken.addr()) + 1);
    ip_ok(&["addr", "add", &format!("{gw}/24"), "dev", &leftover]);
    assert!(host_uses(taken));
    let lease = SubnetLease::starting_at(taken);
    assert_ne!(
        lease.net(),
        taken,
        "{taken} is used on the host but was leased"
    );
}

#[test]
fn unique_names_fit_linux_limits_and_do_not_repeat() {
    let ids: HashSet<String> = (0..2000).map(|_| unique_id()).collect();
    assert_eq!(ids.len(), 2000);
    for _ in 0..50 {
        let link = unique_link_name();
        assert!(link.len() <= 15, "{link} is longer than IFNAMSIZ-1");
        assert!(link.starts_with("cnt"));
        let ns = unique_netns_name();
        assert!(!Path::new(NETNS_RUN_DIR).join(&ns).exists());
    }
}

#[test]
fn host_local_ips_lists_only_the_address_files() {
    let dir = tempfile::tempdir().unwrap();
    assert!(host_local_ips(dir.path(), "mynet").is_empty(), "no dir yet");
    let net_dir = dir.path().join("mynet");
    fs::create_dir(&net_dir).unwrap();
    for name in [
        "10.201.3.10",
        "10.201.3.2",
        "fd00::5",
        "lock",
        "last_reserved_ip.0",
    ] {
        fs::write(net_dir.join(name), "id\neth0").unwrap();
    }
    assert_eq!(
        host_local_ips(dir.path(), "mynet"),
        vec!["10.201.3.2", "10.201.3.10", "fd00::5"]
    );
}

/// Runs a real plugin from `/usr/lib/cni` with `conf` on stdin.
fn run_plugin(command: &str, conf: &Value, netns: &Path, container: &str) -> Value {
    let plugin_dir = Path::new("/usr/lib/cni");
    let binary = plugin_dir.join(conf["type"].as_str().unwrap());
    assert!(
        binary.exists(),
        "{} is missing: install the reference plugins (make setup)",
        binary.display()
    );
    let mut child = Command::new(&binary)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} {command} failed: {} {}",
        binary.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

#[test]
fn testnet_serves_a_real_bridge_plugin_and_cleans_up_after_it() {
    require_root!();
    let mut net = TestNet::new();
    let ns = net.netns();
    let network = format!("net-{}", net.id());
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "type": "bridge",
        "bridge": net.bridge(),
        "isGateway": true,
        "ipMasq": false,
        "ipam": net.host_local_ipam(),
    });
    let result = run_plugin("ADD", &conf, ns.path(), net.id());

    let ip: std::net::Ipv4Addr = result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(net.subnet().contains(&ip), "{ip} outside {}", net.subnet());
    assert_eq!(
        host_local_ips(&net.data_dir(), &network),
        vec![ip.to_string()]
    );
    assert_eq!(
        addrs_v4(&ns, "eth0"),
        vec![format!("{ip}/24").parse().unwrap()]
    );
    assert!(link_exists(net.bridge()));
    assert!(ping(&ns, IpAddr::V4(net.gateway())), "container -> bridge");
    // No default route was added: only the subnet is reachable.
    let routes = support::netns::exec_ok(&ns, "ip", &["-4", "route", "show", "default"]);
    assert!(
        routes.trim().is_empty(),
        "default route in the container: {routes}"
    );
    let host_veth = result["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert!(link_exists(&host_veth));

    let bridge = net.bridge().to_owned();
    let data_dir = net.data_dir();
    drop(ns);
    drop(net);
    assert!(!link_exists(&bridge), "bridge left behind");
    assert!(!data_dir.exists());
    eventually(&format!("host veth {host_veth} is gone"), || {
        !link_exists(&host_veth)
    });
}
