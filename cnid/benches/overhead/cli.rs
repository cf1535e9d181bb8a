//! The benchmark's arguments (clap derive); what they do is in `main.rs`
//! and the scenarios.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// What a CNI runtime adds on top of running the plugins, against the floor.
#[derive(Debug, Parser)]
#[command(
    name = "overhead",
    after_help = "Without --bench (as `cargo test` runs it) it only checks its own arithmetic."
)]
pub(crate) struct Args {
    /// Run the benchmark (cargo bench passes it).
    #[arg(long, hide = true)]
    pub(crate) bench: bool,
    /// A smoke run (small iteration counts).
    #[arg(long)]
    pub(crate) quick: bool,
    /// No SCHED_FIFO for the latency loops.
    #[arg(long)]
    pub(crate) no_rt: bool,
    /// Skip the comparison with Go's cnitool (built from cnid/tests/go/cnitool).
    #[arg(long)]
    pub(crate) no_go: bool,
    /// Run these sections only.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Section::value_variants().to_vec())]
    pub(crate) only: Vec<Section>,
    /// The shipped binaries (cnitool, cnid, cni-noop, cnid-shim); default: cargo's.
    #[arg(long, value_name = "DIR")]
    pub(crate) bin_dir: Option<PathBuf>,
    /// The report (default: TARGET/bench/overhead.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// Replace the generated part of this file (BENCHMARKS.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) update: Option<PathBuf>,
    /// criterion's output dir (default: TARGET/criterion).
    #[arg(long, value_name = "DIR")]
    pub(crate) criterion_dir: Option<PathBuf>,
    /// Another cnid build, run alongside in the scale section (before/after).
    #[arg(long, value_name = "CNID")]
    pub(crate) scale_baseline: Option<PathBuf>,
    /// Another cnid build, alternating with ours in the hop section; without it the hop section is skipped.
    #[arg(long, value_name = "CNID")]
    pub(crate) hop_baseline: Option<PathBuf>,
    /// Namespaces per batch in the batch1000 section (default 1000, --quick 100; a /20).
    #[arg(long, value_name = "N", value_parser = between::<1, 4000>)]
    pub(crate) batch1000_count: Option<usize>,
    /// Its concurrencies.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "1,4,8", value_parser = between::<1, 64>)]
    pub(crate) batch1000_concurrency: Vec<usize>,
    /// Its repetitions per concurrency, runners alternating (default 2, --quick 1).
    #[arg(long, value_name = "R", value_parser = between::<1, 1000>)]
    pub(crate) batch1000_reps: Option<usize>,
    /// Sandboxes per burst in the burst section (default 100, --quick 32; a /22).
    #[arg(long, value_name = "N", value_parser = between::<1, 1000>)]
    pub(crate) burst_count: Option<usize>,
    /// Its concurrencies (default 16,32).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = between::<1, 64>)]
    pub(crate) burst_concurrency: Option<Vec<usize>>,
    /// Its paired repetitions per concurrency (default 3, --quick 1).
    #[arg(long, value_name = "R", value_parser = between::<1, 1000>)]
    pub(crate) burst_reps: Option<usize>,
    /// The burst with every cache and state dir on tmpfs (fsync free).
    #[arg(long)]
    pub(crate) burst_tmpfs: bool,
    /// More arguments for the burst's cnid, space-separated.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub(crate) burst_cnid_args: Option<String>,
}

/// The report's sections, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Section {
    Floor,
    Noop,
    Real,
    Batch,
    Batch1000,
    Hop,
    Memory,
    Scale,
    Core,
    Shim,
    Trace,
    Burst,
}

impl Args {
    pub(crate) fn wants(&self, s: Section) -> bool {
        self.only.contains(&s)
    }

    /// cargo's target dir: `CARGO_TARGET_DIR`, or three levels above this
    /// executable (`target/release/deps/overhead-HASH`).
    pub(crate) fn target_dir() -> PathBuf {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                let exe = std::env::current_exe().ok()?;
                Some(exe.parent()?.parent()?.parent()?.to_owned())
            })
            .unwrap_or_else(|| PathBuf::from("target"))
    }
}

fn between<const LO: usize, const HI: usize>(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (LO..=HI).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a number from {LO} to {HI}")),
    }
}
