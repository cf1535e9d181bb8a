//! `cnid`: the CNI runtime daemon. See `cnid --help` and `cnid/API.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use cnid::daemon::{self, Config, PeerPolicy, SystemdEnv};

/// CNI runtime daemon: ADD, DEL, CHECK, STATUS and GC over HTTP/1.1 + JSON
/// on a Unix socket, one operation at a time per container.
///
/// Environment: NETCONFPATH, CNI_PATH (':'-separated), CNI_CACHE_DIR and
/// CNID_SOCKET are used when the matching flag is absent (as cnitool);
/// RUST_LOG sets the log filter (default "info"). Socket activation
/// (LISTEN_FDS) and NOTIFY_SOCKET are honoured.
#[derive(Debug, Parser)]
#[command(name = "cnid", version = env!("CNID_BUILD_VERSION"))]
struct Cli {
    /// Socket path [env: CNID_SOCKET] [default: /run/cnid/cnid.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Group owning the socket (name or gid) [default: root's].
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// Socket mode, octal.
    #[arg(long, value_name = "MODE", default_value = "0660", value_parser = parse_mode)]
    socket_mode: u32,
    /// Network configuration dir [env: NETCONFPATH] [default: /etc/cni/net.d].
    #[arg(long, value_name = "DIR")]
    conf_dir: Option<PathBuf>,
    /// Plugin dir, in lookup order; repeat for several [env: CNI_PATH]
    /// [default: /opt/cni/bin, /usr/lib/cni].
    #[arg(long = "plugin-dir", value_name = "DIR")]
    plugin_dirs: Vec<PathBuf>,
    /// Result cache dir, shared with cnitool and libcni [env: CNI_CACHE_DIR]
    /// [default: /var/lib/cni].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// State dir for ADD intents (crash safety).
    #[arg(long, value_name = "DIR", default_value = daemon::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// A uid allowed to use the socket besides root; repeat or comma-separate.
    #[arg(long = "allow-uid", value_name = "UID", value_delimiter = ',')]
    allow_uids: Vec<u32>,
    /// A primary gid (number or group name) allowed to use the socket;
    /// repeat or comma-separate.
    #[arg(long = "allow-gid", value_name = "GID", value_delimiter = ',')]
    allow_gids: Vec<String>,
    /// Operations running plugins at once (across containers).
    #[arg(long, value_name = "N", default_value_t = daemon::DEFAULT_MAX_PARALLEL)]
    max_parallel: usize,
    /// Operations running their plugins at once before the next waits for
    /// one of them to end (at most 15 s or a quarter of its deadline; a slot
    /// is held 10 s at most); while others wait, their plugins run with a
    /// larger CPU weight, and while a CPU idles a waiting one runs without a
    /// slot. 0: no pacing. [default: twice the CPUs]
    #[arg(long, value_name = "N")]
    plugin_slots: Option<usize>,
    /// Default ADD deadline (queueing included): 60s, 500ms, 2m.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    timeout_add: Duration,
    /// Default DEL deadline.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    timeout_del: Duration,
    /// Default CHECK deadline.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    timeout_check: Duration,
    /// Default STATUS deadline.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    timeout_status: Duration,
    /// Default GC deadline.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    timeout_gc: Duration,
    /// The largest deadline a request may ask for (timeoutMs).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    max_timeout: Duration,
    /// How long shutdown waits for running operations.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// Request body cap in bytes (suffixes K and M: 1024-based; at most 64M).
    #[arg(long, value_name = "BYTES", default_value = "512K", value_parser = parse_size)]
    body_limit: usize,
    /// How long a client has to send a request's head, and then as long
    /// for its body; a connection past it is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Open connections at most (lowered to half the open-file limit); at
    /// the cap a new connection replaces the one that waited longest
    /// without a request in progress, or gets 503 if all are busy.
    #[arg(long, value_name = "N", default_value_t = daemon::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Ready (GET /v1/health/ready answers 200) once at least this many
    /// networks are loaded whose plugins answer VERSION; 503 with the
    /// reason until then.
    #[arg(long, value_name = "N", default_value_t = 1)]
    min_networks: usize,
    /// Do not watch the conf dir with inotify (reload on SIGHUP only).
    #[arg(long)]
    no_watch: bool,
    /// Refuse (409, naming the owner) an ADD, CHECK or DEL whose netns and
    /// ifname belong to another attached container, unless the request
    /// sets "force": true. On by default; the last of this and
    /// --no-check-netns-owner wins.
    #[arg(long, overrides_with = "no_check_netns_owner")]
    check_netns_owner: bool,
    /// Run ADD, CHECK and DEL even when their netns and ifname belong to
    /// another attached container (turns the default owner check off).
    #[arg(long, overrides_with = "check_netns_owner")]
    no_check_netns_owner: bool,
    /// Delete a cached attachment whose network namespace has been gone
    /// this long (its runtime never sent DEL); 0 turns this off. Cached
    /// attachments of an earlier boot whose namespaces are gone are
    /// deleted regardless (at start, then checked every 30 s).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = cnid::shim::conf::parse_duration)]
    stale_after: Duration,
    /// CHECK each cached attachment about this often, spread over the
    /// interval, and report those whose CHECK fails ("drifted" in
    /// /v1/attachments; nothing is repaired). 0 (the default) turns it off.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = cnid::shim::conf::parse_duration)]
    check_every: Duration,
    /// Runtime worker threads.
    #[arg(long, value_name = "N", default_value_t = 2)]
    worker_threads: usize,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("not an octal mode: {e}"))?;
    if m > 0o777 {
        return Err("mode must be at most 0777".into());
    }
    Ok(m)
}

