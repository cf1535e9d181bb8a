//! What a CNI runtime adds on top of running the plugins, measured against
//! the floor: a minimal loop that runs the same plugins with prebuilt stdin
//! and environment (see `floor.rs`). Every scenario runs in the same
//! process as its floor, alternating with it, and is reported as a ratio to
//! it (median and 10th–90th percentile of the per-iteration ratios).
//!
//! ```text
//! make bench        # criterion for cni-core, then this; updates BENCHMARKS.md
//! cargo bench -p cnid --bench overhead -- [--quick] [--no-rt] [--no-go] [--only floor,noop,real,batch,memory,scale,core,shim]
//!     [--bin-dir DIR] [--out FILE] [--update BENCHMARKS.md] [--criterion-dir DIR]
//!     [--batch1000-count N] [--batch1000-concurrency 1,4,8] [--batch1000-reps R]
//!     [--hop-baseline CNID] [--burst-count N] [--burst-concurrency 16,32] [--burst-reps R]
//! ```
//!
//! Scenarios: the noop plugin's own run; noop chains of 1 and 8 plugins run
//! in-process (`cni_async::Cni`), by `cnitool` as a process and through
//! `cnid` (scenarios 1–3); the real chain loopback + bridge/host-local +
//! tuning in a real namespace (4); batches of namespaces on the real chain
//! at concurrency 1, 4 and 16 (5); cni-core's criterion benchmarks, read
//! back (6); cnitool's peak RSS and cnid's RSS idle and with 1,000 ADDs in
//! flight; cnid with 10,000 attachments cached (scale); `cnid-shim`'s added time over a direct cnid request, and its
//! peak RSS (7); a batch of 1,000 namespaces through `cnitool batch`
//! against Go's cnitool and the floor (batch1000); the cnid hop against
//! another cnid build (hop, with `--hop-baseline`); the cnid ADD with a
//! `traceparent` header against without (trace); a burst of 100 pods
//! set up by containerd's go-cni through `cnid-shim` into cnid against
//! go-cni straight on the chain (burst; `--only burst` runs it alone).
//! Scenarios 4 and 5, batch1000 and burst need root.
//!
//! `cargo test` runs this binary without `--bench`: it then only checks its
//! arithmetic and exits.

mod batch;
mod batch1000;
mod burst;
mod chains;
mod core_benches;
mod floor;
mod go;
mod hop;
mod memory;
mod report;
mod scale;
mod setup;
mod shim;
mod spawn;
mod stats;
mod trace;

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use cnid::client::Client;

use crate::chains::{NOOP_NETNS, Runner};
use crate::report::{Findings, Table, Target};
use crate::setup::{Bins, C_NOOP, Daemon, NOOP1, NOOP8, REAL, RealNet, Storage, Tree};
use crate::spawn::Prepared;
use crate::stats::Summary;

const USAGE: &str = "usage: overhead --bench [--quick] [--no-rt] [--no-go] \
[--only floor,noop,real,batch,batch1000,hop,memory,scale,core,shim,trace,burst] [--bin-dir DIR] [--out FILE] \
[--update BENCHMARKS.md] [--criterion-dir DIR] [--scale-baseline CNID] [--hop-baseline CNID] \
[--batch1000-count N] [--batch1000-concurrency LIST] [--batch1000-reps R] \
[--burst-count N] [--burst-concurrency LIST] [--burst-reps R] [--burst-tmpfs] \
[--burst-cnid-args ARGS]
  --quick       a smoke run (small iteration counts)
  --no-rt       no SCHED_FIFO for the latency loops
  --no-go       skip the comparison with Go's cnitool (built from cnid/tests/go/cnitool)
  --only LIST   run these sections only
  --bin-dir DIR the shipped binaries (cnitool, cnid, cni-noop, cnid-shim); default: build them
  --scale-baseline CNID  another cnid build, run alongside in the scale section (before/after)
  --hop-baseline CNID    another cnid build, alternating with ours in the hop section (before/after);
                         without it the hop section is skipped
  --batch1000-count N    namespaces per batch in the batch1000 section (default 1000, --quick 100)
  --batch1000-concurrency LIST  its concurrencies (default 1,4,8)
  --batch1000-reps R     its repetitions per concurrency, runners alternating (default 2, --quick 1)
  --burst-count N        sandboxes per burst in the burst section (go-cni via cnid against direct;
                         default 100, --quick 32)
  --burst-concurrency LIST  its concurrencies (default 16,32)
  --burst-reps R         its paired repetitions per concurrency (default 3, --quick 1)
  --burst-tmpfs          the burst with every cache and state dir on tmpfs (fsync free)
  --burst-cnid-args ARGS more arguments for the burst's cnid, space-separated
Without --bench (as `cargo test` runs it) it only checks its own arithmetic.";

const SECTIONS: [&str; 12] = [
    "floor",
    "noop",
    "real",
    "batch",
    "batch1000",
    "hop",
    "memory",
    "scale",
    "core",
    "shim",
    "trace",
    "burst",
];

