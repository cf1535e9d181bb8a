//! A test harness: N network namespaces on a bridge network, set up with the
//! batch API, each pinged from the first, all torn down, with timings.
//!
//! ```text
//! sudo -E cargo run -p cni-examples --bin harness                       # 50 on the bundled network
//! sudo -E cargo run -p cni-examples --bin harness -- --count 200 --generate --subnet 10.253.32.0/22
//! ```
//!
//! By default the namespaces join the bundled `cnirs-bridge` network
//! (bridge `cnirs-br0`, 10.253.10.0/24, addresses .10 to .250, so at most
//! 241 namespaces; host-local keeps its reservations in
//! `/var/lib/cni/networks/cnirs-bridge`). `--generate` uses a network made
//! up here instead: loopback plus a bridge of its own (`--bridge`, default
//! `cnirs-hbr0`) with host-local on `--subnet` (default 10.253.30.0/24) and
//! its `dataDir` in the temp dir, so nothing is written outside it.
//!
//! Progress goes to stderr (one line, redrawn, on a terminal; a line per
//! tenth otherwise), the summary to stdout. The exit status is 0 only when
//! every namespace was attached and answered, the teardown succeeded and
//! nothing is left behind (checked at the end: namespaces with the run's
//! prefix, the bridge if this run created it, host-local reservations).
//!
//! Ctrl-C or SIGTERM at any point stops the run and tears down everything
//! set up so far; the exit status is then 130 or 143. Only SIGKILL leaves
//! namespaces behind (`ip netns list | grep PREFIX`).
//!
//! Traffic stays on the bridge: no gateway, no masquerading, no default route.

use cni_examples::common;

use std::io::{IsTerminal as _, Write as _};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use cni_async::Cni;
use cni_async::batch::{Batch, BatchBuilder, BatchEvent, BatchEventKind};
use cni_async::multi::{LOOPBACK_IFNAME, MultiNetwork, Sandbox};
use cni_async::netns::Netns;
use cni_core::{NetworkConfigList, confdir};
use common::{Bridge, CacheDir, HostLocalDirs, Interrupt, Signals};
use futures::stream::{self, StreamExt as _};
use ipnet::IpNet;
use serde_json::json;

/// Sets up COUNT namespaces on a bridge network, pings each from the first,
/// tears everything down, and prints how long each phase took.
#[derive(Debug, Parser)]
#[command(name = "harness")]
struct Args {
    /// How many namespaces.
    #[arg(long, default_value_t = 50)]
    count: usize,
    /// How many are set up, pinged or torn down at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The conf dir to load the network from.
    #[arg(long, value_name = "DIR", default_value = common::DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// The network (its `name`) in the conf dir.
    #[arg(long, value_name = "NAME", default_value = "cnirs-bridge")]
    network: String,
    /// Use a generated network instead: loopback + a bridge of its own
    /// (--bridge) with host-local on --subnet, its dataDir in the temp dir.
    #[arg(long)]
    generate: bool,
    /// The bridge of the generated network.
    #[arg(long, value_name = "NAME", default_value = "cnirs-hbr0")]
    bridge: String,
    /// The subnet of the generated network.
    #[arg(long, value_name = "CIDR", default_value = "10.253.30.0/24")]
    subnet: IpNet,
    /// Plugin dirs, `:`-separated [default: $CNI_PATH, else /opt/cni/bin:/usr/lib/cni].
    #[arg(long, value_name = "DIRS")]
    plugin_dirs: Option<String>,
    /// The result cache dir [default: a temp dir, removed at the end].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Namespace names (and container IDs) are PREFIX + index
    /// [default: cnirs-hPID-].
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// Print every namespace's address and ping.
    #[arg(long, short)]
    verbose: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode> {
    common::require_root("harness")?;
    let mut signals = Signals::install()?;
    let cache = CacheDir::new(args.cache_dir.clone())?;
    let plugin_dirs = common::plugin_dirs(args.plugin_dirs.as_deref());
    let list = if args.generate {
        generated_network(&args, &cache)?
    } else {
        confdir::load_network(&args.conf_dir, &args.network).with_context(|| {
            format!(
                "load network {:?} from {}",
                args.network,
                args.conf_dir.display()
            )
        })?
    };
    let host_local = HostLocalDirs::of(&list);
    let cni = Cni::builder()
        .plugin_dirs(&plugin_dirs)
        .cache_dir(cache.path())
        .build();
    let mut builder = MultiNetwork::builder(cni).timeout(Duration::from_secs(60));
    if args.generate {
        builder = builder.loopback();
    }
    let networks = builder.network(list.clone()).build()?;
    let ifname = networks
        .networks()
        .iter()
        .map(|n| n.ifname())
        .find(|i| *i != LOOPBACK_IFNAME)
        .unwrap_or("eth0")
        .to_owned();
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("cnirs-h{}-", std::process::id()));
    let concurrency = args.concurrency.max(1);

