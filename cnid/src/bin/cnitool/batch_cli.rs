//! The command line of `cnitool batch` (the `cnitool-batch` binary), as
//! clap definitions only; what the commands do is in `batch.rs`.
//!
//! `cnitool` hands `cnitool batch ARGS` over as `cnitool-batch [-i NAME]
//! [--json-errors] ARGS` (`batch_exec.rs`), so the global options of
//! cnitool are accepted here too, before or after the subcommand.

use clap::{Args, Parser, Subcommand};

/// The environment variables, for `--help`.
const ENV_HELP: &str = "\
Environment (as for cnitool add/del):
  NETCONFPATH          conf dir with the network configurations [default: /etc/cni/net.d]
  CNI_PATH             plugin dirs, ':'-separated [default: /opt/cni/bin:/usr/lib/cni]
  CNI_ARGS             K=V;K=V pairs passed to the plugins as CNI_ARGS
  CAP_ARGS             capability arguments, a JSON object
  CNI_IFNAME           interface name when -i is not given [default: eth0]
  CNI_CACHE_DIR        result cache dir [default: /var/lib/cni]
  CNI_TIMEOUT          deadline of each ADD or DEL in seconds, may be fractional [default: 60]
  CNITOOL_JSON_ERRORS  set to 1 for --json-errors
  RUST_LOG             log filter (tracing), logs go to stderr

Namespaces are /run/netns/PREFIX0, PREFIX1, ... (seen by `ip netns`); each
member's container ID is derived from that path as `cnitool add` derives it,
so `cnitool check|del NETWORK /run/netns/NAME` work on one member.";

/// `cnitool batch`: many network namespaces on one network, for test harnesses.
#[derive(Debug, Parser)]
#[command(
    name = "cnitool-batch",
    bin_name = "cnitool batch",
    version = env!("CNID_BUILD_VERSION"),
    about = "Set up or tear down many network namespaces on one network at once, for test harnesses",
    after_help = ENV_HELP
)]
pub(crate) struct BatchCli {
    /// Interface name (defaults to env var CNI_IFNAME or 'eth0')
    #[arg(short = 'i', long, global = true, value_name = "NAME")]
    pub(crate) ifname: Option<String>,
    /// On failure, print the CNI error JSON on stderr instead of the message
    /// (also with env CNITOOL_JSON_ERRORS=1)
    #[arg(long, global = true)]
    pub(crate) json_errors: bool,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: BatchCommand,
}

/// `up|down`.
#[derive(Debug, Subcommand)]
pub(crate) enum BatchCommand {
    /// Create namespaces PREFIX0, PREFIX1, ... (N in all) and attach each to
    /// the network; prints a JSON summary. Exit status 1 when any failed (those
    /// are rolled back and their namespaces deleted; the attached ones stay up)
    Up(BatchUpArgs),
    /// DEL every attachment of the network in namespaces named PREFIX and a
    /// number, and delete those namespaces; prints a JSON summary. Nothing to do is a
    /// success
    Down(BatchDownArgs),
}

/// `up <network> --count N`.
#[derive(Debug, Args)]
pub(crate) struct BatchUpArgs {
    /// Network name (the `name` of a configuration in NETCONFPATH)
    #[arg(value_name = "NETWORK")]
    pub(crate) network: String,
    /// How many namespaces
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) count: u32,
    #[command(flatten)]
    pub(crate) common: BatchCommonArgs,
}

/// `down <network>`.
#[derive(Debug, Args)]
pub(crate) struct BatchDownArgs {
    /// Network name (its configuration, or the one cached at ADD when it is gone)
    #[arg(value_name = "NETWORK")]
    pub(crate) network: String,
    #[command(flatten)]
    pub(crate) common: BatchCommonArgs,
}

/// Options of both commands.
#[derive(Debug, Args)]
pub(crate) struct BatchCommonArgs {
    /// Namespace name prefix: letters, digits, '_', '.', '-', starting with a
    /// letter or digit and not ending with a digit
    #[arg(long, value_name = "PREFIX", default_value = crate::batch::DEFAULT_PREFIX,
          value_parser = crate::batch::parse_prefix)]
    pub(crate) prefix: String,
    /// How many namespaces are set up (or torn down) at once [default: the
    /// number of CPUs]
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) concurrency: Option<u32>,
    /// No progress on stderr
    #[arg(short, long)]
    pub(crate) quiet: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definitions_are_consistent() {
        BatchCli::command().debug_assert();
    }

    #[test]
    fn options_and_defaults() {
        let cli = BatchCli::try_parse_from([
            "cnitool-batch",
            "--ifname",
            "net0",
            "up",
            "net",
            "--count",
            "20",
            "-i",
            "net1",
        ])
        .unwrap();
        // The last one wins: cnitool passes its own -i first.
        assert_eq!(cli.ifname.as_deref(), Some("net1"));
        match cli.command {
            BatchCommand::Up(a) => {
                assert_eq!((a.network.as_str(), a.count), ("net", 20));
                assert_eq!(a.common.prefix, crate::batch::DEFAULT_PREFIX);
                assert_eq!(a.common.concurrency, None);
                assert!(!a.common.quiet);
            }
            other => panic!("parsed as {other:?}"),
        }
        let cli = BatchCli::try_parse_from([
            "cnitool-batch",
            "--json-errors",
            "down",
            "net",
            "--prefix",
            "t-",
            "--concurrency",
            "3",
            "-q",
        ])
        .unwrap();
        assert!(cli.json_errors);
        match cli.command {
            BatchCommand::Down(a) => {
                assert_eq!(
                    (a.common.prefix.as_str(), a.common.concurrency),
                    ("t-", Some(3))
                );
                assert!(a.common.quiet);
            }
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn bad_options_are_usage_errors() {
        for bad in [
            &["cnitool-batch"][..],
            &["cnitool-batch", "up", "net"],
            &["cnitool-batch", "up", "net", "--count", "0"],
            &[
                "cnitool-batch",
                "up",
                "net",
                "--count",
                "2",
                "--concurrency",
                "0",
            ],
            &[
                "cnitool-batch",
                "up",
                "net",
                "--count",
                "2",
                "--prefix",
                "ns1",
            ],
            &["cnitool-batch", "down", "net", "--prefix", ""],
            &["cnitool-batch", "down", "net", "--prefix", "a/b-"],
            &["cnitool-batch", "down"],
            &["cnitool-batch", "down", "net", "extra"],
        ] {
            assert!(BatchCli::try_parse_from(bad).is_err(), "{bad:?} parsed");
        }
    }
}
