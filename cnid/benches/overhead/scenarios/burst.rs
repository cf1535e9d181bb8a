//! A burst of pods (`--only burst`, root): containerd's go-cni
//! (`cnid/tests/go/gocni`, the calls of containerd's CRI plugin) setting
//! up N sandboxes (100 by default) at concurrency C (16 and 32), then
//! removing them, through `cnid-shim` into cnid, against go-cni straight
//! on the same chain. No Kubernetes: what a
//! node feels when many pods land on it at once, with the runtime's own
//! client library.
//!
//! - **direct**: go-cni's conf dir holds the chain (bridge + host-local +
//!   portmap); go-cni runs loopback and the chain's plugins itself.
//! - **via cnid**: go-cni's conf dir holds the list `cnid-shim config`
//!   writes for the same network; go-cni runs loopback and the shim, the
//!   shim hands the call to cnid (default options, cache and state on
//!   disk), which runs the chain.
//!
//! Both on one bridge and subnet of the bench's own (`cnu<pid>`, a
//! 10.24x.y.0/22), one host-local data dir, no gateway, no masquerade; the
//! port mapping's host IP is the subnet's `.1`, which nothing on the host
//! has, so the DNAT rules catch no one else's traffic. Namespaces
//! `cnu<pid>-…` are created (untimed) before each round and deleted after
//! it. Each round is one go-cni process for the setup and one for the
//! removal; the two runners alternate (direct first in even repetitions,
//! via cnid first in odd ones), and each figure is a ratio of adjacent
//! rounds at the same concurrency: p50 and p95 of the per-sandbox call
//! times, and the wall time of the whole burst. Medians of the
//! repetitions are reported.
//!
//! CPU per pod: go-cni's own and its reaped children's (getrusage, printed
//! by go-cni: the shims and loopback via cnid; loopback and the chain's
//! plugins direct), and cnid's own and its reaped children's (the chain's
//! plugins), from `/proc/PID/stat` before and after each half.
//!
//! # Caveats
//!
//! - portmap adds its rules under the shared `CNI-HOSTPORT-*` chains of
//!   the host's iptables (as any runtime on the host does), one DNAT chain
//!   per container named by hash of its ID; DEL removes them.
//! - The shim's CPU is not measured alone: via cnid, go-cni's children are
//!   the shims and loopback. The shim's share is that less loopback's
//!   (direct children less cnid's reaped plugins).
//! - Normal scheduling policy (a burst is about throughput on a busy
//!   node); the load average is recorded per round.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};
use cni_async::netns::{NETNS_RUN_DIR, Netns};
use cnid::client::Client;
use serde::Deserialize;
use serde_json::json;

use crate::Cx;
use crate::procs::{histogram_means, metrics, proc_cpu};
use crate::report::{Table, load_average, row, section as md};
use crate::setup::{Daemon, REAL_PLUGIN_DIR, RealNet, Storage};
use crate::stats::{Order, Summary, quantile, rounds, secs};

/// The network's name (in cnid's conf dir and go-cni's direct one).
const NETWORK: &str = "bench-burst";
const CONF_FILE: &str = "40-burst.conflist";

/// The two runners: go-cni straight on the chain, and through cnid.
const WAYS: [&str; 2] = ["direct", "cnid"];

/// What go-cni prints (`cnid/tests/go/gocni`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GoReport {
    sandboxes: Vec<GoSandbox>,
    wall_ms: f64,
    failed: usize,
    cpu_self_ms: f64,
    cpu_children_ms: f64,
}

#[derive(Debug, Deserialize)]
struct GoSandbox {
    id: String,
    #[serde(default)]
    ips: Vec<String>,
    ms: BTreeMap<String, f64>,
    #[serde(default)]
    error: String,
}

/// One half (setup or removal) of a round: the per-sandbox call times
/// (sorted), the burst's wall time (go-cni's clock), and CPU: go-cni
/// itself, its reaped children, cnid itself, cnid's reaped children
/// (seconds).
struct Half {
    calls: Vec<f64>,
    wall: f64,
    cpu: [f64; 4],
}

/// The figures of a half: p50, p95 and total.
const FIGS: [fn(&Half) -> f64; 3] = [
    |h| quantile(&h.calls, 0.5),
    |h| quantile(&h.calls, 0.95),
    |h| h.wall,
];