    let types: Vec<&str> = list.plugins().iter().map(|p| p.plugin_type()).collect();
    println!(
        "harness: {} namespaces ({prefix}0..{}), {concurrency} at a time, on network {} ({}; interface {ifname})",
        args.count,
        args.count.saturating_sub(1),
        list.name(),
        types.join(", "),
    );
    println!(
        "plugin dirs: {}; result cache: {}",
        common::show_paths(&plugin_dirs),
        cache.path().display()
    );

    // The bridge first, with a fixed MAC; deleted at the end if made here.
    let bridge = match common::bridge_of(&list) {
        Some(name) => {
            let b = Bridge::ensure(&name)?;
            println!(
                "bridge {name}: {}",
                if b.created() {
                    "created"
                } else {
                    "exists, kept"
                }
            );
            Some(b)
        }
        None => None,
    };

    let progress = Progress::new(args.count);
    let recorder = progress.clone();
    let batch_builder = BatchBuilder::new(networks)
        .prefix(&prefix)
        .count(args.count)
        .concurrency(concurrency)
        .sandbox_template(Sandbox::new("", "").with_label("HARNESS", "1"))
        .on_event(move |e| recorder.event(e));

    // Setup. On a signal the setup future is dropped, which kills the
    // plugins in flight and tears down what was created (blocking, on this
    // thread, with the same progress events).
    let mut stopped_by: Option<Interrupt> = None;
    let setup_started = Instant::now();
    let batch: Option<Batch> = tokio::select! {
        b = batch_builder.setup() => Some(b?),
        s = signals.recv() => {
            // The drop has torn down by now (see above).
            progress.interrupt(&format!("{s}: setup stopped, what was set up is torn down"));
            stopped_by = Some(s);
            None
        }
    };
    progress.finish_line();

    let mut failed = false;
    let mut timings = Timings::default();
    if let Some(batch) = batch {
        let counts = batch.counts();
        timings.setup = Some(batch.setup_elapsed());
        println!(
            "setup: {} attached, {} failed in {} ({} per namespace, {:.1}/s; attach latency {})",
            counts.attached,
            counts.failed,
            secs(batch.setup_elapsed()),
            per(batch.setup_elapsed(), args.count),
            rate(args.count, batch.setup_elapsed()),
            progress.attach_latency(),
        );
        for m in batch.failed() {
            failed = true;
            let why = m
                .error()
                .map(|e| common::error_chain(e))
                .unwrap_or_default();
            println!("  {} failed: {why}", m.name());
        }
        if args.verbose {
            for m in batch.attached() {
                let ips = m.result().map(|r| r.addresses(&ifname)).unwrap_or_default();
                println!("  {} {ifname} {ips:?}", m.name());
            }
        }

        // Pings, unless interrupted.
        let pings = tokio::select! {
            p = ping_all(&batch, &ifname, concurrency, args.verbose) => Some(p),
            s = signals.recv() => {
                println!("{s}: stopping the pings, tearing down");
                stopped_by = Some(s);
                None
            }
        };
        match pings {
            Some(Ok(report)) => {
                timings.pings = Some(report.elapsed);
                failed |= report.answered < report.sent;
                println!(
                    "pings: {}/{} answered from {} ({}) in {}{}",
                    report.answered,
                    report.sent,
                    report.source,
                    report
                        .source_ip
                        .map_or_else(|| "?".to_owned(), |ip| ip.to_string()),
                    secs(report.elapsed),
                    if report.unanswered.is_empty() {
                        String::new()
                    } else {
                        format!("; no answer from {}", report.unanswered.join(", "))
                    }
                );
            }
            Some(Err(e)) => {
                failed = true;
                println!("pings: {e:#}");
            }
            None => {}
        }

        // Teardown, to its end; signals meanwhile are only reported.
        progress.start_teardown();
        let started = Instant::now();
        let teardown = batch.teardown();
        tokio::pin!(teardown);
        let outcome = loop {
            tokio::select! {
                r = &mut teardown => break r,
                s = signals.recv() => progress.interrupt(&format!("{s}: already tearing down")),
            }
        };
        progress.finish_line();
        let elapsed = started.elapsed();
        timings.teardown = Some(elapsed);
        let c = progress.counts();
        println!(
            "teardown: {} deleted, {} failed in {} ({} per namespace, {:.1}/s)",
            c.deleted,
            c.teardown_failed,
            secs(elapsed),
            per(elapsed, args.count),
            rate(args.count, elapsed),
        );
        if let Err(e) = outcome {
            failed = true;
            println!("  {:#}", anyhow::Error::new(e));
        }
    } else {
        let c = progress.counts();
        println!(
            "interrupted after {}: {} attached, {} failed; torn down: {} deleted, {} failed",
            secs(setup_started.elapsed()),
            c.attached,
            c.failed,
            c.deleted,
            c.teardown_failed,
        );
    }

