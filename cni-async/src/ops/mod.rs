//! The CNI operations on network configuration lists and single networks:
//! what libcni's `CNIConfig` does, in tokio, with deadlines.
//!
//! [`Cni`] holds the plugin dirs, the result cache, the executor and the
//! default deadlines; it is cheap to clone and safe to share between tasks.
//!
//! | operation | plugins run | cache |
//! |---|---|---|
//! | [`Cni::add_network_list`] | first to last, each result chained as the next `prevResult`; stops at the first error | final result written after the whole chain succeeded |
//! | [`Cni::del_network_list`] | last to first, `prevResult` = cached result (0.4.0+); stops at the first error | removed after success, kept on failure |
//! | [`Cni::check_network_list`] | first to last, `prevResult` = cached result | read; CHECK without a cached result is refused (code 3) |
//! | [`Cni::status_network_list`] | first to last (1.1.0 lists only) | - |
//! | [`Cni::gc_network_list`] | DEL of each stale cached attachment, then GC of every plugin (1.1.0) | stale entries removed |
//!
//! Each verb returns a request ([`AddRequest`], [`DelRequest`],
//! [`CheckRequest`], [`StatusRequest`], [`GcRequest`]) that runs when
//! awaited; options chain onto it first: `.timeout(d)`, `.rollback(true)`
//! (ADD), or a whole [`CallOptions`] with `.options(&opts)`. The
//! single-network verbs ([`Cni::add_network`], ...) have the same shape.
//!
//! Names and IDs are validated on every verb (libcni: ADD only), so no
//! cache path built from them can leave the cache dir. Each ADD, DEL and
//! CHECK holds the attachment's lock ([`crate::cache`]) for its whole run.
//!
//! # Caveats
//! - **Deadlines** bound the whole operation, not each plugin: every plugin
//!   gets what is left of the operation's deadline. The default is per verb
//!   ([`Timeouts`]); [`CallOptions::timeout`] overrides it per call.
//! - **Cancellation**: dropping the future of an operation kills the plugin
//!   that is running (its whole process group) but cannot undo the plugins
//!   that already ran. The spec makes the caller follow every ADD with a DEL,
//!   also a failed or cancelled one; do that, or set
//!   [`CallOptions::rollback`] and let the ADD finish, or use
//!   [`AddRequest::rollback_on_cancel`]: the ADD runs on a task of its own,
//!   and a caller that drops it gets what it made rolled back (as cnid
//!   does for every request); [`Cni::wait_detached`] waits for that work.
//! - **Rollback** (opt-in, [`CallOptions::rollback`]): when an ADD fails part
//!   way, the plugins that ran, including the one that failed, are deleted
//!   last to first with a fresh deadline, never the expired one. When the
//!   cache holds another container's attachment on the same netns and
//!   ifname (cnitool's, say, made while this ADD ran), the rollback runs
//!   with `CNI_NETNS` empty, as a DEL of a netns that is gone: the plugins
//!   release what they allocated for this container (IPAM) and leave the
//!   interface, which is the other container's, alone.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use cni_async::Cni;
//! use cni_core::{confdir, RuntimeConf};
//! use std::path::Path;
//! use std::time::Duration;
//!
//! let cni = Cni::builder().plugin_dirs(["/opt/cni/bin", "/usr/lib/cni"]).build();
//! let list = confdir::load_network(Path::new("/etc/cni/net.d"), "mynet")?;
//! let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
//! let result = cni
//!     .add_network_list(&list, &rt)
//!     .timeout(Duration::from_secs(30))
//!     .rollback(true)
//!     .await?;
//! println!("{}", result.to_json_pretty());
//! cni.check_network_list(&list, &rt).await?;
//! cni.del_network_list(&list, &rt).await?;
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::error::Chain;
use cni_core::error::code;
use cni_core::result::CniResult;
use cni_core::stdin::{GcAttachment, StdinInput, plugin_stdin, version_stdin};
use cni_core::validate::Escaped;
use cni_core::version::PluginInfo;
use cni_core::{Command, NetworkConfigList, PluginConfig, RuntimeConf, Version, env, validate};
use futures::future::BoxFuture;
use serde_json::Value;
use tracing::Instrument;

use crate::cache::{AttachmentLock, ResultCache};
use crate::error::{ERROR_STDERR_MAX, ERROR_STDOUT_MAX, Error, Errors, lossy_capped};
use crate::exec::{
    ExecRequest, OutputLimits, PluginExec, PluginStderr, RawExec, SinkSlot, StderrSink, Timeouts,
};

/// The default plugin dirs: `/opt/cni/bin`, then Debian's `/usr/lib/cni`.
pub const DEFAULT_PLUGIN_DIRS: [&str; 2] = ["/opt/cni/bin", "/usr/lib/cni"];

/// Per-call options, set on a request with [`AddRequest::options`] (and
/// the same method of the other requests), or one at a time
/// ([`AddRequest::timeout`], [`AddRequest::rollback`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// Deadline for the whole operation; `None` = the per-verb default.
    pub timeout: Option<Duration>,
    /// ADD only: when the chain fails part way, DEL the plugins that ran
    /// (including the one that failed), last to first, with a fresh deadline.
    pub rollback: bool,
}

impl CallOptions {
    /// Options with this deadline.
    pub fn with_timeout(timeout: Duration) -> Self {
        CallOptions {
            timeout: Some(timeout),
            ..Default::default()
        }
    }
}

/// What GC did.
///
/// A stale attachment whose DEL failed, or that the deadline left no time
/// for, does not fail the GC: it is listed in [`GcSummary::failed`] (its
/// cache entry stays, so the next GC or a DEL tries again) and the others
/// are still deleted. Callers that treat any leftover as a failure (as the
/// reference cnitool does) use [`GcSummary::into_result`].
#[derive(Debug, Default)]
pub struct GcSummary {
    /// Stale cached attachments that were deleted (DEL run, cache entry removed).
    pub deleted: Vec<GcAttachment>,
    /// Stale cached attachments that were not deleted, in the order tried.
    pub failed: Vec<GcFailure>,
    /// Whether GC was sent to the plugins (1.1.0 lists only).
    pub plugins_called: bool,
    /// True when the list has `disableGC` and nothing was done.
    pub disabled: bool,
}

/// A stale attachment GC could not delete, and why.
#[derive(Debug)]
pub struct GcFailure {
    /// The attachment.
    pub attachment: GcAttachment,
    /// Why its DEL failed: the plugin's error, or [`Error::Timeout`] when
    /// the GC's deadline expired during or before it.
    pub error: Error,
}

impl GcFailure {
    /// The error with the attachment and network named in its context.
    pub fn into_error(self, network: &str) -> Error {
        Error::Context {
            context: format!(
                "delete stale attachment {} {} of network {network}",
                self.attachment.container_id, self.attachment.ifname
            ),
            source: Box::new(self.error),
        }
    }
}

