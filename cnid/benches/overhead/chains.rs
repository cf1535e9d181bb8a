//! Scenarios 1 to 4: one attachment's ADD, CHECK and DEL, run by the floor
//! and by each runtime in turn, many times.
//!
//! Each iteration runs every runner once (ADD, CHECK, DEL), in a shuffled
//! order (fixed seed), so the floor and each runtime alternate, and each
//! sits in every position and after every other runner equally often on
//! average (what a runner leaves behind, such as the kernel's deferred veth
//! teardown, falls on whoever comes next). Ratios and differences are
//! taken per iteration (runtime / floor of the same iteration), then
//! summarised: median and 10th–90th percentile.

use std::ffi::{OsStr, OsString};
use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use cni_async::Cni;
use cni_async::cache::ResultCache;
use cni_core::{NetworkConfigList, RuntimeConf};
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use tokio::runtime::Runtime;

use crate::floor::{FloorChain, PLAN_VERBS};
use crate::report::{Findings, Table};
use crate::setup::{Bins, Storage, Tree};
use crate::spawn::{Prepared, env_with};
use crate::stats::Summary;

/// The runner name of Go's cnitool.
pub(crate) const GO_CNITOOL: &str = "Go cnitool";

/// The runner name of the floor as a process (`floor_driver.c`).
pub(crate) const DRIVER: &str = "C driver";

/// The verbs of one iteration, in order.
pub(crate) const VERBS: [&str; 3] = ["ADD", "CHECK", "DEL"];

/// Who runs the chain.
pub(crate) enum Runner {
    /// The floor (see [`crate::floor`]).
    Floor { chain: FloorChain, result: Vec<u8> },
    /// `cni_async::Cni` in this process, on a current-thread runtime.
    InProcess {
        cni: Cni,
        list: NetworkConfigList,
        rt: RuntimeConf,
        /// Cache I/O on the calling thread (`ResultCache::with_inline_io`).
        inline: bool,
        /// Plugins started by `tokio::process` (`RawExec::with_posix_spawn`).
        posix: bool,
    },
    /// `cnitool add|check|del` as a process (spawned like a plugin): ours,
    /// or Go's on libcni (`name` says which); or the floor as a process,
    /// the static C driver (`floor_driver.c`, issue 25's floor) running the
    /// floor's steps from its plan files, whose ADD output goes to `result`
    /// (untimed) for its CHECK and DEL to read, as a runtime reads its
    /// cache.
    Cnitool {
        name: &'static str,
        add: Prepared,
        check: Prepared,
        del: Prepared,
        result: Option<PathBuf>,
    },
    /// A request to a running `cnid` with the typed client (`name`: which
    /// cnid, "cnid" for the one under test).
    Cnid {
        name: &'static str,
        client: Client,
        network: String,
        req: AttachmentRequest,
    },
}

