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
//! - **floor**: [`super::batch::floor_batch`] on C threads, namespaces made
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

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cni_async::netns::{NETNS_RUN_DIR, Netns};

use super::batch::{self, BatchRun, FIGS};
use crate::Cx;
use crate::chains::cnitool_env;
use crate::procs::{gnu_time, peak_rss_kib};
use crate::report::{Table, load_average, row, section as md};
use crate::setup::RealNet;
use crate::spawn::Env;
use crate::stats::Summary;

/// The network's name and file.
const NETWORK: &str = "bench-batch1000";
const CONF_FILE: &str = "30-batch1000.conflist";

/// The runners, in their order of the first repetition.
const RUNNERS: [&str; 3] = ["floor", "cnitool batch", "Go cnitool loop"];

/// One run's figures, with the peak RSS of cnitool batch's up and down
/// (KiB: `%M`, own `VmHWM`) and the load average at its start.
struct Run(BatchRun, Option<[(u64, u64); 2]>, String);

/// The environment of a cnitool (`tool`: ours or Go's), its cache on disk.
fn env(cx: &Cx, tool: &str) -> anyhow::Result<Env> {
    let d = cx.tree.root().join(format!("batch1000-cache-{tool}"));
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    cnitool_env(&cx.tree, &d)
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let go = match (cx.go.clone(), cx.root) {
        (Some(go), true) => go,
        (None, _) => {
            return cx.skip("the batch of 1,000 (batch1000): it needs Go's cnitool (see above)");
        }
        _ => return cx.skip("the batch of 1,000 (batch1000) needs root"),
    };
    let (n, reps) = (
        cx.args.batch1000_count.unwrap_or(cx.n(100, 1000)),
        cx.args.batch1000_reps.unwrap_or(cx.n(1, 2)),
    );
    let net = RealNet::new(&cx.tree, "cnk", 20, Some((NETWORK, CONF_FILE)))?;
    let per_s = |d: Duration| n as f64 / d.as_secs_f64();
    let title = format!(
        "{n} namespaces on the real chain (bridge {}, {}), cache on disk",
        net.bridge, net.subnet
    );
    let header = "concurrency|runner|setup ns/s, median (min–max)|teardown ns/s, median (min–max)|total ms/ns, median (min–max)|CPU ms/ns (all processes)|load average at start";
    let mut rates = Table::new(title, header);
    let header = "concurrency|cnitool batch ÷ floor, setup / teardown / total time|Go loop ÷ cnitool batch, setup / teardown / total time";
    let mut ratios = Table::new(
        "ratios, per repetition (same concurrency, adjacent runs)",
        header,
    );
    // cnitool batch's peak RSS: %M and VmHWM of up, then of down.
    let mut rss: [Vec<f64>; 4] = Default::default();
    let mm = |v: &[f64], d: usize| Summary::min_max(v).fmt(1.0, d);
    for &c in &cx.args.batch1000_concurrency {
        let mut runs: [Vec<Run>; 3] = Default::default();
        for rep in 0..reps {
            for which in if rep % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] } {
                let started = Instant::now();
                let r = run_one(cx, &net, &go, which, &format!("c{c}r{rep}"), n, c);
                let r =
                    r.with_context(|| format!("batch1000 c={c} rep {rep}: {}", RUNNERS[which]))?;
                let (setup, teardown, took) = (
                    per_s(r.0.setup),
                    per_s(r.0.teardown),
                    started.elapsed().as_secs_f64(),
                );
                eprintln!(
                    "overhead: batch1000 c={c} rep {rep} {}: {took:.1} s (setup {setup:.0}/s, teardown {teardown:.0}/s; load {})",
                    RUNNERS[which], r.2
                );
                for (i, k) in r.1.iter().flatten().flat_map(|(m, h)| [*m, *h]).enumerate() {
                    rss[i].push(k as f64);
                }
                runs[which].push(r);
            }
        }
        for (which, rs) in runs.iter().enumerate() {
            let per = |f: batch::Fig, g: &dyn Fn(Duration) -> f64| {
                rs.iter().map(|r| g(f(&r.0))).collect::<Vec<_>>()
            };
            let ms_per_ns = |d: Duration| d.as_secs_f64() * 1e3 / n as f64;
            let [setup, teardown] = [FIGS[0], FIGS[1]].map(|f| mm(&per(f, &per_s), 0));
            let [total, cpu] = [FIGS[2], FIGS[3]].map(|f| mm(&per(f, &ms_per_ns), 2));
            let loads: Vec<&str> = rs.iter().map(|r| r.2.as_str()).collect();
            row!(
                rates,
                c,
                RUNNERS[which],
                setup,
                teardown,
                total,
                cpu,
                loads.join("; ")
            );
        }
        let three = |a: usize, b: usize| {
            let ratio = |f: batch::Fig| {
                let v = runs[a]
                    .iter()
                    .zip(&runs[b])
                    .map(|(x, y)| f(&x.0).as_secs_f64() / f(&y.0).as_secs_f64());
                Summary::min_max(&v.collect::<Vec<_>>()).ratio()
            };
            [FIGS[0], FIGS[1], FIGS[2]].map(ratio).join(" / ")
        };
        row!(ratios, c, three(1, 0), three(2, 1));
    }
    // Go's cnitool's peak RSS for one `add` and one `del` on the chain, and
    // ours for one `add`, for scale.
    let (genv, oenv) = (env(cx, "go")?, env(cx, "cnitool")?);
    let mut one: [Vec<f64>; 3] = Default::default();
    for i in 0..5 {
        let name = format!("{}m-{i}", net.prefix);
        drop(Netns::create(&name)?);
        let path = format!("{NETNS_RUN_DIR}/{name}");
        let rss = |p: &Path, verb: &str, env| {
            peak_rss_kib(p, &[verb, NETWORK, &path], env, None, cx.tree.root())
        };
        let r = (|| -> anyhow::Result<()> {
            one[0].push(rss(&go, "add", &genv)?);
            one[1].push(rss(&go, "del", &genv)?);
            one[2].push(rss(&cx.bins.cnitool, "add", &oenv)?);
            rss(&cx.bins.cnitool, "del", &oenv).map(drop)
        })();
        Netns::delete_named(&name)?;
        r?;
    }
    let header = "process|GNU time %M (largest of it and its plugins)|own VmHWM, sampled";
    let mut mem = Table::new("peak RSS, KiB, median (min–max)", header);
    let mm0 = |v: &[f64]| mm(v, 0);
    row!(
        mem,
        format!("cnitool batch up, {n} namespaces"),
        mm0(&rss[0]),
        mm0(&rss[1])
    );
    row!(
        mem,
        format!("cnitool batch down, {n} namespaces"),
        mm0(&rss[2]),
        mm0(&rss[3])
    );
    row!(mem, "Go cnitool add, one namespace", mm0(&one[0]), "–");
    row!(mem, "Go cnitool del, one namespace", mm0(&one[1]), "–");
    row!(mem, "cnitool add, one namespace", mm0(&one[2]), "–");
    rates.note(format!(
        "{reps} repetitions per concurrency, runners alternating (floor, cnitool batch, Go loop; \
         then reversed). Setup = create the namespace + ADD; teardown = DEL + delete it. CPU \
         is user + system of this process and every process it reaped (cnitool, sh, ip, the \
         plugins). Normal scheduling policy."
    ));
    mem.note(
        "%M of a process includes its largest reaped child's (the bridge plugin's); \
         VmHWM is the process's own, read from /proc every 5 ms while it runs.",
    );
    Ok(Some(md(
        &format!("Batch of {n}: cnitool batch against a loop of Go's cnitool and the floor"),
        "`cnitool batch up|down` (one process each) against C shell loops of Go's cnitool \
         (`ip netns add` + `go-cnitool add`; `go-cnitool del` + `ip netns del`) and the floor \
         on as many threads, on the real chain (loopback, bridge/host-local, tuning; no \
         gateway, no masquerade).",
        &[rates, ratios, mem],
    )))
}

