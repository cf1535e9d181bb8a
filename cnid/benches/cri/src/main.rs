//! The CRI benchmark: a burst of pod sandboxes through containerd's CRI
//! API, with the network set up by cnid (cnid-shim's list in containerd's
//! CNI conf dir, cnid runs the chain) against the same chain straight in
//! containerd's conf dir.
//!
//! Everything is the run's own: a containerd with its own config, root,
//! state dir and socket (started for each round, stopped after it), a
//! cnid on its own socket and dirs, a bridge and a /24 leased for the run
//! (bridge + host-local + portmap, no gateway, no masquerade, the port
//! mapping's host IP the subnet's `.1`, which nothing has), and a sandbox
//! image built locally (`mkimage.sh`: a static pause, no registry).
//!
//! Per concurrency and repetition one round of each way, adjacent, the
//! order alternating; each figure is the ratio of the two rounds (via
//! cnid ÷ direct), reported as the median (min–max) of the repetitions.
//! The tables are printed as Markdown on stdout.
//!
//! # Caveats
//!
//! - Root only; containerd and runc must be installed (`make bench-cri`
//!   installs them with apt-get).
//! - A failed round stops and removes the sandboxes it ran (their CNI DEL
//!   included). Whatever the end (an error, Ctrl-C), the run's guards then
//!   stop cnid and containerd and kill any shim of its containerd and any
//!   process in its cgroup parent, unmount what is left under its dir
//!   ([`containerd::sweep`]) and delete the dir and the bridge; what could
//!   not be removed is printed. A sandbox that never got its StopPodSandbox
//!   (a signal mid-round) had no CNI DEL: portmap's `CNI-DN-…` chain for it
//!   stays in the nat table (a rule for the subnet's `.1`, which nothing
//!   has).

mod cnid;
mod containerd;
mod grpc;
mod proto;
mod report;
mod round;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::json;

use crate::containerd::Layout;
use crate::round::{Ctx, Round, Way};

/// The reference plugins (Debian's containernetworking-plugins).
const PLUGINS: &str = "/usr/lib/cni";
/// The network's name, in cnid's conf dir and the direct one.
const NETWORK: &str = "bench-cri";

