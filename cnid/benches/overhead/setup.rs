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
    /// Other builds of the noop plugin found in the bin dir, measured
    /// beside `noop` (issue 25): `cni-noop-c` (C, static, `make bench`
    /// builds it when a C compiler is there) and `cni-noop-dynamic`.
    pub(crate) noop_variants: Vec<(&'static str, PathBuf)>,
    /// The floor as a process (`floor_driver.c` built static as
    /// `cni-floor-c` by `make bench`), when the bin dir has it: issue 25's
    /// goal 2 is judged against it.
    pub(crate) driver: Option<PathBuf>,
    /// An empty static C program (`empty.c`, `cni-empty-c`): the reference
    /// of cnid-shim's start-up.
    pub(crate) empty_c: Option<PathBuf>,
}

/// The C driver's file name in the bin dir.
pub(crate) const DRIVER_FILE: &str = "cni-floor-c";

impl Bins {
    /// From `dir` when given (binaries built by `cargo build --release`,
    /// as shipped), else the ones cargo built for this benchmark.
    pub(crate) fn find(dir: Option<&Path>) -> anyhow::Result<Bins> {
        let bins = match dir {
            Some(d) => Bins {
                cnitool: d.join("cnitool"),
                cnid: d.join("cnid"),
                noop: d.join("cni-noop"),
                shim: d.join("cnid-shim"),
                noop_variants: NOOP_VARIANTS
                    .iter()
                    .map(|(label, file)| (*label, d.join(file)))
                    .filter(|(_, p)| p.is_file())
                    .collect(),
                driver: Some(d.join(DRIVER_FILE)).filter(|p| p.is_file()),
                empty_c: Some(d.join("cni-empty-c")).filter(|p| p.is_file()),
            },
            None => Bins {
                // Other packages' binaries (cnitool, cnid-shim): cargo
                // builds them with the workspace (`make bench`), next to
                // cnid's.
                cnitool: Path::new(env!("CARGO_BIN_EXE_cnid")).with_file_name("cnitool"),
                cnid: env!("CARGO_BIN_EXE_cnid").into(),
                noop: cni_test_support::noop::build_noop().map_err(anyhow::Error::msg)?,
                shim: Path::new(env!("CARGO_BIN_EXE_cnid")).with_file_name("cnid-shim"),
                noop_variants: Vec::new(),
                driver: None,
                empty_c: None,
            },
        };
        for b in [&bins.cnitool, &bins.cnid, &bins.noop, &bins.shim] {
            if !b.is_file() {
                bail!(
                    "{} not found (build with `cargo build --release -p cnid -p cnitool -p cnid-shim --bins -p cni-noop`)",
                    b.display()
                );
            }
        }
        Ok(bins)
    }
}

/// Where the cache (and cnid's state dir) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Storage {
    /// A dir on the disk (`/var/tmp`): every cache write and removal is
    /// fsynced, as by default.
    Disk,
    /// A dir on tmpfs (`/dev/shm`): the same code, but fsync costs nothing.
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

/// The temp tree.
pub(crate) struct Tree {
    disk: tempfile::TempDir,
    shm: tempfile::TempDir,
    /// The plugin dir holding `noop`.
    pub(crate) bin: PathBuf,
    /// The conf dir.
    pub(crate) conf: PathBuf,
    /// The plugin dirs the runtimes use: `bin`, then the reference plugins.
    pub(crate) plugin_dirs: Vec<PathBuf>,
}

impl Tree {
    pub(crate) fn new(bins: &Bins) -> anyhow::Result<Tree> {
        let disk = tempfile::Builder::new()
            .prefix("cni-bench-")
            .tempdir_in("/var/tmp")
            .context("temp dir in /var/tmp")?;
        let shm = tempfile::Builder::new()
            .prefix("cni-bench-")
            .tempdir_in("/dev/shm")
            .context("temp dir in /dev/shm")?;
        let bin = disk.path().join("bin");
        let conf = disk.path().join("net.d");
        for d in [&bin, &conf] {
            fs::create_dir_all(d)?;
        }
        for s in [Storage::Disk, Storage::Tmpfs] {
            let root = match s {
                Storage::Disk => disk.path(),
                Storage::Tmpfs => shm.path(),
            };
            fs::create_dir_all(root.join("cache"))?;
            fs::create_dir_all(root.join("state"))?;
        }
        // A copy, not a link: the plugin's page cache and path are ours.
        let noop = bin.join("noop");
        // Through the test support's writer: never "text file busy".
        cni_test_support::executable::copy_executable(&bins.noop, &noop, 0o755);
        let tree = Tree {
            plugin_dirs: vec![bin.clone(), PathBuf::from(REAL_PLUGIN_DIR)],
            disk,
            shm,
            bin,
            conf,
        };
        let noop = |extra: Value| {
            let mut p = json!({"type": "noop"});
            if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
                p.extend(e.clone());
            }
            p
        };
        tree.write_conf(
            "10-noop1.conflist",
            &json!({"cniVersion": "1.0.0", "name": NOOP1, "plugins": [noop(json!({}))]}),
        )?;
        let eight: Vec<Value> = (0..8).map(|_| noop(json!({}))).collect();
        tree.write_conf(
            "11-noop8.conflist",
            &json!({"cniVersion": "1.0.0", "name": NOOP8, "plugins": eight}),
        )?;
        tree.write_conf(
            "12-slow.conflist",
            &json!({"cniVersion": "1.0.0", "name": SLOW,
                    "plugins": [noop(json!({"sleepMs": SLOW_ADD_MS}))]}),
        )?;
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
        fs::write(self.conf.join(file), serde_json::to_vec_pretty(conf)?)?;
        Ok(())
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

/// The real chain's own bridge, subnet and namespaces. Dropping it deletes
/// every namespace whose name starts with [`RealNet::prefix`] and the
/// bridge (the veths go with the namespaces).
pub(crate) struct RealNet {
    prefix: String,
    bridge: String,
    subnet: String,
}

impl RealNet {
    /// Picks a bridge name and a free `10.24x.y.0/24`, creates the bridge
    /// (fixed MAC: Linux otherwise gives a bridge the lowest MAC of its
    /// ports, and the bridge plugin's CHECK fails when it changes) and
    /// writes the `bench-real` network: loopback, bridge with host-local,
    /// tuning. No gateway, no masquerade, no route out.
    pub(crate) fn create(tree: &Tree) -> anyhow::Result<RealNet> {
        RealNet::create_as(tree, "cnb", REAL, "20-real.conflist", 24)
    }

