//! `cnitool`: a drop-in for the reference Go cnitool, on `cni-async`.
//!
//! ```text
//! cnitool [-i IFNAME] [--json-errors] add|check|del|gc|status NETWORK NETNS
//! cnitool version PLUGIN
//! cnitool validate NETWORK
//! cnitool [-i IFNAME] batch up NETWORK --count N [--concurrency C] [--prefix P] [-q]
//! cnitool [-i IFNAME] batch down NETWORK [--concurrency C] [--prefix P] [-q]
//! ```
//!
//! `batch` is the `cnitool-batch` binary (`batch_main.rs`), which cnitool
//! execs (`batch_exec.rs`) so that its code does not weigh on other commands.
//!
//! Environment as the reference (`NETCONFPATH`, `CNI_PATH`, `CNI_ARGS`,
//! `CAP_ARGS`, `CNI_IFNAME`) plus `CNI_CACHE_DIR`, `CNI_TIMEOUT`,
//! `CNITOOL_JSON_ERRORS` and `RUST_LOG`; see `cnitool --help`.
//!
//! Layout: `cli` (clap definitions), one module per subcommand with an
//! `exec` function, `setup` (environment → settings and runtime conf),
//! `backend` (where operations run: today in-process), `report` (the
//! failure contract: stderr, exit status 1, optional error JSON).
//!
//! The process is short-lived and run once per operation: a current-thread
//! runtime, no work before parsing, logging only when `RUST_LOG` is set.

mod add;
mod backend;
mod batch_exec;
mod check;
mod cli;
mod del;
mod gc;
mod report;
mod setup;
mod status;
mod validate;
mod version;

use std::process::ExitCode;

use clap::Parser;

use crate::backend::{Backend, Local};
use crate::cli::{Cli, Command};
use crate::setup::{Env, Settings};

fn main() -> ExitCode {
    let json_env = report::json_errors_from_env();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let json = json_env || std::env::args_os().any(|a| a == "--json-errors");
            return report::usage_error(&e, json);
        }
    };
    let json = json_env || cli.global.json_errors;
    init_logging();

    let env: Env<'_> = &setup::process_env;
    let settings = match Settings::from_env(env) {
        Ok(s) => s,
        Err(e) => return report::failure(&e.into(), None, json),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let e = anyhow::Error::new(e).context("cannot start the tokio runtime");
            return report::failure(&e, None, json);
        }
    };
    let backend = Local::new(settings);
    match runtime.block_on(run(&backend, env, &cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&e, backend.cni_version(), json),
    }
}

async fn run(backend: &impl Backend, env: Env<'_>, cli: &Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match &cli.command {
        Command::Add(args) => add::exec(backend, env, global, args).await,
        Command::Check(args) => check::exec(backend, env, global, args).await,
        Command::Del(args) => del::exec(backend, env, global, args).await,
        Command::Gc(args) => gc::exec(backend, env, global, args).await,
        Command::Status(args) => status::exec(backend, env, global, args).await,
        Command::Version(args) => version::exec(backend, args).await,
        Command::Validate(args) => validate::exec(backend, args).await,
        Command::Batch(args) => batch_exec::exec(global, args),
    }
}

/// A tracing subscriber on stderr, only when `RUST_LOG` is set and non-empty.
///
/// The filter is `tracing_subscriber`'s `Targets` (`info`,
/// `cni_async=debug,warn`, ...), not `EnvFilter`: it covers what a CLI needs
/// and keeps the regex engine of `EnvFilter` out of the binary (about 0.7 MB
/// of code, a quarter of a megabyte of RSS on every run).
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let Some(spec) = std::env::var_os("RUST_LOG").filter(|v| !v.is_empty()) else {
        return;
    };
    let filter = match spec
        .to_str()
        .map(str::parse::<tracing_subscriber::filter::Targets>)
    {
        Some(Ok(filter)) => filter,
        Some(Err(e)) => {
            eprintln!("warning: ignoring RUST_LOG {spec:?}: {e}");
            return;
        }
        None => {
            eprintln!("warning: ignoring RUST_LOG {spec:?}: not valid UTF-8");
            return;
        }
    };
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(filter)
        .try_init();
}