/// Everything the rounds work with; per runner go-cni's conf dir, plugin
/// path and cache dir.
struct Ctx<'a> {
    gocni: &'a Path,
    net: &'a RealNet,
    daemon: &'a Daemon,
    host_ip: String,
    sides: [(PathBuf, String, PathBuf); 2],
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(gocni) = cx.gocni.clone() else {
        return Ok(None);
    };
    if !cx.root {
        return cx.skip("the burst section needs root (namespaces, a bridge)");
    }
    let a = &cx.args;
    let n = a.burst_count.unwrap_or(cx.n(32, 100));
    let reps = a.burst_reps.unwrap_or(cx.n(1, 3));
    let storage = [Storage::Disk, Storage::Tmpfs][usize::from(a.burst_tmpfs)];
    let cnid_args = a.burst_cnid_args.as_deref().unwrap_or_default();
    let cnid_args: Vec<&str> = cnid_args.split_whitespace().collect();
    // A /22: room for 1,022 sandboxes.
    let net = RealNet::new(&cx.tree, "cnu", 22, None)?;
    let host_ip = net
        .subnet
        .split_once(".0/")
        .map(|(head, _)| format!("{head}.1"));
    let host_ip = host_ip.context("the subnet's .1")?;
    // The chain, in cnid's conf dir (before it starts) and the direct one.
    let root = cx.tree.root().join("burst");
    let caches = cx.tree.cache(storage).with_file_name("burst");
    let ipam = json!({"type": "host-local", "ranges": [[{"subnet": net.subnet}]], "dataDir": caches.join("host-local")});
    let plugins = json!([
        {"type": "bridge", "bridge": net.bridge, "isGateway": false, "ipMasq": false, "ipam": ipam},
        {"type": "portmap", "capabilities": {"portMappings": true}}
    ]);
    let chain = cx.tree.write_list(CONF_FILE, NETWORK, plugins)?;
    let shim_bin = root.join("shim-bin");
    let shim_path = format!("{}:{REAL_PLUGIN_DIR}", shim_bin.display());
    let side = |conf: &str, path: String, cache: &str| (root.join(conf), path, caches.join(cache));
    let direct = side("direct-net.d", REAL_PLUGIN_DIR.into(), "direct-cache");
    let sides = [direct, side("cnid-net.d", shim_path, "cnid-cache")];
    for d in sides.iter().flat_map(|s| [&s.0, &s.2]).chain([&shim_bin]) {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let pretty = serde_json::to_vec_pretty(&chain)?;
    std::fs::write(sides[0].0.join(CONF_FILE), pretty)?;
    let shim = shim_bin.join("cnid-shim");
    cni_test_support::executable::copy_executable(&cx.bins.shim, &shim, 0o755);
    let daemon = Daemon::start(&cx.bins.cnid, &cx.tree, storage, "burst", &cnid_args)?;
    // The shim's list, as `cnid-shim config` writes it from the running cnid.
    let mut config = Command::new(&cx.bins.shim);
    config
        .args(["config", "--socket"])
        .arg(&daemon.socket)
        .args(["--network", NETWORK, "--timeout", "120s"]);
    let out = config
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .context("cnid-shim config")?;
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "cnid-shim config: {}", err.trim());
    std::fs::write(sides[1].0.join("00-cnid.conflist"), &out.stdout)?;
    let ctx = Ctx {
        gocni: &gocni,
        net: &net,
        daemon: &daemon,
        host_ip,
        sides,
    };
    // Warm-up: one small round each (page cache, cnid's first connection).
    for way in [0, 1] {
        let r = round(&ctx, way, "w", n.min(16), 8)
            .with_context(|| format!("burst warm-up via {}", WAYS[way]));
        r.map_err(|e| daemon.ctx(e))?;
    }
    let title =
        format!("{n} sandboxes, via cnid ÷ direct, median (min–max) of the repetitions' ratios");
    let header =
        "concurrency|setup p50|setup p95|setup total|teardown p50|teardown p95|teardown total";
    let mut ratios = Table::new(title, header);
    let header = "concurrency|runner|setup p50 / p95 / total|teardown p50 / p95 / total|load average at start";
    let mut abs = Table::new("absolute, ms, median of the repetitions", header);
    let header = "concurrency|runner|verb|go-cni itself|go-cni's children|cnid itself|cnid's children (the chain)|all";
    let title = "CPU per pod, ms (user + system), median of the repetitions";
    let mut cpu = Table::new(title, header);
    let title = "cnid's own account (its /metrics histograms over the via-cnid rounds): mean ms per operation, plugin run or admission";
    let mut account = Table::new(title, "concurrency|series|mean ms|count");
    // cnid's `/metrics` samples.
    let client = cx.tokio.block_on(Client::connect(&daemon.socket))?;
    let histograms = || anyhow::Ok(metrics(&cx.tokio.block_on(client.metrics())?));
    let concurrency = cx.args.burst_concurrency.clone();
    for c in concurrency.unwrap_or_else(|| vec![16, 32]) {
        let before = histograms()?;
        // Per way, per repetition: [setup, removal] and the load at start;
        // direct and via cnid in turn first.
        let rounds = rounds(
            (2, 0, reps),
            Order::Rotate,
            &format!("burst c={c}"),
            |way, rep| {
                let t = Instant::now();
                let r = round(&ctx, way, &format!("c{c}r{rep}"), n, c)
                    .with_context(|| format!("rep {rep} via {}", WAYS[way]));
                let r = r.map_err(|e| daemon.ctx(e))?;
                let figs = |h: &Half| FIGS.map(|f| format!("{:.0}", f(h) * 1e3)).join("/");
                let (setup, teardown, took) = (figs(&r.0[0]), figs(&r.0[1]), secs(t));
                eprintln!(
                    "overhead: burst c={c} rep {rep} {}: setup {setup} teardown {teardown} ms (p50/p95/total); {took:.1} s; load {}",
                    WAYS[way], r.1
                );
                Ok(r)
            },
        )?;
        for (series, mean, count) in histogram_means(&before, &histograms()?) {
            let (series, mean) = (format!("`{series}`"), format!("{:.1}", mean * 1e3));
            row!(account, c, series, mean, format!("{count:.0}"));
        }
        let mut cells = vec![c.to_string()];
        for h in [0, 1] {
            for f in FIGS {
                let r: Vec<f64> = rounds[1]
                    .iter()
                    .zip(&rounds[0])
                    .map(|(v, d)| f(&v.0[h]) / f(&d.0[h]))
                    .collect();
                cells.push(Summary::min_max(&r).ratio());
            }
        }
        ratios.row(cells);
        for (way, rs) in rounds.iter().enumerate() {
            let med = |f: &dyn Fn(&[Half; 2]) -> f64| {
                Summary::min_max(&rs.iter().map(|r| f(&r.0)).collect::<Vec<_>>()).median
            };
            let three = |h: usize| {
                FIGS.map(|f| format!("{:.0}", med(&|r| f(&r[h])) * 1e3))
                    .join(" / ")
            };
            let loads: Vec<&str> = rs.iter().map(|r| r.1.as_str()).collect();
            row!(abs, c, WAYS[way], three(0), three(1), loads.join("; "));
            for (h, verb) in ["ADD", "DEL"].into_iter().enumerate() {
                let parts: [f64; 4] =
                    std::array::from_fn(|k| med(&|r| r[h].cpu[k]) * 1e3 / n as f64);
                let mut cells = vec![c.to_string(), WAYS[way].into(), verb.into()];
                cells.extend(
                    parts
                        .iter()
                        .chain([&parts.iter().sum::<f64>()])
                        .map(|x| format!("{x:.2}")),
                );
                cpu.row(cells);
            }
        }
    }
    ratios.note(format!(
        "{reps} repetitions per concurrency; in each, one round per runner (direct first in even \
         repetitions, via cnid first in odd ones); a ratio divides adjacent rounds. p50 and p95 \
         of the per-sandbox go-cni call (Setup: loopback + the network; Remove), total = the \
         burst's wall time. Normal scheduling policy."
    ));
    cpu.note(
        "go-cni's children: loopback and, direct, the chain's plugins; via cnid, cnid-shim. \
         cnid's: from /proc/PID/stat (utime + stime, cutime + cstime) around each half.",
    );
    let options = if cnid_args.is_empty() {
        "its default options".to_owned()
    } else {
        format!("`{}`", cnid_args.join(" "))
    };
    let intro = format!(
        "containerd's go-cni (`cnid/tests/go/gocni`: loopback + the default network, the pod's \
         labels, portMappings) sets up {n} sandboxes at concurrency C in real namespaces on \
         bridge {} ({}) + host-local + portmap (no gateway, no masquerade, host IP of the port \
         mapping {}), then removes them; cnid with {options}, {} (cnid's cache and state, both \
         runners' libcni caches, host-local's data dir). \
         `cargo bench -p cnid --bench overhead -- --only burst`.",
        net.bridge,
        net.subnet,
        ctx.host_ip,
        storage.label(),
    );
    let title = "Burst: go-cni through cnid-shim into cnid against go-cni straight on the chain";
    Ok(Some(md(title, &intro, &[ratios, abs, cpu, account])))
}

