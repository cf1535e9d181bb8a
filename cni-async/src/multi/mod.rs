//! Several networks per sandbox: the high-level API a container runtime
//! uses, after containerd's go-cni.
//!
//! A [`MultiNetwork`] is a fixed, ordered set of networks (the **default
//! set**), each with the interface name it gets in the sandbox: the
//! loopback network, the first N networks of a conf dir in go-cni's order,
//! explicit lists (see [`MultiNetworkBuilder`]); the others get `eth0`,
//! `eth1`, ... in order. The conf dir's further networks are kept too, to
//! be named by a sandbox.
//!
//! A [`Sandbox`] is one container: its ID, netns path, labels (`CNI_ARGS`)
//! and capability arguments. It is attached to the default set, or, when
//! it names networks ([`Sandbox::with_network`], as ocicni's `PodNetwork`),
//! to the loopback network (when configured) plus those, in that order.
//!
//! [`MultiNetwork::setup`] ADDs the sandbox's networks and undoes them all
//! when one fails; [`MultiNetwork::remove`], [`MultiNetwork::check`],
//! [`MultiNetwork::status`] and [`MultiNetwork::gc`] go on past errors and
//! report every one ([`Error::Multiple`]).
//!
//! [`MultiResult`] aggregates the results. An error about one network
//! names it (`network "NAME" (ifname IFNAME) VERB`).
//!
//! With the feature `daemon`, a runtime doing more around each network's
//! step (cnid: its ADD journal) runs the same orchestration with steps of
//! its own (`StepHook`, `setup_steps`, ..., `NetworkGates`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use cni_async::Cni;
//! use cni_core::caps::{Capabilities, PortMapping};
//! use cni_async::multi::{MultiNetwork, Sandbox, SetupMode};
//!
//! let cni = Cni::builder()
//!     .plugin_dirs(["/opt/cni/bin", "/usr/lib/cni"])
//!     .build();
//! // lo, then the first two networks of the conf dir as eth0 and eth1.
//! let networks = MultiNetwork::builder(cni)
//!     .loopback()
//!     .conf_dir("/etc/cni/net.d", 2)
//!     .mode(SetupMode::Parallel)
//!     .build()?;
//!
//! let sandbox = Sandbox::new("pod-1234", "/run/netns/pod-1234")
//!     .with_label("K8S_POD_NAME", "web")
//!     .with_capabilities(Capabilities::new().port_mappings([PortMapping::tcp(8080, 80)]));
//! let result = networks.setup(&sandbox).await?;
//! for (ifname, iface) in &result.interfaces {
//!     for ip in &iface.ip_configs {
//!         println!("{ifname}: {}", ip.address);
//!     }
//! }
//! networks.check(&sandbox).await?;
//! networks.remove(&sandbox).await?;
//! # Ok(()) }
//! ```
//!
//! # Caveats
//!
//! - **One operation per container at a time.** The spec asks runtimes not
//!   to run two operations for the same container at once. [`SetupMode::Serial`]
//!   (the default) follows that; [`SetupMode::Parallel`] runs the ADDs of the
//!   different networks of one sandbox concurrently, as go-cni's `Setup`
//!   does: faster with slow IPAM, and safe with the reference plugins (each
//!   attachment has its own lock), but outside the letter of the spec. Do
//!   not run two of these calls for the same sandbox at once yourself.
//! - **Cancellation.** Dropping the future of [`MultiNetwork::setup`] kills
//!   the plugins that are running but undoes nothing: neither the networks
//!   already set up nor the partial chain of the one being set up. Call
//!   [`MultiNetwork::remove`] afterwards (the spec requires a DEL after every
//!   ADD, also a cancelled one), or run `setup` on its own task so that it
//!   finishes and rolls back by itself.
//! - **Setup is not idempotent: an attached sandbox is refused.** A setup
//!   run again over a sandbox set up fails with [`Error::AlreadyAttached`]
//!   at the first network that is attached, and leaves the sandbox as it
//!   was; run [`MultiNetwork::remove`] first. (Answering the cached results
//!   would hide an attachment that no longer matches the request; the spec
//!   asks runtimes not to ADD twice without a DEL.)
//! - **Rollback can fail.** When a network fails and deleting the others
//!   fails too, the error is [`Error::RollbackFailed`] holding both; call
//!   [`MultiNetwork::remove`] again later.
//! - **Labels need `IgnoreUnknown`.** Plugins built on libcni's `LoadArgs`
//!   reject unknown `CNI_ARGS` keys unless `IgnoreUnknown=1` is among them;
//!   [`Sandbox`] adds it when there are labels (as containerd does).
//! - **The conf dir is read once**, by [`MultiNetworkBuilder::build`];
//!   rebuild to pick up changes ([`MultiNetwork::remove`] still deletes the
//!   attachments of networks dropped since, from the cache).
//! - **GC exclusion covers this `MultiNetwork` and its clones** only, not
//!   another `Cni` or process on the same network: keep one per node, or
//!   use cnid.

