//! Scenarios 1 to 4: one attachment's ADD, CHECK and DEL, run by the floor
//! and by each runtime in turn, in shuffled rounds (`stats::rounds`);
//! ratios and differences are per iteration against the floor of the same
//! iteration, summarised as median and 10th–90th percentile.

use std::ffi::OsStr;
use std::future::IntoFuture;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use cni_async::Cni;
use cni_async::cache::ResultCache;
use cni_core::{NetworkConfigList, RuntimeConf};
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use tokio::runtime::Runtime;

use crate::floor::FloorChain;
use crate::report::{Findings, Table, row};
use crate::setup::{Storage, Tree};
use crate::spawn::{Env, Prepared, env_with};
use crate::stats::{Order, Summary, diffs, rounds, secs};

/// The runner names of Go's cnitool and of the floor as a process
/// (`floor_driver.c`).
pub(crate) const GO_CNITOOL: &str = "Go cnitool";
pub(crate) const DRIVER: &str = "C driver";

/// The verbs of one iteration, in order; and ADD+DEL, as tabulated.
pub(crate) const VERBS: [&str; 3] = ["ADD", "CHECK", "DEL"];
const ALL_VERBS: [&str; 4] = ["ADD", "CHECK", "DEL", "ADD+DEL"];

/// The netns path the noop chains are given (they never enter it).
pub(crate) const NOOP_NETNS: &str = "/proc/self/ns/net";

/// Who runs the chain: a name, and one iteration (ADD, CHECK, DEL; the
/// time of each, in seconds).
pub(crate) struct Runner(pub(crate) &'static str, Cycle);
type Cycle = Box<dyn FnMut(&Runtime) -> anyhow::Result<[f64; 3]>>;

/// Times `verb(0)`, `verb(1)`, `verb(2)` in turn.
fn time3(mut verb: impl FnMut(usize) -> anyhow::Result<()>) -> anyhow::Result<[f64; 3]> {
    let mut t = [0.0; 3];
    for (v, t) in t.iter_mut().enumerate() {
        let s = Instant::now();
        verb(v).with_context(|| VERBS[v])?;
        *t = secs(s);
    }
    Ok(t)
}

/// Where runners run a chain: the network, the netns path, the tree and the
/// cache's storage.
#[derive(Clone, Copy)]
pub(crate) struct On<'a>(
    pub(crate) &'a NetworkConfigList,
    pub(crate) &'a str,
    pub(crate) &'a Tree,
    pub(crate) Storage,
);

