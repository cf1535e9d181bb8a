//! Several networks per sandbox: the high-level API a container runtime
//! uses, after containerd's go-cni.
//!
//! A [`MultiNetwork`] is a fixed, ordered set of networks, each with the
//! interface name it gets in the sandbox:
//!
//! - the loopback network ([`MultiNetworkBuilder::loopback`], network
//!   `cni-loopback`, interface `lo`), as go-cni's `WithLoNetwork`;
//! - the first N networks of a conf dir ([`MultiNetworkBuilder::conf_dir`]),
//!   in go-cni's order (`.conflist`, `.conf` and `.json` files sorted
//!   together by file name, so the first is the default network; a network
//!   name is taken once, from the file libcni's lookup by name picks);
//! - explicit lists ([`MultiNetworkBuilder::network`],
//!   [`MultiNetworkBuilder::network_with_ifname`]).
//!
//! Networks without an explicit interface name get `eth0`, `eth1`, ... in
//! order (the prefix is [`MultiNetworkBuilder::interface_prefix`]). These
//! are the **default set**. The conf dir's further networks (beyond the
//! first N) are kept too, to be named by a sandbox.
//!
//! A [`Sandbox`] is one container: its ID, netns path, labels (`CNI_ARGS`;
//! [`Sandbox::with_kubernetes_pod`] sets those containerd sets) and
//! capability arguments. It is attached to the default set, or, when it
//! names networks ([`Sandbox::with_network`], a [`NetworkRequest`] each, as
//! ocicni's `PodNetwork` and Podman's per-network options), to the loopback
//! network (when configured) plus those, in that order, each with its own
//! interface name, extra `CNI_ARGS` and capability arguments (static `ips`,
//! `mac`, `aliases`, ...).
//!
//! | call | what runs | on failure |
//! |---|---|---|
//! | [`MultiNetwork::setup`] | ADD of each of the sandbox's networks, in order or all at once ([`SetupMode`]), each with [`CallOptions::rollback`] | the networks already set up are deleted again (DEL, fresh deadline, last to first); the error names the network that failed |
//! | [`MultiNetwork::remove`] | DEL of each network, last to first; a network no longer known is deleted with its cached config; works without the netns | goes on; every error is reported ([`Error::Multiple`]) |
//! | [`MultiNetwork::check`] | CHECK of each network, in order | goes on; every error is reported |
//! | [`MultiNetwork::status`], [`MultiNetwork::status_of`] | STATUS of the default set, or of a sandbox's networks (ready iff all are) | goes on; every error is reported (codes 50/51 kept) |
//! | [`MultiNetwork::gc`] | GC of every network for a node, from the set of live container IDs, each network's GC alone (no ADD, DEL or CHECK of it meanwhile) | goes on; every error is reported |
//!
//! [`MultiResult`] aggregates the results: interfaces keyed by name with
//! their addresses, MAC and sandbox, the routes and DNS settings, and the
//! raw result of each network.
//!
//! Errors about one network are [`Error::Context`] values whose context
//! reads `network "NAME" (ifname IFNAME) VERB`, so the failing network is
//! always named.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use cni_async::Cni;
//! use cni_async::caps::{Capabilities, PortMapping};
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
//! - **Rollback can fail.** When a network fails and deleting the others
//!   fails too, the error is [`Error::RollbackFailed`] holding both; call
//!   [`MultiNetwork::remove`] again later.
//! - **Labels need `IgnoreUnknown`.** Plugins built on libcni's `LoadArgs`
//!   (host-local, static, ...) reject unknown `CNI_ARGS` keys unless
//!   `IgnoreUnknown=1` is among them. [`Sandbox`] adds it in front when
//!   there are labels (as containerd does) unless told not to.
//! - **The conf dir is read once**, by [`MultiNetworkBuilder::build`].
//!   Rebuild to pick up changes. [`MultiNetwork::remove`] still deletes the
//!   attachments of networks the rebuilt set no longer has, from the cache.
//! - **GC exclusion covers this `MultiNetwork` and its clones** (they share
//!   the per-network gates). Operations run through another `Cni` or
//!   another process on the same network are not held back by it; keep one
//!   `MultiNetwork` per node, or use cnid, whose queue does the same for
//!   every client.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::RwLock;

use cni_core::result::{CniResult, Dns, Route};
use cni_core::{
    CapabilityArgs, CniArgs, Command, NetworkConfigList, RuntimeConf, confdir, validate,
};
use futures::future::join_all;
use ipnet::IpNet;

use crate::error::Errors;
use crate::{CallOptions, Cni, Error, ErrorKind, GcSummary};
use cni_core::stdin::GcAttachment;

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

/// How [`MultiNetwork::setup`] runs the ADDs of the networks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SetupMode {
    /// One network after the other, in order (go-cni's `SetupSerially`).
    #[default]
    Serial,
    /// All networks at once (go-cni's `Setup`); see the module caveats.
    Parallel,
}

/// One network of a [`MultiNetwork`]: a configuration list and the
/// interface name it gets in the sandbox.
#[derive(Debug, Clone)]
pub struct NetworkAttachment {
    list: NetworkConfigList,
    ifname: String,
    path: Option<PathBuf>,
}

impl NetworkAttachment {
    /// The network name.
    pub fn name(&self) -> &str {
        self.list.name()
    }

    /// The interface name in the sandbox (`CNI_IFNAME`).
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The configuration list.
    pub fn list(&self) -> &NetworkConfigList {
        &self.list
    }

    /// The file it was loaded from, for networks found in a conf dir.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

#[derive(Debug)]
enum Source {
    Loopback,
    ConfDir {
        dir: PathBuf,
        max: usize,
    },
    List {
        list: Box<NetworkConfigList>,
        ifname: Option<String>,
    },
}

/// Builder for [`MultiNetwork`]. Networks are set up in the order they are
/// added here; see the [module docs](self).
#[derive(Debug)]
#[must_use]
pub struct MultiNetworkBuilder {
    cni: Cni,
    sources: Vec<Source>,
    prefix: String,
    mode: SetupMode,
    timeout: Option<Duration>,
    allow_empty: bool,
}

impl MultiNetworkBuilder {
    /// A builder with no networks, prefix `eth`, serial setup and the
    /// `Cni`'s default deadlines.
    pub fn new(cni: Cni) -> Self {
        MultiNetworkBuilder {
            cni,
            sources: Vec::new(),
            prefix: DEFAULT_INTERFACE_PREFIX.to_owned(),
            mode: SetupMode::default(),
            timeout: None,
            allow_empty: false,
        }
    }

