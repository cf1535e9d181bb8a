//! The command line, as clap definitions only; what each command does is in
//! its own module (`add.rs`, `del.rs`, ...).
//!
//! The surface is the reference cnitool's (`add|check|del|gc|status <network>
//! <netns>`, global `-i/--ifname`, extra positional arguments ignored as
//! cobra's `MinimumNArgs(2)` allows), plus `version`, `validate`, `batch`,
//! `--json-errors` and `--socket`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::batch_cli::BatchArgs;
use crate::setup::Env;

/// The environment variables, for `--help`.
const ENV_HELP: &str = "\
Environment:
  NETCONFPATH          conf dir with the network configurations [default: /etc/cni/net.d]
  CNI_PATH             plugin dirs, ':'-separated [default: /opt/cni/bin:/usr/lib/cni]
  CNI_ARGS             K=V;K=V pairs passed to the plugins as CNI_ARGS
  CAP_ARGS             capability arguments, a JSON object
  CNI_IFNAME           interface name when -i is not given [default: eth0]
  CNI_CACHE_DIR        result cache dir [default: /var/lib/cni]
  CNI_TIMEOUT          deadline of each operation in seconds, may be fractional
                       [default: 60 for add/check/del/gc, 10 for status/version]
  CNITOOL_JSON_ERRORS  set to 1 for --json-errors
  TRACEPARENT, TRACESTATE, BAGGAGE
                       W3C trace context handed to the plugins (to cnid as
                       headers with --socket); a malformed one is dropped
  CNID_SOCKET          cnid's socket when --socket is not given: add, check, del,
                       gc and status go to the daemon (version, validate and
                       batch always run here)
  RUST_LOG             log filter (tracing) for stderr [default: warnings only]";

/// CNI Tool: executes a CNI configuration on a network namespace.
#[derive(Debug, Parser)]
#[command(
    name = "cnitool",
    version = env!("CNID_BUILD_VERSION"),
    about = "Add, check, delete, garbage-collect or get the status of a network attachment of a network namespace",
    after_help = ENV_HELP
)]
pub(crate) struct Cli {
    /// Global options.
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options of every command.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// Interface name (defaults to env var CNI_IFNAME or 'eth0')
    #[arg(short = 'i', long, global = true, value_name = "NAME")]
    pub(crate) ifname: Option<String>,
    /// On failure, print the CNI error JSON on stderr instead of the message
    /// (also with env CNITOOL_JSON_ERRORS=1)
    #[arg(long, global = true)]
    pub(crate) json_errors: bool,
    /// Send add, check, del, gc and status to the cnid daemon listening on
    /// this socket instead of running the plugins here (also with env
    /// CNID_SOCKET)
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
}

impl GlobalArgs {
    /// cnid's socket: `--socket`, else `CNID_SOCKET`; `None` (the plugins run
    /// here) when neither is set (an empty `CNID_SOCKET` counts as unset).
    pub(crate) fn daemon_socket(&self, env: Env<'_>) -> Option<PathBuf> {
        self.socket
            .clone()
            .or_else(|| env(ENV_SOCKET).filter(|v| !v.is_empty()).map(PathBuf::from))
    }
}

/// `CNID_SOCKET`: cnid's socket when `--socket` is not given.
pub(crate) const ENV_SOCKET: &str = "CNID_SOCKET";

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Add network interface to a network namespace; prints the result
    Add(AttachmentArgs),
    /// Check network interface in a network namespace
    Check(AttachmentArgs),
    /// Delete network interface from a network namespace (uses the cached
    /// configuration when the network's file is gone)
    Del(AttachmentArgs),
    /// Garbage collect: delete every cached attachment of the network, then
    /// send GC to its plugins (1.1.0 networks); prints what was deleted.
    /// With --stale: delete only the cached attachments whose network
    /// namespace is gone (of every network, or of NETWORK)
    Gc(GcArgs),
    /// Get status of the network's plugins (1.1.0 networks); prints whether
    /// the network is ready
    Status(NetworkArgs),
    /// List the networks of the conf dir (or cnid's, with a socket): the
    /// default network first, plugins, capabilities, and unusable files
    Networks,
    /// Print a plugin's VERSION reply
    Version(VersionArgs),
    /// Check that every plugin of a network is installed and supports its
    /// version; prints the capabilities the network enables, one per line
    Validate(ValidateArgs),
    /// Set up or tear down many network namespaces on one network at once,
    /// for test harnesses; prints a JSON summary (`batch up`, `batch down`)
    Batch(BatchArgs),
}

impl Command {
    /// Whether `--force` was given (`add`, `check`, `del`).
    pub(crate) fn force(&self) -> bool {
        matches!(self, Command::Add(a) | Command::Check(a) | Command::Del(a) if a.force)
    }

    /// Whether cnid runs the command when a socket is given: `add`, `check`,
    /// `del`, `gc` and `status` (`version`, `validate` and `batch` ask the
    /// plugins of this machine).
    pub(crate) fn goes_to_daemon(&self) -> bool {
        matches!(
            self,
            Command::Add(_)
                | Command::Check(_)
                | Command::Del(_)
                | Command::Gc(_)
                | Command::Status(_)
                | Command::Networks
        )
    }
}

