//! The networks loaded from the conf dir, and their reloading: cnid's view
//! of the library's [`NetworkSet`] (see [`cni_async::confwatch`] for how
//! reloads and the watcher behave).
//!
//! Each request takes a snapshot (an `Arc`) of the conf dir, so a reload
//! never changes the configuration under an operation that already started.
//! A file that does not parse is logged and listed in `GET /v1/networks`
//! under `errors`; the other networks stay usable. Reloads happen on SIGHUP
//! and, unless disabled, when the conf dir changes (inotify).
//!
//! # Caveats
//! inotify does not see changes on some network filesystems; use SIGHUP
//! there (`--no-watch` turns the watcher off).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::UNIX_EPOCH;

use cni_async::confwatch::{ConfSnapshot, ConfWatcher, LoadedNetwork, NetworkSet, Unusable};
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::api::{ConfigError, NetworkInfo, NetworksResponse};
use crate::daemon::lock;

/// One usable network.
pub(crate) type Loaded = LoadedNetwork;

/// The conf dir as of one reload.
pub(crate) type Snapshot = ConfSnapshot;

/// The unusable files of a snapshot (and the conf dir itself, when it
/// cannot be read), as the API lists them.
pub(crate) fn errors(snap: &Snapshot) -> Vec<ConfigError> {
    snap.skipped
        .iter()
        .map(|s| ConfigError {
            file: s.path.display().to_string(),
            reason: s.reason.clone(),
        })
        .chain(snap.dir_error.iter().map(|e| ConfigError {
            file: String::new(),
            reason: e.clone(),
        }))
        .collect()
}

/// The loaded networks of one conf dir.
#[derive(Debug)]
pub(crate) struct Networks {
    set: Arc<NetworkSet>,
    metrics: Arc<Metrics>,
    /// The last readiness seen: 0 none yet, 1 ready, 2 not ready (a
    /// change is logged).
    last_ready: std::sync::atomic::AtomicU8,
    /// The unusable networks the last readiness named (a change is logged).
    last_unusable: std::sync::Mutex<Vec<Unusable>>,
}

/// Why a network must not be loaded by the cnid listening on `socket`: a
/// plugin of it is `cnid-shim` aimed at that socket, so every ADD would
/// wait on itself until its deadline, and every DEL (the rollback's too)
/// the same way.
pub(crate) fn calls_cnid_itself(
    list: &cni_core::NetworkConfigList,
    socket: &Path,
) -> Option<String> {
    list.plugins()
        .iter()
        .filter(|p| p.plugin_type() == crate::shim::setup::SHIM_TYPE)
        .find_map(|p| {
            let target = p
                .raw()
                .get("socket")
                .and_then(|v| v.as_str())
                .unwrap_or(crate::shim::conf::DEFAULT_SOCKET);
            same_socket(Path::new(target), socket).then(|| {
                format!(
                    "network {:?} calls cnid itself: its plugin {:?} forwards to {target:?}, this cnid's own socket (a cnid-shim list in cnid's own conf dir; install it into the runtime's conf dir instead)",
                    list.name(),
                    crate::shim::setup::SHIM_TYPE
                )
            })
        })
}

/// Whether two socket paths name the same socket: the same file when both
/// exist, else the same path once their dirs are resolved.
fn same_socket(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    let resolved = |p: &Path| match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or_else(|_| p.to_owned()),
        _ => p.to_owned(),
    };
    resolved(a) == resolved(b)
}