struct Opts {
    quick: bool,
    realtime: bool,
    only: Vec<String>,
    bin_dir: Option<PathBuf>,
    /// Where Go's cnitool is built.
    go_dir: PathBuf,
    no_go: bool,
    out: PathBuf,
    update: Option<PathBuf>,
    criterion_dir: PathBuf,
    /// A cnid binary the scale section runs alongside (before a change).
    scale_baseline: Option<PathBuf>,
    /// A cnid binary the hop section runs alongside (before a change).
    hop_baseline: Option<PathBuf>,
    batch1000_count: Option<usize>,
    batch1000_concurrency: Vec<usize>,
    batch1000_reps: Option<usize>,
    burst_count: Option<usize>,
    burst_concurrency: Option<Vec<usize>>,
    burst_reps: Option<usize>,
    burst_tmpfs: bool,
    burst_cnid_args: Vec<String>,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let target_dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                // target/release/deps/overhead-HASH
                let exe = std::env::current_exe().ok()?;
                Some(exe.parent()?.parent()?.parent()?.to_owned())
            })
            .unwrap_or_else(|| PathBuf::from("target"));
        let mut o = Opts {
            quick: false,
            realtime: true,
            only: SECTIONS.iter().map(|s| (*s).to_owned()).collect(),
            bin_dir: None,
            go_dir: target_dir.join("bench").join("go"),
            no_go: false,
            out: target_dir.join("bench").join("overhead.md"),
            update: None,
            criterion_dir: target_dir.join("criterion"),
            scale_baseline: None,
            hop_baseline: None,
            batch1000_count: None,
            batch1000_concurrency: vec![1, 4, 8],
            batch1000_reps: None,
            burst_count: None,
            burst_concurrency: None,
            burst_reps: None,
            burst_tmpfs: false,
            burst_cnid_args: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--bench" => {}
                "--help" | "-h" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                "--quick" => o.quick = true,
                "--no-rt" => o.realtime = false,
                "--no-go" => o.no_go = true,
                "--only" => {
                    o.only = value()?.split(',').map(str::to_owned).collect();
                    if let Some(bad) = o.only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                        bail!("unknown section {bad:?} (one of {})", SECTIONS.join(", "));
                    }
                }
                "--bin-dir" => o.bin_dir = Some(value()?.into()),
                "--out" => o.out = value()?.into(),
                "--update" => o.update = Some(value()?.into()),
                "--criterion-dir" => o.criterion_dir = value()?.into(),
                "--scale-baseline" => o.scale_baseline = Some(value()?.into()),
                "--hop-baseline" => o.hop_baseline = Some(value()?.into()),
                "--batch1000-count" => {
                    let v = value()?;
                    let n: usize = v
                        .parse()
                        .with_context(|| format!("--batch1000-count {v:?}"))?;
                    if !(1..=4000).contains(&n) {
                        bail!("--batch1000-count {n}: 1 to 4000 (the subnet is a /20)");
                    }
                    o.batch1000_count = Some(n);
                }
                "--batch1000-concurrency" => {
                    o.batch1000_concurrency = batch1000::parse_concurrency(&value()?)?;
                }
                "--batch1000-reps" => {
                    let v = value()?;
                    o.batch1000_reps = Some(
                        v.parse()
                            .with_context(|| format!("--batch1000-reps {v:?}"))?,
                    );
                }
                "--burst-count" => {
                    let v = value()?;
                    let n: usize = v.parse().with_context(|| format!("--burst-count {v:?}"))?;
                    if !(1..=1000).contains(&n) {
                        bail!("--burst-count {n}: 1 to 1000 (the subnet is a /22)");
                    }
                    o.burst_count = Some(n);
                }
                "--burst-concurrency" => {
                    o.burst_concurrency = Some(batch1000::parse_concurrency(&value()?)?);
                }
                "--burst-tmpfs" => o.burst_tmpfs = true,
                "--burst-cnid-args" => {
                    o.burst_cnid_args = value()?.split_whitespace().map(str::to_owned).collect();
                }
                "--burst-reps" => {
                    let v = value()?;
                    o.burst_reps = Some(v.parse().with_context(|| format!("--burst-reps {v:?}"))?);
                }
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(o)
    }

    fn wants(&self, section: &str) -> bool {
        self.only.iter().any(|s| s == section)
    }
}