impl GcSummary {
    /// `Ok(self)` when no stale attachment was left; otherwise every
    /// failure as one [`Error::Multiple`] naming the attachments.
    pub fn into_result(self, network: &str) -> Result<GcSummary, Error> {
        if self.failed.is_empty() {
            return Ok(self);
        }
        let mut errors = Errors::new(format!("GC of network {network}"));
        for f in self.failed {
            errors.push(f.into_error(network));
        }
        errors.into_result_listed().map(|()| GcSummary::default())
    }
}

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

    /// A cache with non-default settings.
    pub fn cache(mut self, cache: ResultCache) -> Self {
        self.cache = cache;
        self
    }

    /// The executor (default [`RawExec`]).
    pub fn exec(mut self, exec: Arc<dyn PluginExec>) -> Self {
        self.exec = Some(exec);
        self
    }

    /// Per-verb deadlines.
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Caps on plugin output.
    pub fn output_limits(mut self, limits: OutputLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Whether ADD and CHECK also refuse a netns that is not a network
    /// namespace ([`check_netns`](crate::check_netns); default off, as
    /// libcni, which leaves it to the plugins). An empty or relative netns
    /// is refused for ADD and CHECK either way
    /// ([`check_netns_path`](crate::nscheck::check_netns_path)). cnid turns
    /// it on: its callers must not learn anything else about the host's
    /// files.
    pub fn check_netns(mut self, check: bool) -> Self {
        self.check_netns = check;
        self
    }

    /// Where the stderr of plugins that succeed goes (libcni writes it to
    /// the caller's stderr). Called once per plugin run of ADD, DEL, CHECK,
    /// STATUS or GC that succeeded with non-empty stderr, with the plugin
    /// type, verb, network and the bytes ([`PluginStderr`]). Default: none.
    /// Such stderr is also logged as an `info` tracing event, with or
    /// without a sink (escaped, first [`LOG_STDERR_MAX`](crate::exec::LOG_STDERR_MAX)
    /// bytes). A failing plugin's stderr is part of its error instead.
    ///
    /// ```no_run
    /// use std::io::Write;
    /// use std::sync::Arc;
    /// use cni_async::Cni;
    /// use cni_async::exec::PluginStderr;
    ///
    /// // Pass it through, as libcni does.
    /// let cni = Cni::builder()
    ///     .plugin_stderr(Arc::new(|s: &PluginStderr<'_>| {
    ///         let _ = std::io::stderr().lock().write_all(s.bytes);
    ///     }))
    ///     .build();
    /// ```
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

#[derive(Debug)]
struct Inner {
    plugin_dirs: Vec<PathBuf>,
    cni_path: String,
    cache: ResultCache,
    exec: Arc<dyn PluginExec>,
    timeouts: Timeouts,
    limits: OutputLimits,
    check_netns: bool,
    stderr_sink: SinkSlot,
    /// How many ADDs run on tasks of their own
    /// ([`AddRequest::rollback_on_cancel`]); [`Cni::wait_detached`] waits
    /// for 0.
    detached: tokio::sync::watch::Sender<usize>,
}

/// Runs CNI operations (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cni {
    inner: Arc<Inner>,
}

impl Default for Cni {
    fn default() -> Self {
        Cni::builder().build()
    }
}

/// One network as the operations see it: a list, or a single plugin
/// configuration used on its own (libcni's `AddNetwork` and friends).
#[derive(Debug)]
struct Net<'a> {
    name: &'a str,
    version: Version,
    plugins: &'a [PluginConfig],
    cache_bytes: Cow<'a, [u8]>,
    disable_check: bool,
}

impl<'a> Net<'a> {
    fn list(list: &'a NetworkConfigList) -> Self {
        Net {
            name: list.name(),
            version: list.version(),
            plugins: list.plugins(),
            cache_bytes: Cow::Owned(list.cache_bytes()),
            disable_check: list.disable_check(),
        }
    }

    fn single(plugin: &'a PluginConfig) -> Result<Self, Error> {
        let version = cni_core::version::select_version(plugin.cni_version(), &[])?;
        Ok(Net {
            name: plugin.name().unwrap_or_default(),
            version,
            plugins: std::slice::from_ref(plugin),
            cache_bytes: Cow::Borrowed(plugin.bytes()),
            disable_check: false,
        })
    }
}

/// A [`Net`] that owns its parts, for an ADD on a task of its own.
#[derive(Debug)]
struct OwnedNet {
    name: String,
    version: Version,
    plugins: Vec<PluginConfig>,
    cache_bytes: Vec<u8>,
    disable_check: bool,
}

impl OwnedNet {
    fn new(net: &Net<'_>) -> Self {
        OwnedNet {
            name: net.name.to_owned(),
            version: net.version,
            plugins: net.plugins.to_vec(),
            cache_bytes: net.cache_bytes.to_vec(),
            disable_check: net.disable_check,
        }
    }

    fn net(&self) -> Net<'_> {
        Net {
            name: &self.name,
            version: self.version,
            plugins: &self.plugins,
            cache_bytes: Cow::Borrowed(&self.cache_bytes),
            disable_check: self.disable_check,
        }
    }
}

/// Counts one detached ADD in [`Inner::detached`] while it lives (also
/// when its task panics).
#[derive(Debug)]
struct DetachedGuard(Cni);

impl DetachedGuard {
    fn new(cni: &Cni) -> Self {
        cni.inner.detached.send_modify(|n| *n += 1);
        DetachedGuard(cni.clone())
    }
}

impl Drop for DetachedGuard {
    fn drop(&mut self) {
        self.0.inner.detached.send_modify(|n| *n -= 1);
    }
}

/// A deadline for one operation.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    total: Duration,
}

/// The error of a plugin run that a spent deadline left no time to start
/// (what `run_plugin` answers then, without looking the plugin up).
fn not_started(plugin: &PluginConfig, command: Command, deadline: Deadline) -> Error {
    Error::Timeout {
        plugin_type: plugin.plugin_type().to_owned(),
        command,
        elapsed: deadline.total,
        timeout: deadline.total,
        stderr_so_far: String::new(),
    }
}