/// Runs runner `which` once: N namespaces set up and torn down at
/// concurrency `c`; none may be left.
fn run_one(
    cx: &Cx,
    net: &RealNet,
    go: &Path,
    which: usize,
    tag: &str,
    n: usize,
    c: usize,
) -> anyhow::Result<Run> {
    let (load, prefix) = (
        load_average(),
        format!("{}{}{tag}-", net.prefix, ["f", "o", "g"][which]),
    );
    let (batch, rss) = match which {
        0 => (
            batch::floor_batch(&cx.tree.load(NETWORK)?, &cx.tree, &prefix, n, c)?,
            None,
        ),
        1 => ours(cx, &prefix, n, c).map(|(b, r)| (b, Some(r)))?,
        _ => {
            let env = env(cx, "go")?;
            let run = batch::measure(|| {
                Ok((
                    go_loops(go, &env, &prefix, n, c, "up")?,
                    go_loops(go, &env, &prefix, n, c, "down")?,
                ))
            });
            if run.is_err() {
                let _ = go_loops(go, &env, &prefix, n, c, "clean");
            }
            (run?, None)
        }
    };
    let left = Netns::list_named()?
        .into_iter()
        .filter(|x| x.starts_with(&prefix))
        .count();
    anyhow::ensure!(
        left == 0,
        "{}: {left} namespaces left after teardown",
        RUNNERS[which]
    );
    Ok(Run(batch, rss, load))
}