impl On<'_> {
    /// The floor (see [`crate::floor`]).
    pub(crate) fn floor(self) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-floor", self.1, "eth0");
        let chain = FloorChain::new(self.0, &rt, &self.2.plugin_dirs)?;
        let mut result = Vec::new();
        let cycle = move |_: &Runtime| {
            time3(|v| {
                if v == 0 {
                    chain.add(&mut result)
                } else {
                    chain.with_result(v, &result)
                }
            })
        };
        Ok(Runner("floor", Box::new(cycle)))
    }

    /// A program per verb, spawned like a plugin (posix_spawn, stdout read
    /// to EOF); an ADD must print a result. With `result`, the ADD's output
    /// is written there (untimed) for CHECK and DEL to read, as a runtime
    /// reads its cache.
    fn process(
        name: &'static str,
        verbs: [Prepared; 3],
        result: Option<std::path::PathBuf>,
    ) -> Runner {
        let mut out = Vec::new();
        let cycle = move |_: &Runtime| {
            let mut t = [0.0; 3];
            for (i, p) in verbs.iter().enumerate() {
                t[i] = p.run_ok(&[], &mut out)?.0;
                anyhow::ensure!(i > 0 || !out.is_empty(), "{} printed no result", p.label);
                if let (0, Some(r)) = (i, &result) {
                    std::fs::write(r, &out).with_context(|| format!("writing {}", r.display()))?;
                }
            }
            Ok(t)
        };
        Runner(name, Box::new(cycle))
    }

    /// The floor as a process: the static C driver at `driver` running the
    /// floor's steps from its plan files, in `dir` with its result file.
    pub(crate) fn driver(self, driver: &Path, dir: &Path) -> anyhow::Result<Runner> {
        let rt = RuntimeConf::new("bench-driver", self.1, "eth0");
        let plans = FloorChain::new(self.0, &rt, &self.2.plugin_dirs)?.write_plans(dir)?;
        let result = dir.join("result");
        let prep = |i: usize| {
            let (plan, env) = &plans[i];
            let args = [plan.as_os_str(), result.as_os_str()];
            Prepared::new(
                driver,
                &args[..1 + usize::from(i > 0)],
                env,
                format!("C driver {}", VERBS[i]),
            )
        };
        Ok(On::process(
            DRIVER,
            [prep(0)?, prep(1)?, prep(2)?],
            Some(result),
        ))
    }

    /// `cni_async::Cni` in this process, on a current-thread runtime; cache
    /// I/O on the calling thread when `inline`
    /// (`ResultCache::with_inline_io`), plugins started by `tokio::process`
    /// when `posix` (`RawExec::with_posix_spawn`).
    pub(crate) fn in_process(self, inline: bool, posix: bool) -> Runner {
        let exec = cni_async::exec::RawExec::new().with_posix_spawn(posix);
        let cache = ResultCache::new(self.2.cache(self.3)).with_inline_io(inline);
        let builder = Cni::builder()
            .exec(std::sync::Arc::new(exec))
            .plugin_dirs(self.2.plugin_dirs.iter().cloned());
        let cni = builder.cache(cache).build();
        let (name, id) = match (inline, posix) {
            (true, _) => ("in-process, inline I/O", "bench-inproc-inline"),
            (false, true) => ("in-process, tokio::process", "bench-inproc-posix"),
            (false, false) => ("in-process", "bench-inproc"),
        };
        let (list, rt) = (self.0.clone(), RuntimeConf::new(id, self.1, "eth0"));
        let cycle = move |tokio: &Runtime| {
            time3(|v| {
                match v {
                    0 => drop(tokio.block_on(cni.add_network_list(&list, &rt).into_future())?),
                    1 => tokio.block_on(cni.check_network_list(&list, &rt).into_future())?,
                    _ => tokio.block_on(cni.del_network_list(&list, &rt).into_future())?,
                }
                Ok(())
            })
        };
        Runner(name, Box::new(cycle))
    }

    /// A cnitool (`name`: ours, "cnitool", or [`GO_CNITOOL`], whose cache
    /// is a dir of its own beside ours; both derive the same container ID
    /// from the netns path), with the same environment.
    pub(crate) fn cnitool(self, name: &'static str, path: &Path) -> anyhow::Result<Runner> {
        let mut cache = self.2.cache(self.3);
        if name == GO_CNITOOL {
            cache.set_file_name("cache-go");
            std::fs::create_dir_all(&cache)?;
        }
        let (env, network) = (cnitool_env(self.2, &cache)?, self.0.name());
        let prep = |verb: &str| {
            let args = [verb, network, self.1].map(OsStr::new);
            Prepared::new(path, &args, &env, format!("{name} {verb} {network}"))
        };
        Ok(On::process(
            name,
            [prep("add")?, prep("check")?, prep("del")?],
            None,
        ))
    }

    /// A request to a running `cnid` with the typed client (`name`: which
    /// cnid, "cnid" for the one under test), attaching container `id`.
    pub(crate) fn cnid(self, name: &'static str, id: &str, client: Client) -> Runner {
        let (req, network) = (
            AttachmentRequest::new(id, self.1, "eth0"),
            self.0.name().to_owned(),
        );
        let cycle = move |tokio: &Runtime| {
            time3(|v| {
                match v {
                    0 => drop(tokio.block_on(client.add(&network, &req))?),
                    1 => tokio.block_on(client.check(&network, &req))?,
                    _ => tokio.block_on(client.del(&network, &req))?,
                }
                Ok(())
            })
        };
        Runner(name, Box::new(cycle))
    }
}

