//! `make demo`: cnid end to end on a fresh machine, leaving nothing behind.
//!
//! ```text
//! make demo                                             # as root: setup, build, run
//! sudo -E cargo run -p cni-examples --bin demo          # after `cargo build -p cnid --bin cnid`
//! ```
//!
//! It starts the built `cnid` (`--cnid`, default: `cnid` next to this
//! program, where cargo puts both) on a socket in a fresh temp dir, with a
//! temp state dir and result cache and the bundled networks
//! (`examples/net.d`); waits until it answers `GET /v1/health`; runs the
//! `daemon-client` flow (`examples/src/daemon_flow.rs`: two namespaces
//! ADDed to `cnirs-bridge` through the daemon, their addresses, a ping each
//! way, CHECK, the daemon's view of the attachments); tears it down (DEL,
//! namespaces, bridge if it created it, host-local's dir if it created it);
//! stops cnid with SIGTERM; checks that nothing is left (namespaces, bridge,
//! host-local reservations of its containers, the socket, cnid's intents
//! and cache entries); removes the temp dir and ends with
//! `demo: done, everything torn down`.
//!
//! Ctrl-C or SIGTERM at any step ends that step, and the teardown, the stop
//! of cnid and the checks still run; the exit status is then 130 or 143.
//! cnid runs in a process group of its own, so the terminal's Ctrl-C reaches
//! only the demo, and cnid stays up to serve the teardown's DELs. Only
//! SIGKILL of the demo leaves things behind (cnid then keeps running; its
//! pid is printed).
//!
//! Traffic stays on the bridge: no gateway, no masquerading, no default route.

use cni_examples::common;
use cni_examples::daemon_flow;

use std::fs;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use cni_async::netns::Netns;
use cni_core::{NetworkConfigList, confdir};
use cnid_client::Client;
use common::{HostLocalDirs, Interrupt, Signals};
use daemon_flow::{Flow, heading};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tempfile::TempDir;

/// How long cnid may take to answer its first health check.
const READY_LIMIT: Duration = Duration::from_secs(20);
/// How long cnid may take to drain and exit after SIGTERM.
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// Runs cnid on a temporary socket with the bundled networks, attaches two
/// new network namespaces through it, shows their addresses, a ping and the
/// daemon's attachments, and tears everything down.
#[derive(Debug, Parser)]
#[command(name = "demo")]
struct Args {
    /// The cnid binary [default: `cnid` next to this program].
    #[arg(long, value_name = "PATH")]
    cnid: Option<PathBuf>,
    /// The conf dir cnid loads.
    #[arg(long, value_name = "DIR", default_value = common::DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// The network (its `name`).
    #[arg(long, value_name = "NAME", default_value = "cnirs-bridge")]
    network: String,
    /// Plugin dirs, `:`-separated [default: $CNI_PATH, else /opt/cni/bin:/usr/lib/cni].
    #[arg(long, value_name = "DIRS")]
    plugin_dirs: Option<String>,
    /// Namespace names (and container IDs) are PREFIX + `a` and PREFIX + `b`
    /// [default: cnirs-demoPID-].
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The temp dir and what goes in it.
#[derive(Debug)]
struct Dirs {
    tmp: TempDir,
    socket: PathBuf,
    state: PathBuf,
    cache: PathBuf,
    log: PathBuf,
}

impl Dirs {
    fn new() -> Result<Dirs> {
        let tmp = tempfile::Builder::new()
            .prefix("cnid-demo-")
            .tempdir()
            .context("create the demo's temp dir")?;
        let p = tmp.path().to_owned();
        Ok(Dirs {
            socket: p.join("cnid.sock"),
            state: p.join("state"),
            cache: p.join("cache"),
            log: p.join("cnid.log"),
            tmp,
        })
    }
}

async fn run(args: Args) -> Result<ExitCode> {
    common::require_root("demo")?;
    // From here on Ctrl-C no longer kills us: it ends the current step and
    // we tear down.
    let mut signals = Signals::install()?;
    daemon_flow::enable_headings();

    let cnid_bin = match args.cnid.clone() {
        Some(p) => p,
        None => next_to_self("cnid")?,
    };
    let plugin_dirs = common::plugin_dirs(args.plugin_dirs.as_deref());
    let list = confdir::load_network(&args.conf_dir, &args.network).with_context(|| {
        format!(
            "load network {:?} from {}",
            args.network,
            args.conf_dir.display()
        )
    })?;
    require_plugins(&list, &plugin_dirs)?;
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("cnirs-demo{}-", std::process::id()));
    let dirs = Dirs::new()?;
    println!(
        "demo: cnid on a temporary socket, two network namespaces on {}, everything torn down at the end",
        args.network
    );