/// cnitool batch up, then down, each under GNU time.
fn ours(
    cx: &Cx,
    prefix: &str,
    count: usize,
    c: usize,
) -> anyhow::Result<(BatchRun, [(u64, u64); 2])> {
    let (cnitool, env) = (&cx.bins.cnitool, env(cx, "cnitool")?);
    let mut rss = [(0, 0); 2];
    // `cnitool batch VERB NETWORK MORE`, under GNU time.
    let run_batch = |verb: &str, more: String| {
        let args = format!("batch {verb} {NETWORK} --prefix {prefix} --concurrency {c} {more}");
        gnu_time(
            cnitool,
            &args.split(' ').collect::<Vec<_>>(),
            &env,
            None,
            cx.tree.root(),
        )
    };
    let run = batch::measure(|| {
        let up = run_batch("up", format!("--count {count} --quiet"))?;
        rss[0] = (up.1, up.2);
        let summary: serde_json::Value =
            serde_json::from_slice(&up.3).context("cnitool batch up's summary")?;
        if summary["attached"].as_u64() != Some(count as u64) {
            bail!(
                "cnitool batch up: {} of {count} attached",
                summary["attached"]
            );
        }
        let down = run_batch("down", "--quiet".into())?;
        rss[1] = (down.1, down.2);
        Ok((up.0, down.0))
    });
    if run.is_err() {
        // Leave nothing of this run behind.
        let mut cmd = Command::new(cnitool);
        cmd.args(["batch", "down", NETWORK, "--prefix", prefix, "--quiet"])
            .env_clear()
            .envs(env.iter().cloned());
        let _ = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    Ok((run?, rss))
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

/// `c` shell loops of `verb` at once; the wall time until the last exits.
fn go_loops(
    go: &Path,
    env: &Env,
    prefix: &str,
    count: usize,
    c: usize,
    verb: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut children = Vec::new();
    for k in 0..c.min(count) {
        let args = [
            &k.to_string(),
            &c.to_string(),
            &count.to_string(),
            prefix,
            verb,
        ];
        let mut cmd = Command::new("sh");
        cmd.args(["-c", GO_LOOP, "sh"])
            .args(args)
            .arg(go)
            .arg(NETWORK)
            .env_clear()
            .envs(env.iter().cloned());
        children.push(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("sh")?,
        );
    }
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
