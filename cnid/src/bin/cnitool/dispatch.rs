//! What `cnitool` and `cnitool-daemon` share past the command line: the
//! dispatch of a parsed command to its module, and logging.

use crate::backend::Backend;
use crate::cli::{Cli, Command};
use crate::setup::Env;
use crate::{add, batch_exec, check, del, gc, status, validate, version};

/// Runs `cli`'s command on `backend`.
pub(crate) async fn run(backend: &impl Backend, env: Env<'_>, cli: &Cli) -> anyhow::Result<()> {
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
pub(crate) fn init_logging() {
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
