//! The shim's subcommands for putting it on a node: `config` prints the
//! runtime's network list for a cnid network, `install` copies the shim
//! into the runtime's plugin dir and writes that list into the runtime's
//! conf dir once cnid is ready, `uninstall` takes both away, `health` is a
//! probe (`cnid-shim --help` prints their flags).
//!
//! The list names the shim, cnid's socket and network, and declares every
//! capability some plugin of cnid's network declares (`GET
//! /v1/networks/{network}`): a runtime passes `runtimeConfig` only for
//! capabilities the list declares. Its `cniVersion` is the network's,
//! capped at 1.0.0 (what libcni before 1.2, in containerd 1.x and CRI-O,
//! speaks), with `cniVersions` offering the network's own version to newer
//! runtimes; `--cni-version` sets it outright.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_core::Version;
use cni_durable as durable;
use serde_json::{Map, Value, json};

use super::conf::{DEFAULT_SOCKET, parse_duration, parse_timeout};
use super::http;
use cnid_api::{self as api, HealthResponse, NetworkInfo, NetworksResponse};

/// The plugin type (and binary name) of the shim.
pub const SHIM_TYPE: &str = "cnid-shim";

/// The default name of the list in the runtime's conf dir: sorts before
/// the usual `10-*` files, so runtimes that take the first file as their
/// default network (containerd, CRI-O, the kubelet) take this one.
pub const DEFAULT_FILE: &str = "00-cnid.conflist";

/// The highest version `config` writes as `cniVersion` unless told
/// otherwise (newer versions go in `cniVersions`).
pub const DEFAULT_MAX_VERSION: Version = Version::V1_0_0;

const USAGE: &str = "\
cnid-shim: a CNI plugin that hands every call to cnid (run by a container runtime
with CNI_COMMAND set), and its set-up subcommands:

  cnid-shim config    [--socket S] [--network N] [--name NAME] [--cni-version V] [--timeout T]
      print the runtime's network list for cnid's network N (default: cnid's first)
  cnid-shim install   --conf-dir DIR [--plugin-dir DIR] [--file NAME] [--wait T]
                      [--stay [--refresh T]] [config flags]
      wait until cnid is ready and has the network, copy this binary into the
      plugin dir, write the list into the conf dir (atomically, default name
      00-cnid.conflist); with --stay keep running and rewrite the list when
      cnid's network changes
  cnid-shim uninstall --conf-dir DIR [--plugin-dir DIR] [--file NAME]
      remove the list (and the binary from the plugin dir)
  cnid-shim health    [--socket S] [--live] [--timeout T]
      exit 0 when cnid answers and is not draining (--live: answers at all)

Defaults: --socket /run/cnid/cnid.sock, --wait 2m, --refresh 30s, --timeout 5s (health).
";

/// The options of the subcommands.
#[derive(Debug, Clone, PartialEq)]
pub struct Opts {
    /// cnid's socket.
    pub socket: PathBuf,
    /// cnid's network (default: its first).
    pub network: Option<String>,
    /// The runtime's network name (default: cnid's).
    pub name: Option<String>,
    /// The list's `cniVersion`.
    pub cni_version: Option<Version>,
    /// The shim's `timeout` (written as given).
    pub timeout: Option<String>,
    /// The runtime's conf dir.
    pub conf_dir: Option<PathBuf>,
    /// The runtime's plugin dir.
    pub plugin_dir: Option<PathBuf>,
    /// The list's file name.
    pub file: String,
    /// How long `install` waits for cnid.
    pub wait: Duration,
    /// `install`: keep running.
    pub stay: bool,
    /// `install --stay`: how often to look at cnid's network again.
    pub refresh: Duration,
    /// `health`: a draining cnid passes.
    pub live: bool,
    /// `health`: how long to wait for the answer.
    pub probe_timeout: Duration,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            socket: PathBuf::from(DEFAULT_SOCKET),
            network: None,
            name: None,
            cni_version: None,
            timeout: None,
            conf_dir: None,
            plugin_dir: None,
            file: DEFAULT_FILE.to_owned(),
            wait: Duration::from_secs(120),
            stay: false,
            refresh: Duration::from_secs(30),
            live: false,
            probe_timeout: Duration::from_secs(5),
        }
    }
}