/// A positive duration (`N`, `Nms`, `Ns`, `Nm`), parsed as cnid-shim's
/// `timeout`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = cnid::shim::conf::parse_duration(s)?;
    if d.is_zero() {
        return Err("duration must be positive".into());
    }
    Ok(d)
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.strip_suffix(['K', 'k']) {
        Some(n) => (n, 1024),
        None => match s.strip_suffix('M') {
            Some(n) => (n, 1024 * 1024),
            None => (s, 1),
        },
    };
    let n: usize = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    n.checked_mul(mult)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid size {s:?}"))
}

fn gid_of(group: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => bail!("no group named {group:?}"),
        Err(e) => Err(e).with_context(|| format!("cannot look up group {group:?}")),
    }
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn config(cli: Cli, systemd: SystemdEnv) -> anyhow::Result<(Config, usize)> {
    let defaults = Config::default();
    let plugin_dirs = if !cli.plugin_dirs.is_empty() {
        cli.plugin_dirs
    } else if let Some(p) = std::env::var_os("CNI_PATH").filter(|v| !v.is_empty()) {
        std::env::split_paths(&p).collect()
    } else {
        defaults.plugin_dirs.clone()
    };
    let gids = cli
        .allow_gids
        .iter()
        .map(|g| gid_of(g))
        .collect::<anyhow::Result<Vec<u32>>>()
        .context("--allow-gid")?;
    let socket_group = cli
        .socket_group
        .as_deref()
        .map(gid_of)
        .transpose()
        .context("--socket-group")?;
    if cli.max_parallel == 0 {
        bail!("--max-parallel must be at least 1");
    }
    if cli.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    if cli.body_limit > daemon::MAX_BODY_LIMIT {
        bail!(
            "--body-limit {} is over the maximum {} (64M)",
            cli.body_limit,
            daemon::MAX_BODY_LIMIT
        );
    }
    let config = Config {
        socket: cli
            .socket
            .or_else(|| env_path("CNID_SOCKET"))
            .unwrap_or(defaults.socket),
        socket_mode: cli.socket_mode,
        socket_group,
        conf_dir: cli
            .conf_dir
            .or_else(|| env_path("NETCONFPATH"))
            .unwrap_or(defaults.conf_dir),
        plugin_dirs,
        cache_dir: cli
            .cache_dir
            .or_else(|| env_path("CNI_CACHE_DIR"))
            .unwrap_or(defaults.cache_dir),
        state_dir: cli.state_dir,
        peers: PeerPolicy {
            uids: cli.allow_uids,
            gids,
        },
        max_parallel: cli.max_parallel,
        plugin_slots: cli.plugin_slots.unwrap_or_else(daemon::pace::default_slots),
        timeouts: cni_async::Timeouts {
            add: cli.timeout_add,
            del: cli.timeout_del,
            check: cli.timeout_check,
            status: cli.timeout_status,
            gc: cli.timeout_gc,
            ..cni_async::Timeouts::default()
        },
        max_timeout: cli.max_timeout,
        body_limit: cli.body_limit,
        request_timeout: cli.request_timeout,
        idle_timeout: cli.idle_timeout,
        max_connections: cli.max_connections,
        shutdown_timeout: cli.shutdown_timeout,
        watch: !cli.no_watch,
        min_networks: cli.min_networks,
        check_netns_owner: !cli.no_check_netns_owner,
        stale_after: (!cli.stale_after.is_zero()).then_some(cli.stale_after),
        check_every: (!cli.check_every.is_zero()).then_some(cli.check_every),
        systemd,
    };
    Ok((config, cli.worker_threads.max(1)))
}

