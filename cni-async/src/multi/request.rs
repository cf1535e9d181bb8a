//! What a sandbox asks for: [`Sandbox`], [`NetworkRequest`], [`KubernetesPod`].

use std::path::Path;

use cni_core::{CapabilityArgs, CniArgs, RuntimeConf};

use super::*;
use crate::Error;

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
    /// Capability arguments (see [`cni_core::caps`]).
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
        self.capability_args.0.extend(caps.into().0);
        self
    }
}

pub(super) fn set_pair(args: &mut CniArgs, key: String, value: String) {
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
    /// A sandbox with no labels and no capability arguments; `netns` is kept
    /// as the string plugins get (not UTF-8: refused, see [`RuntimeConf::new`]).
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
        self.capability_args.0.extend(caps.into().0);
        self
    }

    setters! {
        /// Whether to add `IgnoreUnknown=1` (see [`Sandbox::ignore_unknown`]).
        pub fn with_ignore_unknown(ignore_unknown: bool);
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

#[cfg(test)]
mod tests {
    use super::*;

    use pretty_assertions::assert_eq;

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
}