/// Runs go-cni's `phase` over `sandboxes` at concurrency `c` via `way`,
/// with cnid's CPU read around it.
fn half(
    ctx: &Ctx<'_>,
    way: usize,
    phase: &str,
    sandboxes: &[OsString],
    c: usize,
) -> anyhow::Result<(Half, GoReport)> {
    let (conf, plugin_path, cache) = &ctx.sides[way];
    let (c0, k0) = proc_cpu(ctx.daemon.pid())?;
    let mut cmd = Command::new(ctx.gocni);
    cmd.arg("-conf-dir")
        .arg(conf)
        .args(["-plugin-dir", plugin_path, "-cache-dir"])
        .arg(cache);
    cmd.args([
        "-phase",
        phase,
        "-parallel",
        &c.to_string(),
        "-host-ip",
        &ctx.host_ip,
    ])
    .args(sandboxes);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    let out = cmd.stdin(Stdio::null()).output().context("run gocni")?;
    let (c1, k1) = proc_cpu(ctx.daemon.pid())?;
    let (stderr, st) = (String::from_utf8_lossy(&out.stderr), out.status);
    let rep: GoReport = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("gocni {phase} ({st}): no report; stderr: {}", stderr.trim()))?;
    if rep.failed > 0 || !st.success() {
        let first = rep.sandboxes.iter().find(|s| !s.error.is_empty());
        let first = first.map_or("?".into(), |s| format!("{}: {}", s.id, s.error));
        let (failed, of, via) = (rep.failed, rep.sandboxes.len(), WAYS[way]);
        bail!("gocni {phase} via {via}: {failed} of {of} failed ({st}); first: {first}");
    }
    let mut calls: Vec<f64> = rep
        .sandboxes
        .iter()
        .map(|s| s.ms.get(phase).copied().unwrap_or(f64::NAN) / 1e3)
        .collect();
    calls.sort_by(f64::total_cmp);
    let cpu = [
        rep.cpu_self_ms / 1e3,
        rep.cpu_children_ms / 1e3,
        c1 - c0,
        k1 - k0,
    ];
    Ok((
        Half {
            calls,
            wall: rep.wall_ms / 1e3,
            cpu,
        },
        rep,
    ))
}