mod builder;
// Public with the feature `daemon` (a runtime with steps of its own);
// without it, what `MultiNetwork` runs itself.
#[cfg_attr(not(feature = "daemon"), allow(unreachable_pub, dead_code))]
mod gate;
mod operations;
mod request;
mod result;
#[cfg_attr(not(feature = "daemon"), allow(unreachable_pub, dead_code))]
mod steps;

pub use builder::{MultiNetworkBuilder, NetworkAttachment, SetupMode};
#[cfg(not(feature = "daemon"))]
use gate::NetworkGates;
#[cfg(feature = "daemon")]
pub use gate::{GateKind, GateTicket, NetworkGates};
pub use operations::{LiveContainers, NetworkGc};
pub use request::{KubernetesPod, NetworkRequest, Sandbox};
pub use result::{InterfaceConfig, IpInfo, MultiResult, NetworkResult};
#[cfg(feature = "daemon")]
pub use steps::{HookError, SandboxStep, StepHook, check_steps, remove_steps, setup_steps};

use std::sync::Arc;
use std::time::Duration;

use cni_core::NetworkConfigList;

use crate::Cni;
#[cfg(doc)]
use crate::Error;

/// The name of the loopback network ([`MultiNetworkBuilder::loopback`]).
pub const LOOPBACK_NETWORK: &str = "cni-loopback";

/// The interface name of the loopback network.
pub const LOOPBACK_IFNAME: &str = "lo";

/// The default prefix of generated interface names (`eth0`, `eth1`, ...).
pub const DEFAULT_INTERFACE_PREFIX: &str = "eth";

/// The `CNI_ARGS` key that makes libcni-based plugins accept unknown keys.
pub const IGNORE_UNKNOWN: &str = "IgnoreUnknown";

/// The loopback network: the `loopback` plugin at 1.0.0 (the newest version
/// the reference plugins speak).
const LOOPBACK_CONFIG: &str =
    r#"{"cniVersion":"1.0.0","name":"cni-loopback","plugins":[{"type":"loopback"}]}"#;

/// The loopback network ([`MultiNetworkBuilder::loopback`]): network
/// `cni-loopback`, one `loopback` plugin at CNI 1.0.0.
pub fn loopback_network() -> NetworkConfigList {
    // A constant that parses: covered by the tests.
    NetworkConfigList::from_bytes(LOOPBACK_CONFIG.as_bytes(), None)
        .unwrap_or_else(|e| unreachable!("the loopback network's config is valid: {e}"))
}

#[derive(Debug)]
struct Inner {
    cni: Cni,
    /// The default set: what a sandbox that names no network is attached to.
    networks: Vec<NetworkAttachment>,
    /// Further conf-dir networks a sandbox may name (their `ifname` unused).
    available: Vec<NetworkAttachment>,
    prefix: String,
    mode: SetupMode,
    timeout: Option<Duration>,
    /// Per network name: ADD, DEL and CHECK share it, GC takes it alone
    /// (tokio's lock is fair, so a waiting GC holds back later operations).
    gates: NetworkGates,
}

/// A set of networks to attach sandboxes to (see the [module docs](self)).
/// Cheap to clone and safe to share between tasks.
#[derive(Debug, Clone)]
pub struct MultiNetwork {
    inner: Arc<Inner>,
}
