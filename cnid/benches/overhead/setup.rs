//! What the scenarios run on: the binaries, a temp tree with the noop
//! plugin and the conf dir, cache dirs on disk and on tmpfs, bridge
//! networks of the benchmark's own (removed on drop), and `cnid` processes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cni_async::netns::Netns;
use cni_core::NetworkConfigList;
use serde_json::{Value, json};

/// The reference plugins' dir.
pub(crate) const REAL_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Network names in the conf dir.
pub(crate) const NOOP1: &str = "bench-noop1";
pub(crate) const NOOP8: &str = "bench-noop8";
pub(crate) const SLOW: &str = "bench-slow";
pub(crate) const REAL: &str = "bench-real";

/// How long the `bench-slow` network's ADD sleeps.
pub(crate) const SLOW_ADD_MS: u64 = 1000;

/// The label of the static C noop, the first of the other noop builds
/// `make bench` puts in the bin dir: label, file.
pub(crate) const C_NOOP: &str = "C noop (static)";
const NOOP_VARIANTS: [(&str, &str); 2] = [
    (C_NOOP, "cni-noop-c"),
    ("cni-noop (dynamic)", "cni-noop-dynamic"),
];

/// The binaries under test (`shim`: as shipped, statically linked, when
/// from a bin dir). Optional, from a bin dir only: the other builds of the
/// noop plugin ([`NOOP_VARIANTS`]); the floor as a process
/// (`floor_driver.c`, `cni-floor-c`), which cnitool's ADD is judged
/// against; an empty static C program (`empty.c`, `cni-empty-c`), the
/// reference of cnid-shim's start-up.
#[derive(Debug, Clone)]
pub(crate) struct Bins {
    pub(crate) cnitool: PathBuf,
    pub(crate) cnid: PathBuf,
    pub(crate) noop: PathBuf,
    pub(crate) shim: PathBuf,
    pub(crate) noop_variants: Vec<(&'static str, PathBuf)>,
    pub(crate) driver: Option<PathBuf>,
    pub(crate) empty_c: Option<PathBuf>,
}

impl Bins {
    /// From `dir` when given (built by `make bench` as shipped), else the
    /// ones cargo built next to cnid's.
    pub(crate) fn find(dir: Option<&Path>) -> anyhow::Result<Bins> {
        let cargo = Path::new(env!("CARGO_BIN_EXE_cnid"))
            .parent()
            .context("cargo's bin dir")?;
        let d = dir.unwrap_or(cargo);
        let optional = |file: &str| Some(d.join(file)).filter(|p| p.is_file() && dir.is_some());
        let noop = match dir {
            Some(d) => d.join("cni-noop"),
            None => cni_test_support::noop::build_noop().map_err(anyhow::Error::msg)?,
        };
        let variants = NOOP_VARIANTS
            .iter()
            .filter_map(|(l, f)| Some((*l, optional(f)?)));
        let bins = Bins {
            cnitool: d.join("cnitool"),
            cnid: d.join("cnid"),
            noop,
            shim: d.join("cnid-shim"),
            noop_variants: variants.collect(),
            driver: optional("cni-floor-c"),
            empty_c: optional("cni-empty-c"),
        };
        for b in [&bins.cnitool, &bins.cnid, &bins.noop, &bins.shim] {
            let how = "build with `cargo build --release -p cnid -p cnitool -p cnid-shim --bins -p cni-noop`";
            anyhow::ensure!(b.is_file(), "{} not found ({how})", b.display());
        }
        Ok(bins)
    }
}

/// Where the cache (and cnid's state dir) lives: a dir on the disk
/// (`/var/tmp`), every cache write fsynced as by default, or on tmpfs
/// (`/dev/shm`), the same code with fsync free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    Disk,
    Tmpfs,
}

impl Storage {
    pub(crate) const BOTH: [Storage; 2] = [Storage::Disk, Storage::Tmpfs];

    pub(crate) fn label(self) -> &'static str {
        ["cache on disk (fsync)", "cache on tmpfs (fsync free)"][self as usize]
    }

    pub(crate) fn short(self) -> &'static str {
        ["disk", "tmpfs"][self as usize]
    }
}

/// The temp tree: `bin` (the plugin dir holding `noop`), `conf` (the conf
/// dir), and per storage a `cache` and a `state` dir.
pub(crate) struct Tree {
    dirs: [tempfile::TempDir; 2],
    pub(crate) bin: PathBuf,
    pub(crate) conf: PathBuf,
    /// The plugin dirs the runtimes use: `bin`, then the reference plugins.
    pub(crate) plugin_dirs: Vec<PathBuf>,
}

