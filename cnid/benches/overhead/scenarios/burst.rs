//! A burst of pods (`--only burst`, root): containerd's go-cni (`cnid/tests/go/gocni`, the calls
//! of containerd's CRI plugin) setting up N sandboxes (100 by default) at
//! concurrency C (16 and 32), then removing them, through `cnid-shim` into
//! cnid, against go-cni straight on the same chain. No Kubernetes: what a
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
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cni_async::netns::{NETNS_RUN_DIR, Netns};
use serde::Deserialize;
use serde_json::json;

use crate::Cx;
use crate::procs::{histogram_means, metrics, proc_cpu};
use crate::report::{self, Findings, Table, row};
use crate::setup::{Bins, Daemon, REAL_PLUGIN_DIR, RealNet, Storage, Tree};
use crate::stats::{Summary, quantile};

/// The network's name (in cnid's conf dir and go-cni's direct one).
const NETWORK: &str = "bench-burst";
const CONF_FILE: &str = "40-burst.conflist";

/// The section's sizes and its cnid.
#[derive(Debug, Clone)]
struct Plan {
    count: usize,
    concurrency: Vec<usize>,
    reps: usize,
    /// Where cnid's cache and state are (and both runners' libcni caches).
    storage: Storage,
    /// More arguments for cnid (`--burst-cnid-args`).
    cnid_args: Vec<String>,
}

/// The two runners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Direct,
    Cnid,
}

impl Way {
    fn key(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Cnid => "cnid",
        }
    }
}

/// What go-cni prints (`cnid/tests/go/gocni`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GoReport {
    sandboxes: Vec<GoSandbox>,
    wall_ms: f64,
    failed: usize,
    #[serde(rename = "cpuSelfMs")]
    cpu_self_ms: f64,
    #[serde(rename = "cpuChildrenMs")]
    cpu_children_ms: f64,
}

#[derive(Debug, Deserialize)]
struct GoSandbox {
    id: String,
    #[serde(default)]
    ips: Vec<String>,
    ms: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    error: String,
}

/// One half (setup or removal) of a round.
#[derive(Debug, Clone, Default)]
struct Half {
    /// Per-sandbox call times, seconds, sorted.
    calls: Vec<f64>,
    /// Wall time of the burst, seconds (go-cni's own clock).
    wall: f64,
    /// CPU seconds: go-cni itself, its reaped children, cnid itself, cnid's
    /// reaped children.
    go_self: f64,
    go_children: f64,
    cnid_self: f64,
    cnid_children: f64,
}

impl Half {
    fn p(&self, q: f64) -> f64 {
        quantile(&self.calls, q)
    }
}

/// One round: setup, then removal, of N sandboxes by one runner.
struct Round {
    setup: Half,
    remove: Half,
    load: String,
}

/// cnid's `/metrics` samples.
fn histograms(socket: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let deadlines = (Duration::from_secs(30), Duration::from_secs(30));
    let ans = cnid::shim::http::request(socket, "GET", "/metrics", &[], None, deadlines)?;
    anyhow::ensure!(ans.status == 200, "GET /metrics: HTTP {}", ans.status);
    Ok(metrics(&String::from_utf8_lossy(&ans.body)))
}

/// The dirs of one runner: go-cni's conf dir, plugin path and cache.
struct Side {
    conf: PathBuf,
    plugin_path: String,
    cache: PathBuf,
}

/// Everything the rounds work with.
struct Ctx<'a> {
    gocni: &'a Path,
    net: &'a RealNet,
    daemon: &'a Daemon,
    host_ip: String,
    direct: Side,
    cnid: Side,
}

impl Ctx<'_> {
    fn side(&self, way: Way) -> &Side {
        match way {
            Way::Direct => &self.direct,
            Way::Cnid => &self.cnid,
        }
    }
}

/// Writes the chain (cnid's conf dir and the direct one) and makes the
/// dirs; the shim's list is written by [`shim_list`] once cnid runs.
fn prepare(
    bins: &Bins,
    tree: &Tree,
    net: &RealNet,
    storage: Storage,
) -> anyhow::Result<(Side, Side)> {
    let root = tree.root().join("burst");
    let caches = tree.cache(storage).with_file_name("burst");
    let data = caches.join("host-local");
    let chain = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": net.bridge(), "isGateway": false, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": net.subnet()}]],
                      "dataDir": data}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    tree.write_conf(CONF_FILE, &chain)?;
    let direct = Side {
        conf: root.join("direct-net.d"),
        plugin_path: REAL_PLUGIN_DIR.into(),
        cache: caches.join("direct-cache"),
    };
    let shim_bin = root.join("shim-bin");
    let cnid = Side {
        conf: root.join("cnid-net.d"),
        plugin_path: format!("{}:{REAL_PLUGIN_DIR}", shim_bin.display()),
        cache: caches.join("cnid-cache"),
    };
    for d in [
        &direct.conf,
        &direct.cache,
        &cnid.conf,
        &cnid.cache,
        &shim_bin,
    ] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    std::fs::write(
        direct.conf.join(CONF_FILE),
        serde_json::to_vec_pretty(&chain)?,
    )?;
    cni_test_support::executable::copy_executable(&bins.shim, &shim_bin.join("cnid-shim"), 0o755);
    Ok((direct, cnid))
}

