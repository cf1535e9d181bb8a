//! What `cnitool` and `cnitool-daemon` share past the command line: the
//! dispatch of a parsed command to its module, and logging.

use crate::backend::Backend;
use crate::cli::{Cli, Command};
use crate::setup::Env;
use crate::{add, batch_exec, check, del, gc, networks, status, validate, version};

/// Runs `cli`'s command on `backend`.
pub(crate) async fn run(backend: &impl Backend, env: Env<'_>, cli: &Cli) -> anyhow::Result<()> {
    let global = &cli.global;
    match &cli.command {
        Command::Add(args) => add::exec(backend, env, global, args).await,
        Command::Check(args) => check::exec(backend, env, global, args).await,
        Command::Del(args) => del::exec(backend, env, global, args).await,
        Command::Gc(args) => gc::exec(backend, env, global, args).await,
        Command::Status(args) => status::exec(backend, env, global, args).await,
        Command::Networks => networks::exec(backend).await,
        Command::Version(args) => version::exec(backend, args).await,
        Command::Validate(args) => validate::exec(backend, args).await,
        Command::Batch(args) => batch_exec::exec(global, args),
    }
}