impl Runner {
    pub(crate) fn floor(
        list: &NetworkConfigList,
        netns: &str,
        tree: &Tree,
    ) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-floor", netns, "eth0");
        Ok(Runner::Floor {
            chain: FloorChain::new(list, &rt, &tree.plugin_dirs)?,
            result: Vec::new(),
        })
    }

    /// The C driver at `driver`, its plans and result file in `dir`.
    pub(crate) fn driver(
        driver: &Path,
        list: &NetworkConfigList,
        netns: &str,
        tree: &Tree,
        dir: &Path,
    ) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-driver", netns, "eth0");
        let plans = FloorChain::new(list, &rt, &tree.plugin_dirs)?.write_plans(dir)?;
        let result = dir.join("result");
        let prep = |i: usize| {
            let (plan, env) = &plans[i];
            let mut args = vec![plan.as_os_str()];
            if i > 0 {
                args.push(result.as_os_str());
            }
            Prepared::new(driver, &args, env, format!("C driver {}", PLAN_VERBS[i]))
        };
        Ok(Runner::Cnitool {
            name: DRIVER,
            add: prep(0)?,
            check: prep(1)?,
            del: prep(2)?,
            result: Some(result),
        })
    }

    pub(crate) fn in_process(
        list: &NetworkConfigList,
        netns: &str,
        tree: &Tree,
        storage: Storage,
        inline: bool,
    ) -> Runner {
        Runner::in_process_spawn(list, netns, tree, storage, inline, false)
    }

    /// [`Runner::in_process`], plugins started by `tokio::process` when `posix`.
    pub(crate) fn in_process_spawn(
        list: &NetworkConfigList,
        netns: &str,
        tree: &Tree,
        storage: Storage,
        inline: bool,
        posix: bool,
    ) -> Runner {
        let exec = cni_async::exec::RawExec::new().with_posix_spawn(posix);
        let cni = Cni::builder()
            .exec(std::sync::Arc::new(exec))
            .plugin_dirs(tree.plugin_dirs.iter().cloned())
            .cache(ResultCache::new(tree.cache(storage)).with_inline_io(inline))
            .build();
        let id = match (inline, posix) {
            (true, _) => "bench-inproc-inline",
            (false, true) => "bench-inproc-posix",
            (false, false) => "bench-inproc",
        };
        Runner::InProcess {
            cni,
            list: list.clone(),
            rt: RuntimeConf::new(id, netns, "eth0"),
            inline,
            posix,
        }
    }

    pub(crate) fn cnitool(
        bins: &Bins,
        network: &str,
        netns: &str,
        tree: &Tree,
        storage: Storage,
    ) -> anyhow::Result<Runner> {
        Runner::any_cnitool("cnitool", &bins.cnitool, network, netns, tree, storage)
    }

    /// Go's cnitool (see [`crate::go`]), with the same environment and its
    /// own cache dir beside ours (both derive the same container ID from
    /// the netns path).
    pub(crate) fn go_cnitool(
        path: &std::path::Path,
        network: &str,
        netns: &str,
        tree: &Tree,
        storage: Storage,
    ) -> anyhow::Result<Runner> {
        Runner::any_cnitool(GO_CNITOOL, path, network, netns, tree, storage)
    }

    fn any_cnitool(
        name: &'static str,
        path: &std::path::Path,
        network: &str,
        netns: &str,
        tree: &Tree,
        storage: Storage,
    ) -> anyhow::Result<Runner> {
        let cni_path = std::env::join_paths(&tree.plugin_dirs)?;
        let mut cache = tree.cache(storage);
        if name == GO_CNITOOL {
            cache.set_file_name("cache-go");
            std::fs::create_dir_all(&cache)?;
        }
        let env = cnitool_env(tree, &cni_path, &cache);
        let prep = |verb: &str| {
            Prepared::new(
                path,
                &[OsStr::new(verb), OsStr::new(network), OsStr::new(netns)],
                &env,
                format!("{name} {verb} {network}"),
            )
        };
        Ok(Runner::Cnitool {
            name,
            add: prep("add")?,
            check: prep("check")?,
            del: prep("del")?,
            result: None,
        })
    }

    pub(crate) fn cnid(client: Client, network: &str, netns: &str) -> Runner {
        Runner::cnid_as("cnid", "bench-cnid", client, network, netns)
    }

    /// A cnid runner named `name` (another build beside the one under
    /// test), attaching container `id`.
    pub(crate) fn cnid_as(
        name: &'static str,
        id: &str,
        client: Client,
        network: &str,
        netns: &str,
    ) -> Runner {
        Runner::Cnid {
            name,
            client,
            network: network.to_owned(),
            req: AttachmentRequest::new(id, netns, "eth0"),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Runner::Floor { .. } => "floor",
            Runner::InProcess {
                inline: false,
                posix: false,
                ..
            } => "in-process",
            Runner::InProcess {
                inline: false,
                posix: true,
                ..
            } => "in-process, tokio::process",
            Runner::InProcess { inline: true, .. } => "in-process, inline I/O",
            Runner::Cnitool { name, .. } | Runner::Cnid { name, .. } => name,
        }
    }

    /// ADD, CHECK, DEL; the time of each, in seconds.
    fn cycle(&mut self, tokio: &Runtime) -> anyhow::Result<[f64; 3]> {
        let mut t = [0.0; 3];
        match self {
            Runner::Floor { chain, result } => {
                let s = Instant::now();
                chain.add(result)?;
                t[0] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                chain.check(result)?;
                t[1] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                chain.del(result)?;
                t[2] = s.elapsed().as_secs_f64();
            }
            Runner::InProcess { cni, list, rt, .. } => {
                let s = Instant::now();
                tokio.block_on(cni.add_network_list(list, rt).into_future())?;
                t[0] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                tokio.block_on(cni.check_network_list(list, rt).into_future())?;
                t[1] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                tokio.block_on(cni.del_network_list(list, rt).into_future())?;
                t[2] = s.elapsed().as_secs_f64();
            }
            Runner::Cnitool {
                add,
                check,
                del,
                result,
                ..
            } => {
                let mut out = Vec::new();
                for (i, p) in [add, check, del].into_iter().enumerate() {
                    out.clear();
                    let s = Instant::now();
                    let exit = p.run(&[], &mut out)?;
                    t[i] = s.elapsed().as_secs_f64();
                    if !exit.success() {
                        bail!("{} failed ({})", p.label(), exit.describe());
                    }
                    if i == 0 && out.is_empty() {
                        bail!("{} printed no result", p.label());
                    }
                    if let (0, Some(result)) = (i, result.as_ref()) {
                        std::fs::write(result, &out)
                            .with_context(|| format!("writing {}", result.display()))?;
                    }
                }
            }
            Runner::Cnid {
                client,
                network,
                req,
                ..
            } => {
                let s = Instant::now();
                tokio.block_on(client.add(network, req))?;
                t[0] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                tokio.block_on(client.check(network, req))?;
                t[1] = s.elapsed().as_secs_f64();
                let s = Instant::now();
                tokio.block_on(client.del(network, req))?;
                t[2] = s.elapsed().as_secs_f64();
            }
        }
        Ok(t)
    }
}

