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
use crate::report::{Findings, Table, row};
use crate::setup::{Storage, Tree};
use crate::spawn::{Prepared, env_with};
use crate::stats::{Order, Summary, rounds, secs};

/// The runner name of Go's cnitool.
pub(crate) const GO_CNITOOL: &str = "Go cnitool";

/// The runner name of the floor as a process (`floor_driver.c`).
pub(crate) const DRIVER: &str = "C driver";

/// The verbs of one iteration, in order.
pub(crate) const VERBS: [&str; 3] = ["ADD", "CHECK", "DEL"];
/// The verbs and ADD+DEL, as tabulated.
pub(crate) const ALL_VERBS: [&str; 4] = ["ADD", "CHECK", "DEL", "ADD+DEL"];

/// Who runs the chain.
pub(crate) enum Runner {
    /// The floor (see [`crate::floor`]).
    Floor { chain: FloorChain, result: Vec<u8> },
    /// `cni_async::Cni` in this process, on a current-thread runtime; cache
    /// I/O on the calling thread when `inline`
    /// (`ResultCache::with_inline_io`), plugins started by `tokio::process`
    /// when `posix` (`RawExec::with_posix_spawn`).
    InProcess {
        cni: Cni,
        list: NetworkConfigList,
        rt: RuntimeConf,
        inline: bool,
        posix: bool,
    },
    /// A program per verb, spawned like a plugin: our cnitool or Go's
    /// (`name` says which); or the floor as a process, the static C driver
    /// (`floor_driver.c`) running the floor's steps from its plan files,
    /// whose ADD output goes to `result` (untimed) for its CHECK and DEL
    /// to read, as a runtime reads its cache.
    Process {
        name: &'static str,
        verbs: [Prepared; 3],
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

/// Where runners run a chain: the network, the netns path, the tree and the
/// cache's storage.
#[derive(Clone, Copy)]
pub(crate) struct On<'a> {
    pub(crate) list: &'a NetworkConfigList,
    pub(crate) netns: &'a str,
    pub(crate) tree: &'a Tree,
    pub(crate) storage: Storage,
}

impl On<'_> {
    pub(crate) fn floor(self) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-floor", self.netns, "eth0");
        let chain = FloorChain::new(self.list, &rt, &self.tree.plugin_dirs)?;
        Ok(Runner::Floor {
            chain,
            result: Vec::new(),
        })
    }

    /// The C driver at `driver`, its plans and result file in `dir`.
    pub(crate) fn driver(self, driver: &Path, dir: &Path) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-driver", self.netns, "eth0");
        let plans = FloorChain::new(self.list, &rt, &self.tree.plugin_dirs)?.write_plans(dir)?;
        let result = dir.join("result");
        let prep = |i: usize| {
            let (plan, env) = &plans[i];
            let mut args = vec![plan.as_os_str()];
            if i > 0 {
                args.push(result.as_os_str());
            }
            Prepared::new(driver, &args, env, format!("C driver {}", PLAN_VERBS[i]))
        };
        let verbs = [prep(0)?, prep(1)?, prep(2)?];
        Ok(Runner::Process {
            name: DRIVER,
            verbs,
            result: Some(result),
        })
    }

    pub(crate) fn in_process(self, inline: bool, posix: bool) -> Runner {
        let exec = cni_async::exec::RawExec::new().with_posix_spawn(posix);
        let cache = ResultCache::new(self.tree.cache(self.storage)).with_inline_io(inline);
        let plugin_dirs = self.tree.plugin_dirs.iter().cloned();
        let cni = Cni::builder()
            .exec(std::sync::Arc::new(exec))
            .plugin_dirs(plugin_dirs)
            .cache(cache)
            .build();
        let id = match (inline, posix) {
            (true, _) => "bench-inproc-inline",
            (false, true) => "bench-inproc-posix",
            (false, false) => "bench-inproc",
        };
        let (list, rt) = (self.list.clone(), RuntimeConf::new(id, self.netns, "eth0"));
        Runner::InProcess {
            cni,
            list,
            rt,
            inline,
            posix,
        }
    }

    /// A cnitool (`name`: ours, "cnitool", or [`GO_CNITOOL`], whose cache
    /// is a dir of its own beside ours; both derive the same container ID
    /// from the netns path), with the same environment.
    pub(crate) fn cnitool(self, name: &'static str, path: &Path) -> anyhow::Result<Runner> {
        let mut cache = self.tree.cache(self.storage);
        if name == GO_CNITOOL {
            cache.set_file_name("cache-go");
            std::fs::create_dir_all(&cache)?;
        }
        let env = cnitool_env(self.tree, &cache)?;
        let network = self.list.name();
        let prep = |verb: &str| {
            let args = [verb, network, self.netns].map(OsStr::new);
            Prepared::new(path, &args, &env, format!("{name} {verb} {network}"))
        };
        let verbs = [prep("add")?, prep("check")?, prep("del")?];
        Ok(Runner::Process {
            name,
            verbs,
            result: None,
        })
    }

    /// A cnid runner named `name`, attaching container `id`.
    pub(crate) fn cnid(self, name: &'static str, id: &str, client: Client) -> Runner {
        let req = AttachmentRequest::new(id, self.netns, "eth0");
        Runner::Cnid {
            name,
            client,
            network: self.list.name().to_owned(),
            req,
        }
    }
}

