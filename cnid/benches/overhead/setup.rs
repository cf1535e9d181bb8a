//! What the scenarios run on: the binaries, a temp tree with the noop
//! plugin and the conf dir, cache dirs on disk and on tmpfs, the real
//! bridge network (its own bridge, subnet and namespaces, removed on drop),
//! and `cnid` processes.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
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

/// The other noop builds `make bench` puts in the bin dir: label, file.
pub(crate) const NOOP_VARIANTS: [(&str, &str); 2] = [
    ("C noop (static)", "cni-noop-c"),
    ("cni-noop (dynamic)", "cni-noop-dynamic"),
];

/// The label of the C noop among [`Bins::noop_variants`].
pub(crate) const C_NOOP: &str = NOOP_VARIANTS[0].0;

/// The binaries under test.
#[derive(Debug, Clone)]
pub(crate) struct Bins {
    pub(crate) cnitool: PathBuf,
    pub(crate) cnid: PathBuf,
    pub(crate) noop: PathBuf,
    /// As shipped, statically linked (`make shim`) when from a bin dir.
    pub(crate) shim: PathBuf,
    /// Other builds of the noop plugin in the bin dir, measured beside
    /// `noop`: [`NOOP_VARIANTS`].
    pub(crate) noop_variants: Vec<(&'static str, PathBuf)>,
    /// The floor as a process (`floor_driver.c`, `cni-floor-c`): the goal
    /// of cnitool's ADD is judged against it.
    pub(crate) driver: Option<PathBuf>,
    /// An empty static C program (`empty.c`, `cni-empty-c`): the reference
    /// of cnid-shim's start-up.
    pub(crate) empty_c: Option<PathBuf>,
}

impl Bins {
    /// From `dir` when given (built by `make bench` as shipped), else the
    /// ones cargo built next to cnid's.
    pub(crate) fn find(dir: Option<&Path>) -> anyhow::Result<Bins> {
        let cargo = Path::new(env!("CARGO_BIN_EXE_cnid"));
        let d = dir.unwrap_or(cargo.parent().context("cargo's bin dir")?);
        let optional = |file: &str| Some(d.join(file)).filter(|p| p.is_file() && dir.is_some());
        let noop = match dir {
            Some(d) => d.join("cni-noop"),
            None => cni_test_support::noop::build_noop().map_err(anyhow::Error::msg)?,
        };
        let bins = Bins {
            cnitool: d.join("cnitool"),
            cnid: d.join("cnid"),
            noop,
            shim: d.join("cnid-shim"),
            noop_variants: NOOP_VARIANTS
                .iter()
                .filter_map(|(l, f)| Some((*l, optional(f)?)))
                .collect(),
            driver: optional("cni-floor-c"),
            empty_c: optional("cni-empty-c"),
        };
        for b in [&bins.cnitool, &bins.cnid, &bins.noop, &bins.shim] {
            anyhow::ensure!(
                b.is_file(),
                "{} not found (build with `cargo build --release -p cnid -p cnitool -p cnid-shim --bins -p cni-noop`)",
                b.display()
            );
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
    pub(crate) fn label(self) -> &'static str {
        match self {
            Storage::Disk => "cache on disk (fsync)",
            Storage::Tmpfs => "cache on tmpfs (fsync free)",
        }
    }

    pub(crate) fn short(self) -> &'static str {
        match self {
            Storage::Disk => "disk",
            Storage::Tmpfs => "tmpfs",
        }
    }
}

/// The temp tree: `bin` (the plugin dir holding `noop`), `conf` (the conf
/// dir), and per storage a `cache` and a `state` dir.
pub(crate) struct Tree {
    disk: tempfile::TempDir,
    shm: tempfile::TempDir,
    pub(crate) bin: PathBuf,
    pub(crate) conf: PathBuf,
    /// The plugin dirs the runtimes use: `bin`, then the reference plugins.
    pub(crate) plugin_dirs: Vec<PathBuf>,
}

impl Tree {
    pub(crate) fn new(bins: &Bins) -> anyhow::Result<Tree> {
        let temp = |dir| {
            tempfile::Builder::new()
                .prefix("cni-bench-")
                .tempdir_in(dir)
                .with_context(|| format!("temp dir in {dir}"))
        };
        let (disk, shm) = (temp("/var/tmp")?, temp("/dev/shm")?);
        let (bin, conf) = (disk.path().join("bin"), disk.path().join("net.d"));
        for d in [&bin, &conf] {
            fs::create_dir_all(d)?;
        }
        for root in [disk.path(), shm.path()] {
            fs::create_dir_all(root.join("cache"))?;
            fs::create_dir_all(root.join("state"))?;
        }
        // A copy, not a link: the plugin's page cache and path are ours;
        // through the test support's writer: never "text file busy".
        cni_test_support::executable::copy_executable(&bins.noop, &bin.join("noop"), 0o755);
        let plugin_dirs = vec![bin.clone(), PathBuf::from(REAL_PLUGIN_DIR)];
        let tree = Tree {
            plugin_dirs,
            disk,
            shm,
            bin,
            conf,
        };
        let list = |name: &str, plugins: Value| json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
        let noop = json!({"type": "noop"});
        tree.write_conf("10-noop1.conflist", &list(NOOP1, json!([noop])))?;
        tree.write_conf("11-noop8.conflist", &list(NOOP8, json!(vec![noop; 8])))?;
        let slow = json!([{"type": "noop", "sleepMs": SLOW_ADD_MS}]);
        tree.write_conf("12-slow.conflist", &list(SLOW, slow))?;
        Ok(tree)
    }

