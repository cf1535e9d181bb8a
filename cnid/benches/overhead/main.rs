//! What a CNI runtime adds on top of running the plugins, measured against
//! the floor: a minimal loop that runs the same plugins with prebuilt stdin
//! and environment (`floor.rs`). Every latency scenario runs in the same
//! process as its floor, in paired rounds with it (`stats::rounds`), and is
//! reported as a ratio to it (median and 10th–90th percentile of the
//! per-iteration ratios).
//!
//! ```text
//! make bench        # criterion for cni-core, then this; updates BENCHMARKS.md
//! cargo bench -p cnid --bench overhead -- --help
//! ```
//!
//! The shared runner: `stats.rs` (paired rounds), `chains.rs` (the
//! runners of one chain and their tables), `report.rs`, `targets.rs`; one
//! file per scenario in `scenarios/`, run in the order of [`SECTIONS`];
//! the root-only ones (real, batch, batch1000, burst) say so in the report
//! when skipped.
//!
//! `cargo test` runs this binary without `--bench`: it then only checks its
//! arithmetic and exits.

mod chains;
mod cli;
mod floor;
mod go;
mod procs;
mod report;
mod scenarios;
mod setup;
mod spawn;
mod stats;
mod targets;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use tokio::runtime::Runtime;

use crate::cli::{Args, Section};
use crate::report::Findings;
use crate::setup::{Bins, REAL, RealNet, Storage, Tree};

/// Everything a scenario works with: Go's cnitool and containerd's go-cni
/// client when they built; the real chain's bridge network (root only);
/// what was not measured, and why (listed in the report's header).
pub(crate) struct Cx {
    pub(crate) args: Args,
    pub(crate) bins: Bins,
    pub(crate) tree: Tree,
    pub(crate) tokio: Runtime,
    pub(crate) findings: Findings,
    pub(crate) skipped: Vec<String>,
    pub(crate) go: Option<PathBuf>,
    pub(crate) gocni: Option<PathBuf>,
    pub(crate) real: Option<RealNet>,
    pub(crate) root: bool,
}

impl Cx {
    /// An iteration count: `quick` with --quick, else `full`.
    pub(crate) fn n(&self, quick: usize, full: usize) -> usize {
        if self.args.quick { quick } else { full }
    }

    /// Notes that `what` was not measured, and why.
    pub(crate) fn skip(&mut self, what: impl Into<String>) -> anyhow::Result<Option<String>> {
        self.skipped.push(what.into());
        Ok(None)
    }
}

/// A scenario: its section of the report, or `None` when skipped.
type Scenario = fn(&mut Cx) -> anyhow::Result<Option<String>>;

/// The sections in the order they run; from `batch` on with the normal
/// scheduling policy.
const SECTIONS: [(Section, Scenario); 12] = {
    use scenarios::*;
    [
        (Section::Floor, plugin::section),
        (Section::Noop, noop::section),
        (Section::Real, real::section),
        (Section::Hop, hop::section),
        (Section::Shim, shim::section),
        (Section::Trace, trace::section),
        (Section::Batch, batch::section),
        (Section::Batch1000, batch1000::section),
        (Section::Burst, burst::section),
        (Section::Memory, memory::section),
        (Section::Scale, scale::section),
        (Section::Core, core::section),
    ]
};

