//! `cnitool`: a drop-in for the reference Go cnitool, on `cni-async`.
//!
//! ```text
//! cnitool [-i IFNAME] [--json-errors] [--socket PATH] add|check|del|gc|status NETWORK NETNS
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
//! `CNITOOL_JSON_ERRORS`, `CNID_SOCKET` and `RUST_LOG`; see `cnitool --help`.
//!
//! With `--socket PATH` or `CNID_SOCKET`, `add`, `check`, `del`, `gc` and
//! `status` go to the cnid daemon: cnitool execs the `cnitool-daemon`
//! binary (`daemon_main.rs`, `daemon_exec.rs`), which sends them with cnid's
//! client, so that the HTTP client's code does not weigh on every local run.
//!
//! Layout: `cli` (clap definitions), one module per subcommand with an
//! `exec` function, `dispatch` (command → module, logging), `setup`
//! (environment → settings and runtime conf), `backend` (where operations
//! run: in-process; `daemon`: in cnid), `report` (the failure contract:
//! stderr, exit status 1, optional error JSON).
//!
//! The process is short-lived and run once per operation: a current-thread
//! runtime, no work before parsing; warnings on stderr unless `--json-errors`.

mod add;
mod backend;
mod batch_exec;
mod check;
mod cli;
mod daemon_exec;
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

use crate::backend::{Backend, Local};
use crate::cli::Cli;
use crate::setup::{Env, Settings};

fn main() -> ExitCode {
    let json_env = report::json_errors_from_env();
    // `--generate man|complete-*` (make install): cnitool-daemon prints them
    // (cnid::generate says why).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "--generate")
    {
        return report::failure(&daemon_exec::exec(), None, json_env);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let json = json_env || std::env::args_os().any(|a| a == "--json-errors");
            return report::usage_error(&e, json);
        }
    };
    let json = json_env || cli.global.json_errors;
    let env: Env<'_> = &setup::process_env;
    if cli.command.goes_to_daemon() && cli.global.daemon_socket(env).is_some() {
        // Returns only when the exec failed.
        let e = daemon_exec::exec();
        return report::failure(&e, None, json);
    }
    logging::init_logging(json);

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
    match runtime.block_on(dispatch::run(&backend, env, &cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&e, backend.cni_version(), json),
    }
}