    pub(crate) fn root(&self) -> &Path {
        self.disk.path()
    }

    pub(crate) fn cache(&self, s: Storage) -> PathBuf {
        self.storage_root(s).join("cache")
    }

    pub(crate) fn state(&self, s: Storage) -> PathBuf {
        self.storage_root(s).join("state")
    }

    fn storage_root(&self, s: Storage) -> &Path {
        match s {
            Storage::Disk => self.disk.path(),
            Storage::Tmpfs => self.shm.path(),
        }
    }

    pub(crate) fn write_conf(&self, file: &str, conf: &Value) -> anyhow::Result<()> {
        Ok(fs::write(
            self.conf.join(file),
            serde_json::to_vec_pretty(conf)?,
        )?)
    }

    pub(crate) fn load(&self, name: &str) -> anyhow::Result<NetworkConfigList> {
        Ok(cni_core::confdir::load_network(&self.conf, name)?)
    }
}

/// Runs `ip ARGS`, failing with its stderr.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
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
    /// The `bench-real` network: loopback, bridge with host-local, tuning;
    /// no gateway, no masquerade, no route out.
    pub(crate) fn create(tree: &Tree) -> anyhow::Result<RealNet> {
        RealNet::new(tree, "cnb", 24, Some((REAL, "20-real.conflist")))
    }

    /// A bridge on a /`len` (16 to 24); with `chain`, the real chain on it
    /// written as network `chain.0` in file `chain.1` of the conf dir (its
    /// own host-local data dir in the tree).
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
        let used = String::from_utf8_lossy(
            &[
                out(&["-o", "-4", "addr", "show"]),
                out(&["-4", "route", "show"]),
            ]
            .concat(),
        )
        .into_owned();
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
            tree.write_conf(
                file,
                &json!({"cniVersion": "1.0.0", "name": network, "plugins": plugins}),
            )?;
        }
        Ok(net)
    }
}

impl Drop for RealNet {
    fn drop(&mut self) {
        if let Ok(names) = cni_async::netns::Netns::list_named() {
            for n in names.iter().filter(|n| n.starts_with(&self.prefix)) {
                if let Err(e) = cni_async::netns::Netns::delete_named(n) {
                    eprintln!("overhead: cannot delete netns {n}: {e}");
                }
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
        bins: &Bins,
        tree: &Tree,
        storage: Storage,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let state = tree.state(storage).join(tag);
        Daemon::spawn(bins, tree, &tree.cache(storage), &state, tag, extra)?.listening()
    }

    /// A cnid on `cache` and `state`, not waited for.
    pub(crate) fn spawn(
        bins: &Bins,
        tree: &Tree,
        cache: &Path,
        state: &Path,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let socket = tree.root().join(format!("cnid-{tag}.sock"));
        let log = tree.root().join(format!("cnid-{tag}.log"));
        let log_file = fs::File::create(&log)?;
        let mut cmd = Command::new(&bins.cnid);
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
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(15),
                "cnid not listening after 15 s: {}",
                self.log_tail()
            );
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
