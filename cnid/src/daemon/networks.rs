//! The networks loaded from the conf dir, and their reloading.
//!
//! The conf dir is parsed as a whole ([`cni_core::confdir::scan`]); each
//! request takes a snapshot (an `Arc`) of the result, so a reload never
//! changes the configuration under an operation that already started. A
//! file that does not parse is logged and listed in `GET /v1/networks`
//! under `errors`; the other networks stay usable.
//!
//! Reloads happen on SIGHUP and, unless disabled, when the conf dir changes
//! (inotify). The watcher is robust to the conf dir being removed and
//! recreated (or replaced by a rename, or a symlink swap as in Kubernetes
//! ConfigMap volumes): it watches the parent dir for the conf dir's name,
//! the conf dir itself, and its subdirectories (where
//! `<network name>/*.conf` plugin files live), and re-arms after every
//! reload. Events are debounced (100 ms) so an editor's write-rename dance
//! is one reload. When even the parent dir is missing, it retries every 2 s.
//!
//! # Caveats
//! inotify does not see changes on some network filesystems; use SIGHUP
//! there (`--no-watch` turns the watcher off).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cni_core::NetworkConfigList;
use cni_core::confdir;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::api::{ConfigError, NetworkInfo, NetworksResponse};

/// How long events are collected before a reload.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How often arming is retried while the conf dir's parent is missing.
const REARM_RETRY: Duration = Duration::from_secs(2);

/// One usable network.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) path: PathBuf,
    pub(crate) list: Arc<NetworkConfigList>,
    pub(crate) shadowed: Vec<PathBuf>,
}

/// The conf dir as of one reload.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) generation: u64,
    pub(crate) loaded_at_ms: u64,
    /// In conf-dir file order (the first is the default network), one per
    /// name as lookup by name picks it.
    pub(crate) networks: Vec<Arc<Loaded>>,
    by_name: HashMap<String, Arc<Loaded>>,
    pub(crate) errors: Vec<ConfigError>,
}

impl Snapshot {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Loaded>> {
        self.by_name.get(name)
    }
}

/// The loaded networks of one conf dir.
#[derive(Debug)]
pub(crate) struct Networks {
    dir: PathBuf,
    current: RwLock<Arc<Snapshot>>,
    metrics: Arc<Metrics>,
}