/// cnitool's environment: ours without anything that would change what it
/// does, plus where things are.
pub(crate) fn cnitool_env(
    tree: &Tree,
    cni_path: &OsStr,
    cache: &std::path::Path,
) -> Vec<(OsString, OsString)> {
    env_with(&[
        ("NETCONFPATH", Some(tree.conf.as_os_str())),
        ("CNI_PATH", Some(cni_path)),
        ("CNI_CACHE_DIR", Some(cache.as_os_str())),
        ("CNI_IFNAME", None),
        ("CNI_ARGS", None),
        ("CAP_ARGS", None),
        ("CNI_TIMEOUT", None),
        ("CNITOOL_JSON_ERRORS", None),
        ("RUST_LOG", None),
    ])
}

/// The samples of one loop: per runner, per verb, one time per iteration.
pub(crate) struct Samples {
    pub(crate) names: Vec<&'static str>,
    pub(crate) times: Vec<[Vec<f64>; 3]>,
}

impl Samples {
    /// ADD+DEL per iteration of runner `r`.
    fn add_del(&self, r: usize) -> Vec<f64> {
        self.times[r][0]
            .iter()
            .zip(&self.times[r][2])
            .map(|(a, d)| a + d)
            .collect()
    }

    /// The series of runner `r` for `verb` (`ADD`, `CHECK`, `DEL`, `ADD+DEL`).
    pub(crate) fn series(&self, r: usize, verb: &str) -> Vec<f64> {
        match verb {
            "ADD+DEL" => self.add_del(r),
            v => VERBS
                .iter()
                .position(|x| *x == v)
                .map(|i| self.times[r][i].clone())
                .unwrap_or_default(),
        }
    }

    pub(crate) fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| *n == name)
    }
}

