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

use anyhow::{Context, bail};
use cni_async::batch::BatchBuilder;
use cni_async::multi::{MultiNetwork, Sandbox};
use cni_async::netns::{NETNS_RUN_DIR, Netns};
use cni_async::{Cni, cache::ResultCache};
use cni_core::NetworkConfigList;
use tokio::runtime::Runtime;

use crate::Cx;
use crate::floor::FloorChain;
use crate::report::{Table, row, section as md};
use crate::setup::{REAL, Storage, Tree};
use crate::spawn::cpu_times;
use crate::stats::{Order, Summary, rounds};

/// One batch run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchRun {
    pub(crate) setup: Duration,
    pub(crate) teardown: Duration,
    /// CPU of this process (all threads).
    pub(crate) cpu_self: Duration,
    /// CPU of the reaped children (the plugins).
    pub(crate) cpu_children: Duration,
}

impl BatchRun {
    pub(crate) fn total(&self) -> Duration {
        self.setup + self.teardown
    }

    pub(crate) fn cpu(&self) -> Duration {
        self.cpu_self + self.cpu_children
    }
}

pub(crate) fn measure(
    f: impl FnOnce() -> anyhow::Result<(Duration, Duration)>,
) -> anyhow::Result<BatchRun> {
    let (s0, c0) = cpu_times();
    let (setup, teardown) = f()?;
    let (s1, c1) = cpu_times();
    Ok(BatchRun {
        setup,
        teardown,
        cpu_self: s1.saturating_sub(s0),
        cpu_children: c1.saturating_sub(c0),
    })
}