impl Deadline {
    fn after(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            total,
        }
    }

    fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
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
            check_netns: false,
            stderr_sink: SinkSlot::default(),
        }
    }

    /// The plugin dirs.
    pub fn plugin_dirs(&self) -> &[PathBuf] {
        &self.inner.plugin_dirs
    }

    /// The binary that runs for `plugin_type` (the executor's lookup in the
    /// plugin dirs), without running it.
    pub fn find_plugin(&self, plugin_type: &str) -> Result<PathBuf, Error> {
        self.inner
            .exec
            .find_plugin(plugin_type, &self.inner.plugin_dirs)
    }

    /// The result cache.
    pub fn cache(&self) -> &ResultCache {
        &self.inner.cache
    }

    /// The default deadlines.
    pub fn timeouts(&self) -> Timeouts {
        self.inner.timeouts
    }

    fn deadline(&self, command: Command, opts: &CallOptions) -> Deadline {
        Deadline::after(
            opts.timeout
                .unwrap_or_else(|| self.inner.timeouts.for_command(command)),
        )
    }

    /// Waits until every ADD started with
    /// [`AddRequest::rollback_on_cancel`] has ended on its task: finished
    /// and handed to its caller, or (its caller gone) rolled back. For a
    /// graceful shutdown. (A retry of an attachment whose ADD was given up
    /// need not wait: it waits for the attachment's lock.)
    pub async fn wait_detached(&self) {
        let mut rx = self.inner.detached.subscribe();
        // The sender lives in `self`: the wait cannot fail.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    // ----- lists -----

    /// ADD: runs the plugins first to last, chaining each result as the
    /// next `prevResult` (converted to the list's version first), and caches
    /// the final result. Await the request; set options on it first if
    /// needed ([`AddRequest::timeout`], [`AddRequest::rollback`],
    /// [`AddRequest::options`]).
    pub fn add_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> AddRequest<'a> {
        AddRequest {
            cni: self,
            net: Ok(Net::list(list)),
            rt,
            opts: CallOptions::default(),
            detach: false,
        }
    }

    /// DEL: runs the plugins last to first with the cached result as
    /// `prevResult` (0.4.0 and later), then removes the cache entry. A
    /// missing or corrupt cache entry is not an error: DEL runs without
    /// `prevResult`. Repeating a DEL is fine.
    pub fn del_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> DelRequest<'a> {
        DelRequest {
            cni: self,
            target: DelTarget::Net(Ok(Net::list(list))),
            rt,
            opts: CallOptions::default(),
        }
    }

    /// DEL using the configuration stored in the cache entry of the
    /// attachment, for when the network's config has since been removed or
    /// changed (`docs/decisions.md` D10). The cached `CNI_ARGS` and
    /// capability args are used when `rt` has none. Errors with code 3 when
    /// there is no entry.
    pub fn del_cached<'a>(&'a self, network: &'a str, rt: &'a RuntimeConf) -> DelRequest<'a> {
        DelRequest {
            cni: self,
            target: DelTarget::Cached(network),
            rt,
            opts: CallOptions::default(),
        }
    }

    async fn run_del_cached(
        &self,
        network: &str,
        rt: &RuntimeConf,
        opts: &CallOptions,
    ) -> Result<(), Error> {
        self.del_cached_expecting(network, rt, opts, None).await
    }

    /// [`Cni::del_cached`]; with `expect`, only while the cache holds a
    /// record `expect` accepts once the attachment's lock is taken (otherwise
    /// [`Error::NotAttached`], nothing run), and with `rt.netns` as given
    /// (empty: none): what a reap of a record scanned earlier needs
    /// ([`crate::stale`]).
    pub(crate) async fn del_cached_expecting(
        &self,
        network: &str,
        rt: &RuntimeConf,
        opts: &CallOptions,
        expect: Option<&Expect<'_>>,
    ) -> Result<(), Error> {
        validate::network_name(network)?;
        rt.validate()?;
        let Some(CacheEntry::Record(rec)) = self
            .inner
            .cache
            .read(network, &rt.container_id, &rt.ifname)
            .await?
        else {
            return Err(Error::NotAttached {
                network: network.to_owned(),
                container_id: rt.container_id.clone(),
                ifname: rt.ifname.clone(),
            });
        };
        // The entry of a single-network ADD holds a plugin config, not a list.
        let mut list = NetworkConfigList::from_bytes(&rec.config, None)?;
        if list.plugins().is_empty() && !list.raw().contains_key("plugins") {
            list = NetworkConfigList::from_plugin(PluginConfig::from_bytes(&rec.config, None)?)?;
        }
        let mut rt = rt.clone();
        if rt.args.is_empty() {
            rt.args = rec.cni_args.clone();
        }
        if rt.capability_args.is_empty() {
            rt.capability_args = rec.capability_args.clone();
        }
        // A reap (`expect`) chose its netns: empty means none.
        if rt.netns.is_empty() && expect.is_none() {
            rt.netns = rec.netns.clone();
        }
        let deadline = self.deadline(Command::Del, opts);
        self.del_expecting(&Net::list(&list), &rt, deadline, None, expect)
            .await
    }

    /// CHECK: refused below 0.4.0; a no-op with `disableCheck`; refused with
    /// code 3 when no ADD result is cached (spec: never CHECK before ADD,
    /// `docs/decisions.md` D12); otherwise runs the plugins first to last
    /// with the cached result as `prevResult`.
    pub fn check_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> CheckRequest<'a> {
        CheckRequest {
            cni: self,
            net: Ok(Net::list(list)),
            rt,
            opts: CallOptions::default(),
        }
    }

    /// STATUS: asks each plugin, first to last, whether it is ready for ADD.
    /// Lists below 1.1.0 have no STATUS: the call succeeds without running
    /// anything (as libcni). Codes 50 and 51 come back as
    /// [`Error::NotReady`] and [`Error::NotReadyLimitedConnectivity`].
    pub fn status_network_list<'a>(&'a self, list: &'a NetworkConfigList) -> StatusRequest<'a> {
        StatusRequest {
            cni: self,
            list,
            opts: CallOptions::default(),
        }
    }

    async fn run_status(&self, list: &NetworkConfigList, opts: &CallOptions) -> Result<(), Error> {
        validate::network_name(list.name())?;
        if !list.version().has_status_and_gc() {
            tracing::debug!(network = list.name(), version = %list.version(), "STATUS not defined before 1.1.0; nothing to do");
            return Ok(());
        }
        let deadline = self.deadline(Command::Status, opts);
        let span = tracing::info_span!("cni.status", network = list.name());
        async {
            for plugin in list.plugins() {
                let stdin = plugin_stdin(list.name(), list.version(), plugin, StdinInput::Status)?;
                let res = self
                    .run_plugin(list.name(), plugin, Command::Status, None, &stdin, deadline)
                    .await;
                if let Err(e) = res {
                    return Err(match e {
                        Error::Plugin {
                            plugin_type,
                            error: Some(obj),
                            stderr,
                            ..
                        } if obj.code == code::PLUGIN_NOT_AVAILABLE => Error::NotReady {
                            network: list.name().to_owned(),
                            plugin_type,
                            error: obj,
                            stderr,
                        },
                        Error::Plugin {
                            plugin_type,
                            error: Some(obj),
                            stderr,
                            ..
                        } if obj.code == code::PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY => {
                            Error::NotReadyLimitedConnectivity {
                                network: list.name().to_owned(),
                                plugin_type,
                                error: obj,
                                stderr,
                            }
                        }
                        other => other,
                    });
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// GC: a no-op with `disableGC`. Otherwise every cached attachment of
    /// this network that is not in `valid_attachments` gets a DEL (with this
    /// config and the cached args) and loses its cache entry; then, for 1.1.0
    /// lists, every plugin gets GC with `cni.dev/valid-attachments` (and the
    /// older `cni.dev/attachments`). Errors do not stop the rest.
    ///
    /// A stale DEL that fails is reported in [`GcSummary::failed`], not as
    /// an error. The call fails when a plugin's GC fails: then every error,
    /// the stale DELs' first (each naming its attachment), comes back as
    /// [`Error::Multiple`].
    ///
    /// The deadline bounds the whole GC: the stale DELs and the plugins'
    /// GC share it. A plugin still running when it expires is killed; the
    /// stale DELs it leaves no time for are not started and are reported
    /// as failed with [`Error::Timeout`].
    pub fn gc_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        valid_attachments: &'a [GcAttachment],
    ) -> GcRequest<'a> {
        GcRequest {
            cni: self,
            list,
            valid_attachments,
            opts: CallOptions::default(),
        }
    }

    async fn run_gc(
        &self,
        list: &NetworkConfigList,
        valid_attachments: &[GcAttachment],
        opts: &CallOptions,
    ) -> Result<GcSummary, Error> {
        validate::network_name(list.name())?;
        if list.disable_gc() {
            return Ok(GcSummary {
                disabled: true,
                ..Default::default()
            });
        }
        // One deadline for everything below.
        let deadline = self.deadline(Command::Gc, opts);
        let span = tracing::info_span!("cni.gc", network = list.name());
        async {
            let net = Net::list(list);
            let mut summary = GcSummary::default();
            let mut plugin_errors = Vec::new();
            let cached = self.inner.cache.list(None).await?;
            for rec in cached.into_iter().filter(|r| r.network_name == list.name()) {
                let key = GcAttachment {
                    container_id: rec.container_id.clone(),
                    ifname: rec.if_name.clone(),
                };
                if valid_attachments.contains(&key) {
                    continue;
                }
                let rt = rec.runtime_conf();
                let res = match net.plugins.last() {
                    Some(first) if deadline.remaining().is_zero() => {
                        Err(not_started(first, Command::Del, deadline))
                    }
                    _ => self.del(&net, &rt, deadline).await,
                };
                match res {
                    Ok(()) => summary.deleted.push(key),
                    Err(error) => {
                        tracing::warn!(container = %rt.container_id, ifname = %rt.ifname, error = %Chain(&error), "GC could not delete a stale attachment; going on with the others");
                        summary.failed.push(GcFailure {
                            attachment: key,
                            error,
                        });
                    }
                }
            }
            if list.version().has_status_and_gc() {
                summary.plugins_called = true;
                for plugin in list.plugins() {
                    let stdin = plugin_stdin(
                        list.name(),
                        list.version(),
                        plugin,
                        StdinInput::Gc { valid_attachments },
                    )?;
                    if let Err(e) = self
                        .run_plugin(list.name(), plugin, Command::Gc, None, &stdin, deadline)
                        .await
                    {
                        plugin_errors.push(e);
                    }
                }
            }
            if plugin_errors.is_empty() {
                return Ok(summary);
            }
            // The stale DELs' failures first, each naming its attachment.
            let mut all = Errors::new(format!("GC of network {}", list.name()));
            for f in summary.failed {
                all.push(f.into_error(list.name()));
            }
            for e in plugin_errors {
                all.push(e);
            }
            all.into_result_listed().map(|()| GcSummary::default())
        }
        .instrument(span)
        .await
    }

    /// Asks each plugin of the list for its supported versions; errors for
    /// every plugin that is missing or does not support the list's version
    /// (all collected). On success, the capabilities the list enables.
    pub async fn validate_network_list(
        &self,
        list: &NetworkConfigList,
    ) -> Result<Vec<String>, Error> {
        let mut errors = Errors::new(format!("validation of network {}", list.name()));
        for plugin in list.plugins() {
            match self.version_info(plugin.plugin_type()).await {
                Ok(info) if info.supports(list.version()) => {}
                Ok(info) => errors.push(Error::Core(cni_core::Error::UnsupportedVersion {
                    version: list.version().to_string(),
                    context: format!(
                        "plugin {} (supports {})",
                        plugin.plugin_type(),
                        info.supported_versions.join(", ")
                    ),
                })),
                Err(e) => errors.push(e),
            }
        }
        errors.into_result()?;
        Ok(list.capabilities())
    }

    /// The cached final ADD result of an attachment, converted to the list's version.
    pub async fn cached_result(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        self.cached_result_of(list.name(), list.version(), rt).await
    }

    /// The configuration bytes and runtime parameters stored for an
    /// attachment (libcni's `GetNetworkListCachedConfig`).
    pub async fn cached_config(
        &self,
        network: &str,
        rt: &RuntimeConf,
    ) -> Result<Option<(Vec<u8>, RuntimeConf)>, Error> {
        validate::network_name(network)?;
        rt.validate()?;
        match self
            .inner
            .cache
            .read(network, &rt.container_id, &rt.ifname)
            .await?
        {
            Some(CacheEntry::Record(rec)) => {
                let mut out = rt.clone();
                if !rec.cni_args.is_empty() {
                    out.args = rec.cni_args.clone();
                }
                out.capability_args = rec.capability_args.clone();
                Ok(Some((rec.config, out)))
            }
            _ => Ok(None),
        }
    }

    /// The cached attachments, all or those of one container.
    pub async fn cached_attachments(
        &self,
        container_id: Option<&str>,
    ) -> Result<Vec<CacheRecord>, Error> {
        if let Some(c) = container_id {
            validate::container_id(c)?;
        }
        self.inner.cache.list(container_id).await
    }

    /// One page of [`Cni::cached_attachments`] (see
    /// [`ResultCache::list_page`](crate::cache::ResultCache::list_page)):
    /// the records and the file name to continue after, if any is left.
    pub async fn cached_attachments_page(
        &self,
        container_id: Option<&str>,
        page: crate::cache::ListPage,
    ) -> Result<(Vec<CacheRecord>, Option<String>), Error> {
        if let Some(c) = container_id {
            validate::container_id(c)?;
        }
        self.inner.cache.list_page(container_id, page).await
    }

    /// Runs `VERSION` on a plugin.
    pub async fn version_info(&self, plugin_type: &str) -> Result<PluginInfo, Error> {
        let path = self
            .inner
            .exec
            .find_plugin(plugin_type, &self.inner.plugin_dirs)?;
        let mut env = env::plugin_env(Command::Version, None, &self.inner.cni_path);
        // Plugins built on an old skel insist on these even for VERSION;
        // libcni passes "dummy" for the same reason.
        for (k, v) in env.iter_mut() {
            if k == env::CNI_NETNS || k == env::CNI_IFNAME {
                *v = "dummy".into();
            }
        }
        let stdin = version_stdin(Version::CURRENT);
        let out = self
            .inner
            .exec
            .exec(
                ExecRequest::new(
                    &path,
                    plugin_type,
                    Command::Version,
                    &env,
                    &stdin,
                    self.inner.timeouts.version,
                )
                .with_limits(self.inner.limits),
            )
            .await;
        let out = match out {
            Ok(out) => out,
            // A plugin from before VERSION existed (spec 0.1.0) rejects it.
            Err(Error::Plugin { error, stderr, .. })
                if error
                    .as_deref()
                    .is_some_and(|o| o.msg == "unknown CNI_COMMAND: VERSION")
                    || stderr.trim() == "unknown CNI_COMMAND: VERSION" =>
            {
                return Ok(PluginInfo {
                    cni_version: "0.1.0".into(),
                    supported_versions: vec!["0.1.0".into()],
                });
            }
            Err(e) => return Err(e),
        };
        crate::exec::check_success(plugin_type, Command::Version, &out)?;
        PluginInfo::decode(&out.stdout).map_err(|e| Error::PluginOutput {
            plugin_type: plugin_type.to_owned(),
            command: Command::Version,
            reason: e.to_string(),
            stdout: lossy_capped(&out.stdout, ERROR_STDOUT_MAX),
            stderr: lossy_capped(&out.stderr, ERROR_STDERR_MAX),
        })
    }

    // ----- single networks -----

    /// ADD of a single plugin configuration (its own `name` and
    /// `cniVersion`), libcni's `AddNetwork`. Options as
    /// [`Cni::add_network_list`].
    pub fn add_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> AddRequest<'a> {
        AddRequest {
            cni: self,
            net: Net::single(plugin),
            rt,
            opts: CallOptions::default(),
            detach: false,
        }
    }

    /// DEL of a single plugin configuration, libcni's `DelNetwork`.
    pub fn del_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> DelRequest<'a> {
        DelRequest {
            cni: self,
            target: DelTarget::Net(Net::single(plugin)),
            rt,
            opts: CallOptions::default(),
        }
    }

    /// CHECK of a single plugin configuration, libcni's `CheckNetwork`.
    pub fn check_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> CheckRequest<'a> {
        CheckRequest {
            cni: self,
            net: Net::single(plugin),
            rt,
            opts: CallOptions::default(),
        }
    }

    /// The cached result of a single plugin configuration's attachment.
    pub async fn cached_network_result(
        &self,
        plugin: &PluginConfig,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        let net = Net::single(plugin)?;
        self.cached_result_of(net.name, net.version, rt).await
    }

    /// Checks that the plugin exists and supports the config's version;
    /// returns the capabilities it enables.
    pub async fn validate_network(&self, plugin: &PluginConfig) -> Result<Vec<String>, Error> {
        let net = Net::single(plugin)?;
        let info = self.version_info(plugin.plugin_type()).await?;
        if !info.supports(net.version) {
            return Err(Error::Core(cni_core::Error::UnsupportedVersion {
                version: net.version.to_string(),
                context: format!(
                    "plugin {} (supports {})",
                    plugin.plugin_type(),
                    info.supported_versions.join(", ")
                ),
            }));
        }
        Ok(plugin
            .capabilities()
            .iter()
            .filter(|(_, on)| *on)
            .map(|(c, _)| c.clone())
            .collect())
    }

    // ----- the work -----

    fn validate_attachment(net: &Net<'_>, rt: &RuntimeConf) -> Result<(), Error> {
        validate::network_name(net.name)?;
        rt.validate()?;
        // A list without plugins (no `plugins`, plugin files not loaded)
        // would make DEL drop the cache entry without running anything.
        if net.plugins.is_empty() {
            return Err(Error::Core(cni_core::Error::InvalidConfig {
                origin: format!("network {}", net.name),
                reason: "no plugins to run".into(),
            }));
        }
        Ok(())
    }

    /// The ADD. `gave_up` is asked before each plugin and before the cache
    /// write: when it says the caller is gone (a detached ADD's), the
    /// plugins that ran are rolled back and the answer is `Ok(None)`.
    async fn add(
        &self,
        net: Net<'_>,
        rt: &RuntimeConf,
        opts: &CallOptions,
        gave_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<Added>, Error> {
        Self::validate_attachment(&net, rt)?;
        if self.inner.check_netns {
            crate::check_netns(&rt.netns, Command::Add)?;
        } else {
            crate::nscheck::check_netns_path(&rt.netns, Command::Add)?;
        }
        let deadline = self.deadline(Command::Add, opts);
        let span = tracing::info_span!("cni.add", network = net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            let started = Instant::now();
            // File names are ambiguous when names contain '-': never let this
            // ADD overwrite the record of another attachment. The lock and
            // that check take one trip to the blocking pool.
            let lock = self
                .inner
                .cache
                .lock_unused(net.name, &rt.container_id, &rt.ifname, deadline.remaining())
                .await?;
            let mut prev: Option<CniResult> = None;
            let mut prev_value: Option<Value> = None;
            for (index, plugin) in net.plugins.iter().enumerate() {
                if gave_up() {
                    self.roll_back_abandoned(&net, &net.plugins[..index], rt, prev_value.as_ref()).await;
                    return Ok(None);
                }
                let step = self
                    .add_one(&net, plugin, rt, prev_value.as_ref(), deadline)
                    .await;
                match step {
                    Ok(result) => {
                        prev_value = Some(result.to_value());
                        prev = Some(result);
                    }
                    Err(e) if opts.rollback => {
                        tracing::warn!(plugin = plugin.plugin_type(), error = %Escaped(Chain(&e)), "ADD failed; rolling back the plugins that ran");
                        // A plugin that could not be found or started never
                        // ran: its DEL would fail the same way and stop the
                        // rollback of the plugins that did.
                        let started = !matches!(e, Error::PluginNotFound { .. } | Error::Spawn { .. });
                        let ran = &net.plugins[..index + usize::from(started)];
                        let rb = self
                            .rollback(&net, ran, rt, prev_value.as_ref())
                            .await;
                        drop(lock);
                        return Err(match rb {
                            Ok(()) => e,
                            Err(rb) => Error::RollbackFailed {
                                error: Box::new(e),
                                rollback: Box::new(rb),
                            },
                        });
                    }
                    Err(e) => return Err(e),
                }
            }
            let Some(result) = prev else {
                return Err(Error::Core(cni_core::Error::InvalidConfig {
                    origin: format!("network {}", net.name),
                    reason: "no plugins to run".into(),
                }));
            };
            if gave_up() {
                self.roll_back_abandoned(&net, net.plugins, rt, prev_value.as_ref()).await;
                return Ok(None);
            }
            let rec = CacheRecord::new(net.name, rt, net.cache_bytes.to_vec(), prev_value);
            // The lock travels with the write: if this future is dropped
            // mid-write, the lock is released only once the write is done,
            // so a DEL cannot slip in before the record lands.
            let (lock, written) = self.inner.cache.write_holding(&rec, lock).await;
            if let Err(e) = written {
                // The attachment exists but is not recorded: a later DEL would
                // run without prevResult. With rollback, undo it; otherwise
                // the caller must DEL (as after any failed ADD).
                if opts.rollback {
                    let value = result.to_value();
                    if let Err(rb) = self.rollback(&net, net.plugins, rt, Some(&value)).await {
                        return Err(Error::RollbackFailed {
                            error: Box::new(e),
                            rollback: Box::new(rb),
                        });
                    }
                }
                return Err(e);
            }
            tracing::debug!(elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "ADD done");
            Ok(Some(Added { result, lock }))
        }
        .instrument(span)
        .await
    }

    /// Rolls back the plugins a detached ADD ran before its caller gave up
    /// (nobody is left to hear a failure: it is logged).
    async fn roll_back_abandoned(
        &self,
        net: &Net<'_>,
        ran: &[PluginConfig],
        rt: &RuntimeConf,
        prev: Option<&Value>,
    ) {
        tracing::info!(
            plugins = ran.len(),
            "ADD given up by its caller; rolling back the plugins that ran"
        );
        if ran.is_empty() {
            return;
        }
        if let Err(e) = self.rollback(net, ran, rt, prev).await {
            tracing::warn!(error = %Escaped(Chain(&e)), "rollback of a given-up ADD failed");
        }
    }

    /// A detached ADD's task ([`AddRequest::rollback_on_cancel`]): runs
    /// the ADD with rollback, hands the outcome to `tx`, and DELs the
    /// attachment when the caller is gone before taking its result (`ack`
    /// dropped unsent).
    async fn add_detached(
        self,
        owned: OwnedNet,
        rt: RuntimeConf,
        opts: CallOptions,
        (tx, ack): (
            tokio::sync::oneshot::Sender<Result<CniResult, Error>>,
            tokio::sync::oneshot::Receiver<()>,
        ),
        _counted: DetachedGuard,
    ) {
        let outcome = self.add(owned.net(), &rt, &opts, &|| tx.is_closed()).await;
        // The attachment's lock stays held until the caller took the
        // result, or until the DEL below is done: a caller that gave up and
        // retries the same attachment at once waits for it, and this DEL
        // can never delete what the retry made.
        let Added { result, lock } = match outcome {
            Ok(None) => return,
            Ok(Some(added)) => added,
            Err(e) => {
                // A failed ADD was rolled back already.
                let _ = tx.send(Err(e));
                return;
            }
        };
        if tx.send(Ok(result)).is_ok() && ack.await.is_ok() {
            return;
        }
        tracing::info!("ADD given up by its caller after it finished; deleting it");
        let deadline = self.deadline(Command::Del, &CallOptions::default());
        if let Err(e) = self
            .del_expecting(&owned.net(), &rt, deadline, lock, None)
            .await
        {
            tracing::warn!(error = %Escaped(Chain(&e)), "DEL of a given-up ADD failed");
        }
    }

    async fn add_one(
        &self,
        net: &Net<'_>,
        plugin: &PluginConfig,
        rt: &RuntimeConf,
        prev: Option<&Value>,
        deadline: Deadline,
    ) -> Result<CniResult, Error> {
        let stdin = plugin_stdin(
            net.name,
            net.version,
            plugin,
            StdinInput::Attachment {
                rt,
                prev_result: prev,
            },
        )?;
        let out = self
            .run_plugin(net.name, plugin, Command::Add, Some(rt), &stdin, deadline)
            .await?;
        let bad = |reason: String| Error::PluginOutput {
            plugin_type: plugin.plugin_type().to_owned(),
            command: Command::Add,
            reason,
            stdout: lossy_capped(&out.stdout, ERROR_STDOUT_MAX),
            stderr: lossy_capped(&out.stderr, ERROR_STDERR_MAX),
        };
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(bad("plugin succeeded but printed no result".into()));
        }
        let result = CniResult::parse(&out.stdout, net.version).map_err(|e| bad(e.to_string()))?;
        if result.version() == net.version {
            return Ok(result);
        }
        // An older (or newer) result: convert before chaining, printing and
        // caching it (`docs/decisions.md` D6).
        tracing::debug!(plugin = plugin.plugin_type(), from = %result.version(), to = %net.version, "converting plugin result");
        result.convert(net.version).map_err(|e| bad(e.to_string()))
    }

    async fn rollback(
        &self,
        net: &Net<'_>,
        ran: &[PluginConfig],
        rt: &RuntimeConf,
        prev: Option<&Value>,
    ) -> Result<(), Error> {
        // A fresh deadline: never the ADD's, which may have expired.
        let deadline = Deadline::after(self.inner.timeouts.del);
        let rt = &self.rollback_attachment(rt).await;
        let prev = if net.version.has_prev_result_on_del() {
            prev
        } else {
            None
        };
        // Unlike DEL, a rollback goes on past a failing plugin: it is
        // cleanup, and every plugin undone is a leak avoided.
        let mut errors = Errors::new(format!("rollback of network {}", net.name));
        for plugin in ran.iter().rev() {
            if let Err(e) = self.del_one(net, plugin, rt, prev, deadline).await {
                tracing::warn!(plugin = plugin.plugin_type(), error = %Escaped(Chain(&e)), "rollback DEL failed; continuing with the others");
                errors.push(e);
            }
        }
        errors.into_result()
    }

    /// The attachment a rollback DELs: `rt`, or `rt` without its netns when
    /// another container's cached attachment holds that netns and ifname
    /// (see the module's caveats).
    async fn rollback_attachment(&self, rt: &RuntimeConf) -> RuntimeConf {
        if rt.netns.is_empty() {
            return rt.clone();
        }
        let others = match self
            .inner
            .cache
            .others_on(&rt.netns, &rt.ifname, &rt.container_id)
            .await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %Escaped(Chain(&e)), "cannot list the cache before a rollback; rolling back in the netns");
                Vec::new()
            }
        };
        match others.first() {
            None => rt.clone(),
            Some(owner) => {
                tracing::warn!(owner = ?owner.container_id, owner_network = ?owner.network_name,
                    "the netns and interface belong to another container's attachment; rolling back without the netns");
                RuntimeConf {
                    netns: String::new(),
                    ..rt.clone()
                }
            }
        }
    }

    async fn del_one(
        &self,
        net: &Net<'_>,
        plugin: &PluginConfig,
        rt: &RuntimeConf,
        prev: Option<&Value>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let stdin = plugin_stdin(
            net.name,
            net.version,
            plugin,
            StdinInput::Attachment {
                rt,
                prev_result: prev,
            },
        )?;
        self.run_plugin(net.name, plugin, Command::Del, Some(rt), &stdin, deadline)
            .await?;
        Ok(())
    }

    async fn del(&self, net: &Net<'_>, rt: &RuntimeConf, deadline: Deadline) -> Result<(), Error> {
        self.del_expecting(net, rt, deadline, None, None).await
    }

    /// DEL; with `held`, the attachment's lock already held (as a detached
    /// ADD's task holds it from the ADD to the DEL of a result nobody
    /// took); with `expect`, only while the cache holds a record it accepts
    /// once the lock is taken ([`Cni::del_cached_expecting`]).
    async fn del_expecting(
        &self,
        net: &Net<'_>,
        rt: &RuntimeConf,
        deadline: Deadline,
        held: Option<AttachmentLock>,
        expect: Option<&Expect<'_>>,
    ) -> Result<(), Error> {
        Self::validate_attachment(net, rt)?;
        let span = tracing::info_span!("cni.del", network = net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            // DEL must work when things are already gone (spec), also when
            // the cache dir is unusable (read-only, full, removed): then it
            // runs unlocked and without prevResult rather than not at all.
            // Only a lock held by someone else stops it. With prevResult,
            // the record is read in the same trip to the blocking pool as
            // the lock is taken.
            let with_prev = net.version.has_prev_result_on_del();
            let cache = &self.inner.cache;
            let (cid, ifname, timeout) = (&rt.container_id, &rt.ifname, deadline.remaining());
            let locked = if let Some(lock) = held {
                Ok((lock, None))
            } else if with_prev || expect.is_some() {
                cache
                    .lock_and_read(net.name, cid, ifname, timeout)
                    .await
                    .map(|(lock, read)| (lock, Some(read)))
            } else {
                cache.lock(net.name, cid, ifname, timeout).await.map(|lock| (lock, None))
            };
            let (lock, read) = match locked {
                Ok((lock, read)) => (Some(lock), read),
                Err(Error::Cache { path, op, source }) => {
                    tracing::warn!(file = %path.display(), op, error = %source, "cannot take the attachment lock; DEL runs unlocked");
                    (None, None)
                }
                Err(e) => return Err(e),
            };
            if let Some(expect) = expect {
                let same = matches!(&read, Some(Ok(Some(CacheEntry::Record(now)))) if expect(now));
                if lock.is_none() || !same {
                    return Err(Error::NotAttached {
                        network: net.name.to_owned(),
                        container_id: cid.clone(),
                        ifname: ifname.clone(),
                    });
                }
            }
            let prev = if with_prev {
                let read = match read {
                    Some(read) => read,
                    None => cache.read(net.name, cid, ifname).await,
                };
                read.and_then(|entry| result_of_entry(entry, net.version))
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %Escaped(Chain(&e)), "cached result unusable; DEL runs without prevResult");
                        None
                    })
                    .map(|r| r.to_value())
            } else {
                None
            };
            for plugin in net.plugins.iter().rev() {
                self.del_one(net, plugin, rt, prev.as_ref(), deadline).await?;
            }
            // The plugins are done: the attachment is gone. A cache entry we
            // cannot remove is stale, not an error of the DEL (a later DEL or
            // GC finds it again and repeats the harmless DEL).
            if let Err(e) = self
                .inner
                .cache
                .remove(net.name, &rt.container_id, &rt.ifname)
                .await
            {
                tracing::warn!(error = %Chain(&e), "DEL succeeded but its cache entry could not be removed");
                return Ok(());
            }
            if let Some(lock) = lock {
                lock.release_and_remove();
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn check(&self, net: Net<'_>, rt: &RuntimeConf, opts: &CallOptions) -> Result<(), Error> {
        Self::validate_attachment(&net, rt)?;
        if self.inner.check_netns {
            crate::check_netns(&rt.netns, Command::Check)?;
        } else {
            crate::nscheck::check_netns_path(&rt.netns, Command::Check)?;
        }
        if !net.version.has_check() {
            return Err(Error::Unsupported {
                network: net.name.to_owned(),
                command: Command::Check,
                version: net.version,
            });
        }
        if net.disable_check {
            tracing::debug!(network = net.name, "disableCheck is set; CHECK is a no-op");
            return Ok(());
        }
        let deadline = self.deadline(Command::Check, opts);
        let span = tracing::info_span!("cni.check", network = net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            // The lock and the read take one trip to the blocking pool.
            let (_lock, read) = self
                .inner
                .cache
                .lock_and_read(net.name, &rt.container_id, &rt.ifname, deadline.remaining())
                .await?;
            let Some(cached) = result_of_entry(read?, net.version)? else {
                return Err(Error::NotAttached {
                    network: net.name.to_owned(),
                    container_id: rt.container_id.clone(),
                    ifname: rt.ifname.clone(),
                });
            };
            let prev = cached.to_value();
            for plugin in net.plugins {
                let stdin = plugin_stdin(
                    net.name,
                    net.version,
                    plugin,
                    StdinInput::Attachment {
                        rt,
                        prev_result: Some(&prev),
                    },
                )?;
                self.run_plugin(net.name, plugin, Command::Check, Some(rt), &stdin, deadline)
                    .await?;
            }
            Ok(())
        }
        .instrument(span)
        .await
    }

    async fn cached_result_of(
        &self,
        network: &str,
        version: Version,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        validate::network_name(network)?;
        rt.validate()?;
        let entry = self
            .inner
            .cache
            .read(network, &rt.container_id, &rt.ifname)
            .await?;
        result_of_entry(entry, version)
    }

    async fn run_plugin(
        &self,
        network: &str,
        plugin: &PluginConfig,
        command: Command,
        rt: Option<&RuntimeConf>,
        stdin: &[u8],
        deadline: Deadline,
    ) -> Result<crate::exec::ExecOutput, Error> {
        let path = self
            .inner
            .exec
            .find_plugin(plugin.plugin_type(), &self.inner.plugin_dirs)?;
        let env = env::plugin_env(command, rt, &self.inner.cni_path);
        let remaining = deadline.remaining();
        if remaining.is_zero() {
            return Err(not_started(plugin, command, deadline));
        }
        let req = ExecRequest::new(&path, plugin.plugin_type(), command, &env, stdin, remaining)
            .with_limits(self.inner.limits);
        let out = self.inner.exec.exec(req).await?;
        crate::exec::check_success(plugin.plugin_type(), command, &out)?;
        self.inner.stderr_sink.emit(&PluginStderr {
            plugin_type: plugin.plugin_type(),
            command,
            network,
            container_id: rt.map(|rt| rt.container_id.as_str()),
            ifname: rt.map(|rt| rt.ifname.as_str()),
            bytes: &out.stderr,
        });
        Ok(out)
    }
}

