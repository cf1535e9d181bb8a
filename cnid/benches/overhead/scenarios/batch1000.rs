//! A batch of N namespaces (`--only batch1000`, root; 1,000 by default,
//! `--batch1000-count`) on the real chain, through the shipped
//! `cnitool batch up|down`, against a loop of Go's cnitool and the floor.
//!
//! Three runners, each setting up N namespaces (create + ADD) and then
//! tearing them down (DEL + delete), at concurrency C (1, 4 and 8 by
//! default, `--batch1000-concurrency`), alternating per repetition (order
//! floor, cnitool, Go, then reversed, ...):
//!
//! - **cnitool batch**: `cnitool batch up NET --count N --concurrency C
//!   --prefix P --quiet`, then `cnitool batch down NET --prefix P
//!   --concurrency C --quiet`, each one process (the shipped binary, run
//!   under GNU time for its peak RSS). It creates the namespaces itself.
//! - **Go cnitool loop**: C shell loops at once, loop k taking namespaces
//!   k, k+C, ...: `ip netns add NAME && go-cnitool add NET
//!   /run/netns/NAME`, then `go-cnitool del ... && ip netns del NAME`, as
//!   a shell harness does it (Go's cnitool creates no namespaces).
//! - **floor**: [`crate::batch::floor_batch`] on C threads, namespaces made
//!   in this process (`Netns::create`), plugins spawned directly.
//!
//! The network is its own: a bridge `cnk<pid>`, a /20 of 10.24x.y.0 (room
//! for 4,094 members), its own host-local data dir and caches in the temp
//! tree (on disk, so the cache writes are flushed, as by default), no
//! gateway, no masquerade, no route out. Every namespace is named
//! `cnk<pid>-…`; the network's drop deletes any left (and the bridge), and
//! a failed run is torn down before the error is returned.
//!
//! Peak RSS: cnitool batch's as GNU time's `%M` (which is the largest of
//! the process and its reaped plugins) and its own `VmHWM`, sampled from
//! `/proc` every 5 ms while it runs; Go's cnitool per process (`%M` of
//! one `add` and one `del` on the same chain, a few runs).
//!
//! # Caveats
//!
//! - The Go loop pays for a process (`ip`) per namespace created and
//!   deleted; cnitool batch and the floor create them in-process. That is
//!   the difference between the tools as a harness uses them, not a
//!   handicap of libcni.
//! - Batch runs use the normal scheduling policy (their point is
//!   throughput with several processes at once); on a shared machine the
//!   ratios move with the load (recorded per run).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cni_async::netns::{NETNS_RUN_DIR, Netns};

use super::batch::{self, BatchRun};
use crate::Cx;
use crate::chains::cnitool_env;
use crate::procs::{gnu_time, peak_rss_kib};
use crate::report::{self, Findings, Table};
use crate::setup::{Bins, RealNet, Tree};
use crate::stats::Summary;

/// The network's name and file.
pub(crate) const NETWORK: &str = "bench-batch1000";
const CONF_FILE: &str = "30-batch1000.conflist";

/// The section's sizes.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) count: usize,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) reps: usize,
}

/// The runners, in their order of the first repetition.
const RUNNERS: [&str; 3] = ["floor", "cnitool batch", "Go cnitool loop"];

/// One run's figures, with the peak RSS of cnitool batch's up and down
/// (KiB: `%M`, own `VmHWM`).
struct Run {
    batch: BatchRun,
    rss: Option<[(u64, u64); 2]>,
    load: String,
}

/// Where a runner's cache is: the tree's (on disk), one per tool.
fn cache_dir(tree: &Tree, tool: &str) -> anyhow::Result<PathBuf> {
    let d = tree.root().join(format!("batch1000-cache-{tool}"));
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}

/// The environment of both cnitools.
fn env(tree: &Tree, tool: &str) -> anyhow::Result<Vec<(OsString, OsString)>> {
    cnitool_env(tree, &cache_dir(tree, tool)?)
}