impl Tree {
    /// A tree whose `noop` plugin is a copy of `noop`.
    pub(crate) fn new(noop: &Path) -> anyhow::Result<Tree> {
        let temp = |dir| {
            let t = tempfile::Builder::new()
                .prefix("cni-bench-")
                .tempdir_in(dir);
            t.with_context(|| format!("temp dir in {dir}"))
        };
        let dirs = [temp("/var/tmp")?, temp("/dev/shm")?];
        let (bin, conf) = (dirs[0].path().join("bin"), dirs[0].path().join("net.d"));
        let state = dirs
            .iter()
            .flat_map(|d| [d.path().join("cache"), d.path().join("state")]);
        for d in [bin.clone(), conf.clone()].into_iter().chain(state) {
            fs::create_dir_all(d)?;
        }
        // A copy, not a link: the plugin's page cache and path are ours;
        // through the test support's writer: never "text file busy".
        cni_test_support::executable::copy_executable(noop, &bin.join("noop"), 0o755);
        let plugin_dirs = vec![bin.clone(), PathBuf::from(REAL_PLUGIN_DIR)];
        let tree = Tree {
            dirs,
            bin,
            conf,
            plugin_dirs,
        };
        let noop = json!({"type": "noop"});
        let slow = json!([{"type": "noop", "sleepMs": SLOW_ADD_MS}]);
        tree.write_list("10-noop1.conflist", NOOP1, json!([noop]))?;
        tree.write_list("11-noop8.conflist", NOOP8, json!(vec![noop; 8]))?;
        tree.write_list("12-slow.conflist", SLOW, slow)?;
        Ok(tree)
    }

    pub(crate) fn root(&self) -> &Path {
        self.dirs[0].path()
    }

    pub(crate) fn cache(&self, s: Storage) -> PathBuf {
        self.dirs[s as usize].path().join("cache")
    }

    pub(crate) fn state(&self, s: Storage) -> PathBuf {
        self.dirs[s as usize].path().join("state")
    }

    /// Writes network `name` with `plugins` (version 1.0.0) into `file` of
    /// the conf dir.
    pub(crate) fn write_list(
        &self,
        file: &str,
        name: &str,
        plugins: Value,
    ) -> anyhow::Result<Value> {
        let list = json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
        fs::write(self.conf.join(file), serde_json::to_vec_pretty(&list)?)?;
        Ok(list)
    }

    pub(crate) fn load(&self, name: &str) -> anyhow::Result<NetworkConfigList> {
        Ok(cni_core::confdir::load_network(&self.conf, name)?)
    }
}

/// Runs `ip ARGS`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).stdin(Stdio::null()).output();
    let out = out.context("running ip (iproute2)")?;
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        err.trim()
    );
    Ok(())
}

/// A bridge network of the benchmark's own: bridge `TAG<pid>` (fixed MAC:
/// Linux otherwise gives a bridge the lowest MAC of its ports, and the
/// bridge plugin's CHECK fails when it changes) on a free `10.24x.y.0/LEN`,
/// namespaces `TAG<pid>-…`. Dropping it deletes every namespace with that
/// prefix and the bridge (the veths go with the namespaces).
pub(crate) struct RealNet {
    pub(crate) prefix: String,
    pub(crate) bridge: String,
    pub(crate) subnet: String,
}