/// Writes the shim's list for the network into `side`'s conf dir, as
/// `cnid-shim config` writes it from the running cnid.
fn shim_list(bins: &Bins, side: &Side, socket: &Path) -> anyhow::Result<()> {
    let out = Command::new(&bins.shim)
        .args(["config", "--socket"])
        .arg(socket)
        .args(["--network", NETWORK, "--timeout", "120s"])
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .context("cnid-shim config")?;
    if !out.status.success() {
        bail!(
            "cnid-shim config: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    std::fs::write(side.conf.join("00-cnid.conflist"), &out.stdout)?;
    Ok(())
}

/// Runs go-cni's `phase` over `sandboxes` at `concurrency`, with cnid's CPU
/// read around it.
fn half(
    ctx: &Ctx<'_>,
    way: Way,
    phase: &str,
    sandboxes: &[OsString],
    concurrency: usize,
) -> anyhow::Result<(Half, GoReport)> {
    let side = ctx.side(way);
    let (c0, k0) = proc_cpu(ctx.daemon.pid())?;
    let out = Command::new(ctx.gocni)
        .arg("-conf-dir")
        .arg(&side.conf)
        .arg("-plugin-dir")
        .arg(&side.plugin_path)
        .arg("-cache-dir")
        .arg(&side.cache)
        .args(["-phase", phase, "-parallel", &concurrency.to_string()])
        .args(["-host-ip", &ctx.host_ip])
        .args(sandboxes)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .output()
        .context("run gocni")?;
    let (c1, k1) = proc_cpu(ctx.daemon.pid())?;
    let rep: GoReport = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "gocni {phase} ({}): no report; stderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    if rep.failed > 0 || !out.status.success() {
        let first = rep.sandboxes.iter().find(|s| !s.error.is_empty());
        bail!(
            "gocni {phase} via {}: {} of {} failed ({}); first: {}",
            way.key(),
            rep.failed,
            rep.sandboxes.len(),
            out.status,
            first.map_or("?".into(), |s| format!("{}: {}", s.id, s.error))
        );
    }
    let mut calls: Vec<f64> = rep
        .sandboxes
        .iter()
        .map(|s| s.ms.get(phase).copied().unwrap_or(f64::NAN) / 1e3)
        .collect();
    calls.sort_by(f64::total_cmp);
    let h = Half {
        calls,
        wall: rep.wall_ms / 1e3,
        go_self: rep.cpu_self_ms / 1e3,
        go_children: rep.cpu_children_ms / 1e3,
        cnid_self: c1 - c0,
        cnid_children: k1 - k0,
    };
    Ok((h, rep))
}

/// One round of `way`: namespaces, setup, removal, namespaces deleted.
fn round(
    ctx: &Ctx<'_>,
    way: Way,
    tag: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Round> {
    let load = report::load_average();
    let prefix = format!("{}{}{tag}-", ctx.net.prefix(), &way.key()[..1]);
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let r = (|| {
        for n in &names {
            drop(Netns::create(n)?);
        }
        let sandboxes: Vec<OsString> = names
            .iter()
            .map(|n| format!("{n}={NETNS_RUN_DIR}/{n}").into())
            .collect();
        let (setup, rep) = half(ctx, way, "setup", &sandboxes, concurrency)?;
        let mut ips: Vec<&String> = rep.sandboxes.iter().flat_map(|s| &s.ips).collect();
        ips.sort();
        ips.dedup();
        if ips.len() != count {
            bail!(
                "via {}: {} distinct eth0 addresses for {count} sandboxes",
                way.key(),
                ips.len()
            );
        }
        let (remove, _) = half(ctx, way, "remove", &sandboxes, concurrency)?;
        Ok(Round {
            setup,
            remove,
            load: load.clone(),
        })
    })();
    if r.is_err() {
        // Leave no attachment behind: a removal of every sandbox, errors
        // ignored (the namespaces go next, and the bridge with the net).
        let sandboxes: Vec<OsString> = names
            .iter()
            .map(|n| format!("{n}={NETNS_RUN_DIR}/{n}").into())
            .collect();
        let _ = half(ctx, way, "remove", &sandboxes, concurrency);
    }
    for n in &names {
        if Path::new(NETNS_RUN_DIR).join(n).exists() {
            Netns::delete_named(n)?;
        }
    }
    r
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(gocni) = &cx.gocni else {
        return Ok(None);
    };
    if !cx.root {
        cx.skipped
            .push("the burst section needs root (namespaces, a bridge)".into());
        return Ok(None);
    }
    let a = &cx.args;
    let plan = Plan {
        count: a.burst_count.unwrap_or(if a.quick { 32 } else { 100 }),
        concurrency: a.burst_concurrency.clone().unwrap_or_else(|| vec![16, 32]),
        reps: a.burst_reps.unwrap_or(if a.quick { 1 } else { 3 }),
        storage: if a.burst_tmpfs {
            Storage::Tmpfs
        } else {
            Storage::Disk
        },
        cnid_args: a
            .burst_cnid_args
            .iter()
            .flat_map(|s| s.split_whitespace())
            .map(str::to_owned)
            .collect(),
    };
    run(&cx.bins, gocni, &cx.tree, &plan, &mut cx.findings).map(Some)
}

fn run(
    bins: &Bins,
    gocni: &Path,
    tree: &Tree,
    plan: &Plan,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    // A /22: room for 1,022 sandboxes.
    let net = RealNet::bridge_only("cnu", 22, &["loopback", "bridge", "host-local", "portmap"])?;
    let host_ip = net
        .subnet()
        .split_once('/')
        .and_then(|(a, _)| a.rsplit_once('.'))
        .map(|(head, _)| format!("{head}.1"))
        .context("the subnet's .1")?;
    // cnid's conf dir holds the network before it starts.
    let (direct, cnid) = prepare(bins, tree, &net, plan.storage)?;
    let extra: Vec<&str> = plan.cnid_args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(bins, tree, plan.storage, "burst", &extra)?;
    shim_list(bins, &cnid, &daemon.socket)?;
    let ctx = Ctx {
        gocni,
        net: &net,
        daemon: &daemon,
        host_ip,
        direct,
        cnid,
    };
    let n = plan.count;
    // Warm-up: one small round each (page cache, cnid's first connection).
    for way in [Way::Direct, Way::Cnid] {
        round(&ctx, way, "w", n.min(16), 8)
            .with_context(|| format!("burst warm-up via {}", way.key()))
            .map_err(|e| e.context(daemon.log_tail()))?;
    }
    let mut ratios = Table::new(
        &format!("{n} sandboxes, via cnid ÷ direct, median (min–max) of the repetitions' ratios"),
        &[
            "concurrency",
            "setup p50",
            "setup p95",
            "setup total",
            "teardown p50",
            "teardown p95",
            "teardown total",
        ],
    );
    let mut abs = Table::new(
        "absolute, ms, median of the repetitions",
        &[
            "concurrency",
            "runner",
            "setup p50 / p95 / total",
            "teardown p50 / p95 / total",
            "load average at start",
        ],
    );
    let mut cpu = Table::new(
        "CPU per pod, ms (user + system), median of the repetitions",
        &[
            "concurrency",
            "runner",
            "verb",
            "go-cni itself",
            "go-cni's children",
            "cnid itself",
            "cnid's children (the chain)",
            "all",
        ],
    );
    let mut account = Table::new(
        "cnid's own account (its /metrics histograms over the via-cnid rounds): mean ms per \
         operation, plugin run or admission",
        &["concurrency", "series", "mean ms", "count"],
    );
    for &c in &plan.concurrency {
        let before = histograms(&daemon.socket)?;
        let mut rounds: [Vec<Round>; 2] = Default::default();
        for rep in 0..plan.reps {
            let order = if rep % 2 == 0 {
                [Way::Direct, Way::Cnid]
            } else {
                [Way::Cnid, Way::Direct]
            };
            for way in order {
                let t = Instant::now();
                let r = round(&ctx, way, &format!("c{c}r{rep}"), n, c)
                    .with_context(|| format!("burst c={c} rep {rep} via {}", way.key()))
                    .map_err(|e| e.context(daemon.log_tail()))?;
                eprintln!(
                    "overhead: burst c={c} rep {rep} {}: setup p50 {:.0} p95 {:.0} total {:.0} ms; \
                     teardown p50 {:.0} p95 {:.0} total {:.0} ms; {:.1} s; load {}",
                    way.key(),
                    r.setup.p(0.5) * 1e3,
                    r.setup.p(0.95) * 1e3,
                    r.setup.wall * 1e3,
                    r.remove.p(0.5) * 1e3,
                    r.remove.p(0.95) * 1e3,
                    r.remove.wall * 1e3,
                    t.elapsed().as_secs_f64(),
                    r.load
                );
                rounds[way as usize].push(r);
            }
        }
        let after = histograms(&daemon.socket)?;
        for (series, mean, n) in histogram_means(&before, &after) {
            row!(
                account,
                c,
                format!("`{series}`"),
                format!("{:.1}", mean * 1e3),
                format!("{n:.0}")
            );
        }
        let [d, v] = &rounds;
        let mut cells = vec![c.to_string()];
        for (verb, pick) in [
            ("setup", (|r: &Round| &r.setup) as fn(&Round) -> &Half),
            ("teardown", |r: &Round| &r.remove),
        ] {
            for (fig, f) in [
                ("p50", (|h: &Half| h.p(0.5)) as fn(&Half) -> f64),
                ("p95", |h: &Half| h.p(0.95)),
                ("total", |h: &Half| h.wall),
            ] {
                let r: Vec<f64> = v
                    .iter()
                    .zip(d)
                    .map(|(a, b)| f(pick(a)) / f(pick(b)))
                    .collect();
                let s = Summary::min_max(&r);
                findings.put(format!("burst/c{c}/{verb}/{fig}"), s);
                cells.push(s.ratio());
            }
        }
        ratios.row(cells);
        for (way, rs) in [(Way::Direct, d), (Way::Cnid, v)] {
            let med = |f: &dyn Fn(&Round) -> f64| {
                Summary::min_max(&rs.iter().map(f).collect::<Vec<_>>()).median
            };
            let three = |pick: fn(&Round) -> &Half| {
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    med(&|r| pick(r).p(0.5)) * 1e3,
                    med(&|r| pick(r).p(0.95)) * 1e3,
                    med(&|r| pick(r).wall) * 1e3
                )
            };
            abs.row(vec![
                c.to_string(),
                way.key().into(),
                three(|r| &r.setup),
                three(|r| &r.remove),
                rs.iter()
                    .map(|r| r.load.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
            ]);
            for (verb, pick) in [
                ("ADD", (|r: &Round| &r.setup) as fn(&Round) -> &Half),
                ("DEL", |r: &Round| &r.remove),
            ] {
                let per = |f: fn(&Half) -> f64| med(&|r| f(pick(r))) * 1e3 / n as f64;
                let parts = [
                    per(|h| h.go_self),
                    per(|h| h.go_children),
                    per(|h| h.cnid_self),
                    per(|h| h.cnid_children),
                ];
                for (k, val) in ["go_self", "go_children", "cnid_self", "cnid_children"]
                    .iter()
                    .zip(parts)
                {
                    findings.put(
                        format!("burst/c{c}/{}/{verb}/cpu/{k}", way.key()),
                        Summary::min_max(&[val]),
                    );
                }
                let mut row = vec![c.to_string(), way.key().into(), verb.into()];
                row.extend(parts.iter().map(|x| format!("{x:.2}")));
                row.push(format!("{:.2}", parts.iter().sum::<f64>()));
                cpu.row(row);
            }
        }
    }
    ratios.note(format!(
        "{} repetitions per concurrency; in each, one round per runner (direct first in even \
         repetitions, via cnid first in odd ones); a ratio divides adjacent rounds. p50 and p95 \
         of the per-sandbox go-cni call (Setup: loopback + the network; Remove), total = the \
         burst's wall time. Normal scheduling policy.",
        plan.reps
    ));
    cpu.note(
        "go-cni's children: loopback and, direct, the chain's plugins; via cnid, cnid-shim. \
         cnid's: from /proc/PID/stat (utime + stime, cutime + cstime) around each half.",
    );
    let s = format!(
        "### Burst: go-cni through cnid-shim into cnid against go-cni straight on the chain\n\n\
         containerd's go-cni (`cnid/tests/go/gocni`: loopback + the default network, the pod's \
         labels, portMappings) sets up {n} sandboxes at concurrency C in real namespaces on \
         bridge {} ({}) + host-local + portmap (no gateway, no masquerade, host IP of the port \
         mapping {}), then removes them; cnid with {}, {} (cnid's cache and \
         state, both runners' libcni caches, host-local's data dir). \
         `cargo bench -p cnid --bench overhead -- --only burst`.\n\n{}\n{}\n{}\n{}",
        net.bridge(),
        net.subnet(),
        ctx.host_ip,
        if plan.cnid_args.is_empty() {
            "its default options".to_owned()
        } else {
            format!("`{}`", plan.cnid_args.join(" "))
        },
        plan.storage.label(),
        ratios.markdown(),
        abs.markdown(),
        cpu.markdown(),
        account.markdown()
    );
    drop(daemon);
    drop(net);
    Ok(s)
}