    // The bridge, host-local's dir, and the check that nothing is left.
    let mut left: Vec<String> = Vec::new();
    if let Some(b) = bridge {
        match b.release() {
            Ok(what) => println!("{what}"),
            Err(e) => left.push(format!("{e:#}")),
        }
    }
    match host_local.reserved() {
        Ok(ips) if ips.is_empty() => {}
        Ok(ips) => left.push(format!("host-local reservations {ips:?}")),
        Err(e) => left.push(format!("{e:#}")),
    }
    if let Err(e) = host_local.tidy() {
        left.push(format!("{e:#}"));
    }
    let namespaces: Vec<String> = Netns::list_named()?
        .into_iter()
        .filter(|n| is_member(n, &prefix))
        .collect();
    if !namespaces.is_empty() {
        left.push(format!("namespaces {namespaces:?}"));
    }
    drop(cache);
    if left.is_empty() {
        println!("left behind: nothing");
    } else {
        failed = true;
        println!("left behind: {}", left.join("; "));
    }
    if let Some(total) = timings.total() {
        println!(
            "total: {} (setup {}, pings {}, teardown {})",
            secs(total),
            timings.setup.map_or("-".into(), secs),
            timings.pings.map_or("-".into(), secs),
            timings.teardown.map_or("-".into(), secs),
        );
    }

    Ok(match stopped_by {
        Some(s) => ExitCode::from(s.exit_code()),
        None if failed => ExitCode::FAILURE,
        None => ExitCode::SUCCESS,
    })
}

/// Whether `name` is PREFIX + a number.
fn is_member(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
}

/// Loopback is added by the MultiNetwork; this is the bridge network.
fn generated_network(args: &Args, cache: &CacheDir) -> Result<NetworkConfigList> {
    let IpNet::V4(subnet) = args.subnet else {
        bail!("--subnet {}: an IPv4 subnet is needed", args.subnet);
    };
    // host-local hands out network+1 .. broadcast-1 minus the gateway (+1).
    let usable = (1u64 << (32 - u32::from(subnet.prefix_len()))).saturating_sub(3);
    if args.count as u64 > usable {
        bail!(
            "--subnet {subnet} has {usable} addresses for {} namespaces: use a larger one",
            args.count
        );
    }
    let data_dir = cache.path().join("host-local");
    let list = NetworkConfigList::from_value(&json!({
        "cniVersion": "1.0.0",
        "name": "cnirs-harness",
        "plugins": [{
            "type": "bridge",
            "bridge": args.bridge,
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": subnet.trunc().to_string() }]],
                "dataDir": data_dir.display().to_string(),
            }
        }]
    }))?;
    Ok(list)
}

#[derive(Debug)]
struct PingReport {
    source: String,
    source_ip: Option<IpAddr>,
    sent: usize,
    answered: usize,
    unanswered: Vec<String>,
    elapsed: Duration,
}

