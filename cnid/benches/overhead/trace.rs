//! What a W3C trace context costs cnid's ADD: the same cnid answering
//! requests with a `traceparent` (and `tracestate`) header and without,
//! alternating in one shuffled loop (as [`crate::chains::run_loop`]),
//! beside the floor and the in-process runner as references.
//!
//! The traced runner's plugins get `TRACEPARENT`, `TRACESTATE` and
//! `BAGGAGE` (three more variables in each plugin's environment); cnid
//! parses and validates the headers, runs the operation in the trace
//! scope and logs its `trace_id`.
//!
//! - the cost = traced cnid − untraced cnid of the same iteration (the same
//!   daemon, containers of their own).

use anyhow::Context;
use cni_core::trace::TraceContext;
use cnid::client::Client;
use tokio::runtime::Runtime;

use crate::chains::{self, NOOP_NETNS, Runner, Samples};
use crate::report::{Findings, Table};
use crate::setup::{Bins, NOOP1, Storage, Tree};
use crate::stats::Summary;

/// The traced runner's name.
const TRACED: &str = "cnid, traceparent";

/// A sampled traceparent and a tracestate of two members.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

/// The section: one table per storage.
pub(crate) fn section(
    bins: &Bins,
    tree: &Tree,
    tokio: &Runtime,
    warmup: usize,
    iterations: usize,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let list = tree.load(NOOP1)?;
    let ctx = TraceContext::new(Some(TRACEPARENT), Some(TRACESTATE), None);
    let mut tables = Vec::new();
    for storage in [Storage::Disk, Storage::Tmpfs] {
        let tag = format!("trace-{}", storage.short());
        let daemon = crate::hop::daemon(bins, &bins.cnid, tree, storage, &tag)?;
        let plain = tokio.block_on(Client::connect(&daemon.socket))?;
        let traced = plain.with_trace(&ctx);
        // The loop's first runner is the floor (not reported here).
        let mut runners = vec![
            Runner::floor(&list, NOOP_NETNS, tree)?,
            Runner::in_process(&list, NOOP_NETNS, tree, storage, false),
            Runner::cnid(plain, NOOP1, NOOP_NETNS),
            Runner::cnid_as(TRACED, "bench-cnid-traced", traced, NOOP1, NOOP_NETNS),
        ];
        let label = format!("trace context, {}", storage.label());
        let s = chains::run_loop(&mut runners, tokio, warmup, iterations, &label)
            .map_err(|e| e.context(daemon.log_tail()))?;
        tables.push(tabulate(&s, storage, findings)?);
    }
    let mut out = String::from(
        "### A trace context on the cnid hop\n\n\
         One cnid answers requests with `traceparent` and `tracestate` headers and without, \
         alternating in one shuffled loop with the in-process runner (noop ×1); cost = traced − \
         untraced cnid of the same iteration.\n\n",
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
    let (inproc, plain, traced) = (at("in-process")?, at("cnid")?, at(TRACED)?);
    let mut t = Table::new(
        &format!("noop ×1, {}", storage.label()),
        &[
            "verb",
            "in-process ms",
            "cnid ms",
            "cnid with traceparent ms",
            "cost: traced − untraced ms",
        ],
    );
    for verb in ["ADD", "CHECK", "DEL"] {
        let (i, p, tr) = (
            s.series(inproc, verb),
            s.series(plain, verb),
            s.series(traced, verb),
        );
        let cost = Summary::diffs(&tr, &p);
        findings.put(format!("trace/{st}/{verb}/cost"), cost);
        t.row(vec![
            verb.into(),
            Summary::of(&i).ms(),
            Summary::of(&p).ms(),
            Summary::of(&tr).ms(),
            cost.ms(),
        ]);
    }
    if let Some(c) = findings.get(&format!("trace/{st}/ADD/cost")) {
        t.note(format!(
            "{} iterations after warm-up, medians (p10–p90) of per-iteration figures. ADD: a \
             trace context costs {:+.3} ms.",
            c.n,
            c.median * 1e3
        ));
    }
    Ok(t)
}
