//! Real network namespaces, bridges and subnets unique to each test.
//!
//! Tests that touch the kernel's networking run in parallel threads of one
//! test binary and in parallel test binaries, and may be killed half-way.
//! Everything here is therefore unique per test and cleaned up by a guard:
//!
//! - names: `unique_id()` is the pid (5 base-36 digits) plus a per-process
//!   counter (3 digits), unique among live processes; namespace names
//!   (`cnt-ID`) and bridge names (`cntID`, 11 bytes, within Linux's 15) are
//!   also checked against what exists, to step over leftovers of killed runs;
//! - subnets: a /24 from 10.200.0.0 - 10.254.255.0, leased under an `flock`
//!   on `/run/cni-async-tests/subnets/10.X.Y.0`. The kernel drops the lock
//!   when the holder exits, even on SIGKILL, so there are no stale leases; a
//!   subnet with any address or route on the host (a leftover bridge) is
//!   skipped;
//! - [`TestNet`] owns a temp dir (with host-local's `dataDir` and a cache
//!   dir), its namespaces, its bridge name and subnet, and deletes them all
//!   on drop, also when the test panics.
//!
//! Every test that uses this calls [`require_root`] first (TestNet::new does).
#![cfg(feature = "netns")]

use std::fs::{self, File};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use cni_async::Error;
use cni_async::netns::{NETNS_RUN_DIR, Netns, NetnsGuard};
use ipnet::{IpNet, Ipv4Net};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde_json::{Value, json};
use tempfile::TempDir;

/// Where subnet leases are locked.
pub const SUBNET_LOCK_DIR: &str = "/run/cni-async-tests/subnets";
/// Second octet of the first test subnet (10.200.0.0/24).
const SUBNET_FIRST_OCTET: u32 = 200;
/// How many /24s the test range has (10.200.0.0 - 10.254.255.0).
const SUBNET_COUNT: u32 = 55 * 256;

/// Panics unless the test runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root: it creates network namespaces (run the tests as root)"
    );
}

/// 8 characters unique among the live processes of this machine: the pid in
/// 5 base-36 digits, then a per-process counter in 3.
pub fn unique_id() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 36u32.pow(3);
    format!("{}{}", base36(std::process::id(), 5), base36(n, 3))
}

fn base36(mut n: u32, width: usize) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    String::from_utf8(out).expect("ascii")
}

/// A namespace name (`cnt-ID`) not in use in `/run/netns`.
pub fn unique_netns_name() -> String {
    loop {
        let name = format!("cnt-{}", unique_id());
        if !Path::new(NETNS_RUN_DIR).join(&name).exists() {
            return name;
        }
    }
}

/// A link name (`cntID`, 11 bytes) not in use in the host namespace.
pub fn unique_link_name() -> String {
    loop {
        let name = format!("cnt{}", unique_id());
        if !link_exists(&name) {
            return name;
        }
    }
}

/// Whether a link of this name exists in the host namespace (the one the
/// test threads are in).
pub fn link_exists(name: &str) -> bool {
    let dev = fs::read_to_string("/proc/thread-self/net/dev")
        .expect("cannot read /proc/thread-self/net/dev");
    dev.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .any(|(n, _)| n.trim() == name)
}

/// Deletes a host link if it exists (`ip link del NAME`).
pub fn delete_link(name: &str) -> Result<(), String> {
    if !link_exists(name) {
        return Ok(());
    }
    let out = ip(&["link", "del", name]);
    // It may have gone meanwhile (a veth whose peer's namespace died).
    if out.status.success() || !link_exists(name) {
        Ok(())
    } else {
        Err(format!(
            "ip link del {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim_end()
        ))
    }
}

/// Runs `ip ARGS` in the host namespace (stdout and stderr captured).
pub fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run ip")
}