#[derive(Debug, Parser)]
#[command(about = "Pod sandboxes through containerd's CRI: via cnid against the chain direct")]
struct Args {
    /// cnid to run (a release build).
    #[arg(long)]
    cnid: PathBuf,
    /// cnid-shim to put in containerd's CNI bin dir.
    #[arg(long)]
    shim: PathBuf,
    /// The sandbox image (an OCI archive); default: built with mkimage.sh.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Sandboxes per round.
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// Concurrencies, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,32")]
    concurrency: Vec<usize>,
    /// Repetitions (paired rounds) per concurrency.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Sandboxes of the untimed warm-up round of each way (0: none).
    #[arg(long, default_value_t = 16)]
    warmup: usize,
    /// The runc containerd's shims run (default: runc from PATH).
    #[arg(long)]
    runc: Option<PathBuf>,
    /// Keep the run's temp dir (logs, configs) when it ends.
    #[arg(long)]
    keep: bool,
    /// Also run a second cnid with `--plugin-slots N` as a third way,
    /// alternating with the other two in every repetition (0: none).
    #[arg(long, default_value_t = 0)]
    paced: usize,
    /// Arguments for the first cnid (the "via cnid" way), space-separated:
    /// `--cnid-args=--plugin-slots=0` measures it unpaced.
    #[arg(long, value_delimiter = ' ', allow_hyphen_values = true)]
    cnid_args: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cni-bench-cri: tokio: {e}");
            std::process::exit(1);
        }
    };
    // SIGINT or SIGTERM drops the run: its guards stop cnid and
    // containerd, sweep what the sandboxes left and remove the temp dir.
    let res = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut int, mut term) = (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        );
        tokio::select! {
            r = run(&args) => r,
            _ = int.recv() => Err(anyhow::anyhow!("interrupted (SIGINT)")),
            _ = term.recv() => Err(anyhow::anyhow!("terminated (SIGTERM)")),
        }
    });
    if let Err(e) = res {
        eprintln!("cni-bench-cri: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("needs root (containerd, namespaces, iptables)");
    }
    for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"] {
        which(tool).with_context(|| {
            format!(
                "{tool} not found: apt-get install containerd runc (or `make bench-cri` as root)"
            )
        })?;
    }
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        if !Path::new(PLUGINS).join(p).exists() {
            bail!("{PLUGINS}/{p} is missing: run `make setup`");
        }
    }
    let cnid_bin = std::fs::canonicalize(&args.cnid)
        .with_context(|| format!("--cnid {}", args.cnid.display()))?;
    let shim_bin = std::fs::canonicalize(&args.shim)
        .with_context(|| format!("--shim {}", args.shim.display()))?;

    let mut tmp = tempdir(args.keep)?;
    let dir = tmp.path.clone();
    let bin_dir = dir.join("bin");
    let direct_conf = dir.join("direct-net.d");
    let cnid_conf = dir.join("cnid-net.d");
    let paced_conf = dir.join("paced-net.d");
    let cnid_own_conf = dir.join("cnid-conf");
    for d in [
        &bin_dir,
        &direct_conf,
        &cnid_conf,
        &paced_conf,
        &cnid_own_conf,
    ] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    // containerd's CNI bin dir: loopback (which it runs itself), the
    // chain's plugins and the shim.
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        std::os::unix::fs::symlink(Path::new(PLUGINS).join(p), bin_dir.join(p))?;
    }
    std::os::unix::fs::symlink(&shim_bin, bin_dir.join("cnid-shim"))?;

    let lease = cni_test_support::netns::SubnetLease::new();
    let bridge = cni_test_support::netns::LinkGuard::new();
    let host_ip = lease.host(1).to_string();
    let chain = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": bridge.name(), "isGateway": false, "ipMasq": false,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": lease.cidr()}]],
                      "dataDir": dir.join("host-local")}},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    let chain = serde_json::to_vec_pretty(&chain)?;
    std::fs::write(direct_conf.join("40-bench.conflist"), &chain)?;
    std::fs::write(cnid_own_conf.join("40-bench.conflist"), &chain)?;

    let daemon = cnid::Cnid::start(
        &cnid_bin,
        "cnid",
        &dir,
        &cnid_own_conf,
        PLUGINS,
        &args.cnid_args,
    )?;
    cnid::shim_list(&shim_bin, &daemon.socket, NETWORK, &cnid_conf)?;
    // Both cnids read the same list and share host-local's dir: the rounds
    // run one at a time, each ending with every address released.
    let paced = match args.paced {
        0 => None,
        n => {
            let slots = [format!("--plugin-slots={n}")];
            let d = cnid::Cnid::start(&cnid_bin, "paced", &dir, &cnid_own_conf, PLUGINS, &slots)?;
            cnid::shim_list(&shim_bin, &d.socket, NETWORK, &paced_conf)?;
            Some(d)
        }
    };

    let mut layout = Layout::new(&dir.join("containerd"), &bin_dir);
    if let Some(r) = &args.runc {
        layout.runc = r.display().to_string();
    }
    std::fs::create_dir_all(&layout.dir)?;
    tmp.sweep = Some(layout.clone());
    let ctx = Ctx {
        layout: &layout,
        direct_conf: &direct_conf,
        cnid_conf: &cnid_conf,
        cnid_pid: daemon.pid(),
        paced: paced.as_ref().map(|d| (paced_conf.as_path(), d.pid())),
        host_ip,
        leases: &dir.join("host-local").join(NETWORK),
    };
    let mut res = measure(args, &ctx, &dir).await;
    if let Ok(md) = &mut res {
        // How pacing ran the operations: in slots, or lent runs while a
        // CPU idled (work-conserving), or without once their wait was up.
        for (way, d) in [("via cnid", Some(&daemon)), ("paced", paced.as_ref())] {
            if let Some(d) = d {
                let counts = d.paced_counts().await.unwrap_or_else(|e| e.to_string());
                md.push_str(&format!(
                    "\nPaced operations of the {way} cnid: {counts}.\n"
                ));
            }
        }
    }
    let res = res.map_err(|e| {
        let paced = paced.as_ref().map(|d| d.log_tail()).unwrap_or_default();
        e.context(format!("cnid's log:\n{}\n{paced}", daemon.log_tail()))
    });
    drop(paced);
    drop(daemon);
    drop(tmp);
    drop(bridge);
    drop(lease);
    let md = res?;
    println!("{md}");
    Ok(())
}