    heading("start cnid");
    let mut cnid = Cnid::spawn(&cnid_bin, &dirs, &args.conf_dir, &plugin_dirs)?;
    println!(
        "cnid: {} --socket {} --conf-dir {} (pid {}, log {})",
        cnid_bin.display(),
        dirs.socket.display(),
        args.conf_dir.display(),
        cnid.pid,
        dirs.log.display()
    );

    let mut flow: Option<Flow> = None;
    let mut stopped_by: Option<Interrupt> = None;
    let outcome = tokio::select! {
        r = up(&mut cnid, &dirs, &args.network, &prefix, &mut flow) => r,
        s = signals.recv() => {
            println!("{s}: stopping, tearing down");
            stopped_by = Some(s);
            Ok(())
        }
    };
    if let Err(e) = &outcome {
        eprintln!("demo: {e:#}");
        println!("failed, tearing down");
    }
    let mut failed = outcome.is_err();

    // From here on every step runs to its end; signals are only reported.
    let mut created_bridge = None;
    if let Some(flow) = flow {
        heading("tear down: DEL both through cnid, delete the namespaces");
        created_bridge = flow.created_bridge();
        let teardown = flow.teardown();
        tokio::pin!(teardown);
        let torn_down = loop {
            tokio::select! {
                r = &mut teardown => break r,
                s = signals.recv() => println!("{s}: already tearing down"),
            }
        };
        if let Err(e) = torn_down {
            eprintln!("demo: teardown: {e:#}");
            failed = true;
        }
    }

    heading("stop cnid (SIGTERM)");
    let stop = cnid.stop(STOP_LIMIT);
    tokio::pin!(stop);
    let stopped = loop {
        tokio::select! {
            r = &mut stop => break r,
            s = signals.recv() => println!("{s}: already tearing down"),
        }
    };
    match &stopped {
        Ok(status) if status.success() => println!("cnid: exited ({status})"),
        // Stopped before it had installed its handlers (an early Ctrl-C).
        Ok(status) if status.signal() == Some(Signal::SIGTERM as i32) => {
            println!("cnid: ended by SIGTERM before it was ready");
        }
        Ok(status) => {
            eprintln!("demo: cnid exited with {status}");
            failed = true;
        }
        Err(e) => {
            eprintln!("demo: {e:#}");
            failed = true;
        }
    }

    heading("check that nothing is left");
    let left = left_behind(&list, &prefix, created_bridge.as_deref(), &dirs);
    if left.is_empty() {
        println!("left behind: nothing");
    } else {
        for l in &left {
            println!("left behind: {l}");
        }
        failed = true;
    }

    if failed {
        eprintln!("--- cnid log ({}), last lines ---", dirs.log.display());
        eprint!("{}", log_tail(&dirs.log, 40));
    }
    let tmp_path = dirs.tmp.path().to_owned();
    if let Err(e) = dirs.tmp.close() {
        eprintln!("demo: remove {}: {e}", tmp_path.display());
        failed = true;
    } else {
        println!("removed {}", tmp_path.display());
    }

    Ok(match stopped_by {
        _ if failed => {
            println!("demo: failed (see above)");
            ExitCode::FAILURE
        }
        Some(s) => {
            println!("demo: interrupted by {s}, everything torn down");
            ExitCode::from(s.exit_code())
        }
        None => {
            println!("demo: done, everything torn down");
            ExitCode::SUCCESS
        }
    })
}

/// Waits for cnid, then runs the flow; the flow goes into `flow` before its
/// first step, so that the teardown finds it however this ends.
async fn up(
    cnid: &mut Cnid,
    dirs: &Dirs,
    network: &str,
    prefix: &str,
    flow: &mut Option<Flow>,
) -> Result<()> {
    let client = cnid.ready(&dirs.socket, READY_LIMIT).await?;
    flow.insert(Flow::new(client, network, prefix)).run().await
}

/// `name` in the directory of this program.
fn next_to_self(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("find this program's path")?;
    let path = exe
        .parent()
        .map(|d| d.join(name))
        .ok_or_else(|| anyhow!("{} has no parent dir", exe.display()))?;
    if !path.is_file() {
        bail!(
            "{} not found (build it with `cargo build -p cnid --bin cnid`, or pass --cnid PATH)",
            path.display()
        );
    }
    Ok(path)
}

/// Every plugin type of the network (and its IPAM) is installed.
fn require_plugins(list: &NetworkConfigList, plugin_dirs: &[PathBuf]) -> Result<()> {
    let mut missing = Vec::new();
    for plugin in list.plugins() {
        let ipam = plugin
            .raw()
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str);
        for t in std::iter::once(plugin.plugin_type()).chain(ipam) {
            if !plugin_dirs.iter().any(|d| d.join(t).is_file()) && !missing.contains(&t) {
                missing.push(t);
            }
        }
    }
    if !missing.is_empty() {
        bail!(
            "plugins {missing:?} not found in {} (`make setup` installs the reference plugins: \
             apt-get install containernetworking-plugins)",
            common::show_paths(plugin_dirs)
        );
    }
    Ok(())
}