/// Runs `warmup + iterations` iterations; runner 0 must be the floor.
pub(crate) fn run_loop(
    runners: &mut [Runner],
    tokio: &Runtime,
    warmup: usize,
    iterations: usize,
    label: &str,
) -> anyhow::Result<Samples> {
    assert!(matches!(runners.first(), Some(Runner::Floor { .. })));
    let k = runners.len();
    let mut times: Vec<[Vec<f64>; 3]> = (0..k).map(|_| Default::default()).collect();
    let started = Instant::now();
    let mut order: Vec<usize> = (0..k).collect();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for i in 0..warmup + iterations {
        // Fisher–Yates.
        for j in (1..k).rev() {
            order.swap(j, (rng.next() % (j as u64 + 1)) as usize);
        }
        for &r in &order {
            let t = runners[r]
                .cycle(tokio)
                .with_context(|| format!("{label}: {} (iteration {i})", runners[r].name()))?;
            if i >= warmup {
                for v in 0..3 {
                    times[r][v].push(t[v]);
                }
            }
        }
    }
    eprintln!(
        "overhead: {label}: {iterations} iterations in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Samples {
        names: runners.iter().map(Runner::name).collect(),
        times,
    })
}

/// One table for one loop, and its figures recorded under `key`
/// (`KEY/RUNNER/VERB/{time,ratio,added}`; `KEY/cnid-inproc/VERB/added`).
pub(crate) fn tabulate(s: &Samples, title: &str, key: &str, findings: &mut Findings) -> Table {
    let mut table = Table::new(
        title,
        &[
            "runner",
            "verb",
            "time ms, median (p10–p90)",
            "× floor, median (p10–p90)",
            "added ms, median (p10–p90)",
        ],
    );
    for (r, name) in s.names.iter().enumerate() {
        for verb in ["ADD", "CHECK", "DEL", "ADD+DEL"] {
            let mine = s.series(r, verb);
            let floor = s.series(0, verb);
            let time = Summary::of(&mine);
            findings.put(format!("{key}/{name}/{verb}/time"), time);
            if r == 0 {
                table.row(vec![
                    name.to_string(),
                    verb.into(),
                    time.ms(),
                    "1".into(),
                    "–".into(),
                ]);
                continue;
            }
            let ratio = Summary::ratios(&mine, &floor);
            let added = Summary::diffs(&mine, &floor);
            findings.put(format!("{key}/{name}/{verb}/ratio"), ratio);
            findings.put(format!("{key}/{name}/{verb}/added"), added);
            table.row(vec![
                name.to_string(),
                verb.into(),
                time.ms(),
                ratio.ratio(),
                added.ms(),
            ]);
        }
    }
    if let (Some(c), Some(p)) = (s.index("cnid"), s.index("in-process")) {
        for verb in ["ADD", "CHECK", "DEL"] {
            let d = Summary::diffs(&s.series(c, verb), &s.series(p, verb));
            findings.put(format!("{key}/cnid-inproc/{verb}/added"), d);
            table.row(vec![
                "cnid − in-process".into(),
                verb.into(),
                "".into(),
                "".into(),
                d.ms(),
            ]);
        }
    }
    if let (Some(g), Some(c)) = (s.index(GO_CNITOOL), s.index("cnitool")) {
        for verb in ["ADD", "CHECK", "DEL", "ADD+DEL"] {
            let r = Summary::ratios(&s.series(g, verb), &s.series(c, verb));
            findings.put(format!("{key}/go-over-cnitool/{verb}/ratio"), r);
            table.row(vec![
                "Go cnitool ÷ cnitool".into(),
                verb.into(),
                "".into(),
                r.ratio(),
                "".into(),
            ]);
        }
    }
    // Ours over the floor as a process; Go's over it: what no tool can
    // beat Go's cnitool by on this machine.
    for (tool, tag) in [("cnitool", "cnitool"), (GO_CNITOOL, "go")] {
        let (Some(c), Some(d)) = (s.index(tool), s.index(DRIVER)) else {
            continue;
        };
        for verb in ["ADD", "CHECK", "DEL", "ADD+DEL"] {
            let r = Summary::ratios(&s.series(c, verb), &s.series(d, verb));
            findings.put(format!("{key}/{tag}-over-driver/{verb}/ratio"), r);
            table.row(vec![
                format!("{tool} ÷ C driver"),
                verb.into(),
                "".into(),
                r.ratio(),
                "".into(),
            ]);
        }
    }
    table.note(format!("{} iterations after warm-up", s.times[0][0].len()));
    table
}

/// The netns path the noop chains are given (they never enter it).
pub(crate) const NOOP_NETNS: &str = "/proc/self/ns/net";

/// A small deterministic generator for the run order.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
