//! [`CniBuilder`]: how a [`Cni`] is made.

use std::path::PathBuf;
use std::sync::Arc;

use cni_core::env;

use crate::cache::ResultCache;
use crate::exec::{OutputLimits, PluginExec, RawExec, SinkSlot, StderrSink, Timeouts};

use super::{Cni, DEFAULT_PLUGIN_DIRS, Inner};

/// Builder for [`Cni`]: the settings the [`Cni`] will hold.
#[derive(Debug, Clone)]
pub struct CniBuilder {
    inner: Inner,
}

impl CniBuilder {
    /// Where plugin binaries are looked up, in order (`CNI_PATH`).
    pub fn plugin_dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.inner.plugin_dirs = dirs.into_iter().map(Into::into).collect();
        self
    }

    setters! {
        /// The cache dir (default `/var/lib/cni`).
        pub fn cache_dir(inner.cache: impl Into<PathBuf>, ResultCache::new);

        /// A cache with non-default settings.
        pub fn cache(inner.cache: ResultCache);

        /// The executor (default [`RawExec`]).
        pub fn exec(inner.exec: Arc<dyn PluginExec>);

        /// Per-verb deadlines.
        pub fn timeouts(inner.timeouts: Timeouts);

        /// Caps on plugin output.
        pub fn output_limits(inner.limits: OutputLimits);

        /// Whether ADD and CHECK also refuse a netns that is not a network
        /// namespace ([`check_netns`](crate::check_netns)) before any plugin
        /// runs (default on; a missing path fails with code 4 instead of deep
        /// in a plugin). `false` leaves it to the plugins, as libcni does: for
        /// fake plugins, or a path valid only in the plugins' mount namespace.
        pub fn check_netns(inner.check_netns: bool);
    }

    /// Where the stderr of plugins that succeed goes
    /// ([`PluginStderr`](crate::exec::PluginStderr); libcni writes it to the
    /// caller's stderr). Default: none; it is logged at `info` either way.
    /// A failing plugin's stderr is part of its error instead.
    pub fn plugin_stderr(mut self, sink: StderrSink) -> Self {
        self.inner.stderr_sink = crate::hidden::Hidden(Some(sink));
        self
    }

    /// Builds the [`Cni`].
    pub fn build(mut self) -> Cni {
        self.inner.cni_path = env::join_path(&self.inner.plugin_dirs);
        Cni {
            inner: Arc::new(self.inner),
            detached: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }
}

impl Cni {
    /// A builder with the default plugin dirs (or `CNI_PATH` is NOT read:
    /// pass it explicitly), cache dir `/var/lib/cni`, [`RawExec`] and the
    /// default deadlines.
    pub fn builder() -> CniBuilder {
        CniBuilder {
            inner: Inner {
                plugin_dirs: DEFAULT_PLUGIN_DIRS.iter().map(PathBuf::from).collect(),
                cni_path: String::new(),
                cache: ResultCache::default(),
                exec: Arc::new(RawExec::new()),
                timeouts: Timeouts::default(),
                limits: OutputLimits::default(),
                check_netns: true,
                stderr_sink: SinkSlot::default(),
            },
        }
    }
}