impl Networks {
    /// The networks of `dir`, refusing those that would call the cnid
    /// listening on `socket` ([`calls_cnid_itself`]).
    pub(crate) fn new(dir: std::path::PathBuf, socket: &Path, metrics: Arc<Metrics>) -> Self {
        let socket = socket.to_owned();
        Networks {
            set: Arc::new(
                NetworkSet::new(dir).with_refusal(move |list| calls_cnid_itself(list, &socket)),
            ),
            metrics,
            last_ready: std::sync::atomic::AtomicU8::new(0),
            last_unusable: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        self.set.dir()
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.set.snapshot()
    }

    /// Whether at least `min` networks are loaded whose plugins answer
    /// VERSION (the library's readiness, see its memoizing). A change from
    /// what the previous call found is logged (the first call's is the
    /// caller's to log).
    pub(crate) async fn readiness(
        &self,
        cni: &cni_async::Cni,
        min: usize,
    ) -> Result<cni_async::confwatch::Ready, cni_async::confwatch::NotReady> {
        let r = self.set.readiness(cni, min).await;
        let now = if r.is_ok() { 1 } else { 2 };
        match (self.last_ready.swap(now, Ordering::Relaxed), &r) {
            (1, Err(e)) => tracing::warn!(reason = %e.reason, "cnid is no longer ready"),
            (2, Ok(_)) => tracing::info!("cnid is ready"),
            _ => {}
        }
        let unusable = match &r {
            Ok(ready) => &ready.unusable,
            Err(not) => &not.unusable,
        };
        let mut last = lock(&self.last_unusable);
        if *last != *unusable {
            for u in unusable.iter().filter(|u| !last.contains(u)) {
                tracing::warn!(network = %u.network, default = u.default, reason = %u.reason, "network unusable");
            }
            for u in last
                .iter()
                .filter(|u| !unusable.iter().any(|n| n.network == u.network))
            {
                tracing::info!(network = %u.network, "network usable again, or gone");
            }
            *last = unusable.clone();
        }
        drop(last);
        r
    }

    /// The unusable networks as readiness (with `min` networks needed)
    /// finds them now.
    pub(crate) async fn unusable(&self, cni: &cni_async::Cni, min: usize) -> Vec<Unusable> {
        match self.readiness(cni, min).await {
            Ok(ready) => ready.unusable,
            Err(not) => not.unusable,
        }
    }

    /// The start's word on readiness, without running any plugin
    /// ([`NetworkSet::readiness_without_running`]); the next probe's
    /// readiness is logged if it differs.
    pub(crate) async fn readiness_at_start(
        &self,
        cni: &cni_async::Cni,
        min: usize,
    ) -> Result<cni_async::confwatch::Ready, cni_async::confwatch::NotReady> {
        let r = self.set.readiness_without_running(cni, min).await;
        self.last_ready
            .store(if r.is_ok() { 1 } else { 2 }, Ordering::Relaxed);
        r
    }

    /// The answer for a network that is not loaded: "no network
    /// configuration with name ...", naming the conf dir's unusable files
    /// (the network's own may be one of them) and why in the details.
    /// A file refused for what it asks (the versions of its list) names
    /// its network: the answer for that name says why it is refused.
    pub(crate) fn not_found(&self, name: &str) -> super::error::ApiError {
        let mut e = super::error::ApiError::unknown_network(name);
        let snap = self.snapshot();
        let skipped = &snap.skipped;
        if let Some(own) = skipped.iter().find(|s| s.network.as_deref() == Some(name)) {
            e.error.msg = format!(
                "network configuration with name {name:?} in {} is not usable: {}",
                self.dir().display(),
                own.reason
            );
            return e.with_details(own.to_string());
        }
        // The networks there are, and the nearest, as the library says it.
        let known: Vec<String> = snap
            .networks
            .iter()
            .map(|n| n.list.name().to_owned())
            .collect();
        let available = cni_core::error::fmt_available(name, &known);
        e.error.msg.push_str(&available);
        if skipped.is_empty() {
            return e;
        }
        let files: Vec<String> = skipped
            .iter()
            .map(|s| s.path.display().to_string())
            .collect();
        let reasons: Vec<String> = skipped.iter().map(ToString::to_string).collect();
        let mut e = e.with_details(reasons.join("; "));
        e.error.msg = format!(
            "{} (unusable files in {}: {})",
            e.error.msg,
            self.dir().display(),
            files.join(", ")
        );
        e
    }

    /// The network named `name`, if loaded.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Loaded>> {
        self.snapshot().get(name).cloned()
    }

    /// Updates the gauges from the current snapshot.
    fn count(&self) {
        let (snap, m) = (self.snapshot(), &self.metrics);
        m.networks
            .store(snap.networks.len() as i64, Ordering::Relaxed);
        m.config_errors
            .store(errors(&snap).len() as i64, Ordering::Relaxed);
        m.reloads.store(snap.generation, Ordering::Relaxed);
    }

    /// Re-reads the conf dir on the blocking pool (the library logs what
    /// changed).
    pub(crate) async fn reload(&self) {
        self.set.reload().await;
        self.count();
    }

    /// `GET /v1/networks`: each network marked `unusable` (and why) as
    /// readiness with `min` networks needed finds it.
    pub(crate) async fn describe(&self, cni: &cni_async::Cni, min: usize) -> NetworksResponse {
        let unusable = self.unusable(cni, min).await;
        let snap = self.snapshot();
        NetworksResponse {
            conf_dir: self.dir().display().to_string(),
            generation: snap.generation,
            loaded_at_ms: snap
                .loaded_at
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            networks: snap
                .networks
                .iter()
                .map(|n| mark(info(n, false), &unusable))
                .collect(),
            errors: errors(&snap),
            conf_dir_missing: snap.dir_missing,
        }
    }
}

/// `info` with why its network cannot work now, if `unusable` names it.
pub(crate) fn mark(mut info: NetworkInfo, unusable: &[Unusable]) -> NetworkInfo {
    info.unusable = unusable
        .iter()
        .find(|u| u.network == info.name)
        .map(|u| u.reason.clone());
    info
}

/// The API view of a loaded network.
pub(crate) fn info(n: &Loaded, with_config: bool) -> NetworkInfo {
    NetworkInfo::new(&n.list, &n.path, &n.shadowed, with_config)
}

/// The reloading of a conf dir: on SIGHUP and (with inotify) on changes.
/// Set up by [`Watch::start`] before the daemon says it is ready, so that
/// every change from then on is seen; [`Watch::run`] does the reloading.
#[derive(Debug)]
pub(crate) struct Watch {
    networks: Arc<Networks>,
    watcher: Option<ConfWatcher>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Watch {
    pub(crate) fn start(networks: Arc<Networks>, inotify: bool) -> Watch {
        let hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot handle SIGHUP; reload on SIGHUP disabled");
                None
            }
        };
        let watcher = if inotify {
            match networks.set.watcher() {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start inotify; reload only on SIGHUP");
                    None
                }
            }
        } else {
            None
        };
        Watch {
            networks,
            watcher,
            hup,
        }
    }

    /// Reloads until `stop` is cancelled.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let Watch {
            networks,
            watcher,
            mut hup,
        } = self;
        // The watcher reloads inside the library: follow its snapshots for
        // the gauges.
        let mut reloaded = networks.set.subscribe();
        let changes = async {
            match watcher {
                Some(w) => w.run().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(changes);
        let mut watching = true;
        loop {
            let sighup = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                Ok(()) = reloaded.changed() => networks.count(),
                _ = sighup => {
                    tracing::info!("SIGHUP: reloading the conf dir");
                    networks.reload().await;
                }
                e = &mut changes, if watching => {
                    tracing::error!(error = %e, "inotify failed; reload only on SIGHUP from now on");
                    watching = false;
                }
            }
        }
    }
}
