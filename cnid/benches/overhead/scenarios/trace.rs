//! What a W3C trace context costs cnid's ADD (`--only trace`): the same
//! cnid answering requests with a `traceparent` (and `tracestate`) header
//! and without, alternating in one shuffled loop beside the floor and the
//! in-process runner (noop ×1). The traced runner's plugins get
//! `TRACEPARENT`, `TRACESTATE` and `BAGGAGE` (three more variables in each
//! plugin's environment); cnid parses and validates the headers, runs the
//! operation in the trace scope and logs its `trace_id`. The cost = traced
//! − untraced cnid of the same iteration (the same daemon, containers of
//! their own).
//!
//! [`cnid_loop`], the loop of cnid runners against each other, is also the
//! hop section's.

use std::path::Path;

use cni_core::trace::TraceContext;
use cnid::client::Client;

use crate::Cx;
use crate::chains::Col::{Diff, Time};
use crate::chains::{self, Col, NOOP_NETNS, On};
use crate::report::{Table, section as md};
use crate::setup::{Daemon, NOOP1, Storage};

/// The traced runner's name.
const TRACED: &str = "cnid, traceparent";

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    // A sampled traceparent and a tracestate of two members.
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ctx = TraceContext::new(
        Some(parent),
        Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
        None,
    );
    let mut tables = Vec::new();
    for storage in Storage::BOTH {
        let cols = [
            Time("in-process ms", "in-process"),
            Time("cnid ms", "cnid"),
            Time("cnid with traceparent ms", TRACED),
            Diff("cost: traced − untraced ms", TRACED, "cnid", "cost"),
        ];
        let cnid = cx.bins.cnid.clone();
        let daemon = [(
            "cnid",
            "bench-cnid",
            cnid.as_path(),
            format!("trace-{}", storage.short()),
        )];
        let mut t = cnid_loop(
            cx,
            storage,
            "trace",
            &daemon,
            Some((TRACED, "bench-cnid-traced", &ctx)),
            &cols,
        )?;
        if let Some(c) = cx
            .findings
            .get(&format!("trace/{}/ADD/cost", storage.short()))
        {
            t.note(format!(
                "{} iterations after warm-up, medians (p10–p90) of per-iteration figures. ADD: a \
                 trace context costs {:+.3} ms.",
                c.n,
                c.median * 1e3
            ));
        }
        tables.push(t);
    }
    Ok(Some(md(
        "A trace context on the cnid hop",
        "One cnid answers requests with `traceparent` and `tracestate` headers and without, \
         alternating in one shuffled loop with the in-process runner (noop ×1); cost = traced − \
         untraced cnid of the same iteration.",
        &tables,
    )))
}

/// One shuffled loop of the floor, the in-process runner and a runner per
/// daemon of `daemons` (runner name, container ID, cnid binary, tag; each
/// on cache and state dirs of its own beside the tree's), plus a runner on
/// the first daemon sending `traced`'s trace context; tabulated by `cols`,
/// figures under `KEY/STORAGE/VERB/…`.
pub(crate) fn cnid_loop(
    cx: &mut Cx,
    storage: Storage,
    key: &str,
    daemons: &[(&'static str, &str, &Path, String)],
    traced: Option<(&'static str, &str, &TraceContext)>,
    cols: &[Col],
) -> anyhow::Result<Table> {
    let (tree, st) = (&cx.tree, storage.short());
    let list = tree.load(NOOP1)?;
    let on = On(&list, NOOP_NETNS, tree, storage);
    let (mut runners, mut running) = (vec![on.floor()?, on.in_process(false, false)], Vec::new());
    for (name, id, cnid, tag) in daemons {
        let dir = |what: &str| tree.cache(storage).with_file_name(format!("{what}-{tag}"));
        let (cache, state) = (dir("cache"), dir("state"));
        std::fs::create_dir_all(&cache)?;
        std::fs::create_dir_all(&state)?;
        let d = Daemon::spawn(cnid, tree, &cache, &state, tag, &[])?.listening()?;
        let client = cx.tokio.block_on(Client::connect(&d.socket))?;
        runners.push(on.cnid(name, id, client.clone()));
        if let (Some((tname, tid, ctx)), true) = (traced, running.is_empty()) {
            runners.push(on.cnid(tname, tid, client.with_trace(ctx)));
        }
        running.push(d);
    }
    let (label, n) = (format!("{key}, {}", storage.label()), cx.n(30, 1000));
    let s = chains::run_loop(&mut runners, &cx.tokio, cx.n(2, 5) * 4, n, &label).map_err(|e| {
        let logs: Vec<String> = running.iter().map(Daemon::log_tail).collect();
        e.context(logs.join("\n"))
    })?;
    let title = format!("noop ×1, {}", storage.label());
    chains::compare(&s, &title, cols, &format!("{key}/{st}"), &mut cx.findings)
}
