//! What the `in-process`, `harness`, `daemon-client` and `demo` examples
//! share: defaults, signal handling, the bridge they create beforehand,
//! host-local's data dir, ping.
//!
//! Part of the examples' library (`examples/src/lib.rs`); each binary uses
//! a part of it.

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context as _, Result, bail};
use cni_async::netns::Netns;
use cni_core::NetworkConfigList;
use serde_json::Value;
use tempfile::TempDir;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The bundled networks, `examples/net.d`, wherever `cargo run` is started.
pub const DEFAULT_CONF_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/net.d");

/// The plugin dirs when neither `--plugin-dirs` nor `CNI_PATH` is given.
pub const DEFAULT_PLUGIN_PATH: &str = "/opt/cni/bin:/usr/lib/cni";

/// host-local's `dataDir` when the configuration sets none.
pub const HOST_LOCAL_DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// Fails with a clear message unless we are root.
pub fn require_root(program: &str) -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    bail!(
        "{program} needs root: it creates network namespaces and a bridge \
         (run it as root, e.g. `sudo -E cargo run -p cni-examples --bin {program}`)"
    )
}

/// The plugin dirs: `--plugin-dirs`, else `CNI_PATH`, else
/// `/opt/cni/bin:/usr/lib/cni`; `:`-separated, empty parts skipped.
pub fn plugin_dirs(flag: Option<&str>) -> Vec<PathBuf> {
    let path = match flag {
        Some(p) => p.to_owned(),
        None => std::env::var("CNI_PATH").unwrap_or_else(|_| DEFAULT_PLUGIN_PATH.to_owned()),
    };
    path.split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Shows a list of paths as `a:b:c`.
pub fn show_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// The result cache dir: the one given, or a fresh temp dir removed at the
/// end, so that the examples never write to `/var/lib/cni`.
#[derive(Debug)]
pub enum CacheDir {
    /// `--cache-dir`: kept.
    Given(PathBuf),
    /// A temp dir, removed on drop.
    Temp(TempDir),
}

impl CacheDir {
    pub fn new(given: Option<PathBuf>) -> Result<CacheDir> {
        match given {
            Some(dir) => Ok(CacheDir::Given(dir)),
            None => Ok(CacheDir::Temp(
                tempfile::Builder::new()
                    .prefix("cni-examples-cache-")
                    .tempdir()
                    .context("create a temp dir for the result cache")?,
            )),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            CacheDir::Given(p) => p,
            CacheDir::Temp(t) => t.path(),
        }
    }
}

/// SIGINT or SIGTERM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    Int,
    Term,
}

impl Interrupt {
    /// The shell's convention: 128 + the signal number.
    pub fn exit_code(self) -> u8 {
        match self {
            Interrupt::Int => 130,
            Interrupt::Term => 143,
        }
    }
}

impl fmt::Display for Interrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interrupt::Int => "SIGINT",
            Interrupt::Term => "SIGTERM",
        })
    }
}

/// SIGINT and SIGTERM, caught from the moment this is installed: they no
/// longer end the process, [`Signals::recv`] reports them instead.
#[derive(Debug)]
pub struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    pub fn install() -> Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("install the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("install the SIGTERM handler")?,
        })
    }

    /// The next SIGINT or SIGTERM.
    pub async fn recv(&mut self) -> Interrupt {
        tokio::select! {
            _ = self.int.recv() => Interrupt::Int,
            _ = self.term.recv() => Interrupt::Term,
        }
    }
}

/// Runs `ip ARGS` on the host and returns its output; fails on a non-zero exit.
///
/// `ip` runs in a process group of its own, so that a Ctrl-C on the
/// terminal (SIGINT to the foreground group) reaches only the example, whose
/// teardown may be running this very command.
pub fn ip<I, S>(args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new("ip");
    cmd.args(args).stdin(Stdio::null()).process_group(0);
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    Ok(out)
}