/// Runs `ip ARGS` in the host namespace and panics unless it succeeds;
/// returns its stdout.
pub fn ip_ok(args: &[&str]) -> String {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd ARGS` inside `ns` and panics unless it succeeds; returns its
/// stdout.
pub fn exec_ok(ns: &Netns, program: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = ns
        .exec_in(cmd)
        .unwrap_or_else(|e| panic!("{program} {} in {ns}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "{program} {} in {ns} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// All addresses of `ifname` in `ns` (IPv6 link-local ones included).
pub fn addrs(ns: &Netns, ifname: &str) -> Vec<IpNet> {
    ns.addrs(ifname)
        .unwrap_or_else(|e| panic!("addresses of {ifname} in {ns}: {e}"))
}

/// The IPv4 addresses of `ifname` in `ns`: what tests usually compare
/// (IPv6 link-local addresses come and go with link state).
pub fn addrs_v4(ns: &Netns, ifname: &str) -> Vec<IpNet> {
    addrs(ns, ifname)
        .into_iter()
        .filter(|a| matches!(a, IpNet::V4(_)))
        .collect()
}

/// Whether `ip` answers one ping from inside `from` within a second.
pub fn ping(from: &Netns, ip: IpAddr) -> bool {
    from.ping(ip)
        .unwrap_or_else(|e| panic!("cannot run ping in {from}: {e}"))
}

/// The IPs host-local has allocated for `network` in `data_dir`: the files
/// of `data_dir/network` whose names are IP addresses (not `lock` or
/// `last_reserved_ip.0`), sorted. Empty when the dir does not exist.
pub fn host_local_ips(data_dir: &Path, network: &str) -> Vec<String> {
    let dir = data_dir.join(network);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("cannot list {}: {e}", dir.display()),
    };
    let mut ips: Vec<IpAddr> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    ips.sort();
    ips.into_iter().map(|ip| ip.to_string()).collect()
}

/// A /24 in 10.200.0.0 - 10.254.255.0 that no other test (in this or any
/// other process) holds while this value lives.
#[derive(Debug)]
pub struct SubnetLease {
    net: Ipv4Net,
    _lock: Flock<File>,
}

impl SubnetLease {
    /// Leases a free subnet; panics when the whole range is taken.
    pub fn new() -> SubnetLease {
        // Start where other processes are unlikely to be: spread by pid.
        let pid = std::process::id();
        let start = pid
            .wrapping_mul(2_654_435_761)
            .wrapping_add(unique_counter())
            % SUBNET_COUNT;
        SubnetLease::probe_from(start)
    }

    /// Leases the first free subnet from `first` on (wrapping around);
    /// `first` must be a /24 of the test range.
    pub fn starting_at(first: Ipv4Net) -> SubnetLease {
        let [a, b, c, _] = first.addr().octets();
        let b = u32::from(b);
        assert!(
            a == 10 && (SUBNET_FIRST_OCTET..SUBNET_FIRST_OCTET + SUBNET_COUNT / 256).contains(&b),
            "{first} is not in the test range"
        );
        SubnetLease::probe_from((b - SUBNET_FIRST_OCTET) * 256 + u32::from(c))
    }

    fn probe_from(start: u32) -> SubnetLease {
        fs::create_dir_all(SUBNET_LOCK_DIR)
            .unwrap_or_else(|e| panic!("cannot create {SUBNET_LOCK_DIR}: {e}"));
        for k in 0..SUBNET_COUNT {
            let i = (start + k) % SUBNET_COUNT;
            let octet2 = u8::try_from(SUBNET_FIRST_OCTET + i / 256).expect("in range");
            let octet3 = u8::try_from(i % 256).expect("in range");
            let net = Ipv4Net::new(Ipv4Addr::new(10, octet2, octet3, 0), 24).expect("valid /24");
            let path = Path::new(SUBNET_LOCK_DIR).join(net.addr().to_string());
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => lock,
                Err((_, Errno::EWOULDBLOCK)) => continue,
                Err((_, e)) => panic!("cannot lock {}: {e}", path.display()),
            };
            if host_uses(net) {
                continue;
            }
            return SubnetLease { net, _lock: lock };
        }
        panic!("no free test subnet in 10.200.0.0 - 10.254.255.0");
    }

    /// The subnet.
    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// The subnet's address `.n`.
    pub fn host(&self, n: u8) -> Ipv4Addr {
        let [a, b, c, _] = self.net.addr().octets();
        Ipv4Addr::new(a, b, c, n)
    }

    /// The lock file of this lease (for tests of the lease itself).
    pub fn lock_path(&self) -> PathBuf {
        Path::new(SUBNET_LOCK_DIR).join(self.net.addr().to_string())
    }
}

fn unique_counter() -> u32 {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Whether the host has an address in `net` or a route into it (a leftover
/// of a killed run, or a real network).
pub fn host_uses(net: Ipv4Net) -> bool {
    let net = net.to_string();
    let addrs: Value = serde_json::from_str(&ip_ok(&["-4", "-j", "addr", "show", "to", &net]))
        .expect("ip -j addr output is JSON");
    let routes: Value = serde_json::from_str(&ip_ok(&[
        "-4", "-j", "route", "show", "table", "all", "root", &net,
    ]))
    .expect("ip -j route output is JSON");
    let has_addr = addrs.as_array().is_some_and(|links| {
        links.iter().any(|l| {
            l.get("addr_info")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        })
    });
    let has_route = routes.as_array().is_some_and(|r| !r.is_empty());
    has_addr || has_route
}

/// One test's network resources, all removed on drop (also on panic): its
/// namespaces, its bridge and other host links it was told about, its
/// subnet leases, its temp dir, and whatever cleanups were deferred.
///
/// ```ignore
/// let mut net = TestNet::new();
/// let ns = net.netns();                  // /run/netns/cnt-...
/// let ipam = net.host_local_ipam();      // host-local in net.subnet()
/// // ... run a bridge plugin on net.bridge() with CNI_NETNS = ns.path() ...
/// assert!(ping(&ns, net.gateway().into()));
/// ```
pub struct TestNet {
    id: String,
    bridge: String,
    subnets: Vec<SubnetLease>,
    namespaces: Vec<NetnsGuard>,
    links: Vec<String>,
    cleanups: Vec<Box<dyn FnOnce() + Send>>,
    dir: Option<TempDir>,
}

impl std::fmt::Debug for TestNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNet")
            .field("id", &self.id)
            .field("bridge", &self.bridge)
            .field("subnets", &self.subnets)
            .field("namespaces", &self.namespaces)
            .field("links", &self.links)
            .finish_non_exhaustive()
    }
}