impl Opts {
    /// Parses the flags after the subcommand.
    pub fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
                _ => (a.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let duration = |v: String| parse_duration(&v).map_err(|e| format!("{flag}: {e}"));
            match flag {
                "--socket" => o.socket = PathBuf::from(value()?),
                "--network" => o.network = Some(value()?),
                "--name" => o.name = Some(value()?),
                "--cni-version" => {
                    let v = value()?;
                    let parsed = Version::parse(&v)
                        .ok()
                        .filter(Version::is_supported)
                        .ok_or_else(|| format!("--cni-version: unsupported CNI version {v:?}"))?;
                    o.cni_version = Some(parsed);
                }
                "--timeout" => {
                    let v = value()?;
                    parse_timeout(&Value::String(v.clone()))
                        .map_err(|e| format!("--timeout: {e}"))?;
                    o.probe_timeout = parse_duration(&v).map_err(|e| format!("--timeout: {e}"))?;
                    o.timeout = Some(v);
                }
                "--conf-dir" => o.conf_dir = Some(PathBuf::from(value()?)),
                "--plugin-dir" => o.plugin_dir = Some(PathBuf::from(value()?)),
                "--file" => {
                    let f = value()?;
                    if f.is_empty() || f.contains('/') || f.starts_with('.') {
                        return Err(format!("--file: {f:?} is not a plain file name"));
                    }
                    o.file = f;
                }
                "--wait" => o.wait = duration(value()?)?,
                "--refresh" => o.refresh = duration(value()?)?.max(Duration::from_secs(1)),
                "--stay" => o.stay = true,
                "--live" => o.live = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if !o.socket.is_absolute() {
            return Err(format!(
                "--socket: {:?} is not an absolute path",
                o.socket.display().to_string()
            ));
        }
        Ok(o)
    }

    fn conf_dir(&self) -> Result<&Path, String> {
        self.conf_dir.as_deref().ok_or_else(|| {
            "--conf-dir is required (the runtime's conf dir, such as /etc/cni/net.d)".into()
        })
    }
}

/// Runs a subcommand (`args` after the program name); returns the exit
/// status. Output goes to stdout, errors to stderr.
pub fn main(args: &[String]) -> i32 {
    let Some((sub, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return 2;
    };
    if matches!(sub.as_str(), "-h" | "--help" | "help") {
        print!("{USAGE}");
        return 0;
    }
    if sub == "--generate" {
        return super::man::generate(rest, USAGE);
    }
    if matches!(sub.as_str(), "-V" | "--version") {
        println!("cnid-shim {}", env!("CNID_BUILD_VERSION"));
        return 0;
    }
    let opts = match Opts::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cnid-shim {sub}: {e}");
            return 2;
        }
    };
    let res = match sub.as_str() {
        "config" => config(&opts),
        "install" => install(&opts),
        "uninstall" => uninstall(&opts),
        "health" => health(&opts),
        other => {
            eprintln!("cnid-shim: unknown subcommand {other:?}\n\n{USAGE}");
            return 2;
        }
    };
    match res {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cnid-shim {sub}: {e}");
            1
        }
    }
}

fn get_json<T: serde::de::DeserializeOwned>(
    socket: &Path,
    path: &str,
    timeout: Duration,
) -> Result<T, String> {
    let ans = http::request(socket, "GET", path, &[], None, (timeout, timeout))
        .map_err(|e| e.to_string())?;
    if ans.status != 200 {
        let why = cni_core::ErrorObject::decode(&ans.body)
            .map(|e| e.to_string())
            .unwrap_or_else(|| http::preview(&ans.body));
        return Err(format!(
            "cnid answered GET {path} with HTTP {}: {why}",
            ans.status
        ));
    }
    serde_json::from_slice(&ans.body)
        .map_err(|e| format!("cnid's answer to GET {path} does not decode: {e}"))
}

/// cnid's network (the named one, or its first), if cnid is ready.
fn network(opts: &Opts) -> Result<NetworkInfo, String> {
    let t = Duration::from_secs(10);
    let health: HealthResponse = get_json(&opts.socket, &format!("{}/health", api::PREFIX), t)?;
    if health.status != "ok" {
        return Err(format!(
            "cnid on {} is {}",
            opts.socket.display(),
            health.status
        ));
    }
    match &opts.network {
        Some(n) => get_json(
            &opts.socket,
            &format!("{}/networks/{}", api::PREFIX, api::encode(n)),
            t,
        ),
        None => {
            let all: NetworksResponse =
                get_json(&opts.socket, &format!("{}/networks", api::PREFIX), t)?;
            all.networks.into_iter().next().ok_or_else(|| {
                format!(
                    "cnid on {} has no network (conf dir {})",
                    opts.socket.display(),
                    all.conf_dir
                )
            })
        }
    }
}

