//! The cnid daemon: CNI operations over HTTP/1.1 + JSON on a Unix socket.
//!
//! This module holds the whole lifecycle in [`run`], one function per
//! step; ARCHITECTURE.md ("Lifecycle") lists the steps in order and what
//! each submodule owns. Only `http` speaks HTTP.
//!
//! # Caveats
//! - **Shutdown** (SIGTERM, SIGINT): the socket stops accepting, queued
//!   operations are answered 503 (nothing of them ran), running ones finish
//!   (an ADD completes or rolls back) and their answers are written;
//!   connections with no operation in progress are closed at once. Then
//!   the socket file is removed (unless systemd owns it). If they take
//!   longer than [`Config::shutdown_timeout`] (or a second signal arrives)
//!   the daemon exits anyway; an ADD cut off that way is rolled back at the
//!   next start from its intent.
//! - **Plugins inherit the daemon's environment** (as with libcni); the
//!   systemd variables are removed first ([`SystemdEnv::take_from_env`]),
//!   and `CNID_STATE_DIR` (the canonical state dir) and `CNID_DEADLINE_MS`
//!   are added: a restart after a crash lets the plugins still running with
//!   that mark finish within their deadlines (and kills those that do not)
//!   before it rolls back their unfinished ADDs (`orphans`); it serves
//!   everything else meanwhile.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cnid::daemon::Error> {
//! let config = cnid::daemon::Config {
//!     socket: "/run/cnid/cnid.sock".into(),
//!     ..cnid::daemon::Config::default()
//! };
//! let clean = cnid::daemon::run(config).await?;
//! std::process::exit(if clean { 0 } else { 1 });
//! # }
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_async::cache::ResultCache;
use cni_async::daemon::durable::{PrivateDir, ensure_private_dir};
use cni_async::exec::{PluginExec, RawExec};
use cni_async::{Cni, Timeouts};
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod auth;
mod checker;
mod drift;
mod engine;
mod error;
mod http;
mod idle;
mod intents;
mod listen;
mod memory;
mod metrics;
mod networks;
mod operation;
mod orphans;
mod owners;
pub mod pace;
mod queue;
mod reaper;
mod slots;
mod stale_view;
mod tuning;

pub use auth::PeerPolicy;
pub use listen::SystemdEnv;

/// `m`'s guard, also after a panic of another holder (whose state every
/// user of these locks leaves consistent at each step).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The default socket path.
pub const DEFAULT_SOCKET: &str = "/run/cnid/cnid.sock";
/// The default state dir (ADD intents, the daemon's lock).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/cnid";
/// The default conf dir.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The default request body cap: 512 KiB. The largest real requests are an
/// ADD whose capability args carry a pod's annotations (Kubernetes caps
/// them at 256 KiB, JSON escaping can double that) and a GC listing every
/// attachment of a node (about 100 bytes each).
pub const DEFAULT_BODY_LIMIT: usize = 512 * 1024;
/// The largest `--body-limit` accepted.
pub const MAX_BODY_LIMIT: usize = 64 * 1024 * 1024;
/// Request bodies buffered at once over all connections (beyond their
/// first 8 KiB each): at least this, and at least twice the body cap.
pub const BODY_BUDGET: usize = 8 * 1024 * 1024;
/// The default deadline for receiving a request (head, then body).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default keep-alive idle timeout.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The default cap on open connections (kept below half the open-file
/// limit).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The default `--stale-after`.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(300);
/// The default number of operations running plugins at once.
pub const DEFAULT_MAX_PARALLEL: usize = 64;

