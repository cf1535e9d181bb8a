//! `cnitool-daemon`: cnitool with the daemon backend (`daemon.rs`).
//! `cnitool --socket PATH add|check|del|gc|status ...` (or with
//! `CNID_SOCKET`) execs it with its own arguments (`daemon_exec.rs`), so
//! that the HTTP client is not mapped into every `cnitool add`; running it
//! directly works the same.
//!
//! It is cnitool in every other respect: the same command line (`cli.rs`),
//! environment (`setup.rs`), output and failure contract (`report.rs`).
//! `version`, `validate` and `batch` run here as in cnitool; the attachment
//! commands need a socket.

mod add;
mod backend;
mod batch_exec;
mod check;
mod cli;
mod daemon;
mod del;
mod dispatch;
mod gc;
mod logging;
mod networks;
mod report;
mod setup;
mod status;
mod validate;
mod version;

use std::process::ExitCode;

use clap::Parser;
use cni_core::error::code;

use crate::backend::{Backend, Local};
use crate::cli::{Cli, ENV_SOCKET};
use crate::daemon::Daemon;
use crate::report::ToolError;
use crate::setup::{Env, Settings};

fn main() -> ExitCode {
    let json_env = report::json_errors_from_env();
    // `cnitool --generate ...` (make install) lands here: see cnid::generate.
    if let Some(status) = cnid::generate::intercept(<Cli as clap::CommandFactory>::command) {
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
    let timeout = settings.timeout;
    let local = Local::new(settings);
    if !cli.command.goes_to_daemon() {
        let outcome = runtime.block_on(dispatch::run(&local, env, &cli));
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => report::failure(&e, local.cni_version(), json),
        };
    }
    let Some(socket) = cli.global.daemon_socket(env) else {
        let e = ToolError::new(
            code::INVALID_ENVIRONMENT_VARIABLES,
            format!("no cnid socket: pass --socket PATH or set {ENV_SOCKET}"),
        );
        return report::failure(&e.into(), None, json);
    };
    let backend = Daemon::new(socket, timeout, local);
    match runtime.block_on(dispatch::run(&backend, env, &cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&e, backend.cni_version(), json),
    }
}