/// The runtime's network list for cnid's network `info`.
pub fn shim_list(info: &NetworkInfo, opts: &Opts) -> Result<Value, String> {
    let net_version =
        Version::parse(&info.cni_version).map_err(|e| format!("network {:?}: {e}", info.name))?;
    let mut list = Map::new();
    match opts.cni_version {
        Some(v) => {
            list.insert("cniVersion".into(), json!(v.to_string()));
        }
        None if net_version > DEFAULT_MAX_VERSION => {
            list.insert("cniVersion".into(), json!(DEFAULT_MAX_VERSION.to_string()));
            list.insert(
                "cniVersions".into(),
                json!([DEFAULT_MAX_VERSION.to_string(), net_version.to_string()]),
            );
        }
        None => {
            list.insert("cniVersion".into(), json!(net_version.to_string()));
        }
    }
    list.insert(
        "name".into(),
        json!(opts.name.as_deref().unwrap_or(&info.name)),
    );
    let mut plugin = Map::new();
    plugin.insert("type".into(), json!(SHIM_TYPE));
    plugin.insert("socket".into(), json!(opts.socket.display().to_string()));
    plugin.insert("network".into(), json!(info.name));
    if let Some(t) = &opts.timeout {
        plugin.insert("timeout".into(), json!(t));
    }
    if !info.capabilities.is_empty() {
        let caps: Map<String, Value> = info
            .capabilities
            .iter()
            .map(|c| (c.clone(), Value::Bool(true)))
            .collect();
        plugin.insert("capabilities".into(), Value::Object(caps));
    }
    list.insert("plugins".into(), json!([plugin]));
    Ok(Value::Object(list))
}

fn render(list: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(list).unwrap_or_default();
    b.push(b'\n');
    b
}

