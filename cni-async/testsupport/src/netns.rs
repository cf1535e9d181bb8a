//! Real network namespaces, links, bridges and subnets unique to each test,
//! and what tests ask about a namespace.
//!
//! Tests that touch the kernel's networking run in parallel threads of one
//! test binary and in parallel test binaries (of several crates), and may be
//! killed half-way. Everything here is therefore unique per test and
//! cleaned up by a guard on drop, also when the test panics:
//!
//! - names: [`unique_id`] is the pid (5 base-36 digits) plus a per-process
//!   counter (3 digits), unique among live processes; namespace names
//!   (`cnt-ID`) and link names (`cntID`, 11 bytes, within Linux's 15) are
//!   also checked against what exists, to step over leftovers of killed
//!   runs;
//! - subnets: a [`SubnetLease`] is a /24 from 10.200.0.0 - 10.254.255.0,
//!   leased under an `flock` on `/run/cni-async-tests/subnets/10.X.Y.0`
//!   (one lock dir for every crate's tests). The kernel drops the lock when
//!   the holder exits, even on SIGKILL, so there are no stale leases; a
//!   subnet with any address or route on the host (a leftover bridge, a
//!   real network) is skipped;
//! - [`TempNetns`] is a named namespace made with `ip netns add`, deleted on
//!   drop; [`LinkGuard`] reserves a host link name and deletes the link.
//!
//! Questions about any namespace, given the path of its namespace file
//! (`/run/netns/NAME`, `/proc/PID/ns/net`): [`links`], [`addrs`], [`ping`],
//! [`exec_in`] (commands run with `nsenter --net=PATH`).
//!
//! All of this needs root: tests start with [`crate::require_root!`].

use std::fs::{self, File};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::{IpNet, Ipv4Net};
use serde_json::Value;

/// Where `ip netns add` puts named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// Where subnet leases are locked (the same for every crate's tests, so
/// they can run at once).
pub const SUBNET_LOCK_DIR: &str = "/run/cni-async-tests/subnets";
/// Second octet of the first test subnet (10.200.0.0/24).
const SUBNET_FIRST_OCTET: u32 = 200;
/// How many /24s the test range has (10.200.0.0 - 10.254.255.0).
const SUBNET_COUNT: u32 = 55 * 256;