    /// [`RealNet::create`] on a bridge `TAG<pid>`, namespaces `TAG<pid>-…`,
    /// a free `10.24x.y.0/LEN` (`LEN` 16 to 24) and its own host-local data
    /// dir in the tree, as network `network` in `file`.
    pub(crate) fn create_as(
        tree: &Tree,
        tag: &str,
        network: &str,
        file: &str,
        len: u32,
    ) -> anyhow::Result<RealNet> {
        let net = RealNet::bridge_only(tag, len, &["loopback", "bridge", "host-local", "tuning"])?;
        let data = tree.root().join(format!("host-local-{tag}"));
        tree.write_conf(
            file,
            &json!({
                "cniVersion": "1.0.0",
                "name": network,
                "plugins": [
                    {"type": "loopback"},
                    {"type": "bridge", "bridge": net.bridge, "isGateway": false, "ipMasq": false,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": net.subnet}]],
                              "dataDir": data}},
                    {"type": "tuning", "sysctl": {"net.core.somaxconn": "512"}}
                ]
            }),
        )?;
        Ok(net)
    }

    /// The bridge `TAG<pid>` on a free `10.24x.y.0/LEN` (`LEN` 16 to 24),
    /// namespaces `TAG<pid>-…`, no network written: the caller writes its
    /// own chain, of `plugins` (checked to be in the reference plugins' dir).
    pub(crate) fn bridge_only(tag: &str, len: u32, plugins: &[&str]) -> anyhow::Result<RealNet> {
        anyhow::ensure!((16..=24).contains(&len), "subnet length /{len}: 16 to 24");
        for p in plugins {
            if !Path::new(REAL_PLUGIN_DIR).join(p).exists() {
                bail!("{REAL_PLUGIN_DIR}/{p} is missing: run `make setup`");
            }
        }
        let pid = std::process::id();
        let used = Command::new("ip")
            .args(["-o", "-4", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            + &Command::new("ip")
                .args(["-4", "route", "show"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
        // Third octets per subnet, aligned to it.
        let span = 1u32 << (24 - len);
        let blocks = 256 / span;
        let (a, b) = (0..100u32)
            .map(|i| {
                let n = pid.wrapping_add(i.wrapping_mul(7919));
                (240 + n % 10, ((n / 10) % blocks) * span)
            })
            .filter(|&(_, b)| b > 0 || span > 1)
            .find(|&(a, b)| (b..b + span).all(|c| !used.contains(&format!("10.{a}.{c}."))))
            .with_context(|| format!("no free 10.24x.y.0/{len}"))?;
        let net = RealNet {
            prefix: format!("{tag}{pid}-"),
            bridge: format!("{tag}{pid}"),
            subnet: format!("10.{a}.{b}.0/{len}"),
        };
        ip(&["link", "add", "name", &net.bridge, "type", "bridge"])?;
        ip(&["link", "set", &net.bridge, "address", "02:cb:00:00:00:01"])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// The prefix of every namespace name of this run.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn bridge(&self) -> &str {
        &self.bridge
    }

    pub(crate) fn subnet(&self) -> &str {
        &self.subnet
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
    pub(crate) fn start(
        bins: &Bins,
        tree: &Tree,
        storage: Storage,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let state = tree.state(storage).join(tag);
        Daemon::start_on(bins, tree, &tree.cache(storage), &state, tag, extra)
    }

    /// [`Daemon::start`] on `cache` and `state`: started and listening.
    pub(crate) fn start_on(
        bins: &Bins,
        tree: &Tree,
        cache: &Path,
        state: &Path,
        tag: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let mut d = Daemon::spawn_on(bins, tree, cache, state, tag, extra)?;
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Some(st) = d.child.try_wait()? {
                bail!("cnid exited at start ({st}): {}", d.log_tail());
            }
            if start.elapsed() > Duration::from_secs(15) {
                bail!("cnid not listening after 15 s: {}", d.log_tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// A cnid on `cache` and `state`, not waited for.
    pub(crate) fn spawn_on(
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
            .arg(&tree.conf)
            .arg("--cache-dir")
            .arg(cache)
            .arg("--state-dir")
            .arg(state);
        for d in &tree.plugin_dirs {
            cmd.arg("--plugin-dir").arg(d);
        }
        cmd.args(extra)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let child = cmd.spawn().context("starting cnid")?;
        Ok(Daemon { child, socket, log })
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