/// cnitool's environment: ours without anything that would change what it
/// does, plus where things are.
pub(crate) fn cnitool_env(tree: &Tree, cache: &Path) -> anyhow::Result<Env> {
    let cni_path = std::env::join_paths(&tree.plugin_dirs)?;
    let unset = [
        "CNI_IFNAME",
        "CNI_ARGS",
        "CAP_ARGS",
        "CNI_TIMEOUT",
        "CNITOOL_JSON_ERRORS",
        "RUST_LOG",
    ];
    let set = [
        ("NETCONFPATH", tree.conf.as_os_str()),
        ("CNI_PATH", &cni_path),
        ("CNI_CACHE_DIR", cache.as_os_str()),
    ];
    let all: Vec<_> = set
        .iter()
        .map(|(k, v)| (*k, Some(*v)))
        .chain(unset.map(|k| (k, None)))
        .collect();
    Ok(env_with(&all))
}

/// The samples of one loop: per runner, its name and per iteration the
/// time of each verb.
pub(crate) struct Samples(Vec<&'static str>, Vec<Vec<[f64; 3]>>);

impl Samples {
    /// The series of runner `r` for `verb` (`ADD`, `CHECK`, `DEL`, `ADD+DEL`).
    pub(crate) fn series(&self, r: usize, verb: &str) -> Vec<f64> {
        let i = VERBS.iter().position(|x| *x == verb);
        self.1[r]
            .iter()
            .map(|t| i.map_or(t[0] + t[2], |i| t[i]))
            .collect()
    }

    /// The series of the runner named `name`.
    fn of(&self, name: &str, verb: &str) -> anyhow::Result<Vec<f64>> {
        let r = self
            .0
            .iter()
            .position(|n| *n == name)
            .with_context(|| format!("no runner {name:?}"))?;
        Ok(self.series(r, verb))
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
    assert!(runners.first().is_some_and(|r| r.0 == "floor"));
    let k = runners.len();
    let times = rounds((k, warmup, iterations), Order::Shuffle, label, |r, _| {
        let Runner(name, cycle) = &mut runners[r];
        cycle(tokio).with_context(|| *name)
    })?;
    Ok(Samples(runners.iter().map(|r| r.0).collect(), times))
}

/// One table for one loop, and its figures recorded under `key`
/// (`KEY/RUNNER/VERB/{time,ratio,added}`; `KEY/cnid-inproc/VERB/added`).
pub(crate) fn tabulate(s: &Samples, title: &str, key: &str, findings: &mut Findings) -> Table {
    let header = "runner|verb|time ms, median (p10–p90)|× floor, median (p10–p90)|added ms, median (p10–p90)";
    let mut table = Table::new(title, header);
    for (r, name) in s.0.iter().enumerate() {
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
    for verb in VERBS {
        if let (Ok(a), Ok(b)) = (s.of("cnid", verb), s.of("in-process", verb)) {
            let d = Summary::diffs(&a, &b);
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
        for verb in ALL_VERBS {
            let (Ok(sa), Ok(sb)) = (s.of(a, verb), s.of(b, verb)) else {
                break;
            };
            let r = Summary::ratios(&sa, &sb);
            findings.put(format!("{key}/{at}-over-{bt}/{verb}/ratio"), r);
            row!(table, format!("{a} ÷ {b}"), verb, "", r.ratio(), "");
        }
    }
    table.note(format!("{} iterations after warm-up", s.1[0].len()));
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
    f: &mut Findings,
) -> anyhow::Result<Table> {
    let head = cols.iter().map(|c| match c {
        Col::Time(h, _) | Col::Diff(h, ..) => *h,
    });
    let mut t = Table::new(
        title,
        &["verb"]
            .into_iter()
            .chain(head)
            .collect::<Vec<_>>()
            .join("|"),
    );
    for verb in VERBS {
        let mut cells = vec![verb.to_owned()];
        for c in cols {
            cells.push(match *c {
                Col::Time(_, r) => Summary::of(&s.of(r, verb)?).ms(),
                Col::Diff(_, a, b, tag) => {
                    let d = Summary::of(&diffs(&s.of(a, verb)?, &s.of(b, verb)?));
                    f.put(format!("{key}/{verb}/{tag}"), d);
                    d.ms()
                }
            });
        }
        t.row(cells);
    }
    Ok(t)
}
