//! The `in-process` example through a running cnid: two sandboxes on the
//! bundled bridge network, ADDed, pinged, CHECKed, listed and DELed by the
//! daemon, with the typed client `cnid_client::Client` (the package
//! `cnid-client`: the client alone, without the daemon).
//!
//! ```text
//! sudo cnid --socket /tmp/cnid.sock --conf-dir examples/net.d --state-dir /tmp/cnid-state &
//! sudo -E cargo run -p cni-examples --bin daemon-client -- --socket /tmp/cnid.sock
//! ```
//!
//! The socket is `--socket`, else `CNID_SOCKET`, else `/run/cnid/cnid.sock`;
//! the daemon must have the network (`--network`, default `cnirs-bridge`)
//! in its conf dir. `make demo` starts a daemon of its own and runs this
//! same flow (`examples/src/daemon_flow.rs`).
//!
//! The example creates its own two network namespaces (`--prefix`, default
//! `cnirs-dc<pid>-`, + `a`/`b`, also the container IDs) and deletes them at
//! the end, also after an error and on Ctrl-C or SIGTERM (the signal ends
//! the current step, then everything is torn down through the daemon).
//! cnid runs the plugins, so they come from its plugin dirs and their
//! results go to its cache dir; host-local (a child of cnid on this host)
//! keeps its reservations in `/var/lib/cni/networks/cnirs-bridge`, which the
//! DELs release.
//!
//! As in `in-process`: when the network's bridge does not exist, the example
//! creates it first with a fixed MAC (the bridge plugin's CHECK fails
//! otherwise once the second sandbox joins) and deletes it at the end; the
//! sandboxes have no port mappings (portmap 1.1.1's CHECK fails for those).
//! Traffic stays on the bridge: no gateway, no masquerading, no default route.

use cni_examples::common;
use cni_examples::daemon_flow;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use common::{Interrupt, Signals};
use daemon_flow::Flow;

/// Sets up two sandboxes on a network through a running cnid, pings one
/// from the other, CHECKs them, shows the daemon's attachments and tears
/// everything down.
#[derive(Debug, Parser)]
#[command(name = "daemon-client")]
struct Args {
    /// cnid's socket [env: CNID_SOCKET] [default: /run/cnid/cnid.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The network (its `name`, as the daemon loaded it).
    #[arg(long, value_name = "NAME", default_value = "cnirs-bridge")]
    network: String,
    /// Namespace names (and container IDs) are PREFIX + `a` and PREFIX + `b`
    /// [default: cnirs-dcPID-].
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("daemon-client: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode> {
    common::require_root("daemon-client")?;
    // From here on Ctrl-C no longer kills us: it ends the current step and
    // we tear down.
    let mut signals = Signals::install()?;
    let socket = daemon_flow::socket_path(args.socket);
    let client = tokio::select! {
        c = daemon_flow::connect(&socket) => c?,
        s = signals.recv() => {
            println!("{s}: stopping (nothing set up yet)");
            return Ok(ExitCode::from(s.exit_code()));
        }
    };
    let prefix = args
        .prefix
        .unwrap_or_else(|| format!("cnirs-dc{}-", std::process::id()));
    let mut flow = Flow::new(client, &args.network, &prefix);

    let mut stopped_by: Option<Interrupt> = None;
    let outcome = tokio::select! {
        r = flow.run() => r,
        s = signals.recv() => {
            println!("{s}: stopping, tearing down");
            stopped_by = Some(s);
            Ok(())
        }
    };
    if let Err(e) = &outcome {
        eprintln!("daemon-client: {e:#}");
        println!("failed, tearing down");
    }

    // The teardown runs to its end; signals meanwhile are only reported.
    let teardown = flow.teardown();
    tokio::pin!(teardown);
    let torn_down = loop {
        tokio::select! {
            r = &mut teardown => break r,
            s = signals.recv() => println!("{s}: already tearing down"),
        }
    };
    let failed = outcome.is_err() || torn_down.is_err();
    if let Err(e) = torn_down {
        eprintln!("daemon-client: teardown: {e:#}");
    }
    Ok(match stopped_by {
        _ if failed => ExitCode::FAILURE,
        Some(s) => ExitCode::from(s.exit_code()),
        None => ExitCode::SUCCESS,
    })
}