/// The running cnid.
#[derive(Debug)]
struct Cnid {
    child: tokio::process::Child,
    pid: i32,
}

impl Cnid {
    fn spawn(
        program: &Path,
        dirs: &Dirs,
        conf_dir: &Path,
        plugin_dirs: &[PathBuf],
    ) -> Result<Cnid> {
        let log = fs::File::create(&dirs.log)
            .with_context(|| format!("create {}", dirs.log.display()))?;
        let log_err = log
            .try_clone()
            .with_context(|| format!("open {}", dirs.log.display()))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.arg("--socket")
            .arg(&dirs.socket)
            .arg("--conf-dir")
            .arg(conf_dir)
            .arg("--cache-dir")
            .arg(&dirs.cache)
            .arg("--state-dir")
            .arg(&dirs.state);
        for d in plugin_dirs {
            cmd.arg("--plugin-dir").arg(d);
        }
        cmd.env("RUST_LOG", "info")
            // Not a systemd service, whatever the environment says.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            // Its own process group: the terminal's Ctrl-C reaches only the
            // demo, which stops cnid after the teardown has used it.
            .process_group(0)
            // Only for early exits by `?`; the normal path stops it with SIGTERM.
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", program.display()))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| anyhow!("cnid exited at once"))?;
        Ok(Cnid { child, pid })
    }

    /// Waits until cnid answers `GET /v1/health` with `ok`.
    async fn ready(&mut self, socket: &Path, limit: Duration) -> Result<Client> {
        let started = Instant::now();
        loop {
            if let Ok(client) = Client::connect(socket).await
                && let Ok(health) = client.health().await
                && health.status == "ok"
            {
                println!(
                    "cnid {}: ready after {} ms, {} networks loaded, {} unusable files",
                    health.version,
                    started.elapsed().as_millis(),
                    health.networks,
                    health.config_errors
                );
                return Ok(client);
            }
            if let Some(status) = self.child.try_wait().context("wait for cnid")? {
                bail!("cnid exited at start ({status})");
            }
            if started.elapsed() > limit {
                bail!(
                    "cnid did not answer on {} within {limit:?}",
                    socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits up to `limit` (SIGKILL after that).
    async fn stop(&mut self, limit: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait().context("wait for cnid")? {
            bail!("cnid had already exited ({status})");
        }
        kill(Pid::from_raw(self.pid), Signal::SIGTERM).context("send SIGTERM to cnid")?;
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.context("wait for cnid"),
            Err(_) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                bail!("cnid did not exit within {limit:?} of SIGTERM: killed")
            }
        }
    }
}

/// What the run left: namespaces with its prefix, the bridge it created,
/// host-local reservations of its containers, the socket, cnid's ADD
/// intents and cached results.
fn left_behind(
    list: &NetworkConfigList,
    prefix: &str,
    created_bridge: Option<&str>,
    dirs: &Dirs,
) -> Vec<String> {
    let mut left = Vec::new();
    match Netns::list_named() {
        Ok(names) => left.extend(
            names
                .into_iter()
                .filter(|n| n.starts_with(prefix))
                .map(|n| format!("namespace {n}")),
        ),
        Err(e) => left.push(format!("cannot list namespaces: {e}")),
    }
    if let Some(bridge) = created_bridge
        && common::link_exists(bridge)
    {
        left.push(format!("bridge {bridge}"));
    }
    for dir in HostLocalDirs::of(list).paths() {
        let Ok(ips) = common::reserved_ips(dir) else {
            left.push(format!("cannot list {}", dir.display()));
            continue;
        };
        for ip in ips {
            let file = dir.join(ip.to_string());
            let owner = fs::read_to_string(&file).unwrap_or_default();
            if owner.lines().next().is_some_and(|o| o.starts_with(prefix)) {
                left.push(format!("host-local reservation {}", file.display()));
            }
        }
    }
    if dirs.socket.exists() {
        left.push(format!("socket {}", dirs.socket.display()));
    }
    for sub in [dirs.state.join("intents"), dirs.cache.join("results")] {
        if let Ok(entries) = fs::read_dir(&sub) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    left.push(format!("{}", e.path().display()));
                }
            }
        }
    }
    left
}

/// The last `n` lines of cnid's log.
fn log_tail(log: &Path, n: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for l in &lines[lines.len().saturating_sub(n)..] {
        out.push_str(l);
        out.push('\n');
    }
    out
}
