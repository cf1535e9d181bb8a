//! Scenario 5 (`--only batch`, root): batch throughput. N namespaces on
//! the real chain, at a given concurrency: create each namespace and ADD
//! it (setup), then DEL each and delete the namespace (teardown).
//!
//! - runtime: `cni_async::batch::BatchBuilder` (a current-thread runtime;
//!   namespaces are created on the blocking pool).
//! - floor: `concurrency` threads, each taking the next namespace: the same
//!   `Netns::create` and `Netns::delete_named`, and the floor chain
//!   (prebuilt stdin and environment per namespace) for ADD and DEL.
//!
//! Time per namespace is wall time / N; CPU per namespace is the user +
//! system time of this process and of the reaped plugins / N.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cni_async::batch::BatchBuilder;
use cni_async::multi::{MultiNetwork, Sandbox};
use cni_async::netns::{NETNS_RUN_DIR, Netns};
use cni_async::{Cni, cache::ResultCache};
use cni_core::NetworkConfigList;

use crate::Cx;
use crate::floor::FloorChain;
use crate::report::{Table, row, section as md};
use crate::setup::{REAL, Storage, Tree};
use crate::spawn::cpu_times;
use crate::stats::{Order, Summary, rounds};

/// One batch run: setup, teardown, and the CPU of this process (all
/// threads) and of its reaped children (the plugins).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchRun {
    pub(crate) setup: Duration,
    pub(crate) teardown: Duration,
    pub(crate) cpu_self: Duration,
    pub(crate) cpu_children: Duration,
}

/// A figure of a run, per namespace.
pub(crate) type Fig = fn(&BatchRun) -> Duration;

/// Setup, teardown, their sum, CPU (own + children), own CPU.
pub(crate) const FIGS: [Fig; 5] = [
    |r| r.setup,
    |r| r.teardown,
    |r| r.setup + r.teardown,
    |r| r.cpu_self + r.cpu_children,
    |r| r.cpu_self,
];

/// Runs `f` (which returns its setup and teardown times) with the CPU
/// times read around it.
pub(crate) fn measure(
    f: impl FnOnce() -> anyhow::Result<(Duration, Duration)>,
) -> anyhow::Result<BatchRun> {
    let (s0, c0) = cpu_times();
    let (setup, teardown) = f()?;
    let (s1, c1) = cpu_times();
    let (cpu_self, cpu_children) = (s1.saturating_sub(s0), c1.saturating_sub(c0));
    Ok(BatchRun {
        setup,
        teardown,
        cpu_self,
        cpu_children,
    })
}