impl TestNet {
    /// Checks for root, leases a subnet, reserves a bridge name (the bridge
    /// itself is made by whoever needs it, usually the bridge plugin; it is
    /// deleted on drop if it exists) and makes a temp dir.
    pub fn new() -> TestNet {
        require_root();
        let bridge = unique_link_name();
        let id = bridge.trim_start_matches("cnt").to_owned();
        let dir = tempfile::Builder::new()
            .prefix(&format!("cni-test-{id}-"))
            .tempdir()
            .expect("cannot make a temp dir");
        TestNet {
            id,
            links: vec![bridge.clone()],
            bridge,
            subnets: vec![SubnetLease::new()],
            namespaces: Vec::new(),
            cleanups: Vec::new(),
            dir: Some(dir),
        }
    }

    /// This test's unique id (8 characters, `[0-9a-z]`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The temp dir, removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("temp dir lives until drop").path()
    }

    /// A `dataDir` for host-local inside the temp dir (not created: the
    /// plugin makes it).
    pub fn data_dir(&self) -> PathBuf {
        self.dir().join("host-local")
    }

    /// A result-cache dir inside the temp dir (not created).
    pub fn cache_dir(&self) -> PathBuf {
        self.dir().join("cache")
    }

    /// The bridge name reserved for this test (`cntID`, 11 bytes).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The test's first subnet (a /24 in 10.200.0.0 - 10.254.255.0).
    pub fn subnet(&self) -> Ipv4Net {
        self.subnets[0].net()
    }

    /// Address `.n` of the first subnet.
    pub fn host(&self, n: u8) -> Ipv4Addr {
        self.subnets[0].host(n)
    }

    /// The first subnet's `.1`, the gateway host-local hands out by default.
    pub fn gateway(&self) -> Ipv4Addr {
        self.host(1)
    }

    /// Leases one more subnet for this test.
    pub fn another_subnet(&mut self) -> Ipv4Net {
        let lease = SubnetLease::new();
        let net = lease.net();
        self.subnets.push(lease);
        net
    }

    /// An `ipam` object for host-local: the first subnet, `dataDir` in the
    /// temp dir, no routes (never a default route).
    pub fn host_local_ipam(&self) -> Value {
        json!({
            "type": "host-local",
            "ranges": [[{ "subnet": self.subnet().to_string(), "gateway": self.gateway().to_string() }]],
            "dataDir": self.data_dir(),
        })
    }

    /// Creates a new named namespace (`cnt-ID`), deleted on drop; returns
    /// another handle on it (drop that before the TestNet, or the namespace
    /// lives until it is dropped).
    pub fn netns(&mut self) -> Netns {
        for _ in 0..100 {
            let name = unique_netns_name();
            match NetnsGuard::create(&name) {
                Ok(guard) => {
                    let handle = guard
                        .try_clone()
                        .unwrap_or_else(|e| panic!("cannot dup the fd of {name}: {e}"));
                    self.namespaces.push(guard);
                    return handle;
                }
                // Lost a race with someone making the same name: next one.
                Err(Error::Netns { source, .. })
                    if source.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("cannot create network namespace {name}: {e}"),
            }
        }
        panic!("no free network namespace name after 100 tries");
    }

    /// Deletes the host link `name` on drop (if it exists then).
    pub fn track_link(&mut self, name: &str) {
        self.links.push(name.to_owned());
    }

    /// Runs `cleanup` on drop, before namespaces and links are deleted
    /// (last deferred first).
    pub fn defer(&mut self, cleanup: impl FnOnce() + Send + 'static) {
        self.cleanups.push(Box::new(cleanup));
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Never panic here: this often runs while a failed test unwinds.
        while let Some(cleanup) = self.cleanups.pop() {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(cleanup)).is_err() {
                eprintln!("TestNet {}: a deferred cleanup panicked", self.id);
            }
        }
        for guard in self.namespaces.drain(..).rev() {
            let path = guard.path().to_owned();
            if let Err(e) = guard.delete() {
                eprintln!("TestNet {}: cannot delete {}: {e}", self.id, path.display());
            }
        }
        for link in self.links.drain(..).rev() {
            if let Err(e) = delete_link(&link) {
                eprintln!("TestNet {}: {e}", self.id);
            }
        }
        // Only now may another test take the subnets.
        self.subnets.clear();
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_owned();
            if let Err(e) = dir.close() {
                eprintln!("TestNet {}: cannot remove {}: {e}", self.id, path.display());
            }
        }
    }
}

/// The ports of the host bridge `bridge` (its `brif` entries); empty when
/// there is no such bridge.
pub fn bridge_ports(bridge: &str) -> Vec<String> {
    fs::read_dir(format!("/sys/class/net/{bridge}/brif"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl TestNet {
    /// Creates the test's bridge up front with the fixed MAC `mac`.
    /// Otherwise Linux gives a bridge the lowest MAC of its ports, so the
    /// bridge's MAC changes when the second container joins, and the bridge
    /// plugin's CHECK of the first container fails with "Bridge interface
    /// ... Mac doesn't match" (a property of the reference bridge plugin,
    /// not of this runtime).
    pub fn precreate_bridge(&self, mac: &str) {
        let br = self.bridge();
        ip_ok(&["link", "add", "name", br, "type", "bridge"]);
        ip_ok(&["link", "set", br, "address", mac]);
        ip_ok(&["link", "set", br, "up"]);
    }
}
