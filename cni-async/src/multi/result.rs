//! The aggregated result of a sandbox's setup: [`MultiResult`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use cni_core::result::{CniResult, Dns, Route};
use ipnet::IpNet;

#[cfg(doc)]
use super::MultiNetwork;

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

#[cfg(test)]
mod tests {
    use super::*;
    use cni_core::Version;
    use pretty_assertions::assert_eq;

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