/// Runs `work(i)` for i in 0..n on `threads` threads; the first error wins.
fn parallel(
    n: usize,
    threads: usize,
    work: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let (next, failed) = (AtomicUsize::new(0), Mutex::new(None));
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| {
                let mut i = next.fetch_add(1, Ordering::Relaxed);
                while i < n {
                    if let Err(e) = work(i) {
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                        // Stop handing out work.
                        next.store(n, Ordering::Relaxed);
                    }
                    i = next.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    failed
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(Ok(()), Err)
}

/// The floor's batch: `count` namespaces named `prefix<i>`.
pub(crate) fn floor_batch(
    list: &NetworkConfigList,
    tree: &Tree,
    prefix: &str,
    count: usize,
    c: usize,
) -> anyhow::Result<BatchRun> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let chain = |n: &String| {
        let rt = Sandbox::new(n.clone(), format!("{NETNS_RUN_DIR}/{n}")).runtime_conf("eth0");
        FloorChain::new(list, &rt, &tree.plugin_dirs)
    };
    let chains = names
        .iter()
        .map(chain)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let results: Vec<Mutex<Vec<u8>>> = (0..count).map(|_| Mutex::new(Vec::new())).collect();
    let result = |i: usize| results[i].lock().unwrap_or_else(|p| p.into_inner());
    let run = measure(|| {
        let t0 = Instant::now();
        let setup = parallel(count, c, |i| {
            drop(Netns::create(&names[i])?);
            chains[i].add(&mut result(i))
        });
        let t1 = Instant::now();
        let teardown = parallel(count, c, |i| {
            let r = result(i);
            if !r.is_empty() {
                chains[i].with_result(2, &r)?;
            }
            Ok(Netns::delete_named(&names[i])?)
        });
        let t2 = Instant::now();
        setup.context("floor batch setup")?;
        teardown.context("floor batch teardown")?;
        Ok((t1 - t0, t2 - t1))
    });
    if run.is_err() {
        // Leave nothing behind (the caller's guard also sweeps the prefix).
        names.iter().for_each(|n| drop(Netns::delete_named(n)));
    }
    run
}

/// The runtime's batch.
fn runtime_batch(
    cx: &Cx,
    list: &NetworkConfigList,
    storage: Storage,
    prefix: &str,
    n: usize,
    c: usize,
) -> anyhow::Result<BatchRun> {
    let cache = ResultCache::new(cx.tree.cache(storage));
    let cni = Cni::builder()
        .plugin_dirs(cx.tree.plugin_dirs.iter().cloned())
        .cache(cache)
        .build();
    let multi = MultiNetwork::builder(cni).network(list.clone()).build()?;
    measure(|| {
        let t0 = Instant::now();
        let batch = BatchBuilder::new(multi)
            .prefix(prefix)
            .count(n)
            .concurrency(c)
            .setup();
        let batch = cx.tokio.block_on(batch)?;
        let (t1, counts) = (Instant::now(), batch.counts());
        let first_error = batch
            .failed()
            .next()
            .and_then(|m| m.error())
            .map(|e| e.to_string());
        cx.tokio
            .block_on(batch.teardown())
            .context("batch teardown")?;
        let t2 = Instant::now();
        let (attached, first) = (counts.attached, first_error.unwrap_or_default());
        anyhow::ensure!(
            attached == n,
            "batch: {attached} of {n} attached; first error: {first}"
        );
        Ok((t1 - t0, t2 - t1))
    })
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(net) = &cx.real else { return Ok(None) };
    let (list, n, reps) = (cx.tree.load(REAL)?, cx.n(20, 100), cx.n(1, 5));
    let header = "concurrency|cache|runner|setup ms/ns|teardown ms/ns|total ms/ns, median (min–max)|× floor, median (min–max)|CPU ms/ns (own + plugins)";
    let mut t = Table::new(format!("{n} namespaces on the real chain"), header);
    for (c, storage) in [
        (1usize, Storage::Disk),
        (4, Storage::Disk),
        (4, Storage::Tmpfs),
        (16, Storage::Disk),
    ] {
        let st = storage.short();
        // Floor and runtime, in turn first.
        let reps = if c == 4 { reps } else { reps.min(2) };
        let runs = rounds(
            (2, 0, reps),
            Order::Rotate,
            &format!("batch c={c} {st}"),
            |r, rep| {
                let prefix = format!("{}{}{c}{st}r{rep}-", net.prefix, ["f", "b"][r]);
                match r {
                    0 => floor_batch(&list, &cx.tree, &prefix, n, c),
                    _ => runtime_batch(cx, &list, storage, &prefix, n, c),
                }
            },
        )?;
        let per_ns = |i: usize, f: Fig| -> Vec<f64> {
            runs[i]
                .iter()
                .map(|r| f(r).as_secs_f64() / n as f64)
                .collect()
        };
        for (i, (name, key)) in [("floor", "floor"), ("cni-async batch", "runtime")]
            .into_iter()
            .enumerate()
        {
            let [setup, teardown, _, cpu, own] =
                FIGS.map(|f| Summary::of(&per_ns(i, f)).median * 1e3);
            let totals = per_ns(i, FIGS[2]);
            let ratio = totals.iter().zip(per_ns(0, FIGS[2])).map(|(a, b)| a / b);
            let ratio = Summary::min_max(&ratio.collect::<Vec<_>>());
            cx.findings
                .put(format!("batch/c{c}/{st}/{key}/total"), Summary::of(&totals));
            cx.findings
                .put(format!("batch/c{c}/{st}/{key}/ratio"), ratio);
            let (cache, x) = if i == 0 {
                ("–", "1".into())
            } else {
                (st, ratio.ratio())
            };
            let cpu = format!("{cpu:.2} ({own:.2} + {:.2})", cpu - own);
            row!(
                t,
                c,
                cache,
                name,
                format!("{setup:.2}"),
                format!("{teardown:.2}"),
                Summary::min_max(&totals).fmt(1e3, 2),
                x,
                cpu
            );
        }
    }
    t.note(format!(
        "Setup = create the namespace + ADD; teardown = DEL + delete the namespace. Floor and \
         runtime alternate ({reps} runs at concurrency 4, up to 2 at 1 and 16); the ratio pairs each \
         runtime run with the floor run next to it. Cache \"tmpfs\": the same with the cache on \
         tmpfs (fsync free). \"own\" CPU is this process's (all threads, namespace creation \
         included on both sides); \"plugins\" is the reaped children's."
    ));
    Ok(Some(md(
        "Scenario 5: batch throughput",
        "`cni_async::batch::BatchBuilder` against the floor run by as many threads as the \
         concurrency, both creating namespaces with `Netns::create`.",
        &[t],
    )))
}
