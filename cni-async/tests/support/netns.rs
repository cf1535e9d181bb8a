//! Real network namespaces for this crate's tests: the shared helpers of
//! [`cni_test_support::netns`] (unique names, subnet leases, `ip`, links,
//! bridges), plus what needs `cni-async`'s own [`Netns`]: [`TestNet`], which
//! owns a test's namespaces (made with [`NetnsGuard`]), bridge, subnets and
//! temp dir and removes them all on drop, also when the test panics; and
//! [`addrs`], [`addrs_v4`], [`ping`], [`exec_ok`] on a [`Netns`].
//!
//! Every test that uses this starts with `support::require_root!()`
//! ([`TestNet::new`] only asserts it).
#![cfg(feature = "netns")]

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use cni_async::Error;
use cni_async::netns::{Netns, NetnsGuard};
pub use cni_test_support::netns::{
    SUBNET_LOCK_DIR, SubnetLease, bridge_ports, delete_link, host_local_ips, host_uses, ip, ip_ok,
    link_exists, link_exists_in, links, try_addrs, unique_id, unique_link_name, unique_netns_name,
};
use ipnet::{IpNet, Ipv4Net};
use serde_json::{Value, json};
use tempfile::TempDir;

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
#[track_caller]
pub fn addrs(ns: &Netns, ifname: &str) -> Vec<IpNet> {
    cni_test_support::netns::addrs(ns.path(), ifname)
}

/// The IPv4 addresses of `ifname` in `ns`: what tests usually compare
/// (IPv6 link-local addresses come and go with link state).
#[track_caller]
pub fn addrs_v4(ns: &Netns, ifname: &str) -> Vec<IpNet> {
    cni_test_support::netns::addrs_v4(ns.path(), ifname)
}

/// Whether `ip` answers one ping from inside `from` within a second.
pub fn ping(from: &Netns, ip: IpAddr) -> bool {
    cni_test_support::netns::ping(from.path(), ip)
}

/// Where the reference plugins are (Debian's containernetworking-plugins).
pub const REAL_PLUGINS: &str = "/usr/lib/cni";

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
        cni_test_support::assert_root("a TestNet creates network namespaces and bridges");
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

    /// A [`Cni`](cni_async::Cni) on the reference plugins
    /// ([`REAL_PLUGINS`]) with this test's cache dir.
    pub fn real_cni(&self) -> cni_async::Cni {
        cni_async::Cni::builder()
            .plugin_dirs([REAL_PLUGINS])
            .cache_dir(self.cache_dir())
            .build()
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

    /// A 1.0.0 network `name` of one bridge plugin on this test's bridge,
    /// host-local in the first subnet with `dataDir` in the temp dir: no
    /// gateway on the bridge, no masquerading, no routes.
    pub fn bridge_list(&self, name: &str) -> cni_core::NetworkConfigList {
        cni_core::NetworkConfigList::from_value(&json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge(),
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": self.subnet().to_string() }]],
                    "dataDir": self.data_dir(),
                }
            }]
        }))
        .expect("valid list")
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

/// The namespaces of a batch test: a unique prefix (`TAG-ID-`), and every
/// namespace `PREFIX*` deleted on drop (also when the test panics).
#[derive(Debug)]
pub struct BatchNamespaces(pub String);

impl BatchNamespaces {
    /// A unique prefix starting with `tag`.
    pub fn new(tag: &str) -> BatchNamespaces {
        BatchNamespaces(format!("{tag}-{}-", unique_id()))
    }

    /// `PREFIX` + `suffix`.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.0)
    }

    /// `/run/netns/PREFIX<suffix>`.
    pub fn path(&self, suffix: &str) -> String {
        format!("{}/{}", cni_async::netns::NETNS_RUN_DIR, self.name(suffix))
    }

    /// The names `PREFIX*` in `/run/netns`, sorted.
    pub fn existing(&self) -> Vec<String> {
        let mut names: Vec<String> = Netns::list_named()
            .expect("list /run/netns")
            .into_iter()
            .filter(|n| n.starts_with(&self.0))
            .collect();
        names.sort();
        names
    }

    /// `PREFIX` + each suffix, sorted as [`Self::existing`].
    pub fn names(&self, suffixes: &[&str]) -> Vec<String> {
        let mut names: Vec<String> = suffixes.iter().map(|s| self.name(s)).collect();
        names.sort();
        names
    }
}

impl Drop for BatchNamespaces {
    fn drop(&mut self) {
        for name in self.existing() {
            let _ = Netns::delete_named(&name);
        }
    }
}