macro_rules! common_request_methods {
    ($ty:ident) => {
        impl $ty<'_> {
            /// Replaces this call's options.
            pub fn options(mut self, opts: &CallOptions) -> Self {
                self.opts = opts.clone();
                self
            }

            /// The deadline for the whole operation (instead of the
            /// per-verb default of [`Timeouts`]).
            pub fn timeout(mut self, timeout: Duration) -> Self {
                self.opts.timeout = Some(timeout);
                self
            }
        }
    };
}

/// An ADD ready to run ([`Cni::add_network_list`], [`Cni::add_network`]):
/// `.await` it, after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct AddRequest<'a> {
    cni: &'a Cni,
    net: Result<Net<'a>, Error>,
    rt: &'a RuntimeConf,
    opts: CallOptions,
    detach: bool,
}

common_request_methods!(AddRequest);

impl AddRequest<'_> {
    /// When the chain fails part way, DEL the plugins that ran (see
    /// [`CallOptions::rollback`]).
    pub fn rollback(mut self, rollback: bool) -> Self {
        self.opts.rollback = rollback;
        self
    }

    /// Runs the ADD on a task of its own (spawned with `tokio::spawn` when
    /// the request is first polled), with [`CallOptions::rollback`] on, so
    /// that dropping this future leaves nothing behind: a caller that gives
    /// up (a dropped future, a `select!` that lost, a cancelled RPC) gets
    /// the plugins that ran rolled back, last to first. The plugin running
    /// at that moment is not killed: it finishes (within the ADD's
    /// deadline), then no further plugin starts and the rollback runs. An
    /// ADD that had already finished is deleted (DEL with its cached
    /// result). What cnid does for every request.
    ///
    /// The caller's deadline still applies. The work goes on after the
    /// drop, holding the attachment's lock until it is done (from the ADD
    /// to the DEL of a result nobody took): a retry of the same attachment
    /// waits for it, within the retry's own deadline, and never has what it
    /// made deleted by it. [`Cni::wait_detached`] waits for all such work
    /// (before a shutdown).
    ///
    /// ```no_run
    /// # async fn demo(cni: cni_async::Cni, list: cni_core::NetworkConfigList, rt: cni_core::RuntimeConf) {
    /// use std::time::Duration;
    /// let add = cni.add_network_list(&list, &rt).rollback_on_cancel();
    /// // Gives up after 5 s: whatever the ADD made is undone on its task.
    /// if tokio::time::timeout(Duration::from_secs(5), add).await.is_err() {
    ///     cni.wait_detached().await;
    /// }
    /// # }
    /// ```
    pub fn rollback_on_cancel(mut self) -> Self {
        self.opts.rollback = true;
        self.detach = true;
        self
    }
}

