//! The dispatch of a parsed command: where it runs (the attachment commands
//! in cnid when a socket is given, here otherwise) and which module runs it.

use cni_async::trace::{TraceContext, scope};
use cni_core::Version;
use cni_core::error::code;

use crate::backend::{Backend, Local};
use crate::cli::{Cli, Command};
use crate::daemon::Daemon;
use crate::report::ToolError;
use crate::setup::{Env, Settings};
use crate::{add, batch, check, del, gc, networks, status, validate, version};

/// Runs `cli`'s command; its outcome and the `cniVersion` of the network it
/// worked on, if known (what the error JSON is written in).
///
/// `TRACEPARENT`, `TRACESTATE` and `BAGGAGE` of the environment (what
/// libcni's main hands a plugin, so cnitool run by a traced caller keeps
/// the trace) go to the plugins run here, and to cnid as headers.
pub(crate) async fn run(
    settings: Settings,
    env: Env<'_>,
    cli: &Cli,
) -> (anyhow::Result<()>, Option<Version>) {
    let trace = TraceContext::from_lookup(|k| env(k).and_then(|v| v.into_string().ok()));
    match cli.global.daemon_socket(env) {
        Some(socket) if cli.command.goes_to_daemon() => {
            let timeout = settings.timeout;
            let backend = Daemon::new(socket, timeout, Local::new(settings))
                .with_trace(&trace)
                .force(cli.command.force());
            let outcome = scope(trace, on_backend(&backend, env, cli)).await;
            (outcome, backend.cni_version())
        }
        // `batch` runs the plugins here: a socket on its command line would
        // be ignored, and the user would believe cnid ran it.
        _ if matches!(cli.command, Command::Batch(_)) && cli.global.socket.is_some() => {
            let e = ToolError::new(
                code::INVALID_ENVIRONMENT_VARIABLES,
                "cnitool batch runs the plugins here, not in cnid: drop --socket \
                 (attach many namespaces through cnid with one request each)",
            );
            (Err(e.into()), None)
        }
        // Only cnid checks whose a netns is: nothing here to force.
        _ if cli.command.force() => {
            let e = ToolError::new(
                code::INVALID_ENVIRONMENT_VARIABLES,
                "--force is for cnid's refusal of another container's netns and interface: \
                 give --socket (or CNID_SOCKET)",
            );
            (Err(e.into()), None)
        }
        _ => {
            let backend = Local::new(settings);
            let outcome = scope(trace, on_backend(&backend, env, cli)).await;
            (outcome, backend.cni_version())
        }
    }
}

/// Runs `cli`'s command on `backend`.
async fn on_backend(backend: &impl Backend, env: Env<'_>, cli: &Cli) -> anyhow::Result<()> {
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
        // Always here, with this machine's plugins.
        Command::Batch(args) => batch::exec(backend.local(), env, global, args).await,
    }
}