/// Pings every attached namespace from the first one, `concurrency` at a time.
async fn ping_all(
    batch: &Batch,
    ifname: &str,
    concurrency: usize,
    verbose: bool,
) -> Result<PingReport> {
    let ipv4 = |r: Option<&cni_async::MultiResult>| {
        r.and_then(|r| {
            r.addresses(ifname)
                .into_iter()
                .map(|n| n.addr())
                .find(IpAddr::is_ipv4)
        })
    };
    let mut attached = batch.attached();
    let source = attached
        .next()
        .ok_or_else(|| anyhow!("no namespace was attached: nothing to ping"))?;
    let from = source
        .netns()
        .ok_or_else(|| anyhow!("{} has no namespace", source.name()))?;
    let targets: Vec<(&str, Option<IpAddr>)> =
        attached.map(|m| (m.name(), ipv4(m.result()))).collect();
    let started = Instant::now();
    let outcomes: Vec<(&str, Result<common::Ping>)> = stream::iter(targets)
        .map(|(name, ip)| async move {
            let outcome = match ip {
                Some(ip) => common::ping(from, ip, 3).await,
                None => Err(anyhow!("no IPv4 address on {ifname}")),
            };
            (name, outcome)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut report = PingReport {
        source: source.name().to_owned(),
        source_ip: ipv4(source.result()),
        sent: outcomes.len(),
        answered: 0,
        unanswered: Vec::new(),
        elapsed: started.elapsed(),
    };
    for (name, outcome) in outcomes {
        match outcome {
            Ok(p) if p.ok => {
                report.answered += 1;
                if verbose {
                    println!(
                        "  ping {name}: ok, time {} ({} attempt(s))",
                        p.rtt.as_deref().unwrap_or("?"),
                        p.attempts
                    );
                }
            }
            Ok(_) => report.unanswered.push(name.to_owned()),
            Err(e) => report.unanswered.push(format!("{name} ({e:#})")),
        }
    }
    report.unanswered.sort();
    Ok(report)
}

#[derive(Debug, Default)]
struct Timings {
    setup: Option<Duration>,
    pings: Option<Duration>,
    teardown: Option<Duration>,
}

impl Timings {
    fn total(&self) -> Option<Duration> {
        Some(self.setup? + self.pings.unwrap_or_default() + self.teardown?)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

fn per(d: Duration, n: usize) -> String {
    if n == 0 {
        return "-".into();
    }
    format!("{:.0} ms", d.as_secs_f64() * 1000.0 / n as f64)
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

/// The progress line, fed by the batch's events, and what the summary
/// needs from them (per-namespace attach latency, the last counts).
#[derive(Debug, Clone)]
struct Progress {
    inner: Arc<Mutex<ProgressState>>,
}

#[derive(Debug)]
struct ProgressState {
    total: usize,
    tty: bool,
    /// A progress line is drawn and not yet ended (tty only).
    line_open: bool,
    teardown: bool,
    created_at: Vec<Option<Duration>>,
    latencies: Vec<Duration>,
    counts: cni_async::batch::BatchCounts,
    last_printed: usize,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress {
            inner: Arc::new(Mutex::new(ProgressState {
                total,
                tty: std::io::stderr().is_terminal(),
                line_open: false,
                teardown: false,
                created_at: vec![None; total],
                latencies: Vec::new(),
                counts: Default::default(),
                last_printed: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn event(&self, e: &BatchEvent<'_>) {
        let mut st = self.lock();
        st.counts = e.counts;
        match e.kind {
            BatchEventKind::Created => {
                if let Some(slot) = st.created_at.get_mut(e.index) {
                    *slot = Some(e.elapsed);
                }
            }
            BatchEventKind::Attached => {
                if let Some(Some(t0)) = st.created_at.get(e.index).copied() {
                    st.latencies.push(e.elapsed.saturating_sub(t0));
                }
            }
            BatchEventKind::Failed | BatchEventKind::TeardownFailed => {
                let why = e
                    .error
                    .map(|err| common::error_chain(err))
                    .unwrap_or_default();
                st.end_line();
                eprintln!("harness: {} {:?}: {why}", e.name, e.kind);
            }
            // Deleted, and kinds added later.
            _ => {}
        }
        if matches!(
            e.kind,
            BatchEventKind::Deleted | BatchEventKind::TeardownFailed
        ) {
            st.teardown = true;
        }
        st.draw(e.elapsed);
    }

    fn start_teardown(&self) {
        let mut st = self.lock();
        st.teardown = true;
        st.last_printed = 0;
    }

    /// Ends the progress line (tty) before other output.
    fn finish_line(&self) {
        self.lock().end_line();
    }

    fn interrupt(&self, msg: &str) {
        let mut st = self.lock();
        st.end_line();
        println!("{msg}");
    }

    fn counts(&self) -> cni_async::batch::BatchCounts {
        self.lock().counts
    }

    fn attach_latency(&self) -> String {
        let mut l = self.lock().latencies.clone();
        if l.is_empty() {
            return "-".into();
        }
        l.sort();
        let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
        format!(
            "min {} / median {} / max {} ms",
            ms(l[0]),
            ms(l[l.len() / 2]),
            ms(l[l.len() - 1])
        )
    }
}

impl ProgressState {
    fn end_line(&mut self) {
        if self.line_open {
            eprintln!();
            self.line_open = false;
        }
    }

    fn draw(&mut self, elapsed: Duration) {
        let c = self.counts;
        let (phase, done, detail) = if self.teardown {
            (
                "teardown",
                c.deleted + c.teardown_failed,
                format!("{} deleted, {} failed", c.deleted, c.teardown_failed),
            )
        } else {
            (
                "setup",
                c.attached + c.failed,
                format!("{} attached, {} failed", c.attached, c.failed),
            )
        };
        let total = self.total.max(1);
        if self.tty {
            let width = 30;
            let filled = done * width / total;
            eprint!(
                "\r\x1b[2K{phase:<8} [{}{}] {done}/{total}  {detail}  {:.1}s",
                "#".repeat(filled),
                " ".repeat(width - filled.min(width)),
                elapsed.as_secs_f64()
            );
            let _ = std::io::stderr().flush();
            self.line_open = true;
        } else {
            // A line per tenth (and the last one).
            let step = total.div_ceil(10);
            if done > self.last_printed && (done % step == 0 || done == self.total) {
                self.last_printed = done;
                eprintln!(
                    "{phase}: {done}/{}  {detail}  {:.1}s",
                    self.total,
                    elapsed.as_secs_f64()
                );
            }
        }
    }
}