/// `<network> <netns>`, as every attachment command of the reference takes.
#[derive(Debug, Args)]
pub(crate) struct AttachmentArgs {
    /// Network name (the `name` of a configuration in NETCONFPATH)
    #[arg(value_name = "NETWORK")]
    pub(crate) network: String,
    /// Network namespace path; relative paths are taken from the current
    /// directory. The container ID is derived from it
    #[arg(value_name = "NETNS")]
    pub(crate) netns: String,
    /// With a socket: run although the netns and interface belong to
    /// another container's attachment (cnid refuses that with 409 unless
    /// the request sets "force")
    #[arg(long)]
    pub(crate) force: bool,
    /// Ignored (the reference cnitool accepts and ignores extra arguments)
    #[arg(hide = true, value_name = "IGNORED")]
    pub(crate) ignored: Vec<String>,
}

/// `<network> [<netns>]`: the commands that work on a network, not an
/// attachment (`gc`, `status`). The reference requires the netns argument
/// and ignores it; here it may be left out, and is checked when given.
#[derive(Debug, Args)]
pub(crate) struct NetworkArgs {
    /// Network name (the `name` of a configuration in NETCONFPATH)
    #[arg(value_name = "NETWORK")]
    pub(crate) network: String,
    /// Network namespace path: accepted for compatibility, not used
    #[arg(value_name = "NETNS")]
    pub(crate) netns: Option<String>,
    /// Ignored (the reference cnitool accepts and ignores extra arguments)
    #[arg(hide = true, value_name = "IGNORED")]
    pub(crate) ignored: Vec<String>,
}

/// `gc <network> [<netns>]`, or `gc --stale [--dry-run] [<network>]`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Network name (the `name` of a configuration in NETCONFPATH); with
    /// --stale, only this network's attachments (all networks' without it)
    #[arg(value_name = "NETWORK", required_unless_present = "stale")]
    pub(crate) network: Option<String>,
    /// Network namespace path: accepted for compatibility, not used
    #[arg(value_name = "NETNS")]
    pub(crate) netns: Option<String>,
    /// Ignored (the reference cnitool accepts and ignores extra arguments)
    #[arg(hide = true, value_name = "IGNORED")]
    pub(crate) ignored: Vec<String>,
    /// Delete the cached attachments whose network namespace is gone (its
    /// runtime never sent DEL, or the node rebooted) with their cached
    /// configuration, instead of GC; for hosts without cnid (cnid does this
    /// itself). Prints each one with why and what its DEL returned
    #[arg(long)]
    pub(crate) stale: bool,
    /// With --stale: print what would be deleted, delete nothing
    #[arg(long, requires = "stale")]
    pub(crate) dry_run: bool,
}

/// `version <plugin-type>`.
#[derive(Debug, Args)]
pub(crate) struct VersionArgs {
    /// Plugin type (a binary in CNI_PATH)
    #[arg(value_name = "PLUGIN")]
    pub(crate) plugin_type: String,
}

/// `validate <network>`.
#[derive(Debug, Args)]
pub(crate) struct ValidateArgs {
    /// Network name
    #[arg(value_name = "NETWORK")]
    pub(crate) network: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn extra_arguments_are_ignored_and_flags_go_anywhere() {
        let cli =
            Cli::try_parse_from(["cnitool", "add", "net", "ns", "x", "y", "-i", "eth1"]).unwrap();
        assert_eq!(cli.global.ifname.as_deref(), Some("eth1"));
        match cli.command {
            Command::Add(a) => {
                assert_eq!((a.network.as_str(), a.netns.as_str()), ("net", "ns"));
                assert_eq!(a.ignored, ["x", "y"]);
            }
            other => panic!("parsed as {other:?}"),
        }
        let cli = Cli::try_parse_from(["cnitool", "--json-errors", "del", "n", "s"]).unwrap();
        assert!(cli.global.json_errors);
    }

    #[test]
    fn the_socket_flag_wins_over_the_environment() {
        let global = |args: &[&str]| {
            let mut argv = vec!["cnitool"];
            argv.extend_from_slice(args);
            argv.extend_from_slice(&["add", "net", "ns"]);
            Cli::try_parse_from(argv).unwrap().global
        };
        let env = |v: &'static str| {
            move |k: &str| (k == "CNID_SOCKET").then(|| std::ffi::OsString::from(v))
        };
        let flag = global(&["--socket", "/flag.sock"]);
        assert_eq!(
            flag.daemon_socket(&env("/env.sock")),
            Some(PathBuf::from("/flag.sock"))
        );
        assert_eq!(
            global(&[]).daemon_socket(&env("/env.sock")),
            Some(PathBuf::from("/env.sock"))
        );
        // An empty --socket is a usage error; an empty CNID_SOCKET is unset.
        assert!(Cli::try_parse_from(["cnitool", "--socket", "", "add", "n", "s"]).is_err());
        assert_eq!(global(&[]).daemon_socket(&env("")), None);
        assert_eq!(global(&[]).daemon_socket(&|_: &str| None), None);
    }

    #[test]
    fn only_attachment_commands_go_to_the_daemon() {
        let command = |args: &[&str]| {
            let mut argv = vec!["cnitool"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).unwrap().command
        };
        for verb in ["add", "check", "del", "gc", "status"] {
            assert!(command(&[verb, "n", "s"]).goes_to_daemon(), "{verb}");
        }
        assert!(!command(&["version", "bridge"]).goes_to_daemon());
        assert!(!command(&["validate", "n"]).goes_to_daemon());
        assert!(!command(&["batch", "up", "n", "--count", "1"]).goes_to_daemon());
    }

    #[test]
    fn two_arguments_are_required() {
        assert!(Cli::try_parse_from(["cnitool", "add", "net"]).is_err());
        assert!(Cli::try_parse_from(["cnitool", "gc"]).is_err());
    }
}