    /// Accepts a set without networks ([`Self::build`] refuses one by
    /// default). Such a `MultiNetwork` attaches nothing; its
    /// [`MultiNetwork::remove`] DELs the networks a sandbox names, and the
    /// container's other cached attachments, with the configuration cached
    /// at ADD: e.g. to tear down a batch whose network file is gone
    /// ([`BatchBuilder::adopt`](crate::batch::BatchBuilder::adopt)).
    pub fn allow_empty(mut self) -> Self {
        self.allow_empty = true;
        self
    }

    /// Adds the loopback network: network `cni-loopback`, one `loopback`
    /// plugin at CNI 1.0.0, interface `lo`. Call it first so that `lo` is
    /// set up first and removed last.
    pub fn loopback(mut self) -> Self {
        self.sources.push(Source::Loopback);
        self
    }

    /// Adds the first `max` networks (`0`: all) of the conf dir `dir`, read
    /// when [`build`](Self::build) runs, each with the next generated
    /// interface name. Files that do not parse are skipped with a warning;
    /// a dir without any usable network makes `build` fail.
    pub fn conf_dir(mut self, dir: impl Into<PathBuf>, max: usize) -> Self {
        self.sources.push(Source::ConfDir {
            dir: dir.into(),
            max,
        });
        self
    }

    /// Adds a network with the next generated interface name.
    pub fn network(mut self, list: NetworkConfigList) -> Self {
        self.sources.push(Source::List {
            list: Box::new(list),
            ifname: None,
        });
        self
    }

    /// Adds a network with an explicit interface name (not counted in the
    /// generated names).
    pub fn network_with_ifname(
        mut self,
        list: NetworkConfigList,
        ifname: impl Into<String>,
    ) -> Self {
        self.sources.push(Source::List {
            list: Box::new(list),
            ifname: Some(ifname.into()),
        });
        self
    }

    /// The prefix of generated interface names (default `eth`).
    pub fn interface_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How [`MultiNetwork::setup`] runs (default [`SetupMode::Serial`]).
    pub fn mode(mut self, mode: SetupMode) -> Self {
        self.mode = mode;
        self
    }

    /// The deadline of each network's operation (each ADD, DEL, CHECK,
    /// STATUS of one network list); default: the `Cni`'s per-verb deadlines.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Reads the conf dirs and checks the set: at least one network, valid
    /// network and interface names, no interface name twice.
    pub fn build(self) -> Result<MultiNetwork, Error> {
        let mut networks: Vec<NetworkAttachment> = Vec::new();
        let mut available: Vec<NetworkAttachment> = Vec::new();
        let mut generated = 0usize;
        let mut next_ifname = |prefix: &str| {
            let name = format!("{prefix}{generated}");
            generated += 1;
            name
        };
        for source in self.sources {
            match source {
                Source::Loopback => {
                    networks.push(NetworkAttachment {
                        list: loopback_network(),
                        ifname: LOOPBACK_IFNAME.to_owned(),
                        path: None,
                    });
                }
                Source::ConfDir { dir, max } => {
                    let scan = confdir::scan(&dir)?;
                    let found = scan.unique();
                    if found.is_empty() {
                        let missing = !dir.exists();
                        return Err(Error::Core(cni_core::Error::NoConfigs { dir, missing }));
                    }
                    let take = if max == 0 { found.len() } else { max };
                    for (i, net) in found.into_iter().enumerate() {
                        if i < take {
                            networks.push(NetworkAttachment {
                                list: net.list.clone(),
                                ifname: next_ifname(&self.prefix),
                                path: Some(net.path.clone()),
                            });
                        } else {
                            available.push(NetworkAttachment {
                                list: net.list.clone(),
                                ifname: String::new(),
                                path: Some(net.path.clone()),
                            });
                        }
                    }
                }
                Source::List { list, ifname } => {
                    let ifname = ifname.unwrap_or_else(|| next_ifname(&self.prefix));
                    networks.push(NetworkAttachment {
                        list: *list,
                        ifname,
                        path: None,
                    });
                }
            }
        }
        if networks.is_empty() && !self.allow_empty {
            return Err(invalid_set("", "no networks were added"));
        }
        for (i, n) in networks.iter().enumerate() {
            validate::network_name(n.name())?;
            validate::interface_name(&n.ifname)?;
            if networks[..i].iter().any(|m| m.ifname == n.ifname) {
                return Err(invalid_set(
                    &n.ifname,
                    &format!(
                        "interface name used by more than one network (network {:?} and an earlier one)",
                        n.name()
                    ),
                ));
            }
        }
        for n in &available {
            validate::network_name(n.name())?;
        }
        Ok(MultiNetwork {
            inner: Arc::new(Inner {
                cni: self.cni,
                networks,
                available,
                prefix: self.prefix,
                mode: self.mode,
                timeout: self.timeout,
                gates: Mutex::new(HashMap::new()),
            }),
        })
    }
}

fn invalid_set(value: &str, reason: &str) -> Error {
    Error::Core(cni_core::Error::InvalidParameter {
        field: "interface name",
        value: value.to_owned(),
        reason: reason.to_owned(),
        code: cni_core::error::code::INVALID_NETWORK_CONFIG,
    })
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
    gates: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

/// A set of networks to attach sandboxes to (see the [module docs](self)).
/// Cheap to clone and safe to share between tasks.
#[derive(Debug, Clone)]
pub struct MultiNetwork {
    inner: Arc<Inner>,
}

/// One sandbox as [`MultiNetwork`] sees it: what go-cni calls a namespace.
///
/// The same labels and capability arguments go to every network; each
/// plugin gets in its `runtimeConfig` only the capabilities it declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: the namespace path (may be empty for [`MultiNetwork::remove`]
    /// when the namespace is gone).
    pub netns: String,
    /// Labels, passed as `CNI_ARGS` (`K=V;K=V`, in this order).
    pub labels: CniArgs,
    /// Capability arguments (see [`crate::caps`]).
    pub capability_args: CapabilityArgs,
    /// Put `IgnoreUnknown=1` in front of the labels when there are labels
    /// and none is named `IgnoreUnknown` (default true; see the module caveats).
    pub ignore_unknown: bool,
    /// The networks this sandbox asks for by name, each with its own
    /// options; empty: the [`MultiNetwork`]'s default set.
    pub networks: Vec<NetworkRequest>,
}

/// One network a [`Sandbox`] asks for by name, with options of its own:
/// ocicni's `NetAttachment` and per-network runtime config, Podman's
/// per-network static IPs, MAC and aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkRequest {
    /// The network name: one of the [`MultiNetwork`]'s networks.
    pub network: String,
    /// The interface name; `None`: the next generated one (`eth0`, ...,
    /// skipping the names other requests give explicitly).
    pub ifname: Option<String>,
    /// `CNI_ARGS` for this network only, after the sandbox's labels (a key
    /// set in both takes this value).
    pub args: CniArgs,
    /// Capability arguments for this network only, over the sandbox's (a
    /// capability set in both takes this value), e.g. static `ips`, `mac`,
    /// `aliases`.
    pub capability_args: CapabilityArgs,
}

