//! `cnitool`: a drop-in for the reference Go cnitool, on `cni-async`
//! (`cnitool --help`, README.md).
//!
//! Environment as the reference (`NETCONFPATH`, `CNI_PATH`, `CNI_ARGS`,
//! `CAP_ARGS`, `CNI_IFNAME`) plus `CNI_CACHE_DIR`, `CNI_TIMEOUT`,
//! `CNITOOL_JSON_ERRORS`, `CNID_SOCKET` and `RUST_LOG`; see `cnitool --help`.
//!
//! With `--socket PATH` or `CNID_SOCKET`, `add`, `check`, `del`, `gc`,
//! `status` and `networks` go to the cnid daemon (`daemon`, cnid's client).
//!
//! One binary does everything (`src/main.rs` calls [`main`]). The code of
//! `batch` and of the daemon client is in it but only runs, and so only
//! becomes resident, for those commands: `cnitool add` stays small (see
//! BENCHMARKS.md for its peak RSS).
//!
//! Layout: `cli` and `batch_cli` (clap definitions), one module per
//! subcommand with an `exec` function (`batch` for both `batch up` and
//! `batch down`), `dispatch` (command → module), `setup`
//! (environment → settings and runtime conf), `backend` (where operations
//! run: in-process; `daemon`: in cnid), `report` (the failure contract:
//! stderr, exit status 1, optional error JSON).
//!
//! The process is short-lived and run once per operation: a current-thread
//! runtime, no work before parsing; warnings on stderr unless `--json-errors`.
//! Plugins' stderr is passed through to ours (`passthrough`).

mod add;
mod backend;
mod batch;
mod batch_cli;
mod check;
mod cli;
mod daemon;
mod del;
mod dispatch;
mod gc;
mod logging;
mod manual;
mod networks;
mod passthrough;
mod progress;
mod report;
mod setup;
mod status;
mod validate;
mod version;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::setup::{Env, Settings};

/// Runs cnitool with the process's arguments and environment; the exit
/// status (0, or 1 with the failure on stderr; clap's for `--help` and
/// usage errors).
pub fn main() -> ExitCode {
    let json_env = report::json_errors_from_env();
    // `--generate man|complete-*` (make install): see cnid_cli::generate.
    if let Some(status) =
        cnid_cli::generate::intercept(<Cli as clap::CommandFactory>::command, &manual::EXTRAS)
    {
        return status;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let json = json_env || std::env::args_os().any(|a| a == "--json-errors");
            return report::usage_error(&e, json);
        }
    };
    let json = json_env || cli.global.json_errors;
    logging::init_logging(json);
    passthrough::hold(json);

    let env: Env<'_> = &setup::process_env;
    let settings = match Settings::from_env(env) {
        Ok(s) => s,
        Err(e) => return report::failure(&e.into(), None, json),
    };
    // One thread runs the event loop (namespace creation of `batch` goes to
    // tokio's blocking pool); the plugins are processes, in parallel
    // whatever the runtime.
    // The library's builder: one call site of tokio's, so its multi-thread
    // scheduler (which cnid's features turn on) is not linked in.
    let runtime = match cni_async::batch::current_thread_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            let e = anyhow::Error::new(e).context("cannot start the tokio runtime");
            return report::failure(&e, None, json);
        }
    };
    let cache_dir = settings.cache_dir.clone();
    let (outcome, version) = runtime.block_on(dispatch::run(settings, env, &cli));
    passthrough::finish(outcome.is_ok());
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let hint =
                setup::cache_permission_hint(&e, &cache_dir).or_else(|| setup::error_hint(&e));
            report::failure_with_hint(&e, version, json, hint.as_deref())
        }
    }
}