/// cnitool batch up, then down.
fn ours(
    bins: &Bins,
    tree: &Tree,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<(BatchRun, [(u64, u64); 2])> {
    let env = env(tree, "cnitool")?;
    let (n, c) = (count.to_string(), concurrency.to_string());
    let mut rss = [(0, 0); 2];
    let run = batch::measure(|| {
        let up = [
            "batch",
            "up",
            NETWORK,
            "--count",
            &n,
            "--concurrency",
            &c,
            "--prefix",
            prefix,
            "--quiet",
        ];
        let up = gnu_time(&bins.cnitool, &up, &env, None, tree.root())?;
        rss[0] = (up.max_rss, up.hwm);
        let summary: serde_json::Value =
            serde_json::from_slice(&up.stdout).context("cnitool batch up's summary")?;
        if summary["attached"].as_u64() != Some(count as u64) {
            bail!(
                "cnitool batch up: {} of {count} attached",
                summary["attached"]
            );
        }
        let down = [
            "batch",
            "down",
            NETWORK,
            "--prefix",
            prefix,
            "--concurrency",
            &c,
            "--quiet",
        ];
        let down = gnu_time(&bins.cnitool, &down, &env, None, tree.root())?;
        rss[1] = (down.max_rss, down.hwm);
        Ok((up.wall, down.wall))
    });
    match run {
        Ok(r) => Ok((r, rss)),
        Err(e) => {
            // Leave nothing of this run behind.
            let _ = Command::new(&bins.cnitool)
                .args(["batch", "down", NETWORK, "--prefix", prefix, "--quiet"])
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            Err(e)
        }
    }
}

/// One shell loop of the Go runner: `$1` first index, `$2` step, `$3`
/// count, `$4` prefix, `$5` up|down|clean, `$6` Go's cnitool, `$7` the
/// network.
const GO_LOOP: &str = r#"i=$1
while [ "$i" -lt "$3" ]; do
  n="$4$i"
  case "$5" in
    up) ip netns add "$n" && "$6" add "$7" "/run/netns/$n" >/dev/null || exit 1 ;;
    down) "$6" del "$7" "/run/netns/$n" && ip netns del "$n" || exit 1 ;;
    clean) "$6" del "$7" "/run/netns/$n" 2>/dev/null; ip netns del "$n" 2>/dev/null ;;
  esac
  i=$((i + $2))
done
"#;