/// Whether the host has a link named `name`.
pub fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", name])
        .stdin(Stdio::null())
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The links enslaved to bridge `name` (`ip -j link show master NAME`).
pub fn bridge_ports(name: &str) -> Result<Vec<String>> {
    let out = ip(["-j", "link", "show", "master", name])?;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(Vec::new()));
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l.get("ifname")?.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// The bridge the network's `bridge` plugin uses (its `bridge` field,
/// `cni0` by default), if it has one.
pub fn bridge_of(list: &NetworkConfigList) -> Option<String> {
    let plugin = list
        .plugins()
        .iter()
        .find(|p| p.plugin_type() == "bridge")?;
    Some(
        plugin
            .raw()
            .get("bridge")
            .and_then(Value::as_str)
            .unwrap_or("cni0")
            .to_owned(),
    )
}

/// A fixed, locally administered unicast MAC for the bridge `name`
/// (`02:` + 5 bytes of a hash of the name).
pub fn bridge_mac(name: &str) -> String {
    // FNV-1a, 64 bit: stable across runs and Rust versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        b[0], b[1], b[2], b[3], b[4]
    )
}

/// The network's bridge, created by us before any plugin runs.
///
/// A Linux bridge without a MAC of its own takes the lowest MAC of its
/// ports, so it changes when a second container joins, and the `bridge`
/// plugin's CHECK of the first container then fails ("Bridge interface ...
/// Mac doesn't match"). A bridge whose MAC was set keeps it: so when the
/// bridge does not exist yet, we create it with a fixed MAC, and delete it
/// at the end (the plugin never deletes a bridge). One that already exists
/// is left as it is.
#[derive(Debug)]
pub struct Bridge {
    name: String,
    created: bool,
    released: bool,
}