impl NetworkRequest {
    /// A request for `network` with a generated interface name and no
    /// options of its own.
    pub fn new(network: impl Into<String>) -> Self {
        NetworkRequest {
            network: network.into(),
            ifname: None,
            args: CniArgs::new(),
            capability_args: CapabilityArgs::new(),
        }
    }

    /// Sets the interface name.
    pub fn with_ifname(mut self, ifname: impl Into<String>) -> Self {
        self.ifname = Some(ifname.into());
        self
    }

    /// Sets a `CNI_ARGS` pair for this network (replacing one of the same key).
    pub fn with_arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        set_pair(&mut self.args, key.into(), value.into());
        self
    }

    /// Adds capability arguments for this network, replacing those of the same key.
    pub fn with_capabilities(mut self, caps: impl Into<CapabilityArgs>) -> Self {
        for (k, v) in caps.into().0 {
            self.capability_args.insert(k, v);
        }
        self
    }
}

fn set_pair(args: &mut CniArgs, key: String, value: String) {
    match args.0.iter_mut().find(|(k, _)| *k == key) {
        Some(pair) => pair.1 = value,
        None => args.0.push((key, value)),
    }
}

/// The Kubernetes pod a sandbox belongs to, passed to plugins as the
/// `CNI_ARGS` containerd's CRI plugin sets ([`Sandbox::with_kubernetes_pod`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesPod {
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_INFRA_CONTAINER_ID`: the sandbox (pause) container's ID.
    pub infra_container_id: String,
    /// `K8S_POD_UID`.
    pub uid: String,
}

impl Sandbox {
    /// A sandbox with no labels and no capability arguments. `netns` is a
    /// path (e.g. `NetnsGuard::path()`, feature `netns`),
    /// kept as the string plugins get; one that is not UTF-8 is refused by
    /// every operation (see [`RuntimeConf::new`]).
    pub fn new(container_id: impl Into<String>, netns: impl AsRef<Path>) -> Self {
        Sandbox {
            container_id: container_id.into(),
            netns: cni_core::args::netns_string(netns.as_ref()),
            labels: CniArgs::new(),
            capability_args: CapabilityArgs::new(),
            ignore_unknown: true,
            networks: Vec::new(),
        }
    }

    /// Sets a label (replacing one of the same key, keeping its place).
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        set_pair(&mut self.labels, key.into(), value.into());
        self
    }

    /// Sets the labels containerd's CRI plugin passes for a pod:
    /// `K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`,
    /// `K8S_POD_UID` (with `IgnoreUnknown=1` in front, see
    /// [`Sandbox::ignore_unknown`]).
    pub fn with_kubernetes_pod(self, pod: &KubernetesPod) -> Self {
        self.with_labels([
            ("K8S_POD_NAMESPACE", pod.namespace.as_str()),
            ("K8S_POD_NAME", pod.name.as_str()),
            (
                "K8S_POD_INFRA_CONTAINER_ID",
                pod.infra_container_id.as_str(),
            ),
            ("K8S_POD_UID", pod.uid.as_str()),
        ])
    }

    /// Asks for a network by name (see [`Sandbox::networks`]); call once per
    /// network, in setup order.
    pub fn with_network(mut self, request: NetworkRequest) -> Self {
        self.networks.push(request);
        self
    }

    /// Sets several labels (see [`Sandbox::with_label`]).
    pub fn with_labels<I, K, V>(self, labels: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        labels
            .into_iter()
            .fold(self, |sb, (k, v)| sb.with_label(k, v))
    }

    /// Adds capability arguments, replacing those of the same key.
    pub fn with_capabilities(mut self, caps: impl Into<CapabilityArgs>) -> Self {
        for (k, v) in caps.into().0 {
            self.capability_args.insert(k, v);
        }
        self
    }

    /// Whether to add `IgnoreUnknown=1` (see [`Sandbox::ignore_unknown`]).
    pub fn with_ignore_unknown(mut self, on: bool) -> Self {
        self.ignore_unknown = on;
        self
    }

    /// The `CNI_ARGS` pairs sent to plugins: the labels, with
    /// `IgnoreUnknown=1` in front when [`Sandbox::ignore_unknown`] applies.
    pub fn cni_args(&self) -> CniArgs {
        let mut args = CniArgs::new();
        if self.ignore_unknown
            && !self.labels.is_empty()
            && self.labels.get(IGNORE_UNKNOWN).is_none()
        {
            args.push(IGNORE_UNKNOWN, "1");
        }
        args.0.extend(self.labels.0.iter().cloned());
        args
    }

    /// The runtime configuration of this sandbox's attachment with interface `ifname`.
    pub fn runtime_conf(&self, ifname: &str) -> RuntimeConf {
        RuntimeConf {
            container_id: self.container_id.clone(),
            netns: self.netns.clone(),
            ifname: ifname.to_owned(),
            args: self.cni_args(),
            capability_args: self.capability_args.clone(),
        }
    }

    /// Checks the container ID, the netns path and the labels (keys
    /// non-empty; no `;`, `=` or NUL anywhere, so `CNI_ARGS` reads back).
    pub fn validate(&self) -> Result<(), Error> {
        self.runtime_conf(LOOPBACK_IFNAME).validate()?;
        Ok(())
    }
}

/// An address of an interface in a [`MultiResult`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpInfo {
    /// The address with its prefix length.
    pub address: IpNet,
    /// The gateway the plugin reported for it.
    pub gateway: Option<IpAddr>,
}

/// One interface in a [`MultiResult`]: go-cni's `Config`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceConfig {
    /// The addresses assigned to it, in the order the results list them.
    pub ip_configs: Vec<IpInfo>,
    /// Its hardware address.
    pub mac: Option<String>,
    /// The sandbox it is in (the netns path); unset for host-side interfaces.
    pub sandbox: Option<String>,
    /// Its MTU (1.1.0 results).
    pub mtu: Option<u32>,
    /// Its PCI device (1.1.0 results).
    pub pci_id: Option<String>,
    /// Its socket file (1.1.0 results).
    pub socket_path: Option<String>,
}

/// The result of one network of a [`MultiResult`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkResult {
    /// The network name.
    pub network: String,
    /// Its interface name in the sandbox.
    pub ifname: String,
    /// The result as the network's chain returned it (in the list's version).
    pub result: CniResult,
}

/// The aggregated result of [`MultiNetwork::setup`]: go-cni's `Result`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MultiResult {
    /// Every interface the results name, keyed by interface name: the
    /// sandbox interfaces (`lo`, `eth0`, ...) and the host-side ones the
    /// plugins report (bridges, veth peers). Each network's interface name
    /// has an entry even when its result lists no interface; an address
    /// that names no interface belongs to its network's interface.
    pub interfaces: BTreeMap<String, InterfaceConfig>,
    /// The routes of all results, in network order.
    pub routes: Vec<Route>,
    /// The non-empty DNS settings of the results, in network order.
    pub dns: Vec<Dns>,
    /// The result of each network, in network order.
    pub networks: Vec<NetworkResult>,
}

impl MultiResult {
    /// Aggregates per-network results (as [`MultiNetwork::setup`] does).
    pub fn from_results(results: Vec<NetworkResult>) -> Self {
        let mut out = MultiResult::default();
        for nr in &results {
            let current = nr.result.to_current();
            out.interfaces.entry(nr.ifname.clone()).or_default();
            for iface in &current.interfaces {
                let entry = out.interfaces.entry(iface.name.clone()).or_default();
                fill(&mut entry.mac, &iface.mac);
                fill(&mut entry.sandbox, &iface.sandbox);
                fill(&mut entry.pci_id, &iface.pci_id);
                fill(&mut entry.socket_path, &iface.socket_path);
                if entry.mtu.is_none() {
                    entry.mtu = iface.mtu;
                }
            }
            for ip in &current.ips {
                let owner = ip
                    .interface
                    .and_then(|i| usize::try_from(i).ok())
                    .and_then(|i| current.interfaces.get(i))
                    .map_or(nr.ifname.as_str(), |iface| iface.name.as_str());
                out.interfaces
                    .entry(owner.to_owned())
                    .or_default()
                    .ip_configs
                    .push(IpInfo {
                        address: ip.address,
                        gateway: ip.gateway,
                    });
            }
            out.routes.extend(current.routes.iter().cloned());
            if !current.dns.is_empty() {
                out.dns.push(current.dns.clone());
            }
        }
        out.networks = results;
        out
    }

    /// The interface named `ifname`.
    pub fn interface(&self, ifname: &str) -> Option<&InterfaceConfig> {
        self.interfaces.get(ifname)
    }

    /// The addresses of interface `ifname` (none when there is no such interface).
    pub fn addresses(&self, ifname: &str) -> Vec<IpNet> {
        self.interfaces
            .get(ifname)
            .map(|i| i.ip_configs.iter().map(|ip| ip.address).collect())
            .unwrap_or_default()
    }

    /// The result of the network with interface `ifname`.
    pub fn network(&self, ifname: &str) -> Option<&NetworkResult> {
        self.networks.iter().find(|n| n.ifname == ifname)
    }
}

fn fill(slot: &mut Option<String>, value: &Option<String>) {
    if slot.is_none() {
        slot.clone_from(value);
    }
}

impl MultiNetwork {
    /// A builder (see [`MultiNetworkBuilder`]).
    pub fn builder(cni: Cni) -> MultiNetworkBuilder {
        MultiNetworkBuilder::new(cni)
    }

    /// The networks, in setup order.
    pub fn networks(&self) -> &[NetworkAttachment] {
        &self.inner.networks
    }

    /// The [`Cni`] that runs the operations.
    pub fn cni(&self) -> &Cni {
        &self.inner.cni
    }

    /// The setup mode [`MultiNetwork::setup`] uses.
    pub fn mode(&self) -> SetupMode {
        self.inner.mode
    }

    fn opts(&self) -> CallOptions {
        CallOptions {
            timeout: self.inner.timeout,
            rollback: false,
        }
    }

    /// The network named `name`: from the default set, else from the
    /// further networks of the conf dir.
    pub fn find(&self, name: &str) -> Option<&NetworkAttachment> {
        self.inner
            .networks
            .iter()
            .chain(&self.inner.available)
            .find(|n| n.name() == name)
    }

    /// The networks a sandbox's operations run on, with their runtime
    /// configuration, in setup order (see [`Sandbox::networks`]).
    ///
    /// With [`MultiNetwork::remove`], a requested network that is no longer
    /// known comes back as `None`: its DEL uses the cached configuration.
    fn plan<'a>(&'a self, sandbox: &Sandbox) -> Result<Vec<Planned<'a>>, Error> {
        sandbox.validate()?;
        if sandbox.networks.is_empty() {
            return Ok(self
                .inner
                .networks
                .iter()
                .map(|n| Planned {
                    name: n.name().to_owned(),
                    net: Some(n),
                    rt: sandbox.runtime_conf(&n.ifname),
                })
                .collect());
        }
        let mut planned: Vec<Planned<'a>> = self
            .inner
            .networks
            .iter()
            .filter(|n| n.name() == LOOPBACK_NETWORK && n.ifname == LOOPBACK_IFNAME)
            .map(|n| Planned {
                name: n.name().to_owned(),
                net: Some(n),
                rt: sandbox.runtime_conf(&n.ifname),
            })
            .collect();
        let explicit: HashSet<String> = sandbox
            .networks
            .iter()
            .filter_map(|r| r.ifname.clone())
            .chain(planned.iter().map(|p| p.rt.ifname.clone()))
            .collect();
        let mut generated = 0usize;
        let mut next_ifname = || loop {
            let name = format!("{}{generated}", self.inner.prefix);
            generated += 1;
            if !explicit.contains(&name) {
                return name;
            }
        };
        for req in &sandbox.networks {
            validate::network_name(&req.network)?;
            let ifname = req.ifname.clone().unwrap_or_else(&mut next_ifname);
            let mut rt = sandbox.runtime_conf(&ifname);
            for (k, v) in &req.args.0 {
                set_pair(&mut rt.args, k.clone(), v.clone());
            }
            if !req.args.is_empty()
                && sandbox.ignore_unknown
                && rt.args.get(IGNORE_UNKNOWN).is_none()
            {
                rt.args
                    .0
                    .insert(0, (IGNORE_UNKNOWN.to_owned(), "1".to_owned()));
            }
            for (k, v) in &req.capability_args.0 {
                rt.capability_args.insert(k.clone(), v.clone());
            }
            rt.validate()?;
            if planned.iter().any(|p| p.rt.ifname == rt.ifname) {
                return Err(invalid_set(
                    &rt.ifname,
                    &format!(
                        "interface name used by more than one network of sandbox {:?} (network {:?} and an earlier one)",
                        sandbox.container_id, req.network
                    ),
                ));
            }
            planned.push(Planned {
                name: req.network.clone(),
                net: self.find(&req.network),
                rt,
            });
        }
        Ok(planned)
    }

    /// The planned networks that are known, or an error naming those that are not.
    fn known<'p, 'a>(
        planned: &'p [Planned<'a>],
    ) -> Result<Vec<(&'a NetworkAttachment, &'p RuntimeConf)>, Error> {
        let mut out = Vec::with_capacity(planned.len());
        let mut missing = Vec::new();
        for p in planned {
            match p.net {
                Some(n) => out.push((n, &p.rt)),
                None => missing.push(p.name.clone()),
            }
        }
        if missing.is_empty() {
            Ok(out)
        } else {
            Err(Error::Core(cni_core::Error::InvalidParameter {
                field: "network",
                value: missing.join(", "),
                reason: "not among the networks of this MultiNetwork".to_owned(),
                code: cni_core::error::code::INVALID_NETWORK_CONFIG,
            }))
        }
    }

    fn gate(&self, network: &str) -> Arc<RwLock<()>> {
        let mut gates = self.inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(network.to_owned()).or_default().clone()
    }

    /// Attaches the sandbox to its networks (the default set, or those it
    /// names), in the configured [`SetupMode`].
    pub async fn setup(&self, sandbox: &Sandbox) -> Result<MultiResult, Error> {
        self.setup_with(sandbox, self.inner.mode).await
    }

    /// Attaches the sandbox to its networks, in `mode`.
    ///
    /// Each network's ADD runs with [`CallOptions::rollback`], so a chain
    /// that fails part way is undone by itself. When a network fails, the
    /// networks already set up are deleted again, last to first, each DEL
    /// with a fresh deadline; the error names the failing network(s) (in
    /// parallel mode, every network that failed: [`Error::Multiple`]). If
    /// that rollback fails too, the error is [`Error::RollbackFailed`].
    pub async fn setup_with(
        &self,
        sandbox: &Sandbox,
        mode: SetupMode,
    ) -> Result<MultiResult, Error> {
        let planned = self.plan(sandbox)?;
        let networks = Self::known(&planned)?;
        let add_opts = CallOptions {
            rollback: true,
            ..self.opts()
        };
        let add = |(n, rt)| self.add_one(n, rt, add_opts);
        let outcomes: Vec<Result<CniResult, Error>> = match mode {
            SetupMode::Serial => {
                let mut outcomes = Vec::with_capacity(networks.len());
                for &n in &networks {
                    let outcome = add(n).await;
                    let failed = outcome.is_err();
                    outcomes.push(outcome);
                    if failed {
                        break;
                    }
                }
                outcomes
            }
            SetupMode::Parallel => join_all(networks.iter().copied().map(add)).await,
        };

        if outcomes.len() == networks.len() && outcomes.iter().all(Result::is_ok) {
            let results = networks
                .iter()
                .zip(outcomes)
                .filter_map(|((n, rt), r)| {
                    r.ok().map(|result| NetworkResult {
                        network: n.name().to_owned(),
                        ifname: rt.ifname.clone(),
                        result,
                    })
                })
                .collect();
            return Ok(MultiResult::from_results(results));
        }

        // Something failed: undo the networks that were set up, and those
        // whose own rollback failed, last to first.
        let mut errors = Errors::new(format!("setup of container {:?}", sandbox.container_id));
        let mut undo = Vec::new();
        for (&(n, rt), outcome) in networks.iter().zip(outcomes) {
            match outcome {
                Ok(_) => undo.push((n, rt)),
                Err(e) => {
                    if matches!(e, Error::RollbackFailed { .. }) {
                        undo.push((n, rt));
                    }
                    tracing::warn!(network = n.name(), ifname = ?rt.ifname, container = ?sandbox.container_id, error = %cni_core::validate::Escaped(cni_core::error::Chain(&e)), "network setup failed");
                    errors.push(context(n.name(), &rt.ifname, Command::Add, e));
                }
            }
        }
        let error = match errors.into_result() {
            Err(e) => e,
            Ok(()) => unreachable!("a failed setup has an error"),
        };
        let mut rollback_errors =
            Errors::new(format!("rollback of container {:?}", sandbox.container_id));
        for (n, rt) in undo.into_iter().rev() {
            // A fresh deadline per DEL: never the expired one of the ADD.
            if let Err(e) = self.del_one(n, rt).await {
                rollback_errors.push(context(n.name(), &rt.ifname, Command::Del, e));
            }
        }
        match rollback_errors.into_result_listed() {
            Ok(()) => Err(error),
            Err(rollback) => Err(Error::RollbackFailed {
                error: Box::new(error),
                rollback: Box::new(rollback),
            }),
        }
    }

    async fn add_one(
        &self,
        n: &NetworkAttachment,
        rt: &RuntimeConf,
        opts: CallOptions,
    ) -> Result<CniResult, Error> {
        let gate = self.gate(n.name());
        let _shared = gate.read().await;
        self.inner
            .cni
            .add_network_list(&n.list, rt)
            .options(&opts)
            .await
    }

    async fn del_one(&self, n: &NetworkAttachment, rt: &RuntimeConf) -> Result<(), Error> {
        let gate = self.gate(n.name());
        let _shared = gate.read().await;
        self.inner
            .cni
            .del_network_list(&n.list, rt)
            .options(&self.opts())
            .await
    }

    /// Detaches the sandbox from its networks: DEL, last to first, going on
    /// past errors. Fails with [`Error::Multiple`] listing every network
    /// whose DEL failed. Repeating it is fine.
    ///
    /// Teardown completes where it can:
    /// - the namespace may be gone: [`Sandbox::netns`] empty or a stale
    ///   path (plugins are told, and clean up what is outside it);
    /// - a network the sandbox names that this `MultiNetwork` no longer
    ///   has (its file was removed before the runtime rebuilt it) is
    ///   deleted with the configuration cached at ADD
    ///   ([`Cni::del_cached`]);
    /// - so is every other cached attachment of this container on a network
    ///   this `MultiNetwork` does not have at all, so a network removed from
    ///   the conf dir after setup does not leak its attachment.
    pub async fn remove(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        let mut errors = Errors::new(format!("remove of container {:?}", sandbox.container_id));
        for p in planned.iter().rev() {
            let outcome = match p.net {
                Some(n) => self.del_one(n, &p.rt).await,
                None => self.del_cached(&p.name, &p.rt).await,
            };
            if let Err(e) = outcome {
                errors.push(context(&p.name, &p.rt.ifname, Command::Del, e));
            }
        }
        // Cached attachments of this container on networks we do not know.
        match self
            .inner
            .cni
            .cached_attachments(Some(&sandbox.container_id))
            .await
        {
            Ok(records) => {
                for rec in records.iter().rev() {
                    let planned_here = planned
                        .iter()
                        .any(|p| p.name == rec.network_name && p.rt.ifname == rec.if_name);
                    if planned_here || self.find(&rec.network_name).is_some() {
                        continue;
                    }
                    let rt = RuntimeConf {
                        ifname: rec.if_name.clone(),
                        args: CniArgs::new(),
                        capability_args: CapabilityArgs::new(),
                        ..sandbox.runtime_conf(&rec.if_name)
                    };
                    if let Err(e) = self.del_cached(&rec.network_name, &rt).await {
                        errors.push(context(&rec.network_name, &rec.if_name, Command::Del, e));
                    }
                }
            }
            Err(e) => errors.push(e),
        }
        errors.into_result_listed()
    }

    async fn del_cached(&self, network: &str, rt: &RuntimeConf) -> Result<(), Error> {
        let gate = self.gate(network);
        let _shared = gate.read().await;
        match self
            .inner
            .cni
            .del_cached(network, rt)
            .options(&self.opts())
            .await
        {
            // Nothing cached: nothing of ours to delete.
            Err(e) if e.kind() == ErrorKind::NotAttached => Ok(()),
            other => other,
        }
    }

    /// CHECK of the sandbox's networks, in order, going on past errors.
    /// Fails with [`Error::Multiple`] listing every network whose CHECK failed.
    pub async fn check(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        let mut errors = Errors::new(format!("check of container {:?}", sandbox.container_id));
        for (n, rt) in Self::known(&planned)? {
            let gate = self.gate(n.name());
            let _shared = gate.read().await;
            if let Err(e) = self
                .inner
                .cni
                .check_network_list(&n.list, rt)
                .options(&self.opts())
                .await
            {
                errors.push(context(n.name(), &rt.ifname, Command::Check, e));
            }
        }
        errors.into_result_listed()
    }

    /// STATUS of every network of the default set, in order (a no-op for
    /// lists below 1.1.0), going on past errors. Fails with
    /// [`Error::Multiple`] listing every network that is not ready; its
    /// [`Error::code`] is the first one's (50 or 51 when a plugin said so).
    pub async fn status(&self) -> Result<(), Error> {
        self.status_networks(self.inner.networks.iter()).await
    }

    /// STATUS of the networks `sandbox` uses (the default set, or those it
    /// names): ready iff all are. Errors as [`MultiNetwork::status`].
    pub async fn status_of(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        let networks = Self::known(&planned)?;
        self.status_networks(networks.into_iter().map(|(n, _)| n))
            .await
    }

    async fn status_networks<'n>(
        &self,
        networks: impl Iterator<Item = &'n NetworkAttachment>,
    ) -> Result<(), Error> {
        let mut errors = Errors::new("status");
        let mut seen = HashSet::new();
        for n in networks {
            if !seen.insert(n.name()) {
                continue;
            }
            if let Err(e) = self
                .inner
                .cni
                .status_network_list(&n.list)
                .options(&self.opts())
                .await
            {
                errors.push(context(n.name(), &n.ifname, Command::Status, e));
            }
        }
        errors.into_result_listed()
    }

    /// GC for a node: for every network of this `MultiNetwork` (default set
    /// and further conf-dir networks), the cached attachments of containers
    /// not in `live` get a DEL and lose their cache entry, then (1.1.0
    /// lists) the plugins get GC with the live attachments as valid
    /// ([`Cni::gc_network_list`]).
    ///
    /// Each network's GC runs alone: it waits for the ADD, DEL and CHECK of
    /// this `MultiNetwork` (and its clones) that are running on that
    /// network, and holds back those that arrive meanwhile, as the spec asks
    /// of runtimes. Goes on past a failing network; the summaries of those
    /// that worked come back, every failure in [`Error::Multiple`].
    ///
    /// `live` is any collection of container IDs ([`LiveContainers`]):
    /// `["c1", "c2"]`, `&ids` of a `Vec<String>`, a `HashSet<String>`, and
    /// `[]` (no container lives: every cached attachment goes).
    pub async fn gc(&self, live: impl LiveContainers) -> Result<Vec<NetworkGc>, Error> {
        let live = live.into_container_ids();
        let mut out = Vec::new();
        let mut errors = Errors::new("GC of the node");
        let mut seen = HashSet::new();
        for n in self.inner.networks.iter().chain(&self.inner.available) {
            if !seen.insert(n.name()) {
                continue;
            }
            let gate = self.gate(n.name());
            let _exclusive = gate.write().await;
            // Read under the gate: no ADD of this network can run meanwhile.
            let records = match self.inner.cni.cached_attachments(None).await {
                Ok(records) => records,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let valid: Vec<GcAttachment> = records
                .into_iter()
                .filter(|r| r.network_name == n.name() && live.contains(&r.container_id))
                .map(|r| GcAttachment {
                    container_id: r.container_id,
                    ifname: r.if_name,
                })
                .collect();
            match self
                .inner
                .cni
                .gc_network_list(&n.list, &valid)
                .options(&self.opts())
                .await
            {
                Ok(summary) => out.push(NetworkGc {
                    network: n.name().to_owned(),
                    summary,
                }),
                Err(e) => errors.push(Error::Context {
                    context: format!("network {:?} GC", n.name()),
                    source: Box::new(e),
                }),
            }
        }
        errors.into_result_listed().map(|()| out)
    }
}

/// The container IDs that live, for [`MultiNetwork::gc`]: arrays of
/// `&str` (also the empty `[]`, whose element type an `IntoIterator` bound
/// could not infer), vectors, slices and sets of strings, owned or
/// borrowed. Collect an iterator into a `Vec` first.
pub trait LiveContainers {
    /// The IDs, as a set.
    fn into_container_ids(self) -> HashSet<String>;
}

fn id_set<S: AsRef<str>>(ids: impl IntoIterator<Item = S>) -> HashSet<String> {
    ids.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

impl<const N: usize> LiveContainers for [&str; N] {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<const N: usize> LiveContainers for &[&str; N] {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<T: AsRef<str>> LiveContainers for &[T] {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<T: AsRef<str>> LiveContainers for Vec<T> {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<T: AsRef<str>> LiveContainers for &Vec<T> {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<S: std::hash::BuildHasher> LiveContainers for HashSet<String, S> {
    fn into_container_ids(self) -> HashSet<String> {
        self.into_iter().collect()
    }
}

impl<T: AsRef<str>, S: std::hash::BuildHasher> LiveContainers for &HashSet<T, S> {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

impl<T: AsRef<str>> LiveContainers for &std::collections::BTreeSet<T> {
    fn into_container_ids(self) -> HashSet<String> {
        id_set(self)
    }
}

/// One network's part of [`MultiNetwork::gc`].
#[derive(Debug)]
pub struct NetworkGc {
    /// The network name.
    pub network: String,
    /// What its GC did.
    pub summary: GcSummary,
}

/// One network of a sandbox's operation, with its runtime configuration.
#[derive(Debug)]
struct Planned<'a> {
    name: String,
    /// `None`: a requested network this `MultiNetwork` does not have.
    net: Option<&'a NetworkAttachment>,
    rt: RuntimeConf,
}

fn context(network: &str, ifname: &str, command: Command, e: Error) -> Error {
    Error::Context {
        context: format!("network {network:?} (ifname {ifname}) {command}"),
        source: Box::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_core::Version;
    use pretty_assertions::assert_eq;

    fn list(name: &str) -> NetworkConfigList {
        NetworkConfigList::from_bytes(
            format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"x"}}]}}"#)
                .as_bytes(),
            None,
        )
        .unwrap()
    }

    #[test]
    fn interface_names_are_generated_after_loopback_and_explicit_ones_kept() {
        let m = MultiNetwork::builder(Cni::default())
            .loopback()
            .network(list("a"))
            .network_with_ifname(list("b"), "net1")
            .network(list("c"))
            .build()
            .unwrap();
        let got: Vec<(&str, &str)> = m
            .networks()
            .iter()
            .map(|n| (n.name(), n.ifname()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("cni-loopback", "lo"),
                ("a", "eth0"),
                ("b", "net1"),
                ("c", "eth1")
            ]
        );
        assert_eq!(
            m.networks()[0].list().plugins()[0].plugin_type(),
            "loopback"
        );
    }

    #[test]
    fn bad_sets_are_refused() {
        let dup = MultiNetwork::builder(Cni::default())
            .network(list("a"))
            .network_with_ifname(list("b"), "eth0")
            .build()
            .unwrap_err();
        assert!(dup.to_string().contains("\"eth0\""), "{dup}");
        assert!(dup.to_string().contains("network \"b\""), "{dup}");
        let empty = MultiNetwork::builder(Cni::default()).build().unwrap_err();
        assert!(empty.to_string().contains("no networks"), "{empty}");
        let long = MultiNetwork::builder(Cni::default())
            .network_with_ifname(list("a"), "a-very-long-interface")
            .build()
            .unwrap_err();
        assert!(long.to_string().contains("a-very-long-interface"), "{long}");
        let dir = tempfile::tempdir().unwrap();
        let none = MultiNetwork::builder(Cni::default())
            .conf_dir(dir.path(), 1)
            .build()
            .unwrap_err();
        assert!(
            matches!(none, Error::Core(cni_core::Error::NoConfigs { .. })),
            "{none}"
        );
    }

    #[test]
    fn conf_dir_gives_the_first_n_unique_networks() {
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, name: &str| {
            std::fs::write(
                dir.path().join(file),
                format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"x"}}]}}"#),
            )
            .unwrap();
        };
        write("10-b.conflist", "b");
        write("20-a.conflist", "a");
        write("30-dup.conflist", "b");
        write("40-c.conflist", "c");
        std::fs::write(dir.path().join("05-bad.conflist"), "{").unwrap();
        let m = MultiNetwork::builder(Cni::default())
            .loopback()
            .conf_dir(dir.path(), 2)
            .build()
            .unwrap();
        let got: Vec<(&str, &str)> = m
            .networks()
            .iter()
            .map(|n| (n.name(), n.ifname()))
            .collect();
        assert_eq!(
            got,
            vec![("cni-loopback", "lo"), ("b", "eth0"), ("a", "eth1")]
        );
        assert_eq!(
            m.networks()[1].path(),
            Some(dir.path().join("10-b.conflist").as_path())
        );
        let all = MultiNetwork::builder(Cni::default())
            .interface_prefix("net")
            .conf_dir(dir.path(), 0)
            .build()
            .unwrap();
        let got: Vec<(&str, &str)> = all
            .networks()
            .iter()
            .map(|n| (n.name(), n.ifname()))
            .collect();
        assert_eq!(got, vec![("b", "net0"), ("a", "net1"), ("c", "net2")]);
    }

    /// go-cni's order: a Multus-style `.conf` sorting first is the default
    /// network (`eth0`), ahead of the `.conflist` files.
    #[test]
    fn conf_dir_default_network_is_the_first_file_of_any_extension() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("00-multus.conf"),
            r#"{"cniVersion":"1.0.0","name":"multus-cni-network","type":"multus"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("10-calico.conflist"),
            r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico"}]}"#,
        )
        .unwrap();
        let m = MultiNetwork::builder(Cni::default())
            .conf_dir(dir.path(), 1)
            .build()
            .unwrap();
        let got: Vec<(&str, &str)> = m
            .networks()
            .iter()
            .map(|n| (n.name(), n.ifname()))
            .collect();
        assert_eq!(got, vec![("multus-cni-network", "eth0")]);
    }

    #[test]
    fn labels_become_cni_args_with_ignore_unknown() {
        let sb = Sandbox::new("c1", "/run/netns/c1")
            .with_label("K8S_POD_NAME", "web")
            .with_labels([("app", "x"), ("K8S_POD_NAME", "api")]);
        assert_eq!(
            sb.cni_args().to_string(),
            "IgnoreUnknown=1;K8S_POD_NAME=api;app=x"
        );
        assert_eq!(
            sb.clone().with_ignore_unknown(false).cni_args().to_string(),
            "K8S_POD_NAME=api;app=x"
        );
        let explicit = Sandbox::new("c1", "").with_label("IgnoreUnknown", "true");
        assert_eq!(explicit.cni_args().to_string(), "IgnoreUnknown=true");
        assert!(Sandbox::new("c1", "").cni_args().is_empty());
        let rt = sb.runtime_conf("eth1");
        assert_eq!(rt.ifname, "eth1");
        assert_eq!(rt.netns, "/run/netns/c1");
        sb.validate().unwrap();
        for bad in [
            Sandbox::new("c1", "").with_label("a", "b;c=d"),
            Sandbox::new("c1", "").with_label("", "x"),
            Sandbox::new("c1", "").with_label("a=b", "x"),
            Sandbox::new("../c1", ""),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn results_are_aggregated_by_interface() {
        let r0 = CniResult::parse(
            br#"{"cniVersion":"1.0.0",
                "interfaces":[{"name":"lo","mac":"00:00:00:00:00:00","sandbox":"/run/netns/x"}],
                "ips":[{"interface":0,"address":"127.0.0.1/8"}]}"#,
            Version::V1_0_0,
        )
        .unwrap();
        let r1 = CniResult::parse(
            br#"{"cniVersion":"0.4.0",
                "interfaces":[{"name":"br0","mac":"aa:aa:aa:aa:aa:aa"},
                              {"name":"eth0","mac":"02:00:00:00:00:01","sandbox":"/run/netns/x"}],
                "ips":[{"version":"4","interface":1,"address":"10.1.0.2/24","gateway":"10.1.0.1"}],
                "routes":[{"dst":"10.9.0.0/16"}],
                "dns":{"nameservers":["10.1.0.53"]}}"#,
            Version::V0_4_0,
        )
        .unwrap();
        // No interfaces and an address without index: belongs to eth1.
        let r2 = CniResult::parse(
            br#"{"cniVersion":"1.0.0","ips":[{"address":"10.2.0.2/24"}],
                 "interfaces":[{"name":"br0","mac":"bb:bb:bb:bb:bb:bb"}]}"#,
            Version::V1_0_0,
        )
        .unwrap();
        let nr = |network: &str, ifname: &str, result: &CniResult| NetworkResult {
            network: network.into(),
            ifname: ifname.into(),
            result: result.clone(),
        };
        let m = MultiResult::from_results(vec![
            nr("cni-loopback", "lo", &r0),
            nr("a", "eth0", &r1),
            nr("b", "eth1", &r2),
        ]);
        assert_eq!(
            m.interfaces.keys().map(String::as_str).collect::<Vec<_>>(),
            vec!["br0", "eth0", "eth1", "lo"]
        );
        assert_eq!(
            m.addresses("lo"),
            vec!["127.0.0.1/8".parse::<IpNet>().unwrap()]
        );
        let eth0 = m.interface("eth0").unwrap();
        assert_eq!(eth0.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(eth0.sandbox.as_deref(), Some("/run/netns/x"));
        assert_eq!(
            eth0.ip_configs,
            vec![IpInfo {
                address: "10.1.0.2/24".parse().unwrap(),
                gateway: Some("10.1.0.1".parse().unwrap())
            }]
        );
        assert_eq!(
            m.addresses("eth1"),
            vec!["10.2.0.2/24".parse::<IpNet>().unwrap()]
        );
        // The first report of a shared host interface wins.
        assert_eq!(
            m.interface("br0").unwrap().mac.as_deref(),
            Some("aa:aa:aa:aa:aa:aa")
        );
        assert_eq!(m.routes.len(), 1);
        assert_eq!(m.dns.len(), 1);
        assert_eq!(m.dns[0].nameservers, vec!["10.1.0.53".to_owned()]);
        assert_eq!(m.network("eth0").unwrap().network, "a");
        assert_eq!(m.network("eth0").unwrap().result.version(), Version::V0_4_0);
        assert!(m.addresses("nope").is_empty());
    }
}