/// `concurrency` shell loops of `verb` at once; the wall time until the
/// last exits.
fn go_loops(
    go: &Path,
    env: &[(OsString, OsString)],
    prefix: &str,
    count: usize,
    concurrency: usize,
    verb: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (n, c) = (count.to_string(), concurrency.to_string());
    let children = (0..concurrency.min(count))
        .map(|k| {
            Command::new("sh")
                .arg("-c")
                .arg(GO_LOOP)
                .arg("sh")
                .args([&k.to_string(), &c, &n, prefix, verb])
                .arg(go)
                .arg(NETWORK)
                .env_clear()
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("sh")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut failed = None;
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() && failed.is_none() {
            failed = Some(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
    }
    let wall = started.elapsed();
    match failed {
        Some(e) if verb != "clean" => bail!("Go cnitool loop ({verb}) failed: {e}"),
        _ => Ok(wall),
    }
}

/// The Go runner: up, then down.
fn go_run(
    go: &Path,
    tree: &Tree,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<BatchRun> {
    let env = env(tree, "go")?;
    let run = batch::measure(|| {
        let setup = go_loops(go, &env, prefix, count, concurrency, "up")?;
        let teardown = go_loops(go, &env, prefix, count, concurrency, "down")?;
        Ok((setup, teardown))
    });
    if run.is_err() {
        let _ = go_loops(go, &env, prefix, count, concurrency, "clean");
    }
    run
}

/// Go's cnitool's peak RSS (KiB) for one `add` and one `del` on the
/// chain, `runs` times each; and ours for one `add`, for scale.
#[allow(clippy::type_complexity)]
fn single_rss(
    bins: &Bins,
    go: &Path,
    tree: &Tree,
    prefix: &str,
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (mut add, mut del, mut ours) = (Vec::new(), Vec::new(), Vec::new());
    let (genv, oenv) = (env(tree, "go")?, env(tree, "cnitool")?);
    for i in 0..runs {
        let name = format!("{prefix}{i}");
        let ns = Netns::create(&name)?;
        drop(ns);
        let path = format!("{NETNS_RUN_DIR}/{name}");
        let r = (|| -> anyhow::Result<()> {
            let rss = |p: &Path, verb: &str, env| {
                peak_rss_kib(p, &[verb, NETWORK, &path], env, None, tree.root())
            };
            add.push(rss(go, "add", &genv)?);
            del.push(rss(go, "del", &genv)?);
            ours.push(rss(&bins.cnitool, "add", &oenv)?);
            rss(&bins.cnitool, "del", &oenv)?;
            Ok(())
        })();
        Netns::delete_named(&name)?;
        r?;
    }
    Ok((add, del, ours))
}

/// What every run works with.
struct Ctx<'a> {
    bins: &'a Bins,
    go: &'a Path,
    tree: &'a Tree,
    net: &'a RealNet,
}

/// Runs runner `which` once.
fn run_one(
    ctx: &Ctx<'_>,
    which: usize,
    tag: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Run> {
    let Ctx {
        bins,
        go,
        tree,
        net,
    } = *ctx;
    let load = report::load_average();
    let prefix = format!("{}{}{tag}-", net.prefix(), ["f", "o", "g"][which]);
    let (batch, rss) = match which {
        0 => {
            let list = tree.load(NETWORK)?;
            (
                batch::floor_batch(&list, tree, &prefix, count, concurrency)?,
                None,
            )
        }
        1 => {
            let (b, r) = ours(bins, tree, &prefix, count, concurrency)?;
            (b, Some(r))
        }
        _ => (go_run(go, tree, &prefix, count, concurrency)?, None),
    };
    let left: Vec<String> = Netns::list_named()?
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    if !left.is_empty() {
        bail!(
            "{}: {} namespaces left after teardown",
            RUNNERS[which],
            left.len()
        );
    }
    Ok(Run { batch, rss, load })
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let skip = match (&cx.go, cx.root) {
        (None, _) => "the batch of 1,000 (batch1000): it needs Go's cnitool (see above)",
        (_, false) => "the batch of 1,000 (batch1000) needs root",
        (Some(go), true) => {
            let a = &cx.args;
            let plan = Plan {
                count: a
                    .batch1000_count
                    .unwrap_or(if a.quick { 100 } else { 1000 }),
                concurrency: a.batch1000_concurrency.clone(),
                reps: a.batch1000_reps.unwrap_or(if a.quick { 1 } else { 2 }),
            };
            let net = RealNet::create_as(&cx.tree, "cnk", NETWORK, CONF_FILE, 20)?;
            return run(&cx.bins, go, &cx.tree, &net, &plan, &mut cx.findings).map(Some);
        }
    };
    cx.skipped.push(skip.into());
    Ok(None)
}

fn run(
    bins: &Bins,
    go: &Path,
    tree: &Tree,
    net: &RealNet,
    plan: &Plan,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let n = plan.count;
    let ctx = Ctx {
        bins,
        go,
        tree,
        net,
    };
    let per_s = |d: Duration| n as f64 / d.as_secs_f64();
    let mut rates = Table::new(
        &format!(
            "{n} namespaces on the real chain (bridge {}, {}), cache on disk",
            net.bridge(),
            net.subnet()
        ),
        &[
            "concurrency",
            "runner",
            "setup ns/s, median (min–max)",
            "teardown ns/s, median (min–max)",
            "total ms/ns, median (min–max)",
            "CPU ms/ns (all processes)",
            "load average at start",
        ],
    );
    let mut ratios = Table::new(
        "ratios, per repetition (same concurrency, adjacent runs)",
        &[
            "concurrency",
            "cnitool batch ÷ floor, setup / teardown / total time",
            "Go loop ÷ cnitool batch, setup / teardown / total time",
        ],
    );
    let mut rss_up: Vec<f64> = Vec::new();
    let mut rss_down: Vec<f64> = Vec::new();
    let mut hwm_up: Vec<f64> = Vec::new();
    let mut hwm_down: Vec<f64> = Vec::new();
    for &c in &plan.concurrency {
        let mut runs: [Vec<Run>; 3] = Default::default();
        for rep in 0..plan.reps {
            let order: Vec<usize> = if rep % 2 == 0 {
                vec![0, 1, 2]
            } else {
                vec![2, 1, 0]
            };
            for which in order {
                let started = Instant::now();
                let tag = format!("c{c}r{rep}");
                let r = run_one(&ctx, which, &tag, n, c)
                    .with_context(|| format!("batch1000 c={c} rep {rep}: {}", RUNNERS[which]))?;
                eprintln!(
                    "overhead: batch1000 c={c} rep {rep} {}: {:.1} s (setup {:.0}/s, teardown {:.0}/s; load {})",
                    RUNNERS[which],
                    started.elapsed().as_secs_f64(),
                    per_s(r.batch.setup),
                    per_s(r.batch.teardown),
                    r.load
                );
                if let Some([(mu, hu), (md, hd)]) = r.rss {
                    rss_up.push(mu as f64);
                    hwm_up.push(hu as f64);
                    rss_down.push(md as f64);
                    hwm_down.push(hd as f64);
                }
                runs[which].push(r);
            }
        }
        let mm = |v: &[f64], d: usize| {
            let s = Summary::min_max(v);
            format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.p10, s.p90, d = d)
        };
        for (which, name) in RUNNERS.iter().enumerate() {
            let rs = &runs[which];
            let setup: Vec<f64> = rs.iter().map(|r| per_s(r.batch.setup)).collect();
            let teardown: Vec<f64> = rs.iter().map(|r| per_s(r.batch.teardown)).collect();
            let total: Vec<f64> = rs
                .iter()
                .map(|r| r.batch.total().as_secs_f64() * 1e3 / n as f64)
                .collect();
            let cpu: Vec<f64> = rs
                .iter()
                .map(|r| r.batch.cpu().as_secs_f64() * 1e3 / n as f64)
                .collect();
            let key = ["floor", "cnitool", "go"][which];
            findings.put(
                format!("batch1000/c{c}/{key}/setup_rate"),
                Summary::min_max(&setup),
            );
            findings.put(
                format!("batch1000/c{c}/{key}/teardown_rate"),
                Summary::min_max(&teardown),
            );
            rates.row(vec![
                c.to_string(),
                (*name).into(),
                mm(&setup, 0),
                mm(&teardown, 0),
                mm(&total, 2),
                mm(&cpu, 2),
                rs.iter()
                    .map(|r| r.load.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            ]);
        }
        let ratio = |a: usize, b: usize, f: fn(&BatchRun) -> Duration| {
            let v: Vec<f64> = runs[a]
                .iter()
                .zip(&runs[b])
                .map(|(x, y)| f(&x.batch).as_secs_f64() / f(&y.batch).as_secs_f64())
                .collect();
            Summary::min_max(&v)
        };
        let three = |a: usize, b: usize, key: &str, findings: &mut Findings| {
            let s = ratio(a, b, |r| r.setup);
            let t = ratio(a, b, |r| r.teardown);
            let all = ratio(a, b, BatchRun::total);
            findings.put(format!("batch1000/c{c}/{key}/setup"), s);
            findings.put(format!("batch1000/c{c}/{key}/teardown"), t);
            findings.put(format!("batch1000/c{c}/{key}/total"), all);
            format!("{} / {} / {}", s.ratio(), t.ratio(), all.ratio())
        };
        let ours_floor = three(1, 0, "cnitool-over-floor", findings);
        let go_ours = three(2, 1, "go-over-cnitool", findings);
        ratios.row(vec![c.to_string(), ours_floor, go_ours]);
    }
    let (gadd, gdel, oadd) = single_rss(bins, go, tree, &format!("{}m-", net.prefix()), 5)?;
    let mut mem = Table::new(
        "peak RSS, KiB, median (min–max)",
        &[
            "process",
            "GNU time %M (largest of it and its plugins)",
            "own VmHWM, sampled",
        ],
    );
    let mm0 = |v: &[f64]| {
        let s = Summary::min_max(v);
        format!("{:.0} ({:.0}–{:.0})", s.median, s.p10, s.p90)
    };
    findings.put("batch1000/rss/up", Summary::min_max(&rss_up));
    findings.put("batch1000/rss/go-add", Summary::min_max(&gadd));
    mem.row(vec![
        format!("cnitool batch up, {n} namespaces"),
        mm0(&rss_up),
        mm0(&hwm_up),
    ]);
    mem.row(vec![
        format!("cnitool batch down, {n} namespaces"),
        mm0(&rss_down),
        mm0(&hwm_down),
    ]);
    mem.row(vec![
        "Go cnitool add, one namespace".into(),
        mm0(&gadd),
        "–".into(),
    ]);
    mem.row(vec![
        "Go cnitool del, one namespace".into(),
        mm0(&gdel),
        "–".into(),
    ]);
    mem.row(vec![
        "cnitool add, one namespace".into(),
        mm0(&oadd),
        "–".into(),
    ]);
    rates.note(format!(
        "{} repetitions per concurrency, runners alternating (floor, cnitool batch, Go loop; \
         then reversed). Setup = create the namespace + ADD; teardown = DEL + delete it. CPU \
         is user + system of this process and every process it reaped (cnitool, sh, ip, the \
         plugins). Normal scheduling policy.",
        plan.reps
    ));
    mem.note(
        "%M of a process includes its largest reaped child's (the bridge plugin's); \
         VmHWM is the process's own, read from /proc every 5 ms while it runs.",
    );
    Ok(format!(
        "### Batch of {n}: cnitool batch against a loop of Go's cnitool and the floor\n\n\
         `cnitool batch up|down` (one process each) against {c} shell loops of Go's cnitool \
         (`ip netns add` + `go-cnitool add`; `go-cnitool del` + `ip netns del`) and the floor \
         on as many threads, on the real chain (loopback, bridge/host-local, tuning; no \
         gateway, no masquerade).\n\n{}\n{}\n{}",
        rates.markdown(),
        ratios.markdown(),
        mem.markdown(),
        c = "C",
    ))
}