impl Networks {
    pub(crate) fn new(dir: PathBuf, metrics: Arc<Metrics>) -> Self {
        Networks {
            dir,
            current: RwLock::new(Arc::new(Snapshot::default())),
            metrics,
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The network named `name`, if loaded.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Loaded>> {
        self.snapshot().get(name).cloned()
    }

    /// Re-reads the conf dir (blocking: call from a blocking context) and
    /// logs what changed.
    pub(crate) fn reload_blocking(&self) {
        let old = self.snapshot();
        let mut snap = Snapshot {
            generation: old.generation + 1,
            loaded_at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            ..Default::default()
        };
        match confdir::scan(&self.dir) {
            Ok(scan) => {
                // One network per name, picked as libcni's lookup by name
                // does, in the order of the conf dir's files.
                for found in scan.unique() {
                    let name = found.list.name();
                    if let Err(e) = cni_core::validate::network_name(name) {
                        snap.errors.push(ConfigError {
                            file: found.path.display().to_string(),
                            reason: e.to_string(),
                        });
                        continue;
                    }
                    let l = Arc::new(Loaded {
                        path: found.path.clone(),
                        list: Arc::new(found.list.clone()),
                        shadowed: scan
                            .shadowed(found)
                            .into_iter()
                            .map(Path::to_path_buf)
                            .collect(),
                    });
                    snap.by_name.insert(name.to_owned(), l.clone());
                    snap.networks.push(l);
                }
                for s in scan.skipped {
                    snap.errors.push(ConfigError {
                        file: s.path.display().to_string(),
                        reason: s.reason,
                    });
                }
            }
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the conf dir");
                snap.errors.push(ConfigError {
                    file: self.dir.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
        log_changes(&old, &snap);
        self.metrics
            .networks
            .store(snap.networks.len() as i64, Ordering::Relaxed);
        self.metrics
            .config_errors
            .store(snap.errors.len() as i64, Ordering::Relaxed);
        self.metrics.reloads.fetch_add(1, Ordering::Relaxed);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
    }

    /// Reloads on the blocking pool.
    pub(crate) async fn reload(self: &Arc<Self>) {
        let this = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || this.reload_blocking()).await {
            tracing::error!(error = %e, "conf dir reload task failed");
        }
    }

    /// `GET /v1/networks`.
    pub(crate) fn describe(&self) -> NetworksResponse {
        let snap = self.snapshot();
        NetworksResponse {
            conf_dir: self.dir.display().to_string(),
            generation: snap.generation,
            loaded_at_ms: snap.loaded_at_ms,
            networks: snap.networks.iter().map(|n| info(n, false)).collect(),
            errors: snap.errors.clone(),
        }
    }
}

/// The API view of a loaded network.
pub(crate) fn info(n: &Loaded, with_config: bool) -> NetworkInfo {
    let list = &n.list;
    NetworkInfo {
        name: list.name().to_owned(),
        file: n.path.display().to_string(),
        cni_version: list.version().to_string(),
        plugins: list
            .plugins()
            .iter()
            .map(|p| p.plugin_type().to_owned())
            .collect(),
        capabilities: list.capabilities(),
        disable_check: list.disable_check(),
        disable_gc: list.disable_gc(),
        shadowed: n.shadowed.iter().map(|p| p.display().to_string()).collect(),
        config: with_config.then(|| {
            serde_json::from_slice(&list.cache_bytes()).unwrap_or(serde_json::Value::Null)
        }),
    }
}

fn log_changes(old: &Snapshot, new: &Snapshot) {
    for n in &new.networks {
        match old.get(n.list.name()) {
            None => {
                tracing::info!(network = n.list.name(), file = %n.path.display(), "network loaded")
            }
            Some(o) if o.list != n.list || o.path != n.path => {
                tracing::info!(network = n.list.name(), file = %n.path.display(), "network changed")
            }
            Some(_) => {}
        }
    }
    for o in &old.networks {
        if new.get(o.list.name()).is_none() {
            tracing::info!(network = o.list.name(), file = %o.path.display(), "network removed");
        }
    }
    for e in &new.errors {
        if !old.errors.contains(e) {
            tracing::warn!(file = %e.file, reason = %e.reason, "network configuration file not usable");
        }
    }
}

/// An inotify instance with the watches of one conf dir.
struct Watcher {
    fd: AsyncFd<InotifyFd>,
    dir: PathBuf,
    /// Watches on the parent, the conf dir and its subdirs.
    watches: HashMap<PathBuf, WatchDescriptor>,
}

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn dir_flags() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

fn parent_flags() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_ONLYDIR
}

impl Watcher {
    fn new(dir: &Path) -> std::io::Result<Watcher> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(std::io::Error::from)?;
        // SAFETY: the Inotify owns its fd, which stays open (and the same)
        // until the AsyncFd, and with it the Inotify, is dropped.
        let fd = unsafe {
            AsyncFd::register_with_interest(InotifyFd(ino), tokio::io::Interest::READABLE)
        }?;
        Ok(Watcher {
            fd,
            dir: dir.to_owned(),
            watches: HashMap::new(),
        })
    }

    /// Adds the watches that are missing; returns whether the conf dir itself
    /// is watched.
    fn arm(&mut self) -> bool {
        let mut want: Vec<(PathBuf, AddWatchFlags)> = Vec::new();
        if let Some(parent) = self.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            want.push((parent.to_owned(), parent_flags()));
        }
        want.push((self.dir.clone(), dir_flags()));
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                // Follows symlinks: `..data` of a ConfigMap volume is one.
                if e.path().is_dir() {
                    want.push((e.path(), dir_flags()));
                }
            }
        }
        // Forget watches of dirs that are gone (the kernel dropped them).
        self.watches.retain(|p, _| p.exists());
        for (path, flags) in want {
            if self.watches.contains_key(&path) {
                continue;
            }
            match self.fd.get_ref().0.add_watch(&path, flags) {
                Ok(wd) => {
                    self.watches.insert(path, wd);
                }
                Err(e) => {
                    tracing::debug!(dir = %path.display(), error = %e, "cannot watch (yet)")
                }
            }
        }
        self.watches.contains_key(&self.dir)
    }

    /// Waits for events; drains them. Errors end watching.
    async fn wait(&mut self) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(events)) => {
                    for ev in &events {
                        if ev.mask.intersects(
                            AddWatchFlags::IN_IGNORED
                                | AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF,
                        ) {
                            // The watched dir is gone: forget its watch.
                            self.watches.retain(|_, wd| *wd != ev.wd);
                        }
                    }
                    return Ok(());
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    fn drain(&mut self) {
        while let Ok(events) = self.fd.get_ref().0.read_events() {
            if events.is_empty() {
                break;
            }
            for ev in &events {
                if ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                ) {
                    self.watches.retain(|_, wd| *wd != ev.wd);
                }
            }
        }
    }
}

/// Reloads on SIGHUP and on conf dir changes until `stop` is cancelled.
pub(crate) async fn watch(networks: Arc<Networks>, inotify: bool, stop: CancellationToken) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot handle SIGHUP; reload on SIGHUP disabled");
            None
        }
    };
    let mut watcher = if inotify {
        match Watcher::new(networks.dir()) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::error!(error = %e, "cannot start inotify; reload only on SIGHUP");
                None
            }
        }
    } else {
        None
    };
    let mut armed = watcher.as_mut().is_some_and(Watcher::arm);
    // The first load happened before we armed: a change in between is
    // caught by reloading once more now that the watches are in place.
    if watcher.is_some() {
        networks.reload().await;
    }
    loop {
        let changed = async {
            match watcher.as_mut() {
                Some(w) => {
                    if armed {
                        w.wait().await
                    } else {
                        // The conf dir (or its parent) is missing: wait for
                        // it on the parent's watch, and retry arming anyway.
                        tokio::select! {
                            r = w.wait() => r,
                            () = tokio::time::sleep(REARM_RETRY) => Ok(()),
                        }
                    }
                }
                None => std::future::pending().await,
            }
        };
        let sighup = async {
            match hup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            _ = sighup => {
                tracing::info!("SIGHUP: reloading the conf dir");
                networks.reload().await;
                if let Some(w) = watcher.as_mut() {
                    armed = w.arm();
                }
            }
            r = changed => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "inotify failed; reload only on SIGHUP from now on");
                    watcher = None;
                    continue;
                }
                tokio::time::sleep(DEBOUNCE).await;
                if let Some(w) = watcher.as_mut() {
                    w.drain();
                    let was = armed;
                    armed = w.arm();
                    // Nothing of ours changed while the dir stays missing.
                    if !was && !armed {
                        continue;
                    }
                }
                networks.reload().await;
                if let Some(w) = watcher.as_mut() {
                    // Subdirs created since (plugin files of a network).
                    armed = w.arm();
                }
            }
        }
    }
}
