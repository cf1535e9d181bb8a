//! Real network namespaces, links and subnets unique to each test, removed
//! by guards on drop (also when the test panics).
//!
//! - Names: the pid in base 36 plus a per-process counter, checked against
//!   what exists, so parallel tests and parallel test binaries never clash.
//! - Subnets: a /24 from 10.200.0.0 - 10.254.255.0 leased under an `flock`
//!   on `/run/cni-async-tests/subnets/10.X.Y.0`, the same lease files the
//!   `cni-async` tests use, so the two crates' tests can run at once. The
//!   kernel drops the lock when the holder dies, so leases never go stale;
//!   a subnet that has an address or route on the host is skipped.

use std::fs::{self, File};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;

/// Where subnet leases are locked (shared with the cni-async tests).
pub const SUBNET_LOCK_DIR: &str = "/run/cni-async-tests/subnets";
/// Where `ip netns add` puts namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Panics unless the test runs as root (effective UID 0, from
/// `/proc/self/status`).
pub fn require_root() {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("?");
    assert_eq!(
        euid, "0",
        "this test needs root: it creates network namespaces and bridges with `ip` \
         and runs the real plugins in /usr/lib/cni (run the tests as root)"
    );
}

/// 8 characters unique among the live processes: pid (5 base-36 digits) and
/// a per-process counter (3).
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

/// Runs `ip ARGS` (stdout and stderr captured).
pub fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run ip")
}

/// Runs `ip ARGS`, panics unless it succeeds; returns stdout.
#[track_caller]
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

/// `ip -j ARGS` parsed.
#[track_caller]
pub fn ip_json(args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let text = ip_ok(&all);
    if text.trim().is_empty() {
        return Value::Array(Vec::new());
    }
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("ip {} output is not JSON ({e}): {text}", all.join(" ")))
}

/// Whether a link of this name exists in the host namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// A named network namespace (`ip netns add`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `cnt-<unique id>`.
    pub fn new() -> Netns {
        loop {
            let name = format!("cnt-{}", unique_id());
            if Path::new(NETNS_DIR).join(&name).exists() {
                continue;
            }
            ip_ok(&["netns", "add", &name]);
            return Netns { name };
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> String {
        format!("{NETNS_DIR}/{}", self.name)
    }

    /// Runs `PROGRAM ARGS` inside (`ip netns exec`).
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("cannot run ip netns exec")
    }

    /// The IPv4 addresses (`a.b.c.d/len`) of `ifname` inside.
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<String> {
        let v = ip_json(&["-n", &self.name, "addr", "show", "dev", ifname]);
        v.as_array()
            .into_iter()
            .flatten()
            .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
            .filter(|a| a["family"] == "inet")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]))
            .collect()
    }

    /// The MTU of `ifname` inside.
    pub fn mtu(&self, ifname: &str) -> Option<u64> {
        let v = ip_json(&["-n", &self.name, "link", "show", "dev", ifname]);
        v.get(0)?.get("mtu")?.as_u64()
    }

    /// Whether `ip` answers a ping from inside (`ping -c1 -W1`), trying up
    /// to `tries` times (the first may race the link coming up).
    pub fn ping(&self, ip: Ipv4Addr, tries: u32) -> bool {
        let ip = ip.to_string();
        (0..tries).any(|_| self.exec("ping", &["-c1", "-W1", &ip]).status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = ip(&["netns", "del", &self.name]);
        if !out.status.success() && Path::new(NETNS_DIR).join(&self.name).exists() {
            eprintln!(
                "cleanup: ip netns del {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
    }
}

/// A host link name reserved for the test (`cnt<unique id>`, 11 bytes);
/// the link, if someone created it, is deleted on drop.
#[derive(Debug)]
pub struct LinkGuard {
    name: String,
}

impl LinkGuard {
    /// Reserves a name not in use.
    pub fn new() -> LinkGuard {
        loop {
            let name = format!("cnt{}", unique_id());
            if !link_exists(&name) {
                return LinkGuard { name };
            }
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if link_exists(&self.name) {
            let out = ip(&["link", "del", &self.name]);
            if !out.status.success() && link_exists(&self.name) {
                eprintln!(
                    "cleanup: ip link del {} failed: {}",
                    self.name,
                    String::from_utf8_lossy(&out.stderr).trim_end()
                );
            }
        }
    }
}

/// A /24 that no other test holds while this value lives.
#[derive(Debug)]
pub struct SubnetLease {
    third: (u8, u8),
    _lock: File,
}

impl SubnetLease {
    /// Leases a free /24 in 10.200.0.0 - 10.254.255.0.
    pub fn new() -> SubnetLease {
        const FIRST: u32 = 200;
        const COUNT: u32 = 55 * 256;
        fs::create_dir_all(SUBNET_LOCK_DIR)
            .unwrap_or_else(|e| panic!("cannot create {SUBNET_LOCK_DIR}: {e}"));
        let start = std::process::id().wrapping_mul(2_654_435_761) % COUNT;
        for k in 0..COUNT {
            let i = (start + k) % COUNT;
            let b = u8::try_from(FIRST + i / 256).expect("in range");
            let c = u8::try_from(i % 256).expect("in range");
            let path = PathBuf::from(SUBNET_LOCK_DIR).join(format!("10.{b}.{c}.0"));
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => {
                    panic!("cannot lock {}: {e}", path.display())
                }
            }
            let lease = SubnetLease {
                third: (b, c),
                _lock: file,
            };
            if host_uses(&lease.cidr()) {
                continue;
            }
            return lease;
        }
        panic!("no free test subnet in 10.200.0.0 - 10.254.255.0");
    }

    /// `10.b.c.0/24`.
    pub fn cidr(&self) -> String {
        format!("10.{}.{}.0/24", self.third.0, self.third.1)
    }

    /// Address `.n`.
    pub fn host(&self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.third.0, self.third.1, n)
    }
}

/// Whether the host has an address in `cidr` or a route into it.
fn host_uses(cidr: &str) -> bool {
    let addrs = ip_json(&["-4", "addr", "show", "to", cidr]);
    let routes = ip_json(&["-4", "route", "show", "table", "all", "root", cidr]);
    let has_addr = addrs.as_array().is_some_and(|links| {
        links
            .iter()
            .any(|l| l["addr_info"].as_array().is_some_and(|a| !a.is_empty()))
    });
    has_addr || routes.as_array().is_some_and(|r| !r.is_empty())
}

/// The IPs host-local holds for `network` in `data_dir` (files named like
/// an IP address; not `lock` or `last_reserved_ip.0`).
pub fn host_local_ips(data_dir: &Path, network: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(data_dir.join(network)) else {
        return Vec::new();
    };
    let mut ips: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    ips.sort();
    ips
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