/// Runs `work(i)` for i in 0..n on `threads` threads; the first error wins.
fn parallel(
    n: usize,
    threads: usize,
    work: impl Fn(usize) -> anyhow::Result<()> + Sync,
) -> anyhow::Result<()> {
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.min(n) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    if let Err(e) = work(i) {
                        let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                        f.get_or_insert(e);
                        // Stop handing out work.
                        next.store(n, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The floor's batch.
pub(crate) fn floor_batch(
    list: &NetworkConfigList,
    tree: &Tree,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<BatchRun> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    let chains = names
        .iter()
        .map(|n| {
            let path = format!("{NETNS_RUN_DIR}/{n}");
            let rt = Sandbox::new(n.clone(), path).runtime_conf("eth0");
            FloorChain::new(list, &rt, &tree.plugin_dirs)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let results: Vec<Mutex<Vec<u8>>> = (0..count).map(|_| Mutex::new(Vec::new())).collect();
    let run = measure(|| {
        let t0 = Instant::now();
        let setup = parallel(count, concurrency, |i| {
            let ns = Netns::create(&names[i])?;
            drop(ns);
            let mut r = results[i].lock().unwrap_or_else(|p| p.into_inner());
            chains[i].add(&mut r)
        });
        let t1 = Instant::now();
        let teardown = parallel(count, concurrency, |i| {
            let r = results[i].lock().unwrap_or_else(|p| p.into_inner());
            if !r.is_empty() {
                chains[i].del(&r)?;
            }
            Netns::delete_named(&names[i])?;
            Ok(())
        });
        let t2 = Instant::now();
        setup.context("floor batch setup")?;
        teardown.context("floor batch teardown")?;
        Ok((t1 - t0, t2 - t1))
    });
    if run.is_err() {
        // Leave nothing behind (the caller's guard also sweeps the prefix).
        for n in &names {
            let _ = Netns::delete_named(n);
        }
    }
    run
}

/// The runtime's batch.
pub(crate) fn runtime_batch(
    list: &NetworkConfigList,
    tree: &Tree,
    storage: Storage,
    tokio: &Runtime,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<BatchRun> {
    let cni = Cni::builder()
        .plugin_dirs(tree.plugin_dirs.iter().cloned())
        .cache(ResultCache::new(tree.cache(storage)))
        .build();
    let multi = MultiNetwork::builder(cni).network(list.clone()).build()?;
    measure(|| {
        let t0 = Instant::now();
        let batch = tokio.block_on(
            BatchBuilder::new(multi)
                .prefix(prefix)
                .count(count)
                .concurrency(concurrency)
                .setup(),
        )?;
        let t1 = Instant::now();
        let counts = batch.counts();
        let first_error = batch
            .failed()
            .next()
            .and_then(|m| m.error())
            .map(|e| e.to_string());
        tokio.block_on(batch.teardown()).context("batch teardown")?;
        let t2 = Instant::now();
        if counts.attached != count {
            bail!(
                "batch: {} of {count} attached; first error: {}",
                counts.attached,
                first_error.unwrap_or_default()
            );
        }
        Ok((t1 - t0, t2 - t1))
    })
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(net) = &cx.real else { return Ok(None) };
    let list = cx.tree.load(REAL)?;
    let n = cx.sizes.batch_count;
    let mut t = Table::new(
        &format!("{n} namespaces on the real chain"),
        &[
            "concurrency",
            "cache",
            "runner",
            "setup ms/ns",
            "teardown ms/ns",
            "total ms/ns, median (min–max)",
            "× floor, median (min–max)",
            "CPU ms/ns (own + plugins)",
        ],
    );
    for (c, storage) in [
        (1usize, Storage::Disk),
        (4, Storage::Disk),
        (4, Storage::Tmpfs),
        (16, Storage::Disk),
    ] {
        let st = storage.short();
        let reps = if c == 4 {
            cx.sizes.batch_reps
        } else {
            cx.sizes.batch_reps.min(2)
        };
        // Floor and runtime, in turn first.
        let label = format!("batch c={c} {st}");
        let runs = rounds(2, 0, reps, Order::Rotate, &label, |r, rep| {
            let prefix = format!("{}{}{c}{st}r{rep}-", net.prefix, ["f", "b"][r]);
            match r {
                0 => floor_batch(&list, &cx.tree, &prefix, n, c),
                _ => runtime_batch(&list, &cx.tree, storage, &cx.tokio, &prefix, n, c),
            }
        })?;
        let per_ns = |v: &[BatchRun], f: fn(&BatchRun) -> Duration| -> Vec<f64> {
            v.iter().map(|r| f(r).as_secs_f64() / n as f64).collect()
        };
        let floor_total = per_ns(&runs[0], BatchRun::total);
        for (i, (name, key)) in [("floor", "floor"), ("cni-async batch", "runtime")]
            .into_iter()
            .enumerate()
        {
            let total = per_ns(&runs[i], BatchRun::total);
            let (cpu, own) = (
                per_ns(&runs[i], BatchRun::cpu),
                per_ns(&runs[i], |r| r.cpu_self),
            );
            let ratio: Vec<f64> = total.iter().zip(&floor_total).map(|(a, b)| a / b).collect();
            let f = &mut cx.findings;
            f.put(format!("batch/c{c}/{st}/{key}/total"), Summary::of(&total));
            f.put(
                format!("batch/c{c}/{st}/{key}/ratio"),
                Summary::min_max(&ratio),
            );
            let med = |v: &[f64]| Summary::of(v).median * 1e3;
            let (cpu, own) = (med(&cpu), med(&own));
            row!(
                t,
                c,
                if i == 0 { "–" } else { st },
                name,
                format!("{:.2}", med(&per_ns(&runs[i], |r| r.setup))),
                format!("{:.2}", med(&per_ns(&runs[i], |r| r.teardown))),
                Summary::min_max(&total).fmt(1e3, 2),
                if i == 0 {
                    "1".into()
                } else {
                    Summary::min_max(&ratio).ratio()
                },
                format!("{cpu:.2} ({own:.2} + {:.2})", cpu - own),
            );
        }
    }
    t.note(format!(
        "Setup = create the namespace + ADD; teardown = DEL + delete the namespace. Floor and \
         runtime alternate ({} runs at concurrency 4, up to 2 at 1 and 16); the ratio pairs each \
         runtime run with the floor run next to it. Cache \"tmpfs\": the same with the cache on \
         tmpfs (fsync free). \"own\" CPU is this process's (all threads, namespace creation \
         included on both sides); \"plugins\" is the reaped children's.",
        cx.sizes.batch_reps
    ));
    Ok(Some(md(
        "Scenario 5: batch throughput",
        "`cni_async::batch::BatchBuilder` against the floor run by as many threads as the \
         concurrency, both creating namespaces with `Netns::create`.",
        &[t],
    )))
}