impl Bridge {
    pub fn ensure(name: &str) -> Result<Bridge> {
        if link_exists(name) {
            return Ok(Bridge {
                name: name.to_owned(),
                created: false,
                released: false,
            });
        }
        ip(["link", "add", "name", name, "type", "bridge"])
            .with_context(|| format!("create bridge {name}"))?;
        // From here on, dropping `bridge` deletes it again.
        let bridge = Bridge {
            name: name.to_owned(),
            created: true,
            released: false,
        };
        ip(["link", "set", "dev", name, "address", &bridge_mac(name)])
            .with_context(|| format!("set the MAC of bridge {name}"))?;
        ip(["link", "set", "dev", name, "up"]).with_context(|| format!("set bridge {name} up"))?;
        Ok(bridge)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn created(&self) -> bool {
        self.created
    }

    /// Whether the MAC of an existing bridge was set (rather than taken
    /// from a port): `addr_assign_type` 3.
    pub fn has_fixed_mac(&self) -> bool {
        fs::read_to_string(format!("/sys/class/net/{}/addr_assign_type", self.name))
            .is_ok_and(|t| t.trim() == "3")
    }

    /// Deletes the bridge if we created it and no port is left on it;
    /// returns what was done.
    pub fn release(mut self) -> Result<String> {
        self.released = true;
        if !self.created {
            return Ok(format!("bridge {}: kept (it existed before)", self.name));
        }
        let ports = bridge_ports(&self.name)?;
        if !ports.is_empty() {
            bail!(
                "bridge {} still has ports {ports:?}: not deleted",
                self.name
            );
        }
        ip(["link", "del", "dev", &self.name])
            .with_context(|| format!("delete bridge {}", self.name))?;
        Ok(format!("bridge {}: deleted", self.name))
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if self.created && !self.released {
            let _ = ip(["link", "del", "dev", &self.name]);
        }
    }
}

/// host-local's data dirs of a network (`DATADIR/NETWORK`), with the
/// directories that did not exist before the example ran, so that they can
/// be removed again once no address is reserved in them.
#[derive(Debug)]
pub struct HostLocalDirs {
    dirs: Vec<HostLocalDir>,
}

#[derive(Debug)]
struct HostLocalDir {
    path: PathBuf,
    /// Missing before the run, deepest first.
    missing: Vec<PathBuf>,
}

impl HostLocalDirs {
    /// The dirs of every host-local IPAM in the list.
    pub fn of(list: &NetworkConfigList) -> HostLocalDirs {
        let mut dirs: Vec<HostLocalDir> = Vec::new();
        for plugin in list.plugins() {
            let Some(ipam) = plugin.raw().get("ipam") else {
                continue;
            };
            if ipam.get("type").and_then(Value::as_str) != Some("host-local") {
                continue;
            }
            let data_dir = ipam
                .get("dataDir")
                .and_then(Value::as_str)
                .unwrap_or(HOST_LOCAL_DEFAULT_DATA_DIR);
            let path = Path::new(data_dir).join(list.name());
            if dirs.iter().any(|d| d.path == path) {
                continue;
            }
            let missing = path
                .ancestors()
                .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
                .map(Path::to_path_buf)
                .collect();
            dirs.push(HostLocalDir { path, missing });
        }
        HostLocalDirs { dirs }
    }

    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|d| d.path.as_path())
    }

    /// The addresses host-local holds reserved (a file named after each).
    pub fn reserved(&self) -> Result<Vec<IpAddr>> {
        let mut out = Vec::new();
        for d in &self.dirs {
            out.extend(reserved_ips(&d.path)?);
        }
        Ok(out)
    }

    /// Removes the dirs that did not exist before, when no address is
    /// reserved in them any more: host-local's `lock` and
    /// `last_reserved_ip.N` files, then the empty dirs. Returns the removed
    /// dirs. Not safe while another process uses the same network.
    pub fn tidy(&self) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for d in &self.dirs {
            if d.missing.is_empty() || !d.path.exists() || !reserved_ips(&d.path)?.is_empty() {
                continue;
            }
            for entry in
                fs::read_dir(&d.path).with_context(|| format!("list {}", d.path.display()))?
            {
                let entry = entry.with_context(|| format!("list {}", d.path.display()))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name == "lock" || name.starts_with("last_reserved_ip.") {
                    fs::remove_file(entry.path())
                        .with_context(|| format!("remove {}", entry.path().display()))?;
                }
            }
            for dir in &d.missing {
                // Stops at the first dir someone else put something in.
                if fs::remove_dir(dir).is_err() {
                    break;
                }
                removed.push(dir.clone());
            }
        }
        Ok(removed)
    }
}

/// The addresses reserved in host-local's dir `dir` (none when it is missing).
pub fn reserved_ips(dir: &Path) -> Result<Vec<IpAddr>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("list {}", dir.display())),
    };
    let mut ips: Vec<IpAddr> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    ips.sort();
    Ok(ips)
}

/// The outcome of a ping.
#[derive(Debug, Clone)]
pub struct Ping {
    /// An echo was answered.
    pub ok: bool,
    /// `time=... ms` of the answer.
    pub rtt: Option<String>,
    /// Echo requests sent (one per attempt).
    pub attempts: u32,
}

/// Pings `ip` from inside `ns`: one echo with a one-second wait, up to
/// `attempts` times.
pub async fn ping(ns: &Netns, ip: IpAddr, attempts: u32) -> Result<Ping> {
    let mut sent = 0;
    while sent < attempts.max(1) {
        sent += 1;
        let mut cmd = Command::new("ping");
        cmd.args(["-n", "-c", "1", "-W", "1"]).arg(ip.to_string());
        let out = ns
            .exec_in_async(cmd)
            .await
            .with_context(|| format!("ping {ip} from {}", ns.path().display()))?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            let rtt = text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("time="))
                .map(|t| format!("{t} ms"));
            return Ok(Ping {
                ok: true,
                rtt,
                attempts: sent,
            });
        }
    }
    Ok(Ping {
        ok: false,
        rtt: None,
        attempts: sent,
    })
}

/// An error and its sources, `: `-separated (what anyhow's `{:#}` shows),
/// for errors we only borrow.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Some errors repeat their source in their own message.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