fn config(opts: &Opts) -> Result<(), String> {
    let info = network(opts)?;
    let list = shim_list(&info, opts)?;
    std::io::stdout()
        .write_all(&render(&list))
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

/// Waits (up to `--wait`) until cnid is ready and has the network.
fn wait_for_network(opts: &Opts) -> Result<NetworkInfo, String> {
    let start = Instant::now();
    let mut said = false;
    loop {
        match network(opts) {
            Ok(info) => return Ok(info),
            Err(e) if start.elapsed() >= opts.wait => {
                return Err(format!(
                    "cnid not ready within {}s: {e}",
                    opts.wait.as_secs()
                ));
            }
            Err(e) => {
                if !said {
                    println!("waiting for cnid: {e}");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
}

/// Refuses `conf_dir` when it is cnid's own: a shim list there would be a
/// network of cnid's that calls cnid itself.
fn not_cnids_conf_dir(opts: &Opts, conf_dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let all: NetworksResponse = get_json(
        &opts.socket,
        &format!("{}/networks", api::PREFIX),
        Duration::from_secs(10),
    )?;
    let theirs = Path::new(&all.conf_dir);
    let same = match (fs::metadata(theirs), fs::metadata(conf_dir)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => theirs == conf_dir,
    };
    if same {
        return Err(format!(
            "refusing to install into {}: it is the conf dir of cnid on {} itself, which would load the shim's list as a network that calls cnid (every ADD and DEL waiting on itself); give the runtime's conf dir (--conf-dir), or point cnid at another one (cnid --conf-dir)",
            conf_dir.display(),
            opts.socket.display()
        ));
    }
    Ok(())
}

fn install(opts: &Opts) -> Result<(), String> {
    let conf_dir = opts.conf_dir()?;
    let info = wait_for_network(opts)?;
    not_cnids_conf_dir(opts, conf_dir)?;
    if let Some(dir) = &opts.plugin_dir {
        let dest = dir.join(SHIM_TYPE);
        let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
        let same = match (fs::canonicalize(&me), fs::canonicalize(&dest)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if !same {
            let bytes = fs::read(&me).map_err(|e| format!("cannot read {}: {e}", me.display()))?;
            remove_abandoned(dir);
            write_atomic(&dest, &bytes, 0o755)?;
            println!("installed {}", dest.display());
        }
    }
    let path = conf_dir.join(&opts.file);
    let bytes = render(&shim_list(&info, opts)?);
    remove_abandoned(conf_dir);
    write_atomic(&path, &bytes, 0o644)?;
    println!(
        "wrote {} (cnid network {:?}, capabilities [{}])",
        path.display(),
        info.name,
        info.capabilities.join(", ")
    );
    if !opts.stay {
        return Ok(());
    }
    loop {
        std::thread::sleep(opts.refresh);
        // cnid down or the network gone: keep what is there (a runtime
        // gets code 11 from the shim and tries again).
        let Ok(info) = network(opts) else { continue };
        let Ok(list) = shim_list(&info, opts) else {
            continue;
        };
        let bytes = render(&list);
        if fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
            write_atomic(&path, &bytes, 0o644)?;
            println!(
                "rewrote {} (capabilities [{}])",
                path.display(),
                info.capabilities.join(", ")
            );
        }
    }
}

fn uninstall(opts: &Opts) -> Result<(), String> {
    let path = opts.conf_dir()?.join(&opts.file);
    match fs::read(&path) {
        Ok(bytes) => {
            let ours = serde_json::from_slice::<Value>(&bytes).is_ok_and(|v| {
                v["plugins"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["type"] == SHIM_TYPE))
            });
            if !ours {
                return Err(format!(
                    "{} is not a list of {SHIM_TYPE}: left alone",
                    path.display()
                ));
            }
            fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            println!("removed {}", path.display());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{} is not there", path.display());
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    if let Some(dir) = &opts.plugin_dir {
        let bin = dir.join(SHIM_TYPE);
        match fs::remove_file(&bin) {
            Ok(()) => println!("removed {}", bin.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", bin.display())),
        }
    }
    Ok(())
}

fn health(opts: &Opts) -> Result<(), String> {
    let h: HealthResponse = get_json(
        &opts.socket,
        &format!("{}/health", api::PREFIX),
        opts.probe_timeout,
    )?;
    if h.status != "ok" && !opts.live {
        return Err(format!("cnid on {} is {}", opts.socket.display(), h.status));
    }
    println!(
        "cnid {} on {}: {}, {} networks, {} in flight, {} queued",
        h.version,
        opts.socket.display(),
        h.status,
        h.networks,
        h.in_flight,
        h.queued
    );
    Ok(())
}

/// Removes from `dir` the temp files of [`write_atomic`]s killed before
/// their rename (an install killed mid-way: a whole copy of the shim in
/// the plugin dir), whose writer is gone ([`durable::remove_abandoned`]).
/// A failure is a warning: the install goes on.
fn remove_abandoned(dir: &Path) {
    match durable::remove_abandoned(&durable::Disk, dir, durable::ABANDONED_AFTER) {
        Ok(0) => {}
        Ok(n) => eprintln!(
            "removed {n} temp file(s) of killed writes in {}",
            dir.display()
        ),
        Err(e) => eprintln!("warning: cannot {e}"),
    }
}

/// Writes `path` whole or not at all ([`durable::write_atomic`]: a temp
/// file in the same dir whose name starts with `.`, which no runtime
/// loads; fsync, rename over `path`, fsync of the dir).
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    durable::write_atomic(path, bytes, mode, true).map_err(|e| format!("cannot {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(version: &str, caps: &[&str]) -> NetworkInfo {
        NetworkInfo {
            name: "podnet".into(),
            file: "/etc/cnid/net.d/10-podnet.conflist".into(),
            cni_version: version.into(),
            plugins: vec!["bridge".into(), "portmap".into()],
            capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
            disable_check: false,
            disable_gc: false,
            shadowed: vec![],
            config: None,
            unusable: None,
        }
    }

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| (*a).to_owned()).collect()
    }

    #[test]
    fn the_list_copies_capabilities_and_caps_the_version() {
        let opts = Opts::parse(&args(&["--socket", "/x/c.sock", "--timeout", "45s"])).unwrap();
        let l = shim_list(&info("1.0.0", &["portMappings", "bandwidth"]), &opts).unwrap();
        assert_eq!(
            l,
            json!({"cniVersion": "1.0.0", "name": "podnet", "plugins": [{
                "type": "cnid-shim", "socket": "/x/c.sock", "network": "podnet", "timeout": "45s",
                "capabilities": {"portMappings": true, "bandwidth": true}}]})
        );
        let l = shim_list(&info("1.1.0", &[]), &Opts::default()).unwrap();
        assert_eq!(l["cniVersion"], "1.0.0");
        assert_eq!(l["cniVersions"], json!(["1.0.0", "1.1.0"]));
        assert!(l["plugins"][0].get("capabilities").is_none());
        let opts = Opts::parse(&args(&["--cni-version=0.4.0", "--name", "k8s"])).unwrap();
        let l = shim_list(&info("1.1.0", &[]), &opts).unwrap();
        assert_eq!(
            (l["cniVersion"].as_str(), l["name"].as_str()),
            (Some("0.4.0"), Some("k8s"))
        );
        assert!(l.get("cniVersions").is_none());
    }

    #[test]
    fn bad_flags_are_named() {
        for (a, want) in [
            (&["--socket", "rel.sock"][..], "--socket"),
            (&["--cni-version", "9.9.9"], "--cni-version"),
            (&["--timeout", "0s"], "--timeout"),
            (&["--wait", "soon"], "--wait"),
            (&["--file", "../x"], "--file"),
            (&["--bogus"], "unknown argument"),
            (&["--network"], "needs a value"),
        ] {
            let e = Opts::parse(&args(a)).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