fn main() -> ExitCode {
    // `cargo test` runs benchmark binaries without --bench.
    let checked = match std::env::args().any(|a| a == "--bench") {
        false => stats::self_check()
            .and_then(|()| scenarios::scale::self_check())
            .map(|()| eprintln!("overhead: not run under `cargo test` (use `make bench`)"))
            .map_err(anyhow::Error::msg),
        true => run(Args::parse()),
    };
    match checked {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("overhead: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Switches the calling thread (and so what it starts from now on) to
/// SCHED_FIFO priority 10, or back to SCHED_OTHER. Returns whether it worked.
fn set_fifo(on: bool) -> bool {
    let (policy, priority) = if on {
        (libc::SCHED_FIFO, 10)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a valid sched_param for the calling thread (pid 0).
    let ok = unsafe { libc::sched_setscheduler(0, policy, &param) } == 0;
    if !ok {
        eprintln!(
            "overhead: sched_setscheduler: {}",
            std::io::Error::last_os_error()
        );
    }
    ok
}

fn run(args: Args) -> anyhow::Result<()> {
    let (started, load_start) = (Instant::now(), report::load_average());
    setup::raise_nofile();
    let bins = Bins::find(args.bin_dir.as_deref())?;
    let tree = Tree::new(&bins.noop)?;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    let go_dir = Args::target_dir().join("bench/go");
    let mut skipped = Vec::new();
    // Go's programs are built before SCHED_FIFO is switched on: Go's
    // compiler, its threads spinning at a real-time priority, held both
    // CPUs for minutes in a first try. Without them, the report says why.
    let mut build = |wanted: bool, program: &str, what: &str| -> anyhow::Result<_> {
        let built = wanted.then(|| go::build(&go_dir, program)).transpose()?;
        Ok(built.and_then(|b| b.map_err(|why| skipped.push(format!("{what}: {why}"))).ok()))
    };
    let want_go = (args.wants(Section::Noop) || args.wants(Section::Batch1000)) && !args.no_go;
    let go = build(want_go, "cnitool", "the comparison with Go's cnitool")?;
    let gocni = build(
        args.wants(Section::Burst),
        "gocni",
        "the burst section (go-cni)",
    )?;
    // Other load on a shared 2-CPU machine delays wake-ups by a scheduler
    // slice (~4 ms) at random; SCHED_FIFO (inherited by the plugins,
    // cnitool and cnid started from here) keeps that out of the latency
    // loops. Batch and memory run with the normal policy again.
    let realtime = !args.no_rt && root && set_fifo(true);
    // The real network first: the daemons must see its configuration.
    let real = match (
        args.wants(Section::Real) || args.wants(Section::Batch),
        root,
    ) {
        (true, true) => Some(RealNet::new(
            &tree,
            "cnb",
            24,
            Some((REAL, "20-real.conflist")),
        )?),
        (true, false) => {
            skipped.push("scenarios 4 and 5 (real chain, batch) need root".into());
            None
        }
        _ => None,
    };
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let findings = Findings::default();
    let mut cx = Cx {
        args,
        bins,
        tree,
        tokio,
        findings,
        skipped,
        go,
        gocni,
        real,
        root,
    };
    let mut sections = Vec::new();
    for (section, scenario) in SECTIONS {
        if section == Section::Batch && realtime {
            set_fifo(false);
        }
        if cx.args.wants(section) {
            sections.extend(scenario(&mut cx)?);
        }
    }
    cx.real = None;

    let quick = if cx.args.quick { " with --quick" } else { "" };
    let took = started.elapsed().as_secs_f64();
    let mut md = format!(
        "### Latest run\n\n`make bench` (`cargo bench -p cni-core --bench core`, then `cargo bench -p cnid --bench \
         overhead`{quick}); this part took {took:.0} s.\n\n"
    );
    md += &report::machine(&cx.bins, &load_start, &cx.tree.cache(Storage::Disk));
    md += if realtime {
        "- scheduling: SCHED_FIFO priority 10 for the floor, noop and real-chain loops (inherited by the plugins, \
         cnitool and cnid they start), so that other load on the machine does not add random scheduler delays; \
         normal policy for the batch and memory runs\n"
    } else {
        "- scheduling: normal (SCHED_OTHER) throughout\n"
    };
    cx.skipped
        .iter()
        .for_each(|s| md += &format!("- skipped: {s}\n"));
    md += &format!("\n{}", targets::table(&cx.findings).markdown());
    sections
        .iter()
        .for_each(|s| md += &format!("\n{}\n", s.trim_end()));

    let out = cx
        .args
        .out
        .clone()
        .unwrap_or_else(|| Args::target_dir().join("bench/overhead.md"));
    std::fs::create_dir_all(out.parent().context("the report's dir")?)?;
    std::fs::write(&out, &md).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("overhead: report in {}", out.display());
    if let Some(path) = &cx.args.update {
        report::update_marked(path, &md)?;
        eprintln!("overhead: updated {}", path.display());
    }
    println!("{md}");
    Ok(())
}
