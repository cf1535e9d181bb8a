//! [`CniBuilder`]: how a [`Cni`] is made.

use std::path::PathBuf;
use std::sync::Arc;

use cni_core::env;

use crate::cache::ResultCache;
use crate::exec::{OutputLimits, PluginExec, RawExec, SinkSlot, StderrSink, Timeouts};

use super::{Cni, DEFAULT_PLUGIN_DIRS, Inner};

/// Builder for [`Cni`].
#[derive(Debug, Clone)]
pub struct CniBuilder {
    plugin_dirs: Vec<PathBuf>,
    cache: ResultCache,
    exec: Option<Arc<dyn PluginExec>>,
    timeouts: Timeouts,
    limits: OutputLimits,
    check_netns: bool,
    stderr_sink: SinkSlot,
}

impl CniBuilder {
    /// Where plugin binaries are looked up, in order (`CNI_PATH`).
    pub fn plugin_dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.plugin_dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    /// The cache dir (default `/var/lib/cni`).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = ResultCache::new(dir);
        self
    }

    setters! {
        /// A cache with non-default settings.
        pub fn cache(cache: ResultCache);

        /// The executor (default [`RawExec`]).
        pub fn exec(exec: Arc<dyn PluginExec>, Some);

        /// Per-verb deadlines.
        pub fn timeouts(timeouts: Timeouts);

        /// Caps on plugin output.
        pub fn output_limits(limits: OutputLimits);

        /// Whether ADD and CHECK also refuse a netns that is not a network
        /// namespace ([`check_netns`](crate::check_netns)) before any plugin
        /// runs (default on; a missing path fails with code 4 instead of deep
        /// in a plugin). `false` leaves it to the plugins, as libcni does: for
        /// fake plugins, or a path valid only in the plugins' mount namespace.
        pub fn check_netns(check_netns: bool);
    }

    /// Where the stderr of plugins that succeed goes
    /// ([`PluginStderr`](crate::exec::PluginStderr); libcni writes it to the
    /// caller's stderr). Default: none; it is logged at `info` either way.
    /// A failing plugin's stderr is part of its error instead.
    pub fn plugin_stderr(mut self, sink: StderrSink) -> Self {
        self.stderr_sink = SinkSlot(Some(sink));
        self
    }

    /// Builds the [`Cni`].
    pub fn build(self) -> Cni {
        let cni_path = env::join_path(&self.plugin_dirs);
        Cni {
            inner: Arc::new(Inner {
                plugin_dirs: self.plugin_dirs,
                cni_path,
                cache: self.cache,
                exec: self.exec.unwrap_or_else(|| Arc::new(RawExec::new())),
                timeouts: self.timeouts,
                limits: self.limits,
                check_netns: self.check_netns,
                stderr_sink: self.stderr_sink,
                detached: tokio::sync::watch::Sender::new(0),
            }),
        }
    }
}

impl Cni {
    /// A builder with the default plugin dirs (or `CNI_PATH` is NOT read:
    /// pass it explicitly), cache dir `/var/lib/cni`, [`RawExec`] and the
    /// default deadlines.
    pub fn builder() -> CniBuilder {
        CniBuilder {
            plugin_dirs: DEFAULT_PLUGIN_DIRS.iter().map(PathBuf::from).collect(),
            cache: ResultCache::default(),
            exec: None,
            timeouts: Timeouts::default(),
            limits: OutputLimits::default(),
            check_netns: true,
            stderr_sink: SinkSlot::default(),
        }
    }
}
