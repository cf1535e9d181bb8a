//! The cnid hop before and after a change (`--only hop`, with
//! `--hop-baseline CNID`; the bound: no ADD latency regression beyond
//! +0.05 ms): cnid ADD minus in-process ADD, as scenario 3 reports it, for
//! the cnid under test and for another build, both running at once and
//! alternating in one shuffled loop with the floor and `cni_async::Cni` in
//! this process (noop ×1). Each daemon has a cache dir and a state dir of
//! its own on the same file system (disk, then tmpfs), and attaches a
//! container ID of its own.
//!
//! - hop = cnid − in-process of the same iteration (each build);
//! - the change = cnid under test − baseline cnid of the same iteration:
//!   the in-process reference cancels out, so this is the before/after of
//!   the hop without the noise of a third runner.
//!
//! # Caveats
//!
//! - The in-process runner is this tree's `cni_async`; a change of the
//!   library's own ADD is not in the hop, by its definition, but it is in
//!   the in-process rows.
//! - The baseline must accept the flags the bench starts cnid with
//!   (`--socket --conf-dir --cache-dir --state-dir --plugin-dir`) and speak
//!   the same API (`/v1`).

use crate::Cx;
use crate::chains::Col::{Diff, Time};
use crate::report::section as md;
use crate::setup::Storage;

/// The baseline runner's name.
const BASE: &str = "cnid (baseline)";

/// The bound, in seconds.
const BOUND_S: f64 = 0.05e-3;

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(baseline) = cx.args.hop_baseline.clone() else {
        return cx.skip("the hop against a baseline cnid (no --hop-baseline)");
    };
    let mut tables = Vec::new();
    for storage in Storage::BOTH {
        let (st, cnid) = (storage.short(), cx.bins.cnid.clone());
        let daemons = [
            (
                "cnid",
                "bench-cnid",
                cnid.as_path(),
                format!("hop-new-{st}"),
            ),
            (
                BASE,
                "bench-cnid-base",
                baseline.as_path(),
                format!("hop-base-{st}"),
            ),
        ];
        let cols = [
            Time("in-process ms", "in-process"),
            Time("cnid ms", "cnid"),
            Time("baseline cnid ms", BASE),
            Diff("hop, cnid − in-process ms", "cnid", "in-process", "new"),
            Diff("hop, baseline − in-process ms", BASE, "in-process", "base"),
            Diff("change: cnid − baseline ms", "cnid", BASE, "change"),
        ];
        let mut t = super::trace::cnid_loop(cx, storage, "hop", &daemons, None, &cols)?;
        if let Some(c) = cx.findings.get(&format!("hop/{st}/ADD/change")) {
            let within = if c.median <= BOUND_S {
                "within"
            } else {
                "over"
            };
            t.note(format!(
                "{} iterations after warm-up, medians (p10–p90) of per-iteration figures. ADD: \
                 the change is {:+.3} ms against the bound of +{:.2} ms: {within}.",
                c.n,
                c.median * 1e3,
                BOUND_S * 1e3,
            ));
        }
        tables.push(t);
    }
    let intro = format!(
        "Baseline: `{}`. Floor, in-process, cnid and the baseline cnid alternate in one shuffled \
         loop (noop ×1); hop = cnid − in-process of the same iteration; change = cnid − baseline \
         cnid of the same iteration. Bound: +{:.2} ms.",
        baseline.display(),
        BOUND_S * 1e3
    );
    Ok(Some(md(
        "The cnid hop against a baseline build",
        &intro,
        &tables,
    )))
}