impl<'a> IntoFuture for AddRequest<'a> {
    type Output = Result<CniResult, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let net = self.net?;
            if !self.detach {
                let added = self.cni.add(net, self.rt, &self.opts, &|| false).await?;
                return Ok(added.expect("only a detached ADD is given up").result);
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (ack, ack_rx) = tokio::sync::oneshot::channel();
            // Counted before the spawn, so that a `wait_detached` right
            // after this future is dropped sees the task.
            let counted = DetachedGuard::new(self.cni);
            let task = self.cni.clone().add_detached(
                OwnedNet::new(&net),
                self.rt.clone(),
                self.opts,
                (tx, ack_rx),
                counted,
            );
            let handle = tokio::spawn(task);
            let outcome = rx.await;
            // Taken: the task leaves the attachment to the caller.
            let _ = ack.send(());
            match outcome {
                Ok(outcome) => outcome,
                // The task ended without an answer: it panicked (the
                // caller's panic, as in an ADD run in place), or the
                // runtime is shutting down.
                Err(_) => match handle.await {
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    _ => Err(Error::Core(cni_core::Error::InvalidConfig {
                        origin: format!("network {}", net.name),
                        reason: "the ADD's task was cancelled (runtime shutting down)".into(),
                    })),
                },
            }
        })
    }
}

