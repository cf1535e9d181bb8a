//! Runs CNI plugins from async Rust: libcni's operations on tokio, with
//! deadlines, a result cache shared with libcni, and go-cni's
//! multi-network API on top.
//!
//! Configuration, results, validation and the other pure parts come from
//! [`cni_core`]; this crate runs the plugins and keeps the cache.
//!
//! # Where to start
//!
//! | you want to | use |
//! |---|---|
//! | ADD, DEL, CHECK, STATUS, GC one network list (libcni's `CNIConfig`) | [`Cni`], built with [`CniBuilder`] ([`Cni::builder`]); the verbs [`Cni::add_network_list`], [`Cni::del_network_list`], [`Cni::check_network_list`], [`Cni::status_network_list`], [`Cni::gc_network_list`] return requests ([`AddRequest`], ...) that take `.timeout(..)`, `.rollback(..)` or `.options(&`[`CallOptions`]`)` before they are awaited; see [`ops`] |
//! | attach a pod to several networks at once (go-cni) | [`MultiNetwork`] ([`MultiNetworkBuilder`]) and [`Sandbox`]; results in [`MultiResult`]; see [`multi`] |
//! | a [`RuntimeConf`](cni_core::RuntimeConf) with a Kubernetes pod's `CNI_ARGS` (`K8S_POD_NAME`, ... as containerd sets them) | [`Sandbox::with_kubernetes_pod`] ([`KubernetesPod`]), then [`Sandbox::runtime_conf`] |
//! | typed capability args (`portMappings`, `bandwidth`, ...) | [`cni_core::caps`] |
//! | read or list cached attachments, share the cache with libcni | [`cache::ResultCache`] |
//! | find cached attachments whose namespace is gone (reboot, lost DEL) and DEL them | [`stale::StaleScanner`], then [`Cni::reap_stale`]; see [`stale`] |
//! | follow a conf dir and know when networks are ready (feature `watch`) | [`confwatch`] |
//! | many namespaces attached at once, for harnesses and benchmarks (feature `netns`) | [`Batch`], built with [`BatchBuilder`]; see [`batch`] |
//! | create, enter and delete network namespaces (feature `netns`) | [`netns`] |
//! | crash-safe file writes (temp file, fdatasync, rename, dir fsync) | the `cni-durable` crate (std and libc only) |
//! | what a daemon needs beside (the storage seam, deferred flushes and scans of the cache, process-group signals, the boot id; feature `daemon`) | `daemon` |
//! | run plugins another way (a test double, a timing wrapper) | the [`PluginExec`] trait; [`RawExec`] is the real one |
//! | branch on what kind of failure an [`Error`] is | [`Error::kind`] and [`ErrorKind`] |
//!
//! Where this crate differs from libcni on purpose is listed, with the
//! reasons, in the repository's `docs/decisions.md`.
//!
//! # Example
//!
//! ADD a container to a network of the conf dir, read its addresses, CHECK
//! and DEL it (needs root, the plugins and a network namespace, so it is
//! compiled but not run here):
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use std::path::Path;
//! use std::time::Duration;
//!
//! use cni_async::Cni;
//! use cni_core::caps::{Capabilities, PortMapping};
//! use cni_core::{RuntimeConf, confdir};
//!
//! let cni = Cni::builder()
//!     .plugin_dirs(["/opt/cni/bin", "/usr/lib/cni"])
//!     .cache_dir("/var/lib/cni")
//!     .build();
//! let list = confdir::load_network(Path::new("/etc/cni/net.d"), "mynet")?;
//! let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
//! rt.capability_args = Capabilities::new()
//!     .port_mappings([PortMapping::tcp(8080, 80)])
//!     .into_args();
//!
//! let result = cni
//!     .add_network_list(&list, &rt)
//!     .timeout(Duration::from_secs(30))
//!     .rollback(true)
//!     .await?;
//! for address in result.addresses() {
//!     println!("{address}");
//! }
//! cni.check_network_list(&list, &rt).await?;
//! cni.del_network_list(&list, &rt).await?;
//! # Ok(()) }
//! ```
//!
//! # Printing errors
//!
//! An [`Error`]'s message names only its own part (every error of an ADD,
//! CHECK or DEL names its network, interface and verb:
//! [`Error::Operation`]); print the whole chain with [`Chain`], or with
//! anyhow's `{:#}`. After a failed ADD, [`Error::del_owed`] says whether
//! the spec's DEL is owed.
//!
//! To branch on what failed, use [`Error::kind`], or `match` on
//! [`Error::innermost`].
//!
//! # Features
//!
//! - `watch`: [`confwatch`], the conf-dir watcher (inotify).
//! - `netns`: [`netns`] and [`batch`], namespaces for harnesses and tests.
//! - `daemon`: `daemon`, what only a daemon (cnid) needs.
#![warn(missing_docs)]

/// Builder setters, each with its docs: `fn name(mut self, value: T) ->
/// Self` that stores `value` (passed through the function named, such as
/// `Some` or `Into::into`, when asked) in the field named and returns
/// `self`.
macro_rules! setters {
    ($($(#[$doc:meta])* $vis:vis fn $name:ident($($field:ident).+ : $ty:ty $(, $wrap:path)?);)*) => {$(
        $(#[$doc])*
        $vis fn $name(mut self, value: $ty) -> Self {
            self.$($field).+ = $($wrap)?(value);
            self
        }
    )*};
}

#[cfg(feature = "netns")]
pub mod batch;
pub mod cache;
#[cfg(feature = "watch")]
pub mod confwatch;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod error;
pub mod exec;
mod hidden;
pub mod multi;
#[cfg(feature = "netns")]
pub mod netns;
pub mod nscheck;
pub mod ops;
pub mod stale;
mod store;
pub(crate) mod sys;
pub mod trace;

#[cfg(feature = "netns")]
pub use batch::{Batch, BatchBuilder, BatchEvent, BatchEventKind};
/// An error and its causes on one line (`error: cause: cause`), defined in
/// [`cni_core::error::Chain`]: what to print for an [`Error`].
pub use cni_core::error::Chain;
pub use error::{Error, ErrorKind, ErrorList, Errors, PluginExit};
pub use exec::{ExecOutput, ExecRequest, OutputLimits, PluginExec, RawExec, Timeouts};
pub use multi::{
    KubernetesPod, LiveContainers, MultiNetwork, MultiNetworkBuilder, MultiResult, NetworkGc,
    NetworkRequest, Sandbox, SetupMode,
};
pub use nscheck::check_netns;
pub use ops::{
    AddRequest, Attached, CallOptions, CheckRequest, Cni, CniBuilder, DelRequest, Deleted,
    GcFailure, GcRequest, GcSummary, StatusRequest,
};