impl RealNet {
    /// A bridge on a /`len` (16 to 24); with `chain`, the real chain on it
    /// (loopback, bridge with host-local, tuning; no gateway, no masquerade,
    /// no route out) written as network `chain.0` in file `chain.1` of the
    /// conf dir (its own host-local data dir in the tree).
    pub(crate) fn new(
        tree: &Tree,
        tag: &str,
        len: u32,
        chain: Option<(&str, &str)>,
    ) -> anyhow::Result<RealNet> {
        anyhow::ensure!((16..=24).contains(&len), "subnet length /{len}: 16 to 24");
        for p in ["loopback", "bridge", "host-local", "tuning", "portmap"] {
            if !Path::new(REAL_PLUGIN_DIR).join(p).exists() {
                bail!("{REAL_PLUGIN_DIR}/{p} is missing: run `make setup`");
            }
        }
        let out = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default()
        };
        let used = [
            out(&["-o", "-4", "addr", "show"]),
            out(&["-4", "route", "show"]),
        ]
        .concat();
        let used = String::from_utf8_lossy(&used);
        // Third octets per subnet, aligned to it.
        let (pid, span) = (std::process::id(), 1u32 << (24 - len));
        let (a, b) = (0..100u32)
            .map(|i| pid.wrapping_add(i.wrapping_mul(7919)))
            .map(|n| (240 + n % 10, ((n / 10) % (256 / span)) * span))
            .filter(|&(_, b)| b > 0 || span > 1)
            .find(|&(a, b)| (b..b + span).all(|c| !used.contains(&format!("10.{a}.{c}."))))
            .with_context(|| format!("no free 10.24x.y.0/{len}"))?;
        let (bridge, subnet) = (format!("{tag}{pid}"), format!("10.{a}.{b}.0/{len}"));
        ip(&["link", "add", "name", &bridge, "type", "bridge"])?;
        let net = RealNet {
            prefix: format!("{bridge}-"),
            bridge,
            subnet,
        };
        ip(&["link", "set", &net.bridge, "address", "02:cb:00:00:00:01"])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        if let Some((network, file)) = chain {
            let ipam = json!({"type": "host-local", "ranges": [[{"subnet": net.subnet}]],
                              "dataDir": tree.root().join(format!("host-local-{tag}"))});
            let plugins = json!([
                {"type": "loopback"},
                {"type": "bridge", "bridge": net.bridge, "isGateway": false, "ipMasq": false, "ipam": ipam},
                {"type": "tuning", "sysctl": {"net.core.somaxconn": "512"}}
            ]);
            tree.write_list(file, network, plugins)?;
        }
        Ok(net)
    }
}

impl Drop for RealNet {
    fn drop(&mut self) {
        for n in Netns::list_named()
            .unwrap_or_default()
            .iter()
            .filter(|n| n.starts_with(&self.prefix))
        {
            if let Err(e) = Netns::delete_named(n) {
                eprintln!("overhead: cannot delete netns {n}: {e}");
            }
        }
        if let Err(e) = ip(&["link", "del", &self.bridge]) {
            eprintln!("overhead: {e}");
        }
    }
}

/// A `cnid` process on the tree's conf dir; SIGTERM (then SIGKILL) on drop.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// A cnid on the tree's cache dir on `storage` and a state dir `tag`
    /// there, listening.
    pub(crate) fn start(
        cnid: &Path,
        tree: &Tree,
        storage: Storage,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let state = tree.state(storage).join(tag);
        Daemon::spawn(cnid, tree, &tree.cache(storage), &state, tag, extra)?.listening()
    }

    /// A cnid on `cache` and `state`, not waited for.
    pub(crate) fn spawn(
        cnid: &Path,
        tree: &Tree,
        cache: &Path,
        state: &Path,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let socket = tree.root().join(format!("cnid-{tag}.sock"));
        let log = tree.root().join(format!("cnid-{tag}.log"));
        let log_file = fs::File::create(&log)?;
        let mut cmd = Command::new(cnid);
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--conf-dir")
            .arg(&tree.conf);
        cmd.arg("--cache-dir")
            .arg(cache)
            .arg("--state-dir")
            .arg(state);
        for d in &tree.plugin_dirs {
            cmd.arg("--plugin-dir").arg(d);
        }
        for v in ["NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID"] {
            cmd.env_remove(v);
        }
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let child = cmd.spawn().context("starting cnid")?;
        Ok(Daemon { child, socket, log })
    }

    /// Waits until it accepts connections on its socket (15 s at most).
    pub(crate) fn listening(mut self) -> anyhow::Result<Daemon> {
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(st) = self.child.try_wait()? {
                bail!("cnid exited at start ({st}): {}", self.log_tail());
            }
            let late = start.elapsed() > Duration::from_secs(15);
            anyhow::ensure!(!late, "cnid not listening after 15 s: {}", self.log_tail());
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(self)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log_tail(&self) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// `VmRSS` and `VmHWM` in KiB, from `/proc`.
    pub(crate) fn rss_kib(&self) -> anyhow::Result<(u64, u64)> {
        let f = |k| crate::procs::status_kib(self.pid(), k);
        f("VmRSS:")
            .zip(f("VmHWM:"))
            .with_context(|| format!("/proc/{}/status", self.pid()))
    }

    /// An error's context: the last lines of the daemon's log.
    pub(crate) fn ctx(&self, e: anyhow::Error) -> anyhow::Error {
        e.context(self.log_tail())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raises the soft open-files limit to the hard one (1,000 connections at
/// once, on both ends; cnid inherits it).
pub(crate) fn raise_nofile() {
    // SAFETY: plain struct filled by getrlimit and read by setrlimit.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