/// A finished ADD: its result, and the attachment's lock still held (none
/// when the cache task holding it was lost), for a detached ADD to keep
/// until its caller took the result.
struct Added {
    result: CniResult,
    lock: Option<AttachmentLock>,
}

/// What a DEL expects of the record it finds under the lock
/// ([`Cni::del_cached_expecting`]).
pub(crate) type Expect<'a> = dyn Fn(&CacheRecord) -> bool + Send + Sync + 'a;

#[derive(Debug)]
enum DelTarget<'a> {
    Net(Result<Net<'a>, Error>),
    Cached(&'a str),
}

/// A DEL ready to run ([`Cni::del_network_list`], [`Cni::del_network`],
/// [`Cni::del_cached`]): `.await` it, after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct DelRequest<'a> {
    cni: &'a Cni,
    target: DelTarget<'a>,
    rt: &'a RuntimeConf,
    opts: CallOptions,
}

common_request_methods!(DelRequest);

impl<'a> IntoFuture for DelRequest<'a> {
    type Output = Result<(), Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            match self.target {
                DelTarget::Net(net) => {
                    let deadline = self.cni.deadline(Command::Del, &self.opts);
                    self.cni.del(&net?, self.rt, deadline).await
                }
                DelTarget::Cached(network) => {
                    self.cni.run_del_cached(network, self.rt, &self.opts).await
                }
            }
        })
    }
}

