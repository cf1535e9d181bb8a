//! The networks of a conf dir, kept current: a watcher any runtime can use
//! (feature `watch`), and readiness as container runtimes define it.
//!
//! A [`NetworkSet`] holds the parsed conf dir as a [`ConfSnapshot`] behind
//! an `Arc`: an operation keeps the snapshot it started with
//! ([`NetworkSet::snapshot`]); a reload parses the whole dir and swaps it.
//!
//! [`NetworkSet::watch`] reloads whenever the conf dir changes (inotify),
//! coping with what happens to conf dirs on real nodes: the dir missing at
//! start, removed and recreated, renamed over, or swapped through a symlink
//! (Kubernetes ConfigMap volumes); editors' temp files and files written
//! in pieces (events debounced 100 ms; a file that does not parse yet is
//! skipped and loaded by the reload its last write triggers); plugin files
//! in `<confdir>/<network>/` (spec 1.1.0). Every reload logs what changed.
//!
//! **A file that breaks keeps its network's last good version** (as
//! containerd's CRI does): it is listed under [`ConfSnapshot::skipped`],
//! and the network stays loaded, in its place, until the file is fixed,
//! removed, or another file provides the network.
//!
//! **Readiness** ([`NetworkSet::readiness`]) is what containerd and CRI-O
//! wait for before they run pods: at least N networks loaded (go-cni's
//! `WithMinNetworkCount`) whose plugins exist and answer VERSION with the
//! list's version. The answer names every loaded network that cannot work
//! now, even while N others are usable. Each plugin binary (path, device,
//! inode, size, mtime) is asked for VERSION once, and again only when it
//! changes; once ready, the binaries are looked up again (a `stat` each)
//! at most once a second, so a missing plugin shows within about a second.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use std::sync::Arc;
//! use cni_async::Cni;
//! use cni_async::confwatch::NetworkSet;
//!
//! let cni = Cni::default();
//! let set = Arc::new(NetworkSet::new("/etc/cni/net.d"));
//! set.reload().await;
//! let watcher = tokio::spawn({
//!     let set = set.clone();
//!     async move { set.watch().await }
//! });
//! match set.readiness(&cni, 1).await {
//!     Ok(ready) => println!("ready: {:?}", ready.usable),
//!     Err(not) => println!("not ready: {}", not.reason),
//! }
//! let snap = set.snapshot(); // stays as it is while we use it
//! if let Some(default) = snap.default_network() {
//!     println!("default network {}", default.list.name());
//! }
//! watcher.abort();
//! # Ok(()) }
//! ```
//!
//! # Caveats
//! - inotify does not see changes on some network file systems; call
//!   [`NetworkSet::reload`] yourself there (cnid does on SIGHUP).
//! - [`NetworkSet::watch`] runs until its future is dropped; it must run on
//!   a tokio runtime with I/O enabled.
//! - Readiness runs a plugin binary's VERSION (a process) once per
//!   binary and change.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use cni_core::NetworkConfigList;
use cni_core::confdir;
use cni_core::error::{Chain, SkippedFile};

use crate::Cni;
use crate::sys::inotify::{DirWatches, WatchKind};

/// How long events are collected before a reload.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How often arming is retried while the conf dir's parent is missing.
const REARM_RETRY: Duration = Duration::from_secs(2);
/// How often readiness is recomputed while not ready, or, while ready,
/// the networks' binaries are looked at again (a `stat` each).
const RECHECK: Duration = Duration::from_secs(1);

/// One usable network of a [`ConfSnapshot`].
#[derive(Debug)]
pub struct LoadedNetwork {
    /// The file it came from.
    pub path: PathBuf,
    /// The parsed list.
    pub list: Arc<NetworkConfigList>,
    /// Other files with the same network name, not used (lookup by name
    /// picks as libcni does: a `.conflist` first, then by file name).
    pub shadowed: Vec<PathBuf>,
}

