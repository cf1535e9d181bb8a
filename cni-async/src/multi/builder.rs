//! The networks of a [`MultiNetwork`] and how they are built.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cni_core::{NetworkConfigList, confdir, validate};

use super::*;
use crate::{Cni, Error};

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
/// added here; see the [module docs](super).
#[derive(Debug)]
#[must_use]
pub struct MultiNetworkBuilder {
    /// The settings; its networks are filled in by [`Self::build`].
    inner: Inner,
    sources: Vec<Source>,
    allow_empty: bool,
}

impl MultiNetworkBuilder {
    /// A builder with no networks, prefix `eth`, serial setup and the
    /// `Cni`'s default deadlines.
    pub fn new(cni: Cni) -> Self {
        MultiNetworkBuilder {
            inner: Inner {
                cni,
                networks: Vec::new(),
                available: Vec::new(),
                prefix: DEFAULT_INTERFACE_PREFIX.to_owned(),
                mode: SetupMode::default(),
                timeout: None,
                gates: NetworkGates::new(),
            },
            sources: Vec::new(),
            allow_empty: false,
        }
    }

    /// Accepts a set without networks ([`Self::build`] refuses one by
    /// default): its [`MultiNetwork::remove`] DELs what a sandbox names, and
    /// the container's cached attachments, with the configuration cached at
    /// ADD (a batch whose network file is gone).
    pub fn allow_empty(mut self) -> Self {
        self.allow_empty = true;
        self
    }

    fn source(mut self, source: Source) -> Self {
        self.sources.push(source);
        self
    }

    /// Adds the loopback network: network `cni-loopback`, one `loopback`
    /// plugin at CNI 1.0.0, interface `lo`. Call it first so that `lo` is
    /// set up first and removed last.
    pub fn loopback(self) -> Self {
        self.source(Source::Loopback)
    }

    /// Adds the first `max` networks (`0`: all) of the conf dir `dir`, read
    /// when [`build`](Self::build) runs, each with the next generated
    /// interface name. Files that do not parse are skipped with a warning;
    /// a dir without any usable network makes `build` fail.
    pub fn conf_dir(self, dir: impl Into<PathBuf>, max: usize) -> Self {
        let dir = dir.into();
        self.source(Source::ConfDir { dir, max })
    }

    /// Adds a network with the next generated interface name.
    pub fn network(self, list: NetworkConfigList) -> Self {
        let list = Box::new(list);
        self.source(Source::List { list, ifname: None })
    }

    /// Adds a network with an explicit interface name (not counted in the
    /// generated names).
    pub fn network_with_ifname(self, list: NetworkConfigList, ifname: impl Into<String>) -> Self {
        let (list, ifname) = (Box::new(list), Some(ifname.into()));
        self.source(Source::List { list, ifname })
    }

    setters! {
        /// The prefix of generated interface names (default `eth`).
        pub fn interface_prefix(inner.prefix: impl Into<String>, Into::into);

        /// How [`MultiNetwork::setup`] runs (default [`SetupMode::Serial`]).
        pub fn mode(inner.mode: SetupMode);

        /// The deadline of each network's operation (each ADD, DEL, CHECK,
        /// STATUS of one network list); default: the `Cni`'s per-verb deadlines.
        pub fn timeout(inner.timeout: Duration, Some);
    }

    /// Reads the conf dirs and checks the set: at least one network, valid
    /// network and interface names, no interface name twice.
    pub fn build(mut self) -> Result<MultiNetwork, Error> {
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
                    for (i, net) in found.into_iter().enumerate() {
                        let mut n = NetworkAttachment {
                            list: net.list.clone(),
                            ifname: String::new(),
                            path: Some(net.path.clone()),
                        };
                        if max == 0 || i < max {
                            n.ifname = next_ifname(&self.inner.prefix);
                            networks.push(n);
                        } else {
                            available.push(n);
                        }
                    }
                }
                Source::List { list, ifname } => {
                    let ifname = ifname.unwrap_or_else(|| next_ifname(&self.inner.prefix));
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
        self.inner.networks = networks;
        self.inner.available = available;
        Ok(MultiNetwork {
            inner: Arc::new(self.inner),
        })
    }
}

pub(super) fn invalid_set(value: &str, reason: &str) -> Error {
    Error::Core(cni_core::Error::InvalidParameter {
        field: "interface name",
        value: value.to_owned(),
        reason: reason.to_owned(),
        code: cni_core::error::code::INVALID_NETWORK_CONFIG,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use pretty_assertions::assert_eq;

    /// (network, ifname) of each network, in setup order.
    fn names(m: &MultiNetwork) -> Vec<(&str, &str)> {
        m.networks()
            .iter()
            .map(|n| (n.name(), n.ifname()))
            .collect()
    }

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
        let got = names(&m);
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
        let got = names(&m);
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
        let got = names(&all);
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
        let got = names(&m);
        assert_eq!(got, vec![("multus-cni-network", "eth0")]);
    }
}