/// The daemon's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The socket path (unused when socket-activated).
    pub socket: PathBuf,
    /// The socket's mode (default 0660).
    pub socket_mode: u32,
    /// The socket's group (default: ours).
    pub socket_group: Option<u32>,
    /// Where networks are loaded from (`NETCONFPATH`).
    pub conf_dir: PathBuf,
    /// Where plugins are looked up, in order (`CNI_PATH`).
    pub plugin_dirs: Vec<PathBuf>,
    /// The result cache dir, shared with cnitool and libcni (`CNI_CACHE_DIR`).
    pub cache_dir: PathBuf,
    /// The daemon's state dir (ADD intents).
    pub state_dir: PathBuf,
    /// Who may use the socket besides root.
    pub peers: PeerPolicy,
    /// Operations running plugins at once, across containers.
    pub max_parallel: usize,
    /// Operations running their plugins at once before others wait while
    /// the CPUs are busy (`pace`; 0 turns pacing off; by default twice the
    /// CPUs).
    pub plugin_slots: usize,
    /// Default deadline per verb (queueing included).
    pub timeouts: Timeouts,
    /// The largest deadline a request may ask for.
    pub max_timeout: Duration,
    /// The request body cap in bytes (at most [`MAX_BODY_LIMIT`]).
    pub body_limit: usize,
    /// How long a client has to send a request's head, and then its body.
    pub request_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Open connections at most (lowered to half the open-file limit).
    pub max_connections: usize,
    /// How long shutdown waits for running operations.
    pub shutdown_timeout: Duration,
    /// Watch the conf dir with inotify (SIGHUP always reloads).
    pub watch: bool,
    /// Ready (`GET /v1/health/ready`) once at least this many networks are
    /// loaded whose plugins answer VERSION (go-cni's `WithMinNetworkCount`).
    pub min_networks: usize,
    /// Refuse (409) an ADD, CHECK or DEL on another attached container's
    /// netns and ifname unless the request sets `force` (on by default).
    pub check_netns_owner: bool,
    /// How long a cached attachment's namespace must be gone before the
    /// running reaper deletes it (`None`: off; an earlier boot's are
    /// deleted at start regardless: `reaper`).
    pub stale_after: Option<Duration>,
    /// How often each cached attachment is CHECKed (`--check-every`;
    /// `None`: never, the default). Drift is reported, not repaired.
    pub check_every: Option<Duration>,
    /// Socket activation and readiness ([`SystemdEnv::take_from_env`]).
    pub systemd: SystemdEnv,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: DEFAULT_SOCKET.into(),
            socket_mode: 0o660,
            socket_group: None,
            conf_dir: DEFAULT_CONF_DIR.into(),
            plugin_dirs: cni_async::ops::DEFAULT_PLUGIN_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            cache_dir: cni_core::cache::DEFAULT_CACHE_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            peers: PeerPolicy::root_only(),
            max_parallel: DEFAULT_MAX_PARALLEL,
            plugin_slots: pace::default_slots(),
            timeouts: Timeouts::default(),
            max_timeout: Duration::from_secs(300),
            body_limit: DEFAULT_BODY_LIMIT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_timeout: Duration::from_secs(90),
            watch: true,
            min_networks: 1,
            check_netns_owner: true,
            stale_after: Some(DEFAULT_STALE_AFTER),
            check_every: None,
            systemd: SystemdEnv::default(),
        }
    }
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The state dir could not be prepared or is locked by another daemon.
    #[error("state dir {}: {reason}", path.display())]
    StateDir {
        /// The state dir.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The socket could not be bound or taken from systemd.
    #[error("socket {}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// Makes `dir` a private dir of ours (0700; one found open to others is
/// tightened, with a warning) or refuses it: a dir another user owns lets
/// that user plant the ADD intents the next start acts on.
pub(crate) fn private_state_dir(dir: &std::path::Path) -> Result<(), String> {
    match ensure_private_dir(dir).map_err(|e| format!("cannot create: {e}"))? {
        PrivateDir::Tightened { was } => {
            tracing::warn!(dir = %dir.display(), was = %format_args!("{was:04o}"),
                "state directory was open to other users; made it 0700");
            Ok(())
        }
        PrivateDir::Foreign { owner, .. } => Err(format!(
            "owned by uid {owner}, not by us (uid {}): its owner could plant ADD intents; \
             chown it or choose another state dir",
            nix::unistd::geteuid()
        )),
        _ => Ok(()),
    }
}

/// How long a start waits for the state dir's lock before it gives up.
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// How often it tries meanwhile.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// Takes the state dir's lock: one daemon per state dir. The dir is made
/// private ([`private_state_dir`]) and the lock file is 0600.
///
/// The lock is a POSIX record lock (`fcntl(F_SETLK)`), which belongs to
/// the process, not to the open file: a child of ours does not inherit it,
/// so a plugin being spawned (between `fork` and `exec`, while it holds
/// copies of our descriptors) when we are killed cannot keep it held past
/// our death, as it did a `flock`. Nothing else in the daemon opens
/// `cnid.lock` (closing any descriptor of it would drop the lock). A lock
/// still held is waited for, up to [`LOCK_WAIT`]; then the error names the
/// process holding it.
async fn lock_state_dir(dir: &std::path::Path) -> Result<File, Error> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |reason: String| Error::StateDir {
        path: dir.to_owned(),
        reason,
    };
    private_state_dir(dir).map_err(err)?;
    let path = dir.join("cnid.lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_CLOEXEC).bits())
        .open(&path)
        .map_err(|e| err(format!("cannot open {}: {e}", path.display())))?;
    // An older lock file (0644 from the umask): tighten it.
    let mode = file
        .metadata()
        .map_err(|e| err(format!("cannot stat {}: {e}", path.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| err(format!("cannot chmod {}: {e}", path.display())))?;
    }
    let until = Instant::now() + LOCK_WAIT;
    let mut warned = false;
    loop {
        match lock_file(&file) {
            Ok(true) => {
                if warned {
                    tracing::info!("state dir lock taken");
                }
                return Ok(file);
            }
            Ok(false) => {}
            Err(e) => return Err(err(format!("cannot lock {}: {e}", path.display()))),
        }
        let holder = lock_holder(&file);
        if Instant::now() >= until {
            return Err(err(format!(
                "locked by another cnid (one daemon per state dir): {} held {} for {} s",
                holder.as_deref().unwrap_or("a process"),
                path.display(),
                LOCK_WAIT.as_secs()
            )));
        }
        if !warned {
            warned = true;
            tracing::warn!(
                holder = holder.as_deref().unwrap_or("unknown"),
                wait_s = LOCK_WAIT.as_secs(),
                "state dir locked by another process; waiting for it"
            );
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// The whole-file write lock request of [`lock_file`] and [`lock_holder`].
fn whole_file_lock() -> nix::libc::flock {
    nix::libc::flock {
        l_type: nix::libc::F_WRLCK as _,
        l_whence: nix::libc::SEEK_SET as _,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
}

/// `fcntl(F_SETLK)` on the whole file: `Ok(false)` when another process
/// holds it.
fn lock_file(file: &File) -> std::io::Result<bool> {
    use nix::fcntl::{FcntlArg, fcntl};
    match fcntl(file, FcntlArg::F_SETLK(&whole_file_lock())) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Who holds the lock: `pid N (comm)`, from `fcntl(F_GETLK)`.
fn lock_holder(file: &File) -> Option<String> {
    use nix::fcntl::{FcntlArg, fcntl};
    let mut probe = whole_file_lock();
    fcntl(file, FcntlArg::F_GETLK(&mut probe)).ok()?;
    if i32::from(probe.l_type) == nix::libc::F_UNLCK || probe.l_pid <= 0 {
        return None;
    }
    let pid = probe.l_pid;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    Some(format!("pid {pid} ({}, {exe})", comm.trim()))
}

/// Whether the journal in the state dir keeps what the cache dir loses at
/// a reboot: not when the state dir is on tmpfs or ramfs and the cache dir
/// (or, before it exists, its nearest existing parent) is not.
fn journal_outlives_cache(config: &Config) -> Result<(), String> {
    let memory = |p: &std::path::Path| {
        let existing = p.ancestors().find(|a| a.exists()).unwrap_or(p);
        cni_async::daemon::on_memory_fs(existing)
            .map_err(|e| format!("cannot tell the file system of {}: {e}", existing.display()))
    };
    if memory(&config.state_dir)? && !memory(&config.cache_dir)? {
        return Err(format!(
            "the state dir {} is in memory, the cache dir {} is not",
            config.state_dir.display(),
            config.cache_dir.display()
        ));
    }
    Ok(())
}

/// Warns about plugin dirs that do not exist: each one given on the
/// command line, or the defaults when none of them exists. (Readiness
/// then says which plugins are missing.)
fn warn_missing_plugin_dirs(dirs: &[std::path::PathBuf]) {
    let missing: Vec<&std::path::PathBuf> = dirs.iter().filter(|d| !d.is_dir()).collect();
    let default_dirs = cni_async::ops::DEFAULT_PLUGIN_DIRS.map(std::ffi::OsStr::new);
    let defaults = dirs.iter().map(|d| d.as_os_str()).eq(default_dirs);
    if missing.is_empty() || (defaults && missing.len() < dirs.len()) {
        return;
    }
    for d in missing {
        tracing::warn!(dir = %d.display(), "plugin dir does not exist (or is not a directory): no plugin will be found there");
    }
}

/// Runs the daemon until SIGTERM or SIGINT. Returns `Ok(true)` after a
/// clean drain, `Ok(false)` when operations were still running when the
/// shutdown bound expired (or a second signal came).
pub async fn run(config: Config) -> Result<bool, Error> {
    let _state_lock = lock_state_dir(&config.state_dir).await?;
    let (intents, cache) = open_journal(&config)?;
    // Every connection and every running plugin's pipes take descriptors.
    let nofile = tuning::raise_nofile_limit();
    memory::tune_allocator();
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signals)?;

    let metrics = Arc::new(metrics::Metrics::default());
    let networks = Arc::new(networks::Networks::new(
        config.conf_dir.clone(),
        &config.socket,
        metrics.clone(),
    ));
    networks.reload().await;
    // Plugins carry the state dir's mark, so that a restart after a crash
    // finds the ones still running and stops them before the recovery.
    let mark = orphans::mark_value(&config.state_dir);
    let pace = Arc::new(pace::Pace::new(config.plugin_slots, metrics.clone()));
    let cni = build_cni(&config, cache, &metrics, &mark, &pace);
    let (listener, created) = take_listener(&config)?;

    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    // Lending goes on through the shutdown's drain, where operations still
    // wait for slots: it ends when `run` returns, not at `stop`.
    let lending = CancellationToken::new();
    let _lending = lending.clone().drop_guard();
    tokio::spawn(pace.clone().lend(lending));
    let cni_cache = cni.cache().clone();
    let (stale, drift) = (Arc::default(), Arc::default());
    let journal = intents.clone();
    let engine = engine::Engine::new(engine::Parts {
        cni,
        networks: networks.clone(),
        kept: std::sync::Mutex::new(intents.carried_records()),
        intents,
        sched: Arc::new(queue::Scheduler::new(config.max_parallel, metrics.clone())),
        metrics: metrics.clone(),
        deadlines: engine::Deadlines {
            defaults: config.timeouts,
            max: config.max_timeout,
        },
        tracker: tracker.clone(),
        min_networks: config.min_networks,
        owners: owners::Owners::new(cni_cache.clone()),
        check_netns_owner: config.check_netns_owner,
        stale: Arc::clone(&stale),
        drift: Arc::clone(&drift),
        pace,
    });
    before_requests(&engine, &mark, &tracker, &stop).await;
    let shared = (cni_cache, networks.clone(), metrics);
    let reaper = reaper::Reaper::new(
        engine.submitter(),
        shared.clone(),
        stale.clone(),
        config.stale_after,
    );
    start_reaper(reaper, &config, &tracker, &stop).await;
    if let Some(every) = config.check_every {
        tracing::info!(
            every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
            "periodic CHECK of every attachment on"
        );
        let checker = checker::Checker::new(engine.submitter(), shared, (drift, stale), every);
        tracker.spawn(checker.run(stop.clone()));
    }
    let watch = networks::Watch::start(networks, config.watch);
    tracker.spawn(watch.run(stop.clone()));
    // The path clients reach: systemd's, when socket-activated.
    let socket = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_else(|| config.socket.clone());
    tracker.spawn(journal.clone().flush_loop(stop.clone()));
    let server = start_serving(&config, nofile, listener, &engine, &tracker, &stop);
    announce_ready(&engine, &config, &socket).await;

    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(
        signal = which,
        "shutting down: no new requests; finishing running operations"
    );
    let drained = shut_down(
        (&engine, &journal),
        &config,
        (server, created.as_deref()),
        &tracker,
        &stop,
        (&mut term, &mut int),
    )
    .await;
    Ok(drained)
}

/// How long the exit waits for the runtime's blocking-pool threads once
/// [`run`] has returned.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Runs `daemon` (the future of [`run`]) on a runtime of `workers` worker
/// threads, then shuts the runtime down, waiting at most `grace` for its
/// blocking-pool threads.
///
/// Dropping a runtime waits for every blocking-pool thread: one stuck in a
/// read or an fsync on a hung disk would hold the exit forever, after
/// SIGTERM too. Past `grace` such a thread is left to the process's exit.
/// A journal flush cut off so is a crash to the next start, which the
/// journal recovers from (`intents`: the operation was not answered, its
/// ADD is rolled back). A thread in uninterruptible disk sleep still
/// delays the kernel's end of the process; this bounds our own wait.
pub fn block_on<T>(
    workers: usize,
    grace: Duration,
    daemon: impl std::future::Future<Output = T>,
) -> std::io::Result<T> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .max_blocking_threads(16)
        .thread_name("cnid")
        .enable_all()
        .build()?;
    let out = runtime.block_on(daemon);
    runtime.shutdown_timeout(grace);
    Ok(out)
}

/// The ADD journal and the result cache, which the journal's commit lines
/// make durable (the cache then writes without fsync, on the calling
/// worker: `intents`) unless the journal cannot stand for it: on a file
/// system a reboot empties while the cache's is not, or without a boot id.
fn open_journal(config: &Config) -> Result<(intents::Intents, ResultCache), Error> {
    let intents = intents::Intents::new(&config.state_dir);
    let deferred = match journal_outlives_cache(config) {
        Ok(()) if intents.knows_boot() => true,
        Ok(()) => {
            tracing::info!("boot id unreadable: the result cache flushes its own records");
            false
        }
        Err(why) => {
            tracing::info!("{why}: the result cache flushes its own records");
            false
        }
    };
    let cache = ResultCache::new(config.cache_dir.clone())
        .with_durable(!deferred)
        .with_inline_io(true);
    let intents = intents.with_cache(cache.clone(), deferred);
    intents.prepare().map_err(|e| Error::StateDir {
        path: config.state_dir.clone(),
        reason: e.to_string(),
    })?;
    Ok((intents, cache))
}

/// The `Cni` of the daemon: plugins run by [`RawExec`] with the weight of
/// a paced burst (`pace`), timed for the
/// metrics and carrying the state dir's `mark` (`orphans`), looked up in
/// the plugin dirs (those missing are warned about), with the netns check.
fn build_cni(
    config: &Config,
    cache: ResultCache,
    metrics: &Arc<metrics::Metrics>,
    mark: &str,
    pace: &Arc<pace::Pace>,
) -> Cni {
    let raw = Arc::new(pace::PacedExec::new(Arc::new(RawExec::new()), pace.clone()));
    let timed = metrics::TimedExec {
        inner: raw,
        metrics: metrics.clone(),
    };
    let exec: Arc<dyn PluginExec> = Arc::new(orphans::MarkedExec {
        inner: Arc::new(timed),
        value: mark.to_owned(),
    });
    warn_missing_plugin_dirs(&config.plugin_dirs);
    let cni = Cni::builder()
        .plugin_dirs(config.plugin_dirs.clone())
        .cache(cache)
        .exec(exec)
        .timeouts(config.timeouts)
        .check_netns(true)
        .build();
    cni.cache().tighten_dirs();
    cni
}

/// The listener: from systemd, or bound by us (then its path is returned,
/// to be removed at exit).
fn take_listener(config: &Config) -> Result<(UnixListener, Option<PathBuf>), Error> {
    let socket_err = |source| Error::Socket {
        path: config.socket.clone(),
        source,
    };
    Ok(
        match config.systemd.activated_listener().map_err(socket_err)? {
            Some(l) => {
                let path = l
                    .local_addr()
                    .ok()
                    .and_then(|a| a.as_pathname().map(Path::to_path_buf));
                tracing::info!(socket = ?path, "using the socket passed by systemd");
                (l, None)
            }
            None => {
                let l = listen::bind(&config.socket, config.socket_mode, config.socket_group)
                    .map_err(socket_err)?;
                (l, Some(config.socket.clone()))
            }
        },
    )
}

/// What must be done before any request is served: the plugins a killed
/// predecessor left running found, the ADDs that never completed queued
/// for their rollback (`Engine::recover`), and the orphans' containers
/// held until they are gone, in a task of their own (`orphans`).
async fn before_requests(
    engine: &Arc<engine::Engine>,
    mark: &str,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    // Plugins a killed predecessor left running would race the recovery
    // and the requests on their attachments: those wait for them.
    let found = orphans::find_orphans(mark).await;
    // Unfinished ADDs go first in their containers' queues; an orphan's
    // once it is gone.
    let mut deferred = match engine.recover(&found).await {
        Ok((n, deferred)) => {
            if n > 0 {
                tracing::warn!(count = n, "rolling back ADDs that never completed");
            }
            deferred
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot scan the ADD intents");
            Default::default()
        }
    };
    if found.is_empty() {
        return;
    }
    // Each held container is released when its last orphan is gone.
    let mut left: std::collections::HashMap<String, (usize, bool)> = Default::default();
    for o in &found {
        if let Some(key) = orphans::hold_key(o) {
            left.entry(key.to_owned()).or_default().0 += 1;
        }
    }
    let engine = engine.clone();
    let stop = stop.clone();
    tracker.spawn(async move {
        orphans::settle(found, RawExec::DEFAULT_KILL_GRACE, stop, |o, killed| {
            let Some(key) = orphans::hold_key(o) else {
                return;
            };
            let Some(entry) = left.get_mut(key) else {
                return;
            };
            entry.0 -= 1;
            entry.1 |= killed;
            if entry.0 == 0 {
                let killed = entry.1;
                left.remove(key);
                let unfinished = deferred.remove(key).unwrap_or_default();
                engine.release_orphaned(key, unfinished, killed);
            }
        })
        .await;
    });
}

/// The stale-attachment reaper: its pass at start over the attachments an
/// earlier boot left whose namespaces are gone (ahead of any request),
/// then its passes while cnid runs.
async fn start_reaper(
    mut stale_reaper: reaper::Reaper,
    config: &Config,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) {
    match stale_reaper.pass().await {
        0 => {}
        n => tracing::warn!(
            count = n,
            "deleting stale attachments (their namespaces are gone)"
        ),
    }
    // With `--stale-after 0` the passes go on too, judging only an
    // earlier boot's attachments: what the start's pass could not get done
    // (a DEL out of time, a reap out of time while queued) is tried again.
    let every = reaper::interval(config.stale_after.unwrap_or(DEFAULT_STALE_AFTER));
    tracker.spawn(stale_reaper.run(every, stop.clone()));
}

/// Starts the journal's flush task, the heap trimmer and the HTTP server
/// (its connection cap at most half the open-file limit `nofile`).
fn start_serving(
    config: &Config,
    nofile: Option<u64>,
    listener: UnixListener,
    engine: &Arc<engine::Engine>,
    tracker: &TaskTracker,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let max_connections = http::conns::effective_cap(config.max_connections, nofile);
    if max_connections < config.max_connections {
        tracing::info!(
            max_connections,
            configured = config.max_connections,
            nofile = nofile.unwrap_or(0),
            "connection cap lowered to half the open-file limit"
        );
    }
    let body_limit = config.body_limit.clamp(1, MAX_BODY_LIMIT);
    let settings = Arc::new(http::HttpSettings {
        peers: config.peers.clone(),
        body_limit,
        body_budget: Arc::new(tokio::sync::Semaphore::new(BODY_BUDGET.max(2 * body_limit))),
        limits: http::conns::Limits {
            request_timeout: config.request_timeout,
            idle_timeout: config.idle_timeout,
        },
        conns: Arc::new(http::conns::Conns::new(max_connections)),
        warnings: http::conns::Warnings::new(),
        trim: Arc::new(memory::HeapTrim::default()),
    });
    tracker.spawn(memory::trim_heap(
        settings.trim.clone(),
        settings.conns.clone(),
        stop.clone(),
    ));
    tracker.spawn(http::serve(
        listener,
        engine.clone(),
        settings,
        stop.clone(),
        tracker.clone(),
    ))
}

/// Says whether cnid is ready (without running plugins: probes do that),
/// in the log and to systemd.
async fn announce_ready(engine: &engine::Engine, config: &Config, socket: &Path) {
    let (cni, min) = engine.readiness_of();
    match engine.networks().readiness_at_start(cni, min).await {
        Ok(_) => {
            tracing::info!(socket = %socket.display(), conf_dir = %config.conf_dir.display(),
            cache_dir = %config.cache_dir.display(), state_dir = %config.state_dir.display(), "cnid ready")
        }
        Err(e) => {
            tracing::warn!(socket = %socket.display(), conf_dir = %config.conf_dir.display(),
            cache_dir = %config.cache_dir.display(), state_dir = %config.state_dir.display(),
            reason = %e.reason, "cnid serving, not ready")
        }
    }
    if let Some(ns) = &config.systemd.notify_socket
        && let Err(e) = listen::notify(ns, "READY=1")
    {
        tracing::warn!(error = %e, "sd_notify READY=1 failed");
    }
}

/// The shutdown after the first signal (the module's caveats): returns
/// whether every running operation finished.
async fn shut_down(
    (engine, journal): (&engine::Engine, &intents::Intents),
    config: &Config,
    (server, created): (tokio::task::JoinHandle<()>, Option<&std::path::Path>),
    tracker: &TaskTracker,
    stop: &CancellationToken,
    (term, int): (
        &mut tokio::signal::unix::Signal,
        &mut tokio::signal::unix::Signal,
    ),
) -> bool {
    if let Some(ns) = &config.systemd.notify_socket {
        let _ = listen::notify(ns, "STOPPING=1");
    }
    stop.cancel();
    let cancelled = engine.scheduler().stop_accepting();
    if cancelled > 0 {
        tracing::info!(count = cancelled, "queued operations refused");
    }
    let _ = server.await;
    if let Some(path) = created
        && let Err(e) = std::fs::remove_file(path)
    {
        tracing::warn!(socket = %path.display(), error = %e, "cannot remove the socket");
    }
    tracker.close();
    let drained = tokio::select! {
        () = tracker.wait() => true,
        () = tokio::time::sleep(config.shutdown_timeout) => {
            tracing::error!(timeout_s = config.shutdown_timeout.as_secs(), "operations still running at the shutdown bound; exiting (unfinished ADDs roll back at the next start)");
            false
        }
        _ = term.recv() => { tracing::error!("second signal: exiting now"); false }
        _ = int.recv() => { tracing::error!("second signal: exiting now"); false }
    };
    if drained {
        journal.close();
        tracing::info!("all operations finished; bye");
    }
    drained
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    /// A blocking-pool thread stuck for good (a read on a hung disk) does
    /// not hold the exit: [`super::block_on`] returns once its grace is
    /// over. Dropping the runtime instead waits for the thread forever.
    #[test]
    fn a_stuck_blocking_thread_does_not_hold_the_exit() {
        let (gate, stuck) = mpsc::channel::<()>();
        let (done, returned) = mpsc::channel();
        std::thread::spawn(move || {
            let out = super::block_on(1, super::Duration::from_millis(50), async move {
                let (started, running) = tokio::sync::oneshot::channel();
                tokio::task::spawn_blocking(move || {
                    let _ = started.send(());
                    // Never released while the runtime shuts down.
                    let _ = stuck.recv();
                });
                running.await.is_ok()
            });
            let _ = done.send(out.map_err(|e| e.to_string()));
        });
        let out = returned.recv_timeout(super::Duration::from_secs(60));
        assert_eq!(out, Ok(Ok(true)), "the exit waited for the stuck thread");
        drop(gate);
    }
}