/// The conf dir as of one reload.
#[derive(Debug, Default)]
pub struct ConfSnapshot {
    /// Counts reloads: 0 before the first.
    pub generation: u64,
    /// When this reload happened (`None` before the first).
    pub loaded_at: Option<SystemTime>,
    /// Usable networks in conf-dir file order (all extensions sorted
    /// together, so the first is the default network), one per name.
    pub networks: Vec<Arc<LoadedNetwork>>,
    /// Files that could not be used, with the reason (including networks
    /// whose name is not a valid network name).
    pub skipped: Vec<SkippedFile>,
    /// Why the conf dir itself could not be read, if it could not (a
    /// missing dir is no error: it has no networks, see `dir_missing`).
    pub dir_error: Option<String>,
    /// The conf dir does not exist (as of this reload).
    pub dir_missing: bool,
    by_name: HashMap<String, Arc<LoadedNetwork>>,
}

impl ConfSnapshot {
    /// Nothing loaded, skipped or wrong: what a reload of a missing conf
    /// dir gives.
    fn holds_nothing(&self) -> bool {
        self.networks.is_empty() && self.skipped.is_empty() && self.dir_error.is_none()
    }

    /// The network named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<LoadedNetwork>> {
        self.by_name.get(name)
    }

    /// The default network (go-cni's choice): the first file that loads.
    pub fn default_network(&self) -> Option<&Arc<LoadedNetwork>> {
        self.networks.first()
    }

    fn scan(
        dir: &Path,
        generation: u64,
        refuse: Option<&Refusal>,
        previous: &ConfSnapshot,
    ) -> ConfSnapshot {
        let mut snap = ConfSnapshot {
            generation,
            loaded_at: Some(SystemTime::now()),
            ..Default::default()
        };
        snap.dir_missing =
            matches!(std::fs::metadata(dir), Err(e) if e.kind() == io::ErrorKind::NotFound);
        let scan = match confdir::scan(dir) {
            Ok(scan) => scan,
            Err(e) => {
                snap.dir_error = Some(Chain(&e).to_string());
                return snap;
            }
        };
        for found in scan.unique() {
            let name = found.list.name();
            let unusable = match cni_core::validate::network_name(name) {
                Err(e) => Some(e.to_string()),
                Ok(()) => refuse.and_then(|r| r(&found.list)),
            };
            if let Some(reason) = unusable {
                snap.skipped
                    .push(SkippedFile::new(found.path.clone(), reason));
                continue;
            }
            let loaded = Arc::new(LoadedNetwork {
                path: found.path.clone(),
                list: Arc::new(found.list.clone()),
                shadowed: scan
                    .shadowed(found)
                    .into_iter()
                    .map(Path::to_path_buf)
                    .collect(),
            });
            snap.by_name.insert(name.to_owned(), loaded.clone());
            snap.networks.push(loaded);
        }
        for mut s in scan.skipped {
            // A file that loaded before and no longer parses keeps its
            // last good version, unless another file now provides it.
            if let Some(kept) = previous
                .networks
                .iter()
                .find(|n| n.path == s.path && snap.get(n.list.name()).is_none())
            {
                s.reason = format!(
                    "{}; the last good version of network {:?} stays loaded until the file is fixed or removed",
                    s.reason,
                    kept.list.name()
                );
                let at = snap
                    .networks
                    .iter()
                    .position(|n| n.path.file_name() > kept.path.file_name())
                    .unwrap_or(snap.networks.len());
                snap.by_name
                    .insert(kept.list.name().to_owned(), kept.clone());
                snap.networks.insert(at, kept.clone());
            }
            snap.skipped.push(s);
        }
        snap
    }
}

/// What a reload changed (see [`NetworkSet::reload`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Networks that are new.
    pub loaded: Vec<String>,
    /// Networks whose configuration or file changed.
    pub changed: Vec<String>,
    /// Networks that are gone.
    pub removed: Vec<String>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.loaded.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }
}

