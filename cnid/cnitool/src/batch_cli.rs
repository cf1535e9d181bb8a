//! The command line of `cnitool batch up|down`, as clap definitions only
//! (and the check of `--prefix`); what the commands do is in `batch.rs`.
//! cnitool's global options (`-i`, `--json-errors`) apply, before or after
//! the subcommand.

use clap::{Args, Subcommand};

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

/// `batch up|down`: many network namespaces on one network, for test harnesses.
#[derive(Debug, Args)]
#[command(after_help = ENV_HELP)]
pub(crate) struct BatchArgs {
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
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_PREFIX, value_parser = parse_prefix)]
    pub(crate) prefix: String,
    /// How many namespaces are set up (or torn down) at once [default: the
    /// number of CPUs]
    #[arg(long, value_name = "C", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) concurrency: Option<u32>,
    /// No progress on stderr
    #[arg(short, long)]
    pub(crate) quiet: bool,
}

/// The default namespace name prefix.
pub(crate) const DEFAULT_PREFIX: &str = "cnitool-batch-";

/// Longest prefix accepted: room for the index in a 255-byte file name.
const PREFIX_MAX: usize = 200;

/// Checks a `--prefix`: `[A-Za-z0-9][A-Za-z0-9_.-]*`, not ending with a
/// digit, at most 200 bytes.
pub(crate) fn parse_prefix(prefix: &str) -> Result<String, String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if prefix.is_empty() {
        return Err("must not be empty".into());
    }
    if prefix.len() > PREFIX_MAX {
        return Err(format!("longer than {PREFIX_MAX} bytes"));
    }
    if !prefix.starts_with(|c: char| c.is_ascii_alphanumeric()) || !prefix.chars().all(ok_char) {
        return Err(
            "expected letters, digits, '_', '.' or '-', starting with a letter or digit".into(),
        );
    }
    if prefix.ends_with(|c: char| c.is_ascii_digit()) {
        return Err("must not end with a digit (names are the prefix and a number)".into());
    }
    Ok(prefix.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// Parses `cnitool ARGS`, which must be a batch command.
    fn parse(args: &[&str]) -> Result<(Cli, BatchCommand), clap::Error> {
        let mut argv = vec!["cnitool"];
        argv.extend_from_slice(args);
        let mut cli = Cli::try_parse_from(argv)?;
        let command = match std::mem::replace(&mut cli.command, Command::Networks) {
            Command::Batch(b) => b.command,
            other => panic!("parsed as {other:?}"),
        };
        Ok((cli, command))
    }

    #[test]
    fn options_and_defaults() {
        let (cli, command) = parse(&[
            "--ifname", "net0", "batch", "up", "net", "--count", "20", "-i", "net1",
        ])
        .unwrap();
        // The last one wins.
        assert_eq!(cli.global.ifname.as_deref(), Some("net1"));
        match command {
            BatchCommand::Up(a) => {
                assert_eq!((a.network.as_str(), a.count), ("net", 20));
                assert_eq!(a.common.prefix, DEFAULT_PREFIX);
                assert_eq!(a.common.concurrency, None);
                assert!(!a.common.quiet);
            }
            other => panic!("parsed as {other:?}"),
        }
        let (cli, command) = parse(&[
            "batch",
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
        assert!(cli.global.json_errors);
        match command {
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
            &["batch"][..],
            &["batch", "up", "net"],
            &["batch", "up", "net", "--count", "0"],
            &["batch", "up", "net", "--count", "2", "--concurrency", "0"],
            &["batch", "up", "net", "--count", "2", "--prefix", "ns1"],
            &["batch", "down", "net", "--prefix", ""],
            &["batch", "down", "net", "--prefix", "a/b-"],
            &["batch", "down"],
            &["batch", "down", "net", "extra"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn prefixes() {
        for ok in ["cnitool-batch-", "t", "a.b_c-", "X-"] {
            assert_eq!(parse_prefix(ok).as_deref(), Ok(ok));
        }
        for (bad, why) in [
            ("", "empty"),
            ("ns1", "digit"),
            ("-x", "starting"),
            ("a/b", "expected"),
            ("a b", "expected"),
            ("ü-", "expected"),
        ] {
            let e = parse_prefix(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(parse_prefix(&"a".repeat(201)).is_err());
        assert!(parse_prefix(&"a".repeat(200)).is_ok());
    }
}