/// One round of `way`: namespaces, setup, removal, namespaces deleted.
fn round(
    ctx: &Ctx<'_>,
    way: usize,
    tag: &str,
    count: usize,
    c: usize,
) -> anyhow::Result<([Half; 2], String)> {
    let (load, prefix) = (
        load_average(),
        format!("{}{}{tag}-", ctx.net.prefix, &WAYS[way][..1]),
    );
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let sandboxes: Vec<OsString> = names
        .iter()
        .map(|n| format!("{n}={NETNS_RUN_DIR}/{n}").into())
        .collect();
    let r = (|| {
        for n in &names {
            drop(Netns::create(n)?);
        }
        let (setup, rep) = half(ctx, way, "setup", &sandboxes, c)?;
        let mut ips: Vec<&String> = rep.sandboxes.iter().flat_map(|s| &s.ips).collect();
        ips.sort();
        ips.dedup();
        let (got, via) = (ips.len(), WAYS[way]);
        anyhow::ensure!(
            got == count,
            "via {via}: {got} distinct eth0 addresses for {count} sandboxes"
        );
        let (remove, _) = half(ctx, way, "remove", &sandboxes, c)?;
        Ok(([setup, remove], load))
    })();
    if r.is_err() {
        // Leave no attachment behind: a removal of every sandbox, errors
        // ignored (the namespaces go next, and the bridge with the net).
        let _ = half(ctx, way, "remove", &sandboxes, c);
    }
    for n in names
        .iter()
        .filter(|n| Path::new(NETNS_RUN_DIR).join(n).exists())
    {
        Netns::delete_named(n)?;
    }
    r
}
