//! `cnitool-batch`: the `cnitool batch up|down` command (see `batch.rs`),
//! in a binary of its own so that its code is not mapped into every
//! `cnitool add` (see `batch_exec.rs`). `cnitool batch ARGS` execs it;
//! running it directly works the same.
//!
//! It shares cnitool's environment handling (`setup.rs`) and failure
//! contract (`report.rs`): the same variables, the same messages, status 1
//! and, with `--json-errors`, the spec's error JSON on stderr.

mod batch;
mod batch_cli;
mod logging;
mod progress;
mod report;
mod setup;

use std::process::ExitCode;

use clap::Parser;

use crate::batch::Runner;
use crate::batch_cli::BatchCli;
use crate::setup::{Env, Settings};

fn main() -> ExitCode {
    let json_env = report::json_errors_from_env();
    if let Some(status) = cnid::generate::intercept(<BatchCli as clap::CommandFactory>::command) {
        return status;
    }
    let cli = match BatchCli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let json = json_env || std::env::args_os().any(|a| a == "--json-errors");
            return report::usage_error(&e, json);
        }
    };
    let json = json_env || cli.json_errors;
    logging::init_logging(json);

    let env: Env<'_> = &setup::process_env;
    let settings = match Settings::from_env(env) {
        Ok(s) => s,
        Err(e) => return report::failure(&e.into(), None, json),
    };
    // One thread runs the event loop; namespace creation goes to tokio's
    // blocking pool. The plugins are processes: their work is in parallel
    // whatever the runtime.
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
    let runner = Runner::new(settings);
    match runtime.block_on(runner.exec(env, &cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&e, runner.cni_version(), json),
    }
}