/// What changed from `old` to `new`, each change logged, and what else
/// the reload found that is worth a line in the log.
fn changes(dir: &Path, old: &ConfSnapshot, new: &ConfSnapshot) -> Changes {
    let mut out = Changes::default();
    for n in &new.networks {
        let (name, file) = (n.list.name(), n.path.display());
        match old.get(name) {
            None => {
                tracing::info!(network = name, file = %file, "network loaded");
                out.loaded.push(name.to_owned());
            }
            Some(o) if o.list != n.list || o.path != n.path => {
                tracing::info!(network = name, file = %file, "network changed");
                out.changed.push(name.to_owned());
            }
            Some(_) => {}
        }
    }
    for o in &old.networks {
        if new.get(o.list.name()).is_none() {
            tracing::info!(network = o.list.name(), "network removed");
            out.removed.push(o.list.name().to_owned());
        }
    }
    for s in &new.skipped {
        if !old.skipped.contains(s) {
            tracing::warn!(file = %s.path.display(), reason = %s.reason, "network configuration file not usable");
        }
    }
    if let Some(e) = &new.dir_error
        && old.dir_error.as_ref() != Some(e)
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot read the conf dir");
    }
    let (was, now) = (
        old.default_network().map(|n| n.list.name()),
        new.default_network().map(|n| n.list.name()),
    );
    if old.generation > 0 && was.is_some() && was != now {
        tracing::warn!(dir = %dir.display(), was = was.unwrap_or_default(), now = now.unwrap_or_default(),
            "the default network changed (the first file of the conf dir that loads)");
    }
    let newly_empty = new.networks.is_empty() && (old.generation == 0 || !old.networks.is_empty());
    if newly_empty && new.dir_missing {
        tracing::warn!(dir = %dir.display(), "the conf dir does not exist");
    } else if newly_empty {
        tracing::warn!(dir = %dir.display(), "no usable network configuration in the conf dir");
    }
    out
}

/// Why a [`NetworkSet`] is not ready ([`NetworkSet::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// What is missing, for people (no conf dir, no configuration, or
    /// which networks are unusable and why).
    pub reason: String,
    /// The loaded networks that cannot work now, in conf-dir order.
    pub unusable: Vec<Unusable>,
}

/// A loaded network that cannot work now: a plugin binary missing, or not
/// answering VERSION with the list's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unusable {
    /// The network's name.
    pub network: String,
    /// Whether it is the default network (the conf dir's first).
    pub default: bool,
    /// Why, naming the plugin.
    pub reason: String,
}

impl std::fmt::Display for Unusable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let default = if self.default {
            " (the default network)"
        } else {
            ""
        };
        write!(f, "network {:?}{default}: {}", self.network, self.reason)
    }
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// A ready [`NetworkSet`] ([`NetworkSet::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The usable networks, in conf-dir order.
    pub usable: Vec<String>,
    /// The loaded networks that cannot work now, in conf-dir order (the
    /// minimum is met without them).
    pub unusable: Vec<Unusable>,
}

impl Ready {
    /// What is wrong although ready, for people: the unusable networks
    /// and why, `None` when every network is usable.
    pub fn degraded(&self) -> Option<String> {
        if self.unusable.is_empty() {
            return None;
        }
        let each: Vec<String> = self.unusable.iter().map(ToString::to_string).collect();
        Some(format!(
            "ready, but {} network(s) unusable: {}",
            each.len(),
            each.join("; ")
        ))
    }
}

#[derive(Debug)]
struct ReadinessMemo {
    generation: u64,
    min: usize,
    at: Instant,
    outcome: Result<Ready, NotReady>,
    /// For a ready outcome: the plugin types of the loaded networks and
    /// the binaries they resolved to (`None`: not found).
    binaries: Vec<(String, Option<PluginId>)>,
}

/// A plugin binary as found: its path and what tells a replaced or
/// rewritten file apart (device, inode, size, mtime).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PluginId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl PluginId {
    /// The binary `cni` runs for `plugin_type`, as it is now.
    fn find(cni: &Cni, plugin_type: &str) -> Result<PluginId, crate::Error> {
        let path = cni.find_plugin(plugin_type)?;
        let meta =
            std::fs::metadata(&path).map_err(|e| crate::store::io_err(&path, "stat plugin", e))?;
        Ok(PluginId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            path,
        })
    }
}

/// The VERSION answers of plugin binaries, by binary.
type VersionAnswers = HashMap<PluginId, Result<cni_core::version::PluginInfo, String>>;

/// A caller's rule against networks it must not load
/// ([`NetworkSet::with_refusal`]): the reason, or `None` to load it.
pub type Refusal = dyn Fn(&NetworkConfigList) -> Option<String> + Send + Sync;