// ---- names ----

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
        if !Path::new(NETNS_DIR).join(&name).exists() {
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

// ---- the host namespace ----

/// Whether a link of this name exists in the host namespace (the one the
/// calling thread is in: `/proc/thread-self/net/dev`).
pub fn link_exists(name: &str) -> bool {
    let dev = fs::read_to_string("/proc/thread-self/net/dev")
        .expect("cannot read /proc/thread-self/net/dev");
    parse_net_dev(&dev).iter().any(|n| n == name)
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

/// `ip -j ARGS` parsed (an empty array when `ip` prints nothing).
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

// ---- inside a namespace ----

/// Runs `PROGRAM ARGS` inside the network namespace whose file is `ns`
/// (`nsenter --net=NS`; stdout and stderr captured).
pub fn exec_in(ns: impl AsRef<Path>, program: &str, args: &[&str]) -> Output {
    let ns = ns.as_ref();
    Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run nsenter --net={}: {e}", ns.display()))
}

/// [`exec_in`], panicking unless the command succeeds; returns its stdout.
#[track_caller]
pub fn exec_in_ok(ns: impl AsRef<Path>, program: &str, args: &[&str]) -> String {
    let ns = ns.as_ref();
    let out = exec_in(ns, program, args);
    assert!(
        out.status.success(),
        "{program} {} in {} failed ({}): {}",
        args.join(" "),
        ns.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the network interfaces in namespace `ns`, in kernel order
/// (its `/proc/net/dev`).
#[track_caller]
pub fn links(ns: impl AsRef<Path>) -> Vec<String> {
    parse_net_dev(&exec_in_ok(ns, "cat", &["/proc/self/net/dev"]))
}

/// Whether namespace `ns` has an interface named `ifname`.
#[track_caller]
pub fn link_exists_in(ns: impl AsRef<Path>, ifname: &str) -> bool {
    links(ns).iter().any(|l| l == ifname)
}

/// The addresses of interface `ifname` in namespace `ns`, IPv4 and IPv6,
/// with their prefix lengths, in the order the kernel lists them
/// (`ip -j addr show dev IFNAME` inside). IPv6 link-local addresses
/// included: the kernel adds them a moment after a link comes up, so
/// assertions that should not depend on that timing use [`addrs_v4`].
///
/// An error names the namespace and says what failed (no such interface).
pub fn try_addrs(ns: impl AsRef<Path>, ifname: &str) -> Result<Vec<IpNet>, String> {
    let ns = ns.as_ref();
    let out = exec_in(ns, "ip", &["-j", "addr", "show", "dev", ifname]);
    if !out.status.success() {
        return Err(format!(
            "ip addr show dev {ifname} in {} failed ({}): {}",
            ns.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    parse_ip_addr_json(&out.stdout).map_err(|e| {
        format!(
            "output of ip -j addr show dev {ifname} in {}: {e}",
            ns.display()
        )
    })
}

/// [`try_addrs`], panicking on an error.
#[track_caller]
pub fn addrs(ns: impl AsRef<Path>, ifname: &str) -> Vec<IpNet> {
    try_addrs(ns, ifname).unwrap_or_else(|e| panic!("{e}"))
}

/// The IPv4 addresses of `ifname` in `ns`: what tests usually compare.
#[track_caller]
pub fn addrs_v4(ns: impl AsRef<Path>, ifname: &str) -> Vec<IpNet> {
    addrs(ns, ifname)
        .into_iter()
        .filter(|a| matches!(a, IpNet::V4(_)))
        .collect()
}

/// Whether one ICMP echo from namespace `ns` to `ip` is answered within a
/// second (`ping -n -q -c 1 -W 1 IP` inside).
pub fn ping(ns: impl AsRef<Path>, ip: IpAddr) -> bool {
    exec_in(
        ns,
        "ping",
        &["-n", "-q", "-c", "1", "-W", "1", &ip.to_string()],
    )
    .status
    .success()
}

/// Interface names from the text of `/proc/net/dev` (two header lines, then
/// `name: counters...`).
fn parse_net_dev(text: &str) -> Vec<String> {
    text.lines()
        .skip(2)
        .filter_map(|line| line.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Addresses from `ip -j addr show` output: `[{"ifname": .., "addr_info":
/// [{"local": "10.0.0.2", "prefixlen": 24, ..}, ..]}, ..]`. Some iproute2
/// versions print `{}` for links they filtered out; those are skipped.
fn parse_ip_addr_json(bytes: &[u8]) -> Result<Vec<IpNet>, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let links = value.as_array().ok_or("not a JSON array")?;
    let mut out = Vec::new();
    for link in links {
        let Some(infos) = link.get("addr_info").and_then(Value::as_array) else {
            continue;
        };
        for info in infos {
            let local = info
                .get("local")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("addr_info entry without \"local\": {info}"))?;
            let ip: IpAddr = local
                .parse()
                .map_err(|e| format!("bad address {local:?}: {e}"))?;
            let prefix = info
                .get("prefixlen")
                .and_then(Value::as_u64)
                .and_then(|p| u8::try_from(p).ok())
                .ok_or_else(|| format!("addr_info entry without a valid \"prefixlen\": {info}"))?;
            let net =
                IpNet::new(ip, prefix).map_err(|e| format!("bad prefix length in {info}: {e}"))?;
            out.push(net);
        }
    }
    Ok(out)
}

// ---- guards ----

/// A named network namespace made with `ip netns add`, deleted on drop.
#[derive(Debug)]
pub struct TempNetns {
    name: String,
}

impl Default for TempNetns {
    fn default() -> Self {
        Self::new()
    }
}

impl TempNetns {
    /// Creates `cnt-<unique id>`.
    pub fn new() -> TempNetns {
        loop {
            let name = unique_netns_name();
            let out = ip(&["netns", "add", &name]);
            if out.status.success() {
                return TempNetns { name };
            }
            // Lost a race with someone making the same name: next one.
            assert!(
                Path::new(NETNS_DIR).join(&name).exists(),
                "ip netns add {name} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
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

    /// Runs `PROGRAM ARGS` inside (see [`exec_in`]).
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        exec_in(self.path(), program, args)
    }

    /// The IPv4 addresses (`a.b.c.d/len`) of `ifname` inside.
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<String> {
        addrs_v4(self.path(), ifname)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// The MTU of `ifname` inside.
    pub fn mtu(&self, ifname: &str) -> Option<u64> {
        let v = ip_json(&["-n", &self.name, "link", "show", "dev", ifname]);
        v.get(0)?.get("mtu")?.as_u64()
    }

    /// Whether `ip` answers a [`ping`] from inside, trying up to `tries`
    /// times (the first may race the link coming up).
    pub fn ping(&self, ip: Ipv4Addr, tries: u32) -> bool {
        (0..tries).any(|_| ping(self.path(), IpAddr::V4(ip)))
    }
}

impl Drop for TempNetns {
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

/// A process (`sleep`) in a network namespace of its own that has no name:
/// the namespace is held by the process alone, reached as
/// `/proc/PID/ns/net`. The process is killed on drop (and the namespace
/// goes with it).
#[derive(Debug)]
pub struct ProcNs {
    child: std::process::Child,
}

impl Default for ProcNs {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcNs {
    /// Makes a named namespace, starts `sleep` in it, and deletes the name
    /// once the process is in: from then on only the process holds it.
    pub fn new() -> ProcNs {
        use std::os::unix::fs::MetadataExt;
        let ns = TempNetns::new();
        let want = fs::metadata(ns.path()).expect("stat the new netns").ino();
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name(), "sleep", "3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ip netns exec sleep");
        let p = ProcNs { child };
        // `ip netns exec` enters the namespace, then execs sleep.
        let link = p.path();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while fs::metadata(&link).map(|m| m.ino()).ok() != Some(want)
            || fs::read_to_string(format!("/proc/{}/comm", p.pid()))
                .map(|c| c.trim() == "sleep")
                .ok()
                != Some(true)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "sleep never entered {}",
                ns.name()
            );
            std::thread::yield_now();
        }
        drop(ns);
        p
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/proc/PID/ns/net`.
    pub fn path(&self) -> String {
        format!("/proc/{}/ns/net", self.child.id())
    }

    /// The IPv4 addresses (`a.b.c.d/len`) of `ifname` inside.
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<String> {
        addrs_v4(self.path(), ifname)
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

impl Drop for ProcNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A host link name reserved for the test ([`unique_link_name`]); the link,
/// if someone created it, is deleted on drop.
#[derive(Debug)]
pub struct LinkGuard {
    name: String,
}

impl Default for LinkGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl LinkGuard {
    /// Reserves a name not in use.
    pub fn new() -> LinkGuard {
        LinkGuard {
            name: unique_link_name(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if let Err(e) = delete_link(&self.name) {
            eprintln!("cleanup: {e}");
        }
    }
}

// ---- subnets ----

/// A /24 in 10.200.0.0 - 10.254.255.0 that no other test (in this or any
/// other process, of any crate) holds while this value lives.
///
/// A subnet is taken only when both hold: its lock file in
/// [`SUBNET_LOCK_DIR`] is locked by this value, and the host has no
/// address in it and no route into it, in any routing table.
#[derive(Debug)]
pub struct SubnetLease {
    net: Ipv4Net,
    /// The lock file, in [`SUBNET_LOCK_DIR`] (a private dir in this
    /// module's own tests).
    lock_path: PathBuf,
    /// Holds the `flock` (released on drop, or when the process dies).
    lock: File,
}

impl Default for SubnetLease {
    fn default() -> Self {
        Self::new()
    }
}

/// Unlocks before the file closes: a child forked meanwhile by another
/// thread holds a copy of the open file until it execs, and with it the
/// lock, which `LOCK_UN` releases for every copy.
impl Drop for SubnetLease {
    fn drop(&mut self) {
        let _ = self.lock.unlock();
    }
}

impl SubnetLease {
    /// Leases a free subnet; panics when the whole range is taken. The
    /// search starts at a point spread by pid and by a per-process counter,
    /// so parallel tests rarely probe the same subnets.
    pub fn new() -> SubnetLease {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let start = std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed))
            % SUBNET_COUNT;
        SubnetLease::probe_in(Path::new(SUBNET_LOCK_DIR), start)
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
        SubnetLease::probe_in(
            Path::new(SUBNET_LOCK_DIR),
            (b - SUBNET_FIRST_OCTET) * 256 + u32::from(c),
        )
    }

    /// Probes from the `start`-th subnet on, with the lock files in `dir`.
    fn probe_in(dir: &Path, start: u32) -> SubnetLease {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        for k in 0..SUBNET_COUNT {
            let i = (start + k) % SUBNET_COUNT;
            let octet2 = u8::try_from(SUBNET_FIRST_OCTET + i / 256).expect("in range");
            let octet3 = u8::try_from(i % 256).expect("in range");
            let net = Ipv4Net::new(Ipv4Addr::new(10, octet2, octet3, 0), 24).expect("valid /24");
            let path = dir.join(net.addr().to_string());
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => continue,
                Err(fs::TryLockError::Error(e)) => panic!("cannot lock {}: {e}", path.display()),
            }
            if host_uses(net) {
                continue;
            }
            return SubnetLease {
                net,
                lock_path: path,
                lock: file,
            };
        }
        panic!("no free test subnet in 10.200.0.0 - 10.254.255.0");
    }

    /// The subnet.
    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// `10.b.c.0/24`.
    pub fn cidr(&self) -> String {
        self.net.to_string()
    }

    /// The subnet's address `.n`.
    pub fn host(&self, n: u8) -> Ipv4Addr {
        let [a, b, c, _] = self.net.addr().octets();
        Ipv4Addr::new(a, b, c, n)
    }

    /// The lock file of this lease (for tests of the lease itself).
    pub fn lock_path(&self) -> PathBuf {
        self.lock_path.clone()
    }
}

/// Whether the host has an address in `net` or a route into it, in any
/// table (a leftover of a killed run, or a real network).
pub fn host_uses(net: Ipv4Net) -> bool {
    let net = net.to_string();
    let addrs = ip_json(&["-4", "addr", "show", "to", &net]);
    let routes = ip_json(&["-4", "route", "show", "table", "all", "root", &net]);
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

/// A UDP socket made in the network namespace at `path` (by a thread that
/// enters it and exits): the socket holds the namespace while it is open,
/// though no process or thread is in it, no mount names it and no
/// descriptor is of its nsfs file.
pub fn socket_in(path: impl AsRef<Path>) -> std::net::UdpSocket {
    let ns = File::open(path.as_ref()).expect("open the netns");
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        std::net::UdpSocket::bind("0.0.0.0:0").expect("a socket in the netns")
    })
    .join()
    .expect("the socket thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_is_parsed() {
        let text = "Inter-|   Receive                            |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes\n    \
             lo:       0       0    0    0    0     0          0         0        0\n  \
             eth0: 1296      16    0    0    0     0          0         0      796\n";
        assert_eq!(parse_net_dev(text), vec!["lo", "eth0"]);
        assert!(parse_net_dev("").is_empty());
    }

    #[test]
    fn ip_addr_json_is_parsed() {
        let json = br#"[{},{"ifindex":2,"ifname":"eth0","addr_info":[
            {"family":"inet","local":"10.201.3.2","prefixlen":24,"scope":"global"},
            {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]},
            {"ifindex":3,"ifname":"x"}]"#;
        let got = parse_ip_addr_json(json).unwrap();
        assert_eq!(
            got,
            vec![
                "10.201.3.2/24".parse::<IpNet>().unwrap(),
                "fe80::1/64".parse::<IpNet>().unwrap()
            ]
        );
        assert_eq!(parse_ip_addr_json(b"[]").unwrap(), vec![]);
        assert!(parse_ip_addr_json(b"{}").is_err());
        assert!(parse_ip_addr_json(b"not json").is_err());
        assert!(
            parse_ip_addr_json(br#"[{"addr_info":[{"local":"10.0.0.1","prefixlen":33}]}]"#)
                .is_err()
        );
        assert!(
            parse_ip_addr_json(br#"[{"addr_info":[{"local":"nope","prefixlen":3}]}]"#).is_err()
        );
    }

    /// Whether another open file description of `path` can take its lock
    /// now (flock(1), another process).
    fn lockable(path: &Path) -> bool {
        let status = std::process::Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "42"])
            .arg(path)
            .arg("true")
            .status()
            .expect("run flock(1)");
        assert!(matches!(status.code(), Some(0 | 42)), "flock: {status}");
        status.success()
    }

    /// Dropping a lease releases its lock at once, even while a fork in
    /// another test's thread holds a copy of the lock file until its child
    /// execs (the drop unlocks every copy). In a lock dir of its own: in
    /// the shared one, another test may take the freed subnet between the
    /// drop and the check (a lease is free to take then).
    #[test]
    fn a_lease_is_locked_while_it_lives_and_released_on_drop() {
        crate::require_root!("runs ip to see whether the host uses the subnet");
        let dir = tempfile::tempdir().unwrap();
        let lease = SubnetLease::probe_in(dir.path(), 0);
        let path = lease.lock_path();
        assert!(path.starts_with(dir.path()), "{}", path.display());
        assert!(!lockable(&path), "held while the lease lives");
        drop(lease);
        assert!(lockable(&path), "released on drop");
    }

    #[test]
    fn unique_ids_are_eight_base36_characters() {
        let (a, b) = (unique_id(), unique_id());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(id.len(), 8, "{id}");
            assert!(
                id.bytes()
                    .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
            );
        }
    }
}
