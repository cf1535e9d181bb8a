//! The cnid hop before and after a change (issue 21's bound: no ADD
//! latency regression beyond +0.05 ms): cnid ADD minus in-process ADD, as
//! scenario 3 reports it, for the cnid under test and for another build
//! (`--hop-baseline CNID`), both running at once and alternating in one
//! loop.
//!
//! Per iteration, in shuffled order (as [`crate::chains::run_loop`]): the
//! floor, `cni_async::Cni` in this process, the cnid under test and the
//! baseline cnid each run ADD, CHECK and DEL of noop ×1. Each daemon has a
//! cache dir and a state dir of its own on the same file system (disk,
//! then tmpfs), and attaches a container ID of its own.
//!
//! - hop = cnid − in-process of the same iteration (each build);
//! - the change = cnid under test − baseline cnid of the same iteration:
//!   the in-process reference cancels out, so this is the before/after of
//!   the hop without the noise of a third runner.
//!
//! # Caveats
//!
//! - The in-process runner is this tree's `cni_async`; a change of the
//!   library's own ADD (the cache writes in-process) is not in the hop, by
//!   its definition, but it is in the in-process rows.
//! - The baseline must accept the flags the bench starts cnid with
//!   (`--socket --conf-dir --cache-dir --state-dir --plugin-dir`) and speak
//!   the same API (`/v1`).

use std::path::Path;

use anyhow::Context;
use cnid::client::Client;
use tokio::runtime::Runtime;

use crate::chains::{self, NOOP_NETNS, Runner, Samples};
use crate::report::{Findings, Table};
use crate::setup::{Bins, Daemon, NOOP1, Storage, Tree};
use crate::stats::Summary;

/// The baseline runner's name.
const BASE: &str = "cnid (baseline)";

/// The bound of issue 21, in seconds.
pub(crate) const BOUND_S: f64 = 0.05e-3;

/// A daemon of `cnid` on its own cache and state dirs beside the tree's.
pub(crate) fn daemon(
    bins: &Bins,
    cnid: &Path,
    tree: &Tree,
    storage: Storage,
    tag: &str,
) -> anyhow::Result<Daemon> {
    let base = tree.cache(storage);
    let root = base.parent().context("cache dir has a parent")?;
    let cache = root.join(format!("cache-{tag}"));
    let state = root.join(format!("state-{tag}"));
    for d in [&cache, &state] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let bins = Bins {
        cnid: cnid.to_owned(),
        ..bins.clone()
    };
    Daemon::start_on(&bins, tree, &cache, &state, tag, &[])
}

/// The section: one table per storage.
pub(crate) fn section(
    bins: &Bins,
    baseline: &Path,
    tree: &Tree,
    tokio: &Runtime,
    warmup: usize,
    iterations: usize,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let list = tree.load(NOOP1)?;
    let mut tables = Vec::new();
    for storage in [Storage::Disk, Storage::Tmpfs] {
        let st = storage.short();
        let new = daemon(bins, &bins.cnid, tree, storage, &format!("hop-new-{st}"))?;
        let old = daemon(bins, baseline, tree, storage, &format!("hop-base-{st}"))?;
        let new_client = tokio.block_on(Client::connect(&new.socket))?;
        let old_client = tokio.block_on(Client::connect(&old.socket))?;
        let mut runners = vec![
            Runner::floor(&list, NOOP_NETNS, tree)?,
            Runner::in_process(&list, NOOP_NETNS, tree, storage, false),
            Runner::cnid(new_client, NOOP1, NOOP_NETNS),
            Runner::cnid_as(BASE, "bench-cnid-base", old_client, NOOP1, NOOP_NETNS),
        ];
        let label = format!("hop, {}", storage.label());
        let s = chains::run_loop(&mut runners, tokio, warmup, iterations, &label)
            .map_err(|e| e.context(format!("{}\n{}", new.log_tail(), old.log_tail())))?;
        tables.push(tabulate(&s, storage, findings)?);
    }
    let mut out = format!(
        "### The cnid hop against a baseline build (issue 21)\n\n\
         Baseline: `{}`. Floor, in-process, cnid and the baseline cnid alternate in one \
         shuffled loop (noop ×1); hop = cnid − in-process of the same iteration; change = \
         cnid − baseline cnid of the same iteration. Bound: +{:.2} ms.\n\n",
        baseline.display(),
        BOUND_S * 1e3
    );
    for t in tables {
        out.push_str(&t.markdown());
        out.push('\n');
    }
    Ok(out)
}

fn tabulate(s: &Samples, storage: Storage, findings: &mut Findings) -> anyhow::Result<Table> {
    let st = storage.short();
    let at = |name: &str| s.index(name).with_context(|| format!("no runner {name:?}"));
    let (inproc, new, old) = (at("in-process")?, at("cnid")?, at(BASE)?);
    let mut t = Table::new(
        &format!("noop ×1, {}", storage.label()),
        &[
            "verb",
            "in-process ms",
            "cnid ms",
            "baseline cnid ms",
            "hop, cnid − in-process ms",
            "hop, baseline − in-process ms",
            "change: cnid − baseline ms",
        ],
    );
    for verb in ["ADD", "CHECK", "DEL"] {
        let (i, n, o) = (
            s.series(inproc, verb),
            s.series(new, verb),
            s.series(old, verb),
        );
        let hop_new = Summary::diffs(&n, &i);
        let hop_old = Summary::diffs(&o, &i);
        let change = Summary::diffs(&n, &o);
        findings.put(format!("hop/{st}/{verb}/new"), hop_new);
        findings.put(format!("hop/{st}/{verb}/base"), hop_old);
        findings.put(format!("hop/{st}/{verb}/change"), change);
        t.row(vec![
            verb.into(),
            Summary::of(&i).ms(),
            Summary::of(&n).ms(),
            Summary::of(&o).ms(),
            hop_new.ms(),
            hop_old.ms(),
            change.ms(),
        ]);
    }
    let add = findings.get(&format!("hop/{st}/ADD/change"));
    if let Some(c) = add {
        t.note(format!(
            "{} iterations after warm-up, medians (p10–p90) of per-iteration figures. ADD: \
             the change is {:+.3} ms against the bound of +{:.2} ms: {}.",
            c.n,
            c.median * 1e3,
            BOUND_S * 1e3,
            if c.median <= BOUND_S {
                "within"
            } else {
                "over"
            }
        ));
    }
    Ok(t)
}
