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
//!   also a cancelled one; do that, or use
//!   [`AddRequest::rollback_on_cancel`] (the ADD runs on a task of its own
//!   and rolls back when its caller gives up; [`Cni::wait_detached`] waits
//!   for that work).
//! - **Rollback** (opt-in, [`CallOptions::rollback`]): when an ADD fails part
//!   way, the plugins that ran, including the one that failed, are deleted
//!   last to first with a fresh deadline. When the cache holds another
//!   container's attachment on the same netns and ifname, it runs with
//!   `CNI_NETNS` empty, so the plugins release this container's IPAM and
//!   leave the other's interface alone; the same when the cache's records
//!   cannot be read (no proof the interface is this ADD's alone). The
//!   cache answers from its index of records by netns and ifname, brought
//!   up to date before each rollback, so a record another tool wrote
//!   before it counts. When the cache held this
//!   attachment's own record before the ADD (a plain ADD run again, as
//!   libcni allows), a DEL would take the working attachment down, so
//!   nothing is rolled back: the error comes back as is, with a warning.
//!   [`AddRequest::exclusive`] refuses such an ADD before any plugin runs.

mod add;
mod builder;
mod cached;
mod check;
mod del;
mod gc;
mod reap;
mod request;
mod status;
mod version;

pub use add::{AddRequest, Attached};
pub use builder::CniBuilder;
pub use check::CheckRequest;
pub use del::{DelRequest, Deleted};
pub use gc::{GcFailure, GcRequest, GcSummary};
pub use request::Request;
pub use status::StatusRequest;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_core::stdin::{StdinInput, plugin_stdin};
use cni_core::{Command, NetworkConfigList, PluginConfig, RuntimeConf, Version, env, validate};
use serde_json::Value;

use crate::cache::ResultCache;
use crate::error::Error;
use crate::exec::{ExecRequest, OutputLimits, PluginExec, PluginStderr, SinkSlot, Timeouts};

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
    /// (see the [module docs](self)).
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

/// What a [`Cni`] holds, as its [`CniBuilder`] sets it.
#[derive(Debug, Clone)]
struct Inner {
    plugin_dirs: Vec<PathBuf>,
    cni_path: String,
    cache: ResultCache,
    exec: Arc<dyn PluginExec>,
    timeouts: Timeouts,
    limits: OutputLimits,
    check_netns: bool,
    stderr_sink: SinkSlot,
}

/// Runs CNI operations (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cni {
    inner: Arc<Inner>,
    /// How many ADDs run on tasks of their own
    /// ([`AddRequest::rollback_on_cancel`]); [`Cni::wait_detached`] waits
    /// for 0.
    detached: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for Cni {
    fn default() -> Self {
        Cni::builder().build()
    }
}

/// One network as the operations see it: a list, or a single plugin
/// configuration used on its own (libcni's `AddNetwork` and friends);
/// owned ([`Net::into_owned`]) for an ADD on a task of its own.
#[derive(Debug, Clone)]
struct Net<'a> {
    name: Cow<'a, str>,
    version: Version,
    plugins: Cow<'a, [PluginConfig]>,
    cache_bytes: Cow<'a, [u8]>,
    disable_check: bool,
}

impl<'a> Net<'a> {
    fn list(list: &'a NetworkConfigList) -> Self {
        Net {
            name: Cow::Borrowed(list.name()),
            version: list.version(),
            plugins: Cow::Borrowed(list.plugins()),
            cache_bytes: Cow::Owned(list.cache_bytes()),
            disable_check: list.disable_check(),
        }
    }

    fn single(plugin: &'a PluginConfig) -> Result<Self, Error> {
        let version = cni_core::version::select_version(plugin.cni_version(), &[])?;
        Ok(Net {
            name: Cow::Borrowed(plugin.name().unwrap_or_default()),
            version,
            plugins: Cow::Borrowed(std::slice::from_ref(plugin)),
            cache_bytes: Cow::Borrowed(plugin.bytes()),
            disable_check: false,
        })
    }

    fn into_owned(self) -> Net<'static> {
        Net {
            name: Cow::Owned(self.name.into_owned()),
            plugins: Cow::Owned(self.plugins.into_owned()),
            cache_bytes: Cow::Owned(self.cache_bytes.into_owned()),
            ..self
        }
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
    /// [`AddRequest::rollback_on_cancel`] has ended on its task (handed to
    /// its caller, or rolled back): for a graceful shutdown.
    pub async fn wait_detached(&self) {
        let mut rx = self.detached.subscribe();
        // The sender lives in `self`: the wait cannot fail.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// The names, the netns rule of `command` ([`crate::nscheck`]) and a
    /// list with plugins.
    fn validate_attachment(
        &self,
        net: &Net<'_>,
        rt: &RuntimeConf,
        command: Command,
    ) -> Result<(), Error> {
        validate::network_name(&net.name)?;
        rt.validate()?;
        // A list without plugins (no `plugins`, plugin files not loaded)
        // would make DEL drop the cache entry without running anything.
        if net.plugins.is_empty() {
            return Err(Error::Core(cni_core::Error::InvalidConfig {
                origin: format!("network {}", &*net.name),
                reason: "no plugins to run".into(),
            }));
        }
        if self.inner.check_netns {
            crate::check_netns(&rt.netns, command)
        } else {
            crate::nscheck::check_netns_path(&rt.netns, command)
        }
    }

    /// Runs `plugin` for `command` (ADD, DEL, CHECK) on the attachment
    /// `rt`, with `prev` as its `prevResult`.
    async fn run_on_attachment(
        &self,
        net: &Net<'_>,
        plugin: &PluginConfig,
        command: Command,
        rt: &RuntimeConf,
        prev: Option<&Value>,
        deadline: Deadline,
    ) -> Result<crate::exec::ExecOutput, Error> {
        let stdin = plugin_stdin(
            &net.name,
            net.version,
            plugin,
            StdinInput::Attachment {
                rt,
                prev_result: prev,
            },
        )?;
        self.run_plugin(&net.name, plugin, command, Some(rt), &stdin, deadline)
            .await
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
        let path = self.find_plugin(plugin.plugin_type())?;
        let mut env = env::plugin_env(command, rt, &self.inner.cni_path);
        env.extend(crate::trace::env());
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