/// Iteration counts.
struct Sizes {
    noop1: usize,
    noop8: usize,
    real: usize,
    warmup: usize,
    batch_count: usize,
    batch_reps: usize,
    rss_runs: usize,
    inflight: usize,
    own_run: usize,
    shim: usize,
    hop: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                noop1: 20,
                noop8: 10,
                real: 5,
                warmup: 2,
                batch_count: 20,
                batch_reps: 1,
                rss_runs: 3,
                inflight: 200,
                own_run: 50,
                shim: 30,
                hop: 30,
            }
        } else {
            Sizes {
                noop1: 150,
                noop8: 80,
                real: 30,
                warmup: 5,
                batch_count: 100,
                batch_reps: 5,
                rss_runs: 15,
                inflight: 1000,
                own_run: 400,
                shim: 300,
                hop: 1000,
            }
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test` runs benchmark binaries without --bench.
        return match stats::self_check().and_then(|()| scale::self_check()) {
            Ok(()) => {
                eprintln!("overhead: not run under `cargo test` (use `make bench`)");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("overhead: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match Opts::parse(&args).and_then(run) {
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

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run(opts: Opts) -> anyhow::Result<()> {
    let started = Instant::now();
    let sizes = Sizes::new(opts.quick);
    let load_start = report::load_average();
    setup::raise_nofile();
    let bins = Bins::find(opts.bin_dir.as_deref())?;
    let tree = Tree::new(&bins)?;
    let root = is_root();
    let mut skipped: Vec<String> = Vec::new();
    // Go's cnitool is built before SCHED_FIFO is switched on: Go's compiler,
    // its threads spinning at a real-time priority, held both CPUs for
    // minutes in a first try.
    let go = if (opts.wants("noop") || opts.wants("batch1000")) && !opts.no_go {
        match go::build(&opts.go_dir)? {
            Ok(path) => Some(path),
            Err(why) => {
                skipped.push(format!("the comparison with Go's cnitool: {why}"));
                None
            }
        }
    } else {
        None
    };
    // containerd's go-cni client, for the burst section.
    let gocni = if opts.wants("burst") {
        match go::build_program(&opts.go_dir, "gocni", "gocni", &[go::LIBCNI, go::GO_CNI])? {
            Ok(path) => Some(path),
            Err(why) => {
                skipped.push(format!("the burst section (go-cni): {why}"));
                None
            }
        }
    } else {
        None
    };
    // Other load on a shared 2-CPU machine delays wake-ups by a scheduler
    // slice (~4 ms) at random; SCHED_FIFO (inherited by the plugins,
    // cnitool and cnid started from here) keeps that out of the latency
    // loops. Batch and memory run with the normal policy again.
    let realtime = opts.realtime && root && set_fifo(true);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut findings = Findings::default();
    let mut sections: Vec<String> = Vec::new();

    // The real network first: the daemons must see its configuration.
    let real = if root && (opts.wants("real") || opts.wants("batch")) {
        Some(RealNet::create(&tree)?)
    } else {
        if !root && (opts.wants("real") || opts.wants("batch")) {
            skipped.push("scenarios 4 and 5 (real chain, batch) need root".into());
        }
        None
    };

    if opts.wants("floor") {
        sections.push(own_run(&tree, &bins, &sizes, &mut findings)?);
    }

    // Go's cnitool joins the noop loops and the start-up run when it built.
    if let (true, Some(path)) = (opts.wants("noop"), &go) {
        go::startup(&bins.cnitool, path, sizes.own_run, &mut findings)?;
    }

    if opts.wants("noop") || opts.wants("real") {
        let mut noop_tables = Vec::new();
        let mut real_tables = Vec::new();
        for storage in [Storage::Disk, Storage::Tmpfs] {
            let daemon = Daemon::start(&bins, &tree, storage, storage.short(), &[])?;
            let client = tokio.block_on(Client::connect(&daemon.socket))?;
            if opts.wants("noop") {
                for (network, iterations, tag) in
                    [(NOOP1, sizes.noop1, "noop1"), (NOOP8, sizes.noop8, "noop8")]
                {
                    let list = tree.load(network)?;
                    let mut runners = vec![
                        Runner::floor(&list, NOOP_NETNS, &tree)?,
                        Runner::in_process(&list, NOOP_NETNS, &tree, storage, false),
                        Runner::in_process(&list, NOOP_NETNS, &tree, storage, true),
                        Runner::in_process_spawn(&list, NOOP_NETNS, &tree, storage, false, true),
                        Runner::cnitool(&bins, network, NOOP_NETNS, &tree, storage)?,
                        Runner::cnid(client.clone(), network, NOOP_NETNS),
                    ];
                    if let Some(d) = &bins.driver {
                        let dir = tree.cache(storage).with_file_name(format!("driver-{tag}"));
                        runners.push(Runner::driver(d, &list, NOOP_NETNS, &tree, &dir)?);
                    }
                    if let Some(go) = &go {
                        runners.push(Runner::go_cnitool(go, network, NOOP_NETNS, &tree, storage)?);
                    }
                    let label = format!("{tag}, {}", storage.label());
                    let s =
                        chains::run_loop(&mut runners, &tokio, sizes.warmup, iterations, &label)
                            .map_err(|e| e.context(daemon.log_tail()))?;
                    let plugins = list.plugins().len();
                    let title = format!("noop ×{plugins}, {}", storage.label());
                    let key = format!("{tag}/{}", storage.short());
                    noop_tables.push(chains::tabulate(&s, &title, &key, &mut findings));
                }
            }
            if let (true, Some(net)) = (opts.wants("real"), real.as_ref()) {
                let list = tree.load(REAL)?;
                let ns = cni_async::netns::Netns::create(&format!("{}real", net.prefix()))?;
                let path = ns.path().display().to_string();
                let mut runners = vec![
                    Runner::floor(&list, &path, &tree)?,
                    Runner::in_process(&list, &path, &tree, storage, false),
                    Runner::cnitool(&bins, REAL, &path, &tree, storage)?,
                    Runner::cnid(client.clone(), REAL, &path),
                ];
                let label = format!("real chain, {}", storage.label());
                let s = chains::run_loop(&mut runners, &tokio, 2, sizes.real, &label)
                    .map_err(|e| e.context(daemon.log_tail()));
                drop(runners);
                ns.delete()?;
                let s = s?;
                let title = format!(
                    "loopback + bridge/host-local + tuning, {} (bridge {}, {})",
                    storage.label(),
                    net.bridge(),
                    net.subnet()
                );
                let key = format!("real/{}", storage.short());
                real_tables.push(chains::tabulate(&s, &title, &key, &mut findings));
            }
        }
        // Issue 25: the same comparison with the static C noop as the
        // plugin (the cheapest plugin process there is), floor, cnitool and
        // Go's cnitool only, cache on disk.
        let c_noop = bins.noop_variants.iter().find(|(l, _)| *l == C_NOOP);
        if let (true, Some(go), Some((_, c))) = (opts.wants("noop"), &go, c_noop) {
            let cbins = Bins {
                noop: c.clone(),
                ..bins.clone()
            };
            let ctree = Tree::new(&cbins)?;
            for (network, iterations, tag) in [
                (NOOP1, sizes.noop1, "cnoop1"),
                (NOOP8, sizes.noop8, "cnoop8"),
            ] {
                let list = ctree.load(network)?;
                let mut runners = vec![
                    Runner::floor(&list, NOOP_NETNS, &ctree)?,
                    Runner::cnitool(&bins, network, NOOP_NETNS, &ctree, Storage::Disk)?,
                    Runner::go_cnitool(go, network, NOOP_NETNS, &ctree, Storage::Disk)?,
                ];
                if let Some(d) = &bins.driver {
                    let dir = ctree
                        .cache(Storage::Disk)
                        .with_file_name(format!("driver-{tag}"));
                    runners.push(Runner::driver(d, &list, NOOP_NETNS, &ctree, &dir)?);
                }
                let label = format!("{tag}, C noop, {}", Storage::Disk.label());
                let s = chains::run_loop(&mut runners, &tokio, sizes.warmup, iterations, &label)?;
                let title = format!(
                    "C noop (static) ×{}, {}",
                    list.plugins().len(),
                    Storage::Disk.label()
                );
                noop_tables.push(chains::tabulate(
                    &s,
                    &title,
                    &format!("{tag}/disk"),
                    &mut findings,
                ));
            }
        }
        if !noop_tables.is_empty() {
            let mut s = String::from(NOOP_INTRO);
            for t in &noop_tables {
                s.push_str(&t.markdown());
                s.push('\n');
            }
            sections.push(s);
        }
        if go.is_some() && opts.wants("noop") {
            sections.push(go::section(&findings));
        }
        if !real_tables.is_empty() {
            let mut s = String::from(REAL_INTRO);
            for t in &real_tables {
                s.push_str(&t.markdown());
                s.push('\n');
            }
            sections.push(s);
        }
    }

    if opts.wants("hop") {
        match &opts.hop_baseline {
            Some(baseline) => sections.push(hop::section(
                &bins,
                baseline,
                &tree,
                &tokio,
                sizes.warmup * 4,
                sizes.hop,
                &mut findings,
            )?),
            None => skipped.push("the hop against a baseline cnid (no --hop-baseline)".into()),
        }
    }

    if opts.wants("shim") {
        sections.push(shim_section(&bins, &tree, &sizes, &mut findings)?);
    }

    if opts.wants("trace") {
        sections.push(trace::section(
            &bins,
            &tree,
            &tokio,
            sizes.warmup * 4,
            sizes.hop,
            &mut findings,
        )?);
    }

    if realtime {
        set_fifo(false);
    }
    if let (true, Some(net)) = (opts.wants("batch"), real.as_ref()) {
        sections.push(batch_section(&tree, net, &tokio, &sizes, &mut findings)?);
    }

    if opts.wants("batch1000") {
        match (&go, root) {
            (Some(go), true) => {
                let plan = batch1000::Plan {
                    count: opts
                        .batch1000_count
                        .unwrap_or(if opts.quick { 100 } else { 1000 }),
                    concurrency: opts.batch1000_concurrency.clone(),
                    reps: opts
                        .batch1000_reps
                        .unwrap_or(if opts.quick { 1 } else { 2 })
                        .max(1),
                };
                let net = batch1000::network(&tree)?;
                let s = batch1000::section(&bins, go, &tree, &net, &plan, &mut findings);
                drop(net);
                sections.push(s?);
            }
            (None, _) => skipped
                .push("the batch of 1,000 (batch1000): it needs Go's cnitool (see above)".into()),
            (_, false) => skipped.push("the batch of 1,000 (batch1000) needs root".into()),
        }
    }

    if let (true, Some(gocni)) = (opts.wants("burst"), &gocni) {
        if root {
            let plan = burst::plan(
                opts.quick,
                opts.burst_count,
                opts.burst_concurrency.clone(),
                opts.burst_reps,
                if opts.burst_tmpfs {
                    Storage::Tmpfs
                } else {
                    Storage::Disk
                },
                opts.burst_cnid_args.clone(),
            );
            sections.push(burst::section(&bins, gocni, &tree, &plan, &mut findings)?);
        } else {
            skipped.push("the burst section needs root (namespaces, a bridge)".into());
        }
    }

    if opts.wants("memory") {
        sections.push(memory_section(&bins, &tree, &tokio, &sizes, &mut findings)?);
    }

    if opts.wants("scale") {
        sections.push(scale::section(
            &bins,
            &tree,
            &tokio,
            opts.quick,
            opts.scale_baseline.as_ref(),
            &mut findings,
        )?);
    }

    let core = if opts.wants("core") {
        core_benches::load(&opts.criterion_dir)
    } else {
        Vec::new()
    };
    if opts.wants("core") {
        sections.push(core_section(&core, &opts.criterion_dir, &mut findings));
    }
    drop(real);

    let elapsed = started.elapsed();
    let mut md = String::new();
    let _ = writeln!(md, "### Latest run\n");
    let _ = writeln!(
        md,
        "`make bench` (`cargo bench -p cni-core --bench core`, then `cargo bench -p cnid --bench overhead`{}); \
         this part took {:.0} s.\n",
        if opts.quick { " with --quick" } else { "" },
        elapsed.as_secs_f64()
    );
    md.push_str(&report::machine(
        &bins,
        &load_start,
        &tree.cache(Storage::Disk),
    ));
    let _ = writeln!(
        md,
        "- scheduling: {}",
        if realtime {
            "SCHED_FIFO priority 10 for the floor, noop and real-chain loops (inherited by the \
             plugins, cnitool and cnid they start), so that other load on the machine does not \
             add random scheduler delays; normal policy for the batch and memory runs"
        } else {
            "normal (SCHED_OTHER) throughout"
        }
    );
    for s in &skipped {
        let _ = writeln!(md, "- skipped: {s}");
    }
    md.push('\n');
    md.push_str(&report::targets_table(&targets(&findings)).markdown());
    md.push('\n');
    for s in &sections {
        md.push_str(s);
        md.push('\n');
    }

    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&opts.out, &md).with_context(|| format!("writing {}", opts.out.display()))?;
    eprintln!("overhead: report in {}", opts.out.display());
    if let Some(path) = &opts.update {
        report::update_marked(path, &md)?;
        eprintln!("overhead: updated {}", path.display());
    }
    println!("{md}");
    Ok(())
}

const NOOP_INTRO: &str = "### Scenarios 1–3: noop chains (in-process, cnitool, cnid)\n\n\
Each iteration: ADD, CHECK, DEL of one attachment by the floor, by `cni_async::Cni` in this \
process (current-thread runtime; cache I/O on tokio's blocking pool, the default, and \
inline on the calling thread, `ResultCache::with_inline_io`, as cnitool runs it; and with the \
plugins started by `tokio::process` instead of our own spawn, `RawExec::with_posix_spawn`), by \
`cnitool` as a process, and through `cnid` (typed client, one kept-alive connection), in \
shuffled order. `× floor` and `added ms` are per \
iteration against the floor of the same iteration. The floor has no CHECK-specific work; \
a runtime's CHECK reads the cache, its ADD writes it (temp file, fsync, rename, fsync of \
the dir) and its DEL removes it (no fsync: a resurrected record only costs a repeat DEL); cnid \
instead appends a `begin` line to its journal before the plugins and a `commit` line carrying the \
record after them, each fdatasync'd, and writes the cache record without fsync (crash safety and \
durability with two flushes). The tmpfs rows run the same code with the cache (and cnid's \
state dir) on tmpfs, where fsync is free.\n\n";

const REAL_INTRO: &str = "### Scenario 4: the real chain in a real namespace\n\n\
The reference plugins (`/usr/lib/cni`): loopback, bridge with host-local IPAM (no gateway, \
no masquerade), tuning (one sysctl). One namespace; each runner ADDs, CHECKs and DELs its \
own container in turn.\n\n";

/// The noop plugin's own run, against `/bin/true` spawned the same way,
/// and beside it the other noop builds in the bin dir (issue 25: the C
/// one, the dynamic one), all in one rotating loop.
fn own_run(
    tree: &Tree,
    bins: &Bins,
    sizes: &Sizes,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let env = spawn::env_with(&[
        ("CNI_COMMAND", Some(OsStr::new("ADD"))),
        ("CNI_IFNAME", Some(OsStr::new("eth0"))),
        ("CNI_NETNS", Some(OsStr::new("/proc/self/ns/net"))),
        ("CNI_CONTAINERID", Some(OsStr::new("bench"))),
    ]);
    // (label, findings key, program); the benchmark's plugin first,
    // /bin/true last.
    let mut progs = vec![(
        "cni-noop ADD (the plugin of the loops below)",
        "noop".to_owned(),
        Prepared::new(&tree.bin.join("noop"), &[], &env, "noop ADD")?,
    )];
    for (label, path) in &bins.noop_variants {
        progs.push((
            label,
            format!("noop-variant/{label}"),
            Prepared::new(path, &[], &env, *label)?,
        ));
    }
    progs.push((
        "/bin/true",
        "true".to_owned(),
        Prepared::new(Path::new("/bin/true"), &[], &env, "/bin/true")?,
    ));
    let k = progs.len();
    let stdin: &[u8] = br#"{"cniVersion":"1.0.0","name":"bench-noop1","type":"noop"}"#;
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); k];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); k];
    let mut out = Vec::new();
    for i in 0..sizes.own_run + 20 {
        for j in 0..k {
            let r = (i + j) % k;
            let p = &progs[r].2;
            out.clear();
            let s = Instant::now();
            let exit = p.run(&[stdin], &mut out)?;
            let w = s.elapsed().as_secs_f64();
            if !exit.success() {
                bail!("{} failed ({})", p.label(), exit.describe());
            }
            if i >= 20 {
                wall[r].push(w);
                cpu[r].push(exit.cpu.as_secs_f64());
            }
        }
    }
    let truth = k - 1;
    findings.put(
        "own/noop-true/wall".into(),
        Summary::diffs(&wall[0], &wall[truth]),
    );
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let mut t = Table::new(
        "the noop plugin ADD against /bin/true, all spawned as the floor spawns plugins",
        &[
            "program",
            "spawn to reap, ms median (p10–p90)",
            "child CPU, ms mean",
            "− /bin/true, ms median (p10–p90)",
        ],
    );
    for (r, (label, key, _)) in progs.iter().enumerate() {
        let w = Summary::of(&wall[r]);
        findings.put(format!("own/{key}/wall"), w);
        let over = if r == truth {
            "–".to_owned()
        } else {
            Summary::diffs(&wall[r], &wall[truth]).ms()
        };
        t.row(vec![
            (*label).to_owned(),
            w.ms(),
            format!("{:.3}", mean(&cpu[r]) * 1e3),
            over,
        ]);
    }
    t.note(format!(
        "{} rotating runs each. `/bin/true` is the cost of any process start on this machine \
         (posix_spawn, exec, dynamic loading of libc); a plugin's own run is what it adds. \
         `make bench` builds cni-noop statically linked (glibc, crt-static, `no_main`), \
         as the plugin of every noop loop.",
        wall[0].len()
    ));
    Ok(format!(
        "### The floor's unit: one plugin process\n\n{}",
        t.markdown()
    ))
}

fn shim_section(
    bins: &Bins,
    tree: &Tree,
    sizes: &Sizes,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    // tmpfs: the fsyncs are the same both ways and only add noise.
    let daemon = Daemon::start(bins, tree, Storage::Tmpfs, "shim", &[])?;
    let s = shim::measure(
        &bins.shim,
        &daemon.socket,
        NOOP1,
        sizes.warmup * 4,
        sizes.shim,
    )
    .map_err(|e| e.context(daemon.log_tail()))?;
    let rss = shim::rss(
        &bins.shim,
        &daemon.socket,
        NOOP1,
        tree.root(),
        sizes.rss_runs,
    )?;
    let mut t = Table::new(
        "cnid-shim against the same request sent straight to cnid (noop ×1, cache on tmpfs)",
        &[
            "verb",
            "direct ms, p50 (p99)",
            "through cnid-shim ms, p50 (p99)",
            "added ms, p50 (p99)",
        ],
    );
    let pair = |v: &[f64]| {
        let (a, b) = shim::p50_p99(v);
        format!("{:.3} ({:.3})", a * 1e3, b * 1e3)
    };
    for (v, verb) in shim::VERBS.iter().enumerate() {
        let added = s.added(v);
        let (_, p99) = shim::p50_p99(&added);
        findings.put(format!("shim/{verb}/added"), Summary::of(&added));
        findings.put(format!("shim/{verb}/added-p99"), Summary::of(&[p99]));
        t.row(vec![
            (*verb).into(),
            pair(&s.direct[v]),
            pair(&s.shim[v]),
            pair(&added),
        ]);
    }
    findings.put("rss/shim/add".into(), Summary::of(&rss));
    let r = Summary::of(&rss);
    t.note(format!(
        "{} iterations; per iteration and verb the direct request and the shim run in \
         alternating order, and \"added\" is their difference in that iteration. Direct: a \
         fresh connection with the shim's own blocking client, the answer parsed. Shim: \
         spawned as the floor spawns plugins ({}). Peak RSS of the shim's ADD: {:.0} KiB \
         (min–max of {} runs {:.0}–{:.0}; GNU time).",
        s.direct[0].len(),
        bins.shim.display(),
        r.median,
        rss.len(),
        rss.iter().copied().fold(f64::MAX, f64::min),
        rss.iter().copied().fold(f64::MIN, f64::max),
    ));
    Ok(format!(
        "### Scenario 7: cnid-shim\n\n\
         What the CNI plugin that hands a runtime's calls to cnid adds to the same request \
         sent straight to cnid.\n\n{}",
        t.markdown()
    ))
}

fn batch_section(
    tree: &Tree,
    net: &RealNet,
    tokio: &tokio::runtime::Runtime,
    sizes: &Sizes,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let list = tree.load(REAL)?;
    let n = sizes.batch_count;
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
        let reps = if c == 4 {
            sizes.batch_reps
        } else {
            sizes.batch_reps.min(2)
        };
        let (mut floor, mut runtime) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let st = storage.short();
            let fp = format!("{}f{c}{st}r{rep}-", net.prefix());
            let bp = format!("{}b{c}{st}r{rep}-", net.prefix());
            let label = format!("batch c={c} {st} rep {rep}");
            let started = Instant::now();
            let mut one = |is_floor: bool| -> anyhow::Result<()> {
                if is_floor {
                    floor.push(batch::floor_batch(&list, tree, &fp, n, c).context(label.clone())?);
                } else {
                    runtime.push(
                        batch::runtime_batch(&list, tree, storage, tokio, &bp, n, c)
                            .context(label.clone())?,
                    );
                }
                Ok(())
            };
            one(rep % 2 == 0)?;
            one(rep % 2 != 0)?;
            eprintln!(
                "overhead: {label}: {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
        let per_ns = |d: std::time::Duration| d.as_secs_f64() / n as f64;
        let minmax = |v: &[f64], scale: f64, unit: &str| {
            let s = Summary::of(v);
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
            format!(
                "{:.2}{unit} ({:.2}–{:.2})",
                s.median * scale,
                lo * scale,
                hi * scale
            )
        };
        for (name, runs) in [("floor", &floor), ("cni-async batch", &runtime)] {
            let setup: Vec<f64> = runs.iter().map(|r| per_ns(r.setup)).collect();
            let teardown: Vec<f64> = runs.iter().map(|r| per_ns(r.teardown)).collect();
            let total: Vec<f64> = runs.iter().map(|r| per_ns(r.total())).collect();
            let cpu_self: Vec<f64> = runs.iter().map(|r| per_ns(r.cpu_self)).collect();
            let cpu: Vec<f64> = runs.iter().map(|r| per_ns(r.cpu())).collect();
            let floor_total: Vec<f64> = floor.iter().map(|r| per_ns(r.total())).collect();
            let ratio: Vec<f64> = total.iter().zip(&floor_total).map(|(a, b)| a / b).collect();
            let key = if name == "floor" { "floor" } else { "runtime" };
            let st = storage.short();
            findings.put(format!("batch/c{c}/{st}/{key}/total"), Summary::of(&total));
            findings.put(
                format!("batch/c{c}/{st}/{key}/ratio"),
                Summary::min_max(&ratio),
            );
            findings.put(format!("batch/c{c}/{st}/{key}/cpu"), Summary::of(&cpu));
            t.row(vec![
                c.to_string(),
                if name == "floor" {
                    "–".into()
                } else {
                    st.to_string()
                },
                name.into(),
                format!("{:.2}", Summary::of(&setup).median * 1e3),
                format!("{:.2}", Summary::of(&teardown).median * 1e3),
                minmax(&total, 1e3, ""),
                if name == "floor" {
                    "1".into()
                } else {
                    minmax(&ratio, 1.0, "x")
                },
                format!(
                    "{:.2} ({:.2} + {:.2})",
                    Summary::of(&cpu).median * 1e3,
                    Summary::of(&cpu_self).median * 1e3,
                    (Summary::of(&cpu).median - Summary::of(&cpu_self).median) * 1e3
                ),
            ]);
        }
    }
    t.note(format!(
        "Setup = create the namespace + ADD; teardown = DEL + delete the namespace. \
         Floor and runtime alternate ({} runs at concurrency 4, up to 2 at 1 and 16); the \
         ratio pairs each runtime run with the floor run next to it. Cache \"tmpfs\": the \
         same with the cache on tmpfs (fsync free). \"own\" CPU is this \
         process's (all threads, namespace creation included on both sides); \"plugins\" is \
         the reaped children's.",
        sizes.batch_reps
    ));
    Ok(format!(
        "### Scenario 5: batch throughput\n\n\
         `cni_async::batch::BatchBuilder` against the floor run by as many threads as the \
         concurrency, both creating namespaces with `Netns::create`.\n\n{}",
        t.markdown()
    ))
}

fn memory_section(
    bins: &Bins,
    tree: &Tree,
    tokio: &tokio::runtime::Runtime,
    sizes: &Sizes,
    findings: &mut Findings,
) -> anyhow::Result<String> {
    let mut t = Table::new(
        "Peak RSS of short-lived processes (GNU time, `%M`)",
        &["process", "peak RSS KiB, median (min–max)"],
    );
    let fmt = |v: &[f64]| {
        let s = Summary::of(v);
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        format!("{:.0} ({:.0}–{:.0})", s.median, lo, hi)
    };
    let runs = sizes.rss_runs;
    let (add1, del1) = memory::cnitool_rss(bins, tree, NOOP1, runs)?;
    let (add8, _) = memory::cnitool_rss(bins, tree, NOOP8, runs.div_ceil(3))?;
    let (noop, truth) = memory::reference_rss(tree, runs.div_ceil(3))?;
    findings.put("rss/cnitool/add1".into(), Summary::of(&add1));
    t.row(vec!["cnitool add, noop ×1".into(), fmt(&add1)]);
    t.row(vec!["cnitool del, noop ×1".into(), fmt(&del1)]);
    t.row(vec!["cnitool add, noop ×8".into(), fmt(&add8)]);
    t.row(vec!["cni-noop ADD (for scale)".into(), fmt(&noop)]);
    t.row(vec!["/bin/true (for scale)".into(), fmt(&truth)]);
    t.note(
        "A process's peak RSS includes its largest reaped child's (the noop plugin's is \
         smaller than cnitool's). Not measured through the floor's spawn: with vfork the \
         kernel counts the spawner's RSS in the child's peak.",
    );

    let mut d = Table::new(
        "cnid RSS (`/proc/PID/status`)",
        &[
            "configuration",
            "idle after start",
            "idle after 100 requests",
            &format!("{} ADDs in flight: highest VmRSS", sizes.inflight),
            "peak (VmHWM)",
            "running + queued 0.5 s in",
            "time for all",
        ],
    );
    let adds = sizes.inflight;
    for (label, tag, extra) in [
        ("default (--max-parallel 64)", "mem64", vec![]),
        (
            "--max-parallel 1000",
            "mem1000",
            vec!["--max-parallel", "1000"],
        ),
    ] {
        let m = memory::cnid_memory(bins, tree, tokio, tag, &extra, adds)?;
        let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
        findings.put(
            format!("rss/cnid/{tag}/idle_fresh"),
            Summary::of(&[m.idle_fresh as f64]),
        );
        findings.put(
            format!("rss/cnid/{tag}/idle_warm"),
            Summary::of(&[m.idle_warm as f64]),
        );
        findings.put(
            format!("rss/cnid/{tag}/hwm"),
            Summary::of(&[m.inflight_hwm as f64]),
        );
        d.row(vec![
            label.into(),
            mib(m.idle_fresh),
            mib(m.idle_warm),
            mib(m.inflight_rss),
            mib(m.inflight_hwm),
            format!("{} + {}", m.running, m.queued),
            format!("{:.1} s", m.elapsed.as_secs_f64()),
        ]);
    }
    d.note(format!(
        "{adds} ADDs for {adds} containers sent at once over {adds} connections to the \
         `bench-slow` network (a noop that sleeps {} ms in ADD), so they stay in flight.",
        setup::SLOW_ADD_MS
    ));
    Ok(format!("### Memory\n\n{}\n{}", t.markdown(), d.markdown()))
}

fn core_section(core: &[core_benches::CoreBench], dir: &Path, findings: &mut Findings) -> String {
    if core.is_empty() {
        return format!(
            "### Scenario 6: cni-core micro-benchmarks\n\nNo criterion results in {} \
             (run `cargo bench -p cni-core --bench core` first).\n",
            dir.display()
        );
    }
    let mut t = Table::new(
        "criterion, per iteration (samples' p10–p90)",
        &["benchmark", "µs, median (p10–p90)"],
    );
    for b in core {
        findings.put(format!("core/{}", b.id), b.time);
        t.row(vec![format!("`{}`", b.id), b.time.fmt(1e6, 2)]);
    }
    let newest = core.iter().filter_map(|b| b.modified).max();
    let age = newest
        .and_then(|m| m.elapsed().ok())
        .map_or("?".into(), |d| format!("{:.0} min", d.as_secs_f64() / 60.0));
    t.note(format!(
        "`per_plugin_add_work` is everything cni-core does for one plugin of an ADD chain: \
         build its stdin (6-plugin list, prevResult of 3 interfaces and 2 addresses), parse \
         its result, convert it, serialize it for the next plugin. Results from {}, {age} old.",
        dir.display()
    ));
    format!(
        "### Scenario 6: cni-core micro-benchmarks\n\n{}",
        t.markdown()
    )
}

/// The issue's targets, judged on the default configuration (cache on
/// disk, fsync on); the fsync-free figure is in the notes.
fn targets(f: &Findings) -> Vec<Target> {
    let ratio_target = |what: &'static str, key: &str, limit: f64| {
        let disk = f.get(&format!("{key}/ratio").replacen("{s}", "disk", 1));
        let tmpfs = f.get(&format!("{key}/ratio").replacen("{s}", "tmpfs", 1));
        Target {
            what,
            limit: format!("≤ {limit:.2}x"),
            measured: disk.map(|s| s.ratio()),
            met: disk.map(|s| s.median <= limit),
            comment: match (disk, tmpfs) {
                (Some(d), Some(t)) if d.median > limit => format!(
                    "{:+.0}% over; fsync free (tmpfs): {}",
                    (d.median / limit - 1.0) * 100.0,
                    t.ratio()
                ),
                (_, Some(t)) => format!("fsync free (tmpfs): {}", t.ratio()),
                _ => String::new(),
            },
        }
    };
    let mut v = Vec::new();
    let own = f.get("own/noop-true/wall");
    v.push(Target {
        what: "cni-noop's own run (spawn to reap, minus /bin/true's)",
        limit: "well under 0.5 ms".into(),
        measured: own.map(|s| format!("{} ms", s.ms())),
        met: own.map(|s| s.median < 0.25e-3),
        comment: f
            .get("own/noop/wall")
            .zip(f.get("own/true/wall"))
            .map(|(n, t)| {
                format!(
                    "cni-noop {} ms, /bin/true {} ms spawn to reap",
                    n.ms(),
                    t.ms()
                )
            })
            .unwrap_or_default(),
    });
    v.push(ratio_target(
        "in-process noop ×8 ADD+DEL",
        "noop8/{s}/in-process/ADD+DEL",
        1.05,
    ));
    let core = f.get("core/per_plugin_add_work");
    v.push(Target {
        what: "cni-core work per plugin (parse, build, convert)",
        limit: "< 20 µs".into(),
        measured: core.map(|s| format!("{} µs", s.fmt(1e6, 2))),
        met: core.map(|s| s.median < 20e-6),
        comment: "criterion `per_plugin_add_work`".into(),
    });
    // Issue 25's goals 1 and 2, with the static cni-noop (the C noop's
    // figure in the notes).
    let with_c = |mut t: Target, key: &str| {
        if let Some(c) = f.get(key) {
            let c = format!("C noop: {}", c.ratio());
            t.comment = if t.comment.is_empty() {
                c
            } else {
                format!("{}; {c}", t.comment)
            };
        }
        t
    };
    // Goal 2 is ours over the issue's floor, the static C driver (a
    // process, as cnitool is); without it (no C compiler), over the
    // in-process floor, which has no process to start.
    for (what, tag, limit) in [
        ("cnitool noop ×1 ADD ÷ C driver", "noop1", 2.5),
        ("cnitool noop ×8 ADD ÷ C driver", "noop8", 1.8),
    ] {
        let key = |s: &str, k: &str| f.get(&format!("{s}/{k}/ADD/ratio"));
        let Some(disk) = key(&format!("{tag}/disk"), "cnitool-over-driver") else {
            let in_process = match tag {
                "noop1" => "cnitool noop ×1 ADD",
                _ => "cnitool noop ×8 ADD",
            };
            v.push(with_c(
                ratio_target(in_process, &format!("{tag}/{{s}}/cnitool/ADD"), limit),
                &format!("c{tag}/disk/cnitool/ADD/ratio"),
            ));
            continue;
        };
        let mut comment = Vec::new();
        if disk.median > limit {
            comment.push(format!("{:+.0}% over", (disk.median / limit - 1.0) * 100.0));
        }
        for (label, k) in [
            (
                "fsync free (tmpfs)",
                key(&format!("{tag}/tmpfs"), "cnitool-over-driver"),
            ),
            (
                "C noop",
                key(&format!("c{tag}/disk"), "cnitool-over-driver"),
            ),
            (
                "× the in-process floor",
                key(&format!("{tag}/disk"), "cnitool"),
            ),
        ] {
            if let Some(k) = k {
                comment.push(format!("{label}: {}", k.ratio()));
            }
        }
        v.push(Target {
            what,
            limit: format!("≤ {limit:.2}x"),
            measured: Some(disk.ratio()),
            met: Some(disk.median <= limit),
            comment: comment.join("; "),
        });
    }
    // Go's cnitool over ours, per iteration of the same loop.
    for (what, tag, verb, limit) in [
        ("Go's cnitool / ours, noop ×1 ADD", "noop1", "ADD", 2.0),
        ("Go's cnitool / ours, noop ×8 ADD", "noop8", "ADD", 2.0),
    ] {
        let disk = f.get(&format!("{tag}/disk/go-over-cnitool/{verb}/ratio"));
        let tmpfs = f.get(&format!("{tag}/tmpfs/go-over-cnitool/{verb}/ratio"));
        let c = f.get(&format!("c{tag}/disk/go-over-cnitool/{verb}/ratio"));
        let mut comment = Vec::new();
        if let Some(t) = tmpfs {
            comment.push(format!("fsync free (tmpfs): {}", t.ratio()));
        }
        if let Some(c) = c {
            comment.push(format!("C noop: {}", c.ratio()));
        }
        // The most any tool could reach: Go's cnitool over the floor as a
        // process (the static C driver), which caches nothing.
        for (label, k) in [
            ("bound (Go ÷ C driver)", format!("{tag}/disk")),
            ("tmpfs bound", format!("{tag}/tmpfs")),
        ] {
            if let Some(b) = f.get(&format!("{k}/go-over-driver/{verb}/ratio")) {
                comment.push(format!("{label}: {}", b.ratio()));
            }
        }
        v.push(Target {
            what,
            limit: format!("≥ {limit:.1}x"),
            measured: disk.map(|s| s.ratio()),
            met: disk.map(|s| s.median >= limit),
            comment: comment.join("; "),
        });
    }
    v.push(ratio_target(
        "cnitool real chain ADD",
        "real/{s}/cnitool/ADD",
        1.1,
    ));
    let rss = f.get("rss/cnitool/add1");
    v.push(Target {
        what: "cnitool peak RSS, one ADD (noop ×1)",
        limit: "< 4 MiB (4096 KiB)".into(),
        measured: rss.map(|s| format!("{:.0} KiB ({:.0}–{:.0})", s.median, s.p10, s.p90)),
        met: rss.map(|s| s.median < 4096.0),
        comment: rss
            .map(|s| {
                format!(
                    "{:.2} MiB = {:.2} MB",
                    s.median / 1024.0,
                    s.median * 1.024 / 1000.0
                )
            })
            .unwrap_or_default(),
    });
    for verb in ["ADD", "CHECK", "DEL"] {
        let d = f.get(&format!("noop1/disk/cnid-inproc/{verb}/added"));
        let t = f.get(&format!("noop1/tmpfs/cnid-inproc/{verb}/added"));
        v.push(Target {
            what: match verb {
                "ADD" => "cnid round trip over in-process, noop ×1 ADD",
                "CHECK" => "cnid round trip over in-process, noop ×1 CHECK",
                _ => "cnid round trip over in-process, noop ×1 DEL",
            },
            limit: if verb == "ADD" {
                "≤ +0.50 ms median"
            } else {
                "≤ +0.30 ms median"
            }
            .into(),
            measured: d.map(|s| format!("{} ms", s.ms())),
            met: d.map(|s| s.median <= if verb == "ADD" { 0.5e-3 } else { 0.3e-3 }),
            comment: t
                .map(|s| format!("fsync free (tmpfs): {} ms", s.ms()))
                .unwrap_or_default(),
        });
    }
    let added: Vec<(&str, Option<Summary>, Option<Summary>)> = shim::VERBS
        .iter()
        .map(|v| {
            (
                *v,
                f.get(&format!("shim/{v}/added")),
                f.get(&format!("shim/{v}/added-p99")),
            )
        })
        .collect();
    let all = added.iter().all(|(_, a, _)| a.is_some());
    v.push(Target {
        what: "cnid-shim: added to the same request sent straight to cnid (ADD, CHECK, DEL)",
        limit: "≤ 1 ms p50".into(),
        measured: all.then(|| {
            added
                .iter()
                .map(|(verb, a, _)| format!("{verb} {:.3}", a.map_or(f64::NAN, |s| s.median) * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
                + " ms"
        }),
        met: all.then(|| {
            added
                .iter()
                .all(|(_, a, _)| a.is_some_and(|s| s.median <= 1e-3))
        }),
        comment: if all {
            format!(
                "p99: {}",
                added
                    .iter()
                    .map(|(verb, _, p)| format!(
                        "{verb} {:.2}",
                        p.map_or(f64::NAN, |s| s.median) * 1e3
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + " ms"
            )
        } else {
            String::new()
        },
    });
    let srss = f.get("rss/shim/add");
    v.push(Target {
        what: "cnid-shim peak RSS, one ADD",
        limit: "< 4 MiB (4096 KiB)".into(),
        measured: srss.map(|s| format!("{:.0} KiB ({:.0}–{:.0})", s.median, s.p10, s.p90)),
        met: srss.map(|s| s.median < 4096.0),
        comment: String::new(),
    });
    let idle = f.get("rss/cnid/mem64/idle_warm");
    v.push(Target {
        what: "cnid RSS idle (after 100 requests)",
        limit: "< 10 MiB".into(),
        measured: idle.map(|s| format!("{:.1} MiB", s.median / 1024.0)),
        met: idle.map(|s| s.median < 10.0 * 1024.0),
        comment: f
            .get("rss/cnid/mem64/idle_fresh")
            .map(|s| format!("{:.1} MiB right after start", s.median / 1024.0))
            .unwrap_or_default(),
    });
    let hwm = f.get("rss/cnid/mem64/hwm");
    v.push(Target {
        what: "cnid RSS with 1,000 ADDs in flight (peak)",
        limit: "< 40 MiB".into(),
        measured: hwm.map(|s| format!("{:.1} MiB", s.median / 1024.0)),
        met: hwm.map(|s| s.median < 40.0 * 1024.0),
        comment: f
            .get("rss/cnid/mem1000/hwm")
            .map(|s| {
                format!(
                    "with --max-parallel 1000 (all running at once): {:.1} MiB",
                    s.median / 1024.0
                )
            })
            .unwrap_or_default(),
    });
    let b = f.get("batch/c4/disk/runtime/ratio");
    let bt = f.get("batch/c4/tmpfs/runtime/ratio");
    let mut note = f
        .get("batch/c4/disk/runtime/total")
        .zip(f.get("batch/c4/disk/floor/total"))
        .map(|(r, fl)| {
            format!(
                "{:.2} ms vs floor {:.2} ms per namespace",
                r.median * 1e3,
                fl.median * 1e3
            )
        })
        .unwrap_or_default();
    if let Some(t) = bt {
        note.push_str(&format!(
            "; fsync free (tmpfs): {:.2}x (min {:.2}, max {:.2})",
            t.median, t.p10, t.p90
        ));
    }
    v.push(Target {
        what: "batch, concurrency 4, time per namespace",
        limit: "≤ 1.10x floor".into(),
        measured: b.map(|s| {
            format!(
                "{:.2}x (min {:.2}, max {:.2} of {} runs)",
                s.median, s.p10, s.p90, s.n
            )
        }),
        met: b.map(|s| s.median <= 1.10),
        comment: note,
    });
    let at = |what: &str| f.get(&format!("scale/{what}/{}", scale::LARGEST));
    let ready = at("ready");
    v.push(Target {
        what: "cnid with 10,000 attachments (cache and journal): start to ready",
        limit: format!("≤ {} s", scale::READY_GOAL_S),
        measured: ready.map(|s| format!("{:.0} ms", s.median * 1e3)),
        met: ready.map(|s| s.median <= scale::READY_GOAL_S),
        comment: at("ready_cache")
            .map(|s| format!("from the cache alone: {:.0} ms", s.median * 1e3))
            .unwrap_or_default(),
    });
    let rss = at("rss");
    v.push(Target {
        what: "cnid with 10,000 attachments: RSS idle",
        limit: format!("≤ {} MiB", scale::RSS_GOAL_MIB),
        measured: rss.map(|s| format!("{:.1} MiB", s.median)),
        met: rss.map(|s| s.median <= scale::RSS_GOAL_MIB),
        comment: String::new(),
    });
    // Measured by cnid itself (`cnid_admission_duration_seconds`), at
    // every size: the goal is for any.
    let adm = at("admission");
    let sizes = [0, 1000, scale::LARGEST];
    let worst = sizes
        .iter()
        .filter_map(|n| f.get(&format!("scale/admission/{n}")))
        .map(|s| s.median)
        .reduce(f64::max);
    let mut comment: Vec<String> = sizes
        .iter()
        .filter_map(|n| {
            f.get(&format!("scale/admission/{n}"))
                .map(|s| format!("at {n}: {:.3} ms", s.median * 1e3))
        })
        .collect();
    if let Some(w) = at("admission_within") {
        comment.push(format!(
            "{:.0}% within the goal at {}",
            w.median * 100.0,
            scale::LARGEST
        ));
    }
    if let Some(c) = at("cpu_over_zero") {
        comment.push(format!(
            "cnid CPU per ADD+DEL over the empty cache {:+.3} ms",
            c.median * 1e3
        ));
    }
    v.push(Target {
        what: "cnid with 10,000 attachments: admission of an ADD (mean, cnid's own histogram)",
        limit: format!("≤ {} ms at any size", scale::ADMISSION_GOAL_MS),
        measured: adm.map(|s| format!("{:.3} ms", s.median * 1e3)),
        met: worst.map(|w| w <= scale::ADMISSION_GOAL_MS * 1e-3),
        comment: comment.join("; "),
    });
    v
}