/// A CHECK ready to run ([`Cni::check_network_list`],
/// [`Cni::check_network`]): `.await` it, after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct CheckRequest<'a> {
    cni: &'a Cni,
    net: Result<Net<'a>, Error>,
    rt: &'a RuntimeConf,
    opts: CallOptions,
}

common_request_methods!(CheckRequest);

impl<'a> IntoFuture for CheckRequest<'a> {
    type Output = Result<(), Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.cni.check(self.net?, self.rt, &self.opts).await })
    }
}

/// A STATUS ready to run ([`Cni::status_network_list`]): `.await` it,
/// after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct StatusRequest<'a> {
    cni: &'a Cni,
    list: &'a NetworkConfigList,
    opts: CallOptions,
}

common_request_methods!(StatusRequest);

impl<'a> IntoFuture for StatusRequest<'a> {
    type Output = Result<(), Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.cni.run_status(self.list, &self.opts).await })
    }
}

/// A GC ready to run ([`Cni::gc_network_list`]): `.await` it, after
/// setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct GcRequest<'a> {
    cni: &'a Cni,
    list: &'a NetworkConfigList,
    valid_attachments: &'a [GcAttachment],
    opts: CallOptions,
}

common_request_methods!(GcRequest);

impl<'a> IntoFuture for GcRequest<'a> {
    type Output = Result<GcSummary, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.cni
                .run_gc(self.list, self.valid_attachments, &self.opts)
                .await
        })
    }
}

/// The result in a cache entry, in `version`: `None` without an entry or
/// without a result in it. The cached result should be in the config's
/// version unless the config changed while the container ran; it is
/// converted either way.
fn result_of_entry(
    entry: Option<CacheEntry>,
    version: Version,
) -> Result<Option<CniResult>, Error> {
    let Some(value) = entry.as_ref().and_then(CacheEntry::result) else {
        return Ok(None);
    };
    let result = CniResult::from_value(value, version)?;
    Ok(Some(result.convert(version)?))
}