/// The image, the warm-up and the paired rounds; the report as Markdown.
async fn measure(args: &Args, ctx: &Ctx<'_>, dir: &Path) -> anyhow::Result<String> {
    let image = match &args.image {
        Some(i) => i.clone(),
        None => {
            let out = dir.join("pause-oci.tar");
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("mkimage.sh");
            output_ok(
                std::process::Command::new(&script)
                    .arg(&out)
                    .arg(containerd::IMAGE),
                &script.display().to_string(),
            )?;
            out
        }
    };
    // The image goes into containerd's content store once; each round's
    // containerd finds it there at start.
    {
        let cd = containerd::Containerd::start(ctx.layout, ctx.direct_conf, "import").await?;
        eprintln!("cni-bench-cri: {} ({})", cd.version, cd.service);
        containerd::import_image(ctx.layout, &image)?;
        cd.stop()?;
    }
    let ways: &[Way] = if ctx.paced.is_some() {
        &[Way::Direct, Way::Cnid, Way::Paced]
    } else {
        &[Way::Direct, Way::Cnid]
    };
    if args.warmup > 0 {
        for &way in ways {
            round::round(ctx, way, &format!("w-{}", way.key()), args.warmup, 8)
                .await
                .with_context(|| format!("warm-up via {}", way.key()))?;
        }
    }
    let mut version = String::new();
    // Per concurrency, per repetition, one round per way (in `ways`' order).
    let mut results: Vec<(usize, Vec<Vec<Round>>)> = Vec::new();
    for &c in &args.concurrency {
        let mut reps = Vec::new();
        for rep in 0..args.reps {
            // Each way goes first, second, ... equally often: rotated by
            // one per repetition, reversed every other rotation.
            let mut order: Vec<usize> = (0..ways.len()).collect();
            order.rotate_left(rep % ways.len());
            if (rep / ways.len()) % 2 == 1 {
                order.reverse();
            }
            let mut got: Vec<Option<Round>> = vec![None; ways.len()];
            for i in order {
                let way = ways[i];
                let tag = format!("c{c}-r{rep}-{}", way.key());
                let (r, v) = round::round(ctx, way, &tag, args.count, c)
                    .await
                    .with_context(|| format!("round {tag}"))?;
                eprintln!(
                    "cni-bench-cri: {tag}: run p50 {:.0} ms total {:.0} ms, stop+remove total {:.0} ms (load {:.1}–{:.1})",
                    report::quantile(&r.run.calls, 0.5) * 1e3,
                    r.run.wall * 1e3,
                    r.remove.wall * 1e3,
                    r.load.0,
                    r.load.1
                );
                version = v;
                got[i] = Some(r);
            }
            reps.push(got.into_iter().flatten().collect());
        }
        results.push((c, reps));
    }
    if !args.cnid_args.is_empty() {
        version = format!("{version}; via cnid: cnid {}", args.cnid_args.join(" "));
    }
    Ok(report::markdown(&version, args.count, ways, &results))
}

/// Runs `cmd` (stdin empty) and returns its stdout; an error naming `what`
/// with the exit status and stderr when it fails.
pub(crate) fn output_ok(cmd: &mut std::process::Command, what: &str) -> anyhow::Result<Vec<u8>> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The last 15 lines of the log at `path`, headed by its path.
pub(crate) fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    format!(
        "{}:\n{}",
        path.display(),
        lines[lines.len().saturating_sub(15)..].join("\n")
    )
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// The run's temp dir: on drop, what containerd's sandboxes left is swept
/// ([`containerd::sweep`]), then the dir is removed unless kept.
struct TempDir {
    path: PathBuf,
    keep: bool,
    sweep: Option<Layout>,
}

fn tempdir(keep: bool) -> anyhow::Result<TempDir> {
    let path = std::env::temp_dir().join(format!("cnid-bench-cri-{}", std::process::id()));
    std::fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
    Ok(TempDir {
        path,
        keep,
        sweep: None,
    })
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let mut stuck = false;
        for line in self
            .sweep
            .as_ref()
            .map(containerd::sweep)
            .unwrap_or_default()
        {
            stuck |= line.starts_with("could not");
            eprintln!("cni-bench-cri: cleanup: {line}");
        }
        if stuck || self.keep {
            // A mount still under it: removing the tree would reach into it.
            let why = if stuck {
                " (a mount is left under it)"
            } else {
                ""
            };
            eprintln!("cni-bench-cri: kept {}{why}", self.path.display());
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!(
                "cni-bench-cri: could not remove {}: {e}",
                self.path.display()
            );
        }
    }
}