impl Runner {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Runner::Floor { .. } => "floor",
            Runner::InProcess { inline: true, .. } => "in-process, inline I/O",
            Runner::InProcess { posix: true, .. } => "in-process, tokio::process",
            Runner::InProcess { .. } => "in-process",
            Runner::Process { name, .. } | Runner::Cnid { name, .. } => name,
        }
    }

    /// ADD, CHECK, DEL; the time of each, in seconds.
    fn cycle(&mut self, tokio: &Runtime) -> anyhow::Result<[f64; 3]> {
        Ok(match self {
            Runner::Floor { chain, result } => [
                time(|| chain.add(result))?,
                time(|| chain.check(result))?,
                time(|| chain.del(result))?,
            ],
            Runner::InProcess { cni, list, rt, .. } => [
                time(|| Ok(tokio.block_on(cni.add_network_list(list, rt).into_future())?))?,
                time(|| Ok(tokio.block_on(cni.check_network_list(list, rt).into_future())?))?,
                time(|| Ok(tokio.block_on(cni.del_network_list(list, rt).into_future())?))?,
            ],
            Runner::Cnid {
                client,
                network,
                req,
                ..
            } => [
                time(|| Ok(tokio.block_on(client.add(network, req))?))?,
                time(|| Ok(tokio.block_on(client.check(network, req))?))?,
                time(|| Ok(tokio.block_on(client.del(network, req))?))?,
            ],
            Runner::Process { verbs, result, .. } => {
                let (mut t, mut out) = ([0.0; 3], Vec::new());
                for (i, p) in verbs.iter().enumerate() {
                    out.clear();
                    let s = Instant::now();
                    let exit = p.run(&[], &mut out)?;
                    t[i] = secs(s);
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
                t
            }
        })
    }
}

/// How long `f` took, in seconds.
fn time<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<f64> {
    let s = Instant::now();
    f()?;
    Ok(secs(s))
}

/// cnitool's environment: ours without anything that would change what it
/// does, plus where things are.
pub(crate) fn cnitool_env(tree: &Tree, cache: &Path) -> anyhow::Result<Vec<(OsString, OsString)>> {
    let cni_path = std::env::join_paths(&tree.plugin_dirs)?;
    Ok(env_with(&[
        ("NETCONFPATH", Some(tree.conf.as_os_str())),
        ("CNI_PATH", Some(&cni_path)),
        ("CNI_CACHE_DIR", Some(cache.as_os_str())),
        ("CNI_IFNAME", None),
        ("CNI_ARGS", None),
        ("CAP_ARGS", None),
        ("CNI_TIMEOUT", None),
        ("CNITOOL_JSON_ERRORS", None),
        ("RUST_LOG", None),
    ]))
}

/// The samples of one loop: per runner, per verb, one time per iteration.
pub(crate) struct Samples {
    pub(crate) names: Vec<&'static str>,
    pub(crate) times: Vec<Vec<[f64; 3]>>,
}

impl Samples {
    /// The series of runner `r` for `verb` (`ADD`, `CHECK`, `DEL`, `ADD+DEL`).
    pub(crate) fn series(&self, r: usize, verb: &str) -> Vec<f64> {
        let i = VERBS.iter().position(|x| *x == verb);
        let pick = |t: &[f64; 3]| i.map_or(t[0] + t[2], |i| t[i]);
        self.times[r].iter().map(pick).collect()
    }