/// What cnid's man page (section 8) says beyond its clap definitions.
const MANUAL: cnid::generate::Extras = cnid::generate::Extras {
    section: "8",
    sections: &[
        (
            "ENVIRONMENT",
            "\
NETCONFPATH    conf dir when --conf-dir is not given [default: /etc/cni/net.d]
CNI_PATH       plugin dirs, ':'-separated, when no --plugin-dir is given
CNI_CACHE_DIR  result cache dir when --cache-dir is not given [default: /var/lib/cni]
CNID_SOCKET    socket when --socket is not given [default: /run/cnid/cnid.sock]
RUST_LOG       log filter (tracing) [default: info]; logs go to stderr
LISTEN_PID, LISTEN_FDS
               socket activation: the socket systemd passes (cnid.socket)
NOTIFY_SOCKET  readiness and stopping reported to systemd (Type=notify)",
        ),
        (
            "EXIT STATUS",
            "\
0  stopped by SIGTERM or SIGINT after every running operation ended
1  could not start (a flag's value, the state dir held by another cnid, the
   socket), or stopped with operations still running when --shutdown-timeout
   expired or a second signal came (they are rolled back at the next start)
2  usage error: an unknown option, a missing value",
        ),
        (
            "FILES",
            "\
/etc/cni/net.d             network configurations (--conf-dir)
/opt/cni/bin, /usr/lib/cni plugins (--plugin-dir)
/var/lib/cni/results       cached ADD results, shared with cnitool and libcni (--cache-dir)
/var/lib/cni/locks         a lock per attachment while an operation runs on it
/var/lib/cnid/cnid.lock    held while cnid runs: one cnid per state dir (--state-dir)
/var/lib/cnid/intents/     the ADD journal, for the rollback after a crash
/run/cnid/cnid.sock        the API socket (--socket), removed at exit when cnid made it",
        ),
        (
            "SIGNALS",
            "\
SIGTERM, SIGINT  stop accepting, let running operations end (at most
                 --shutdown-timeout), exit; a second signal exits at once
SIGHUP           reload the conf dir (also done on changes, unless --no-watch)",
        ),
    ],
    bash: "",
};

fn main() -> ExitCode {
    // SAFETY: first thing in main; no other thread exists yet.
    let systemd = unsafe { SystemdEnv::take_from_env() };
    if let Some(status) = cnid::generate::intercept(<Cli as clap::CommandFactory>::command, &MANUAL)
    {
        return status;
    }
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .fmt_fields(cnid::logfmt::escaping_fields())
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (config, workers) = match config(cli, systemd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cnid: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match daemon::block_on(workers, daemon::EXIT_GRACE, daemon::run(config)) {
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) => ExitCode::FAILURE,
        Ok(Err(e)) => {
            eprintln!("cnid: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cnid: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1h").is_err());
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_mode("0660").unwrap(), 0o660);
        assert!(parse_mode("999").is_err());
    }
}