/// The networks of one conf dir, reloaded on demand or by a watcher (see
/// the [module docs](self)). Share it in an `Arc`.
pub struct NetworkSet {
    dir: PathBuf,
    refuse: Option<Box<Refusal>>,
    current: RwLock<Arc<ConfSnapshot>>,
    /// Serializes reloads, so generations and change logs are in order.
    reloading: Mutex<()>,
    readiness: tokio::sync::Mutex<Option<ReadinessMemo>>,
    /// VERSION answers by binary, kept across snapshots; only touched under
    /// the `readiness` lock.
    versions: Mutex<VersionAnswers>,
    /// The generation of the latest snapshot, for [`NetworkSet::subscribe`].
    generation: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for NetworkSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkSet")
            .field("dir", &self.dir)
            .field("refuse", &self.refuse.is_some())
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl NetworkSet {
    /// A set for `dir`, empty (generation 0) until the first reload.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        NetworkSet {
            dir: dir.into(),
            refuse: None,
            current: RwLock::new(Arc::new(ConfSnapshot::default())),
            reloading: Mutex::new(()),
            readiness: tokio::sync::Mutex::new(None),
            versions: Mutex::new(HashMap::new()),
            generation: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Networks for which `refuse` gives a reason are not loaded: their
    /// file is listed under [`ConfSnapshot::skipped`] with that reason, as
    /// an unparsable one is (cnid refuses a network that would call cnid).
    pub fn with_refusal(
        mut self,
        refuse: impl Fn(&NetworkConfigList) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.refuse = Some(Box::new(refuse));
        self
    }

    /// A receiver that sees the generation of every new snapshot (whoever
    /// reloaded), e.g. to rebuild a [`crate::MultiNetwork`] or update gauges.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The conf dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The snapshot of the moment.
    pub fn snapshot(&self) -> Arc<ConfSnapshot> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Parses the conf dir again and swaps the snapshot; logs what changed.
    /// Blocking (file I/O): from async code use [`NetworkSet::reload`].
    pub fn reload_blocking(&self) -> Changes {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let old = self.snapshot();
        let new = ConfSnapshot::scan(&self.dir, old.generation + 1, self.refuse.as_deref(), &old);
        let changes = changes(&self.dir, &old, &new);
        let generation = new.generation;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        self.generation.send_replace(generation);
        changes
    }

    /// [`NetworkSet::reload_blocking`] on tokio's blocking pool.
    pub async fn reload(self: &Arc<Self>) -> Changes {
        let this = self.clone();
        match tokio::task::spawn_blocking(move || this.reload_blocking()).await {
            Ok(changes) => changes,
            // Only a panic in the scan gets here; the old snapshot stays.
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "conf dir reload failed");
                Changes::default()
            }
        }
    }

    /// Reloads whenever the conf dir changes, until the future is dropped:
    /// [`NetworkSet::watcher`] then [`ConfWatcher::run`]. Returns only when
    /// inotify fails.
    pub async fn watch(self: &Arc<Self>) -> io::Error {
        match self.watcher() {
            Ok(w) => w.run().await,
            Err(e) => e,
        }
    }

    /// Sets up the watches now (inotify, the conf dir, its parent and
    /// subdirs), so that changes from here on are seen; [`ConfWatcher::run`]
    /// then reloads on them. Needs a tokio runtime with I/O enabled.
    pub fn watcher(self: &Arc<Self>) -> io::Result<ConfWatcher> {
        let mut watches = DirWatches::new()?;
        let armed = self.arm(&mut watches);
        Ok(ConfWatcher {
            set: self.clone(),
            watches,
            armed,
        })
    }

    /// Adds the missing watches (parent, conf dir, its subdirs); returns
    /// whether the conf dir itself is watched.
    fn arm(&self, watches: &mut DirWatches) -> bool {
        watches.forget_missing();
        if let Some(parent) = self.dir.parent().filter(|p| !p.as_os_str().is_empty())
            && let Err(e) = watches.add(parent, WatchKind::Entries)
        {
            tracing::debug!(dir = %parent.display(), error = %e, "cannot watch (yet)");
        }
        if let Err(e) = watches.add(&self.dir, WatchKind::Contents) {
            tracing::debug!(dir = %self.dir.display(), error = %e, "cannot watch (yet)");
        }
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                // Follows symlinks: `..data` of a ConfigMap volume is one.
                let path = e.path();
                if path.is_dir()
                    && let Err(e) = watches.add(&path, WatchKind::Contents)
                {
                    tracing::debug!(dir = %path.display(), error = %e, "cannot watch (yet)");
                }
            }
        }
        watches.watches(&self.dir)
    }

    /// Whether at least `min_networks` networks are loaded whose plugins
    /// all exist in `cni`'s plugin dirs and answer VERSION with the list's
    /// version (see the [module docs](self)). The reason says what is
    /// missing: no configuration at all, or each unusable network and why.
    pub async fn readiness(&self, cni: &Cni, min_networks: usize) -> Result<Ready, NotReady> {
        let snap = self.snapshot();
        let mut memo = self.readiness.lock().await;
        if let Some(m) = memo.as_mut()
            && m.generation == snap.generation
            && m.min == min_networks
        {
            if m.at.elapsed() < RECHECK {
                return m.outcome.clone();
            }
            if m.outcome.is_ok() {
                let unchanged = m
                    .binaries
                    .iter()
                    .all(|(t, id)| PluginId::find(cni, t).ok() == *id);
                if unchanged {
                    m.at = Instant::now();
                    return m.outcome.clone();
                }
                tracing::info!(dir = %self.dir.display(), "a plugin binary of a network is gone, changed or back; checking readiness again");
            }
        }
        let (outcome, binaries) = self.compute_readiness(&snap, cni, min_networks, true).await;
        *memo = Some(ReadinessMemo {
            generation: snap.generation,
            min: min_networks,
            at: Instant::now(),
            outcome: outcome.clone(),
            binaries,
        });
        outcome
    }

    /// [`NetworkSet::readiness`] without running any plugin: a plugin
    /// binary that is found and was not asked for VERSION yet counts as
    /// usable. For a first word at start-up that costs no process; the
    /// next [`NetworkSet::readiness`] asks.
    pub async fn readiness_without_running(
        &self,
        cni: &Cni,
        min_networks: usize,
    ) -> Result<Ready, NotReady> {
        let snap = self.snapshot();
        let _memo = self.readiness.lock().await;
        self.compute_readiness(&snap, cni, min_networks, false)
            .await
            .0
    }

    /// Whether one network's plugins are usable (or why not), and the
    /// binaries its plugin types resolved to (`None`: not found). VERSION
    /// runs once per binary (see `versions`), unless `!run` (then a binary
    /// not asked yet passes).
    async fn check_network(
        &self,
        cni: &Cni,
        list: &NetworkConfigList,
        run: bool,
    ) -> (Result<(), String>, Vec<(String, Option<PluginId>)>) {
        let mut found = Vec::new();
        let mut errors = Vec::new();
        for plugin in list.plugins() {
            let t = plugin.plugin_type();
            let id = match PluginId::find(cni, t) {
                Ok(id) => id,
                Err(e) => {
                    errors.push(Chain(&e).to_string());
                    found.push((t.to_owned(), None));
                    continue;
                }
            };
            found.push((t.to_owned(), Some(id.clone())));
            let known = self
                .versions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .cloned();
            let info = match known {
                Some(info) => info,
                None if !run => continue,
                None => {
                    let info = cni.version_info(t).await.map_err(|e| Chain(&e).to_string());
                    let mut versions = self.versions.lock().unwrap_or_else(|p| p.into_inner());
                    // Binaries of other paths or versions are not asked again.
                    versions.retain(|k, _| k.path != id.path);
                    versions.insert(id.clone(), info.clone());
                    info
                }
            };
            match info {
                Ok(info) if info.supports(list.version()) => {}
                Ok(info) => errors.push(format!(
                    "plugin {t} does not support version {} (supports {})",
                    list.version(),
                    info.supported_versions.join(", ")
                )),
                Err(e) => errors.push(e),
            }
        }
        let outcome = errors.is_empty().then_some(()).ok_or(errors.join("; "));
        (outcome, found)
    }

    async fn compute_readiness(
        &self,
        snap: &ConfSnapshot,
        cni: &Cni,
        min_networks: usize,
        run: bool,
    ) -> (Result<Ready, NotReady>, Vec<(String, Option<PluginId>)>) {
        let dir = self.dir.display();
        let not = |reason: String| {
            (
                Err(NotReady {
                    reason,
                    unusable: Vec::new(),
                }),
                Vec::new(),
            )
        };
        if snap.generation == 0 {
            return not(format!("the conf dir {dir} has not been read yet"));
        }
        if let Some(e) = &snap.dir_error {
            return not(format!("cannot read the conf dir {dir}: {e}"));
        }
        if snap.dir_missing && min_networks > 0 {
            return not(format!("the conf dir {dir} does not exist"));
        }
        if snap.networks.is_empty() && min_networks > 0 {
            let mut reason = format!("no network configuration in {dir}");
            if !snap.skipped.is_empty() {
                let files: Vec<String> = snap
                    .skipped
                    .iter()
                    .map(|s| format!("{}: {}", s.path.display(), s.reason))
                    .collect();
                reason.push_str(&format!(" (unusable: {})", files.join("; ")));
            }
            return not(reason);
        }
        let mut usable = Vec::new();
        let mut binaries: Vec<(String, Option<PluginId>)> = Vec::new();
        let mut unusable = Vec::new();
        for (i, n) in snap.networks.iter().enumerate() {
            let (outcome, found) = self.check_network(cni, &n.list, run).await;
            for f in found {
                if !binaries.iter().any(|(t, _)| *t == f.0) {
                    binaries.push(f);
                }
            }
            match outcome {
                Ok(()) => usable.push(n.list.name().to_owned()),
                Err(reason) => unusable.push(Unusable {
                    network: n.list.name().to_owned(),
                    default: i == 0,
                    reason,
                }),
            }
        }
        if usable.len() >= min_networks {
            return (Ok(Ready { usable, unusable }), binaries);
        }
        let mut reason = format!(
            "{} usable network(s) in {dir}, {min_networks} needed",
            usable.len()
        );
        for u in &unusable {
            reason.push_str(&format!("; {u}"));
        }
        (Err(NotReady { reason, unusable }), Vec::new())
    }
}