    pub(crate) fn index(&self, name: &str) -> anyhow::Result<usize> {
        self.names
            .iter()
            .position(|n| *n == name)
            .with_context(|| format!("no runner {name:?}"))
    }
}

/// Runs `warmup + iterations` shuffled rounds; runner 0 must be the floor.
pub(crate) fn run_loop(
    runners: &mut [Runner],
    tokio: &Runtime,
    warmup: usize,
    iterations: usize,
    label: &str,
) -> anyhow::Result<Samples> {
    assert!(matches!(runners.first(), Some(Runner::Floor { .. })));
    let names: Vec<&'static str> = runners.iter().map(Runner::name).collect();
    let times = rounds(
        runners.len(),
        warmup,
        iterations,
        Order::Shuffle,
        label,
        |r, _| runners[r].cycle(tokio).with_context(|| names[r]),
    )?;
    Ok(Samples { names, times })
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
        for verb in ALL_VERBS {
            let (mine, floor) = (s.series(r, verb), s.series(0, verb));
            let time = Summary::of(&mine);
            findings.put(format!("{key}/{name}/{verb}/time"), time);
            if r == 0 {
                row!(table, name, verb, time.ms(), "1", "–");
                continue;
            }
            let (ratio, added) = (
                Summary::ratios(&mine, &floor),
                Summary::diffs(&mine, &floor),
            );
            findings.put(format!("{key}/{name}/{verb}/ratio"), ratio);
            findings.put(format!("{key}/{name}/{verb}/added"), added);
            row!(table, name, verb, time.ms(), ratio.ratio(), added.ms());
        }
    }
    // Pairs of runners: the difference cnid − in-process; ratios of Go's
    // cnitool over ours, and of ours and Go's over the floor as a process
    // (the most any tool can beat Go's cnitool by on this machine).
    if let (Ok(a), Ok(b)) = (s.index("cnid"), s.index("in-process")) {
        for verb in VERBS {
            let d = Summary::diffs(&s.series(a, verb), &s.series(b, verb));
            findings.put(format!("{key}/cnid-inproc/{verb}/added"), d);
            row!(table, "cnid − in-process", verb, "", "", d.ms());
        }
    }
    let tools = [
        (GO_CNITOOL, "go"),
        ("cnitool", "cnitool"),
        (DRIVER, "driver"),
    ];
    for (x, y) in [(0, 1), (1, 2), (0, 2)] {
        let ((a, at), (b, bt)) = (tools[x], tools[y]);
        let (Ok(ai), Ok(bi)) = (s.index(a), s.index(b)) else {
            continue;
        };
        for verb in ALL_VERBS {
            let r = Summary::ratios(&s.series(ai, verb), &s.series(bi, verb));
            findings.put(format!("{key}/{at}-over-{bt}/{verb}/ratio"), r);
            row!(table, format!("{a} ÷ {b}"), verb, "", r.ratio(), "");
        }
    }
    table.note(format!("{} iterations after warm-up", s.times[0].len()));
    table
}

/// A column of [`compare`]: a runner's times, or the per-iteration
/// difference `a − b` of two runners, recorded as `KEY/VERB/TAG`.
pub(crate) enum Col {
    Time(&'static str, &'static str),
    Diff(&'static str, &'static str, &'static str, &'static str),
}

/// A table of ADD, CHECK and DEL rows with `cols` (cnid builds or
/// requests against each other in one loop).
pub(crate) fn compare(
    s: &Samples,
    title: &str,
    cols: &[Col],
    key: &str,
    findings: &mut Findings,
) -> anyhow::Result<Table> {
    let mut header = vec!["verb"];
    header.extend(cols.iter().map(|c| match c {
        Col::Time(h, _) | Col::Diff(h, ..) => *h,
    }));
    let mut t = Table::new(title, &header);
    for verb in VERBS {
        let mut cells = vec![verb.to_owned()];
        for c in cols {
            cells.push(match *c {
                Col::Time(_, r) => Summary::of(&s.series(s.index(r)?, verb)).ms(),
                Col::Diff(_, a, b, tag) => {
                    let d =
                        Summary::diffs(&s.series(s.index(a)?, verb), &s.series(s.index(b)?, verb));
                    findings.put(format!("{key}/{verb}/{tag}"), d);
                    d.ms()
                }
            });
        }
        t.row(cells);
    }
    Ok(t)
}

/// The netns path the noop chains are given (they never enter it).
pub(crate) const NOOP_NETNS: &str = "/proc/self/ns/net";