/// The watches of a [`NetworkSet`]'s conf dir ([`NetworkSet::watcher`]).
#[derive(Debug)]
pub struct ConfWatcher {
    set: Arc<NetworkSet>,
    watches: DirWatches,
    armed: bool,
}

impl ConfWatcher {
    /// Reloads once (a change since the last reload is not missed), then on
    /// every change, until the future is dropped. Returns only when inotify
    /// fails (the error says why).
    pub async fn run(mut self) -> io::Error {
        self.set.reload().await;
        loop {
            if let Err(e) = self.next().await {
                return e;
            }
        }
    }

    /// Waits for a change, then reloads unless the conf dir is missing and
    /// the set already holds nothing from it.
    async fn next(&mut self) -> io::Result<()> {
        if self.armed {
            self.watches.wait().await?;
        } else {
            // The conf dir (or its parent) is missing: wait for it on the
            // parent's watch, and retry arming anyway.
            tokio::select! {
                r = self.watches.wait() => r?,
                () = tokio::time::sleep(REARM_RETRY) => {}
            }
        }
        tokio::time::sleep(DEBOUNCE).await;
        self.watches.drain();
        self.armed = self.set.arm(&mut self.watches);
        // Decided on what the set holds, not on whether the dir was armed
        // before: the dir can go between a reload's scan and the arming
        // after it, and its networks must go too.
        if !self.armed && self.set.snapshot().holds_nothing() {
            return Ok(());
        }
        self.set.reload().await;
        // Subdirs created since (plugin files of a network).
        self.armed = self.set.arm(&mut self.watches);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race the stress run found: the conf dir goes after a reload's
    /// scan loaded its networks and before the arming that follows it, so
    /// the watcher waits unarmed while the set still holds the networks.
    /// The dir's removal events must still reload (to an empty set).
    #[tokio::test]
    async fn a_dir_removed_between_the_scan_and_the_arming_empties_the_set() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("net.d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("10-late.conflist"),
            r#"{"cniVersion":"1.0.0","name":"late","plugins":[{"type":"p"}]}"#,
        )
        .unwrap();
        let set = Arc::new(NetworkSet::new(&dir));
        let mut watcher = set.watcher().unwrap();
        set.reload().await;
        assert_eq!(set.snapshot().networks.len(), 1);

        std::fs::remove_dir_all(&dir).unwrap();
        // The arming after the reload, done after the removal.
        watcher.armed = set.arm(&mut watcher.watches);
        assert!(!watcher.armed);
        tokio::time::timeout(Duration::from_secs(60), watcher.next())
            .await
            .expect("the removal's events wake the watcher")
            .unwrap();
        let snap = set.snapshot();
        assert!(snap.networks.is_empty(), "{snap:#?}");
        assert!(snap.holds_nothing(), "{snap:#?}");
    }
}
