//! Typed capability arguments: the well-known `runtimeConfig` entries of the
//! CNI conventions (`CONVENTIONS.md`), written with exactly the field names
//! the reference plugins read.
//!
//! A runtime passes capability arguments for every attachment; each plugin
//! receives, in its `runtimeConfig`, only those whose key it declares in its
//! `capabilities` (see [`crate::stdin`]). [`Capabilities`] builds the
//! [`CapabilityArgs`] object from typed values:
//!
//! | capability | type | JSON | read by |
//! |---|---|---|---|
//! | `portMappings` | [`PortMapping`] list | `[{"hostPort":8080,"containerPort":80,"protocol":"tcp","hostIP":"127.0.0.1"}]` | `portmap` |
//! | `ipRanges` | lists of [`IpRange`] | `[[{"subnet":"10.1.2.0/24","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.99","gateway":"10.1.2.254"}]]` | `host-local` |
//! | `bandwidth` | [`Bandwidth`] | `{"ingressRate":2048,"ingressBurst":1600,"egressRate":4096,"egressBurst":1600}` | `bandwidth` |
//! | `dns` | [`Dns`] | `{"servers":["10.0.0.10"],"searches":["corp.example"],"options":["ndots:5"]}` | `win-bridge`, `win-overlay` |
//! | `ips` | [`IpRequest`] list | `["10.10.0.1/24","3ffe:ffff:0:1ff::2"]` | `static`, `host-local` |
//! | `mac` | [`MacAddr`] | `"c2:11:22:33:44:55"` | `tuning` |
//! | `infinibandGUID` | string | `"c2:11:22:33:44:55:66:77"` | `ib-sriov-cni` |
//! | `deviceID` | string | `"0000:04:00.5"` | `host-device` |
//! | `aliases` | strings | `["my-container","primary-db"]` | `alias` |
//! | `cgroupPath` | string | `"/kubepods.slice/..."` | `host-local` |
//! | `io.kubernetes.cri.pod-annotations` | string map | `{"key":"value"}` | various |
//!
//! Anything else goes in with [`Capabilities::set`] (a JSON value) or
//! [`Capabilities::set_serialized`] (any [`Serialize`] value).
//!
//! Optional fields are omitted when unset, as the Go plugins' `omitempty`
//! tags do, and numbers are written as JSON integers. Serialization is
//! derived (`serde`), with the field names of the plugins' Go structs. Every type also
//! implements `Deserialize` (accepting what it writes), so a daemon can take
//! them from its clients.
//!
//! ```
//! use cni_core::caps::{Bandwidth, Capabilities, PortMapping};
//!
//! let caps = Capabilities::new()
//!     .port_mappings([PortMapping::tcp(8080, 80)])
//!     .bandwidth(Bandwidth::symmetric(1_000_000, 100_000))
//!     .cgroup_path("/kubepods.slice/pod1");
//! assert_eq!(
//!     serde_json::to_string(caps.args()).unwrap(),
//!     r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],"#.to_owned()
//!         + r#""bandwidth":{"ingressRate":1000000,"ingressBurst":100000,"egressRate":1000000,"egressBurst":100000},"#
//!         + r#""cgroupPath":"/kubepods.slice/pod1"}"#
//! );
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::CapabilityArgs;
use crate::Error;

/// `portMappings`: host ports forwarded into the container (`portmap`).
pub const PORT_MAPPINGS: &str = "portMappings";
/// `ipRanges`: address pools to allocate from (`host-local`).
pub const IP_RANGES: &str = "ipRanges";
/// `bandwidth`: traffic shaping (`bandwidth`).
pub const BANDWIDTH: &str = "bandwidth";
/// `dns`: resolver settings.
pub const DNS: &str = "dns";
/// `ips`: the addresses to assign (`static`, `host-local`).
pub const IPS: &str = "ips";
/// `mac`: the hardware address of the container interface (`tuning`).
pub const MAC: &str = "mac";
/// `infinibandGUID`: the GUID of an InfiniBand interface.
pub const INFINIBAND_GUID: &str = "infinibandGUID";
/// `deviceID`: the device the network is bound to (`host-device`).
pub const DEVICE_ID: &str = "deviceID";
/// `aliases`: names for the container's addresses (`alias`).
pub const ALIASES: &str = "aliases";
/// `cgroupPath`: the pod's cgroup (`host-local`).
pub const CGROUP_PATH: &str = "cgroupPath";
/// `io.kubernetes.cri.pod-annotations`: the pod's annotations.
pub const POD_ANNOTATIONS: &str = "io.kubernetes.cri.pod-annotations";

/// A transport protocol of a [`PortMapping`], written in lower case.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// `tcp` (the default).
    #[default]
    Tcp,
    /// `udp`.
    Udp,
    /// `sctp`.
    Sctp,
}

impl Protocol {
    /// `tcp`, `udp` or `sctp`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = Error;

    /// `tcp`, `udp` or `sctp`, in any case (Kubernetes writes `TCP`).
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            "sctp" => Ok(Protocol::Sctp),
            _ => Err(invalid(
                "port mapping protocol",
                s,
                "expected tcp, udp or sctp",
            )),
        }
    }
}

/// One entry of `portMappings`.
///
/// Written as `{"hostPort":H,"containerPort":C,"protocol":"tcp"}` plus
/// `"hostIP"` when set: the `portmap` plugin's `PortMapEntry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The port on the host (`hostPort`).
    pub host_port: u16,
    /// The port in the container (`containerPort`).
    pub container_port: u16,
    /// `protocol`.
    #[serde(default, deserialize_with = "de_from_str")]
    pub protocol: Protocol,
    /// Only traffic to this host address is forwarded (`hostIP`); unset
    /// means every address.
    #[serde(
        default,
        rename = "hostIP",
        deserialize_with = "de_opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// A TCP mapping from `host_port` to `container_port`, on every host address.
    pub fn tcp(host_port: u16, container_port: u16) -> Self {
        PortMapping {
            host_port,
            container_port,
            protocol: Protocol::Tcp,
            host_ip: None,
        }
    }

    /// A UDP mapping from `host_port` to `container_port`, on every host address.
    pub fn udp(host_port: u16, container_port: u16) -> Self {
        PortMapping {
            protocol: Protocol::Udp,
            ..PortMapping::tcp(host_port, container_port)
        }
    }

    /// This mapping, only for traffic to `ip` on the host.
    pub fn with_host_ip(mut self, ip: IpAddr) -> Self {
        self.host_ip = Some(ip);
        self
    }
}

/// `bandwidth`: rates in bits per second, bursts in bits; 0 means no limit.
///
/// Written as `{"ingressRate","ingressBurst","egressRate","egressBurst"}`
/// (always all four, as the `bandwidth` plugin's `BandwidthEntry`), plus
/// `unshapedSubnets` / `shapedSubnets` when non-empty (plugins 1.5 and
/// later; the two are mutually exclusive).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bandwidth {
    /// Traffic into the container, bits per second (`ingressRate`).
    #[serde(default)]
    pub ingress_rate: u64,
    /// Ingress burst in bits (`ingressBurst`).
    #[serde(default)]
    pub ingress_burst: u64,
    /// Traffic out of the container, bits per second (`egressRate`).
    #[serde(default)]
    pub egress_rate: u64,
    /// Egress burst in bits (`egressBurst`).
    #[serde(default)]
    pub egress_burst: u64,
    /// Subnets excluded from shaping (`unshapedSubnets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unshaped_subnets: Vec<IpNet>,
    /// Only these subnets are shaped (`shapedSubnets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shaped_subnets: Vec<IpNet>,
}

impl Bandwidth {
    /// The same rate and burst in both directions.
    pub fn symmetric(rate: u64, burst: u64) -> Self {
        Bandwidth {
            ingress_rate: rate,
            ingress_burst: burst,
            egress_rate: rate,
            egress_burst: burst,
            ..Bandwidth::default()
        }
    }
}

/// `dns`: resolver settings for the container. Empty lists are omitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers (`servers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<IpAddr>,
    /// Search domains (`searches`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub searches: Vec<String>,
    /// Resolver options (`options`), such as `ndots:5`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// One pool of an `ipRanges` entry: `host-local`'s range.
///
/// Written as `{"subnet"}` plus `rangeStart`, `rangeEnd` and `gateway` when set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpRange {
    /// The subnet to allocate from (`subnet`).
    pub subnet: IpNet,
    /// First address to hand out (`rangeStart`).
    #[serde(
        default,
        deserialize_with = "de_opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub range_start: Option<IpAddr>,
    /// Last address to hand out (`rangeEnd`).
    #[serde(
        default,
        deserialize_with = "de_opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub range_end: Option<IpAddr>,
    /// The gateway of the subnet (`gateway`).
    #[serde(
        default,
        deserialize_with = "de_opt_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub gateway: Option<IpAddr>,
}

impl IpRange {
    /// The whole subnet, no explicit gateway.
    pub fn subnet(subnet: IpNet) -> Self {
        IpRange {
            subnet,
            range_start: None,
            range_end: None,
            gateway: None,
        }
    }
}

/// An entry of `ips`: an address, with or without a prefix length
/// (`10.1.2.3` or `10.1.2.3/24`). Some plugins (`static`) need the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRequest {
    /// An address without prefix length.
    Addr(IpAddr),
    /// An address with its prefix length (host bits kept).
    Net(IpNet),
}

impl From<IpAddr> for IpRequest {
    fn from(ip: IpAddr) -> Self {
        IpRequest::Addr(ip)
    }
}

impl From<IpNet> for IpRequest {
    fn from(net: IpNet) -> Self {
        IpRequest::Net(net)
    }
}

impl fmt::Display for IpRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpRequest::Addr(ip) => write!(f, "{ip}"),
            IpRequest::Net(net) => write!(f, "{net}"),
        }
    }
}

impl FromStr for IpRequest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        if s.contains('/') {
            s.parse::<IpNet>()
                .map(IpRequest::Net)
                .map_err(|e| invalid("IP address", s, &e.to_string()))
        } else {
            s.parse::<IpAddr>()
                .map(IpRequest::Addr)
                .map_err(|e| invalid("IP address", s, &e.to_string()))
        }
    }
}

impl<'de> Deserialize<'de> for IpRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_from_str(d)
    }
}

/// A 48-bit hardware address, written `c2:11:22:33:44:55` (lower case).
///
/// Parses the colon and dash forms (`C2-11-22-33-44-55`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            invalid(
                "MAC address",
                s,
                "expected six hex octets such as c2:11:22:33:44:55",
            )
        };
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut parts = s.split(sep);
        for slot in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *slot = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_from_str(d)
    }
}

macro_rules! serialize_via_display {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
    )*};
}
serialize_via_display!(Protocol, IpRequest, MacAddr);

impl<'de> Deserialize<'de> for Protocol {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        de_from_str(d)
    }
}

/// Builds [`CapabilityArgs`] from typed values (see the module docs).
///
/// Each setter replaces what was set before under its key. Convert with
/// [`Capabilities::into_args`] or `CapabilityArgs::from`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    args: CapabilityArgs,
}

impl Capabilities {
    /// No capability arguments.
    pub fn new() -> Self {
        Capabilities::default()
    }

    /// `portMappings`.
    pub fn port_mappings(self, mappings: impl IntoIterator<Item = PortMapping>) -> Self {
        let list: Vec<PortMapping> = mappings.into_iter().collect();
        self.set(PORT_MAPPINGS, to_value(&list))
    }

    /// `ipRanges`: the outer list has one entry per address to allocate,
    /// each a list of pools to allocate it from.
    pub fn ip_ranges<I, R>(self, ranges: I) -> Self
    where
        I: IntoIterator<Item = R>,
        R: IntoIterator<Item = IpRange>,
    {
        let outer: Vec<Vec<IpRange>> = ranges
            .into_iter()
            .map(|pools| pools.into_iter().collect())
            .collect();
        self.set(IP_RANGES, to_value(&outer))
    }

    /// `bandwidth`.
    pub fn bandwidth(self, bandwidth: Bandwidth) -> Self {
        self.set(BANDWIDTH, to_value(&bandwidth))
    }

    /// `dns`.
    pub fn dns(self, dns: Dns) -> Self {
        self.set(DNS, to_value(&dns))
    }

    /// `ips`.
    pub fn ips<I, T>(self, ips: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<IpRequest>,
    {
        let list = ips
            .into_iter()
            .map(|ip| Value::String(ip.into().to_string()))
            .collect();
        self.set(IPS, Value::Array(list))
    }

    /// `mac`.
    pub fn mac(self, mac: MacAddr) -> Self {
        self.set(MAC, Value::String(mac.to_string()))
    }

    /// `infinibandGUID`.
    pub fn infiniband_guid(self, guid: impl Into<String>) -> Self {
        self.set(INFINIBAND_GUID, Value::String(guid.into()))
    }

    /// `deviceID`.
    pub fn device_id(self, id: impl Into<String>) -> Self {
        self.set(DEVICE_ID, Value::String(id.into()))
    }

    /// `aliases`.
    pub fn aliases<I, S>(self, aliases: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let list = aliases
            .into_iter()
            .map(|a| Value::String(a.into()))
            .collect();
        self.set(ALIASES, Value::Array(list))
    }

    /// `cgroupPath`.
    pub fn cgroup_path(self, path: impl Into<String>) -> Self {
        self.set(CGROUP_PATH, Value::String(path.into()))
    }

    /// `io.kubernetes.cri.pod-annotations`.
    pub fn pod_annotations<I, K, V>(self, annotations: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let map: BTreeMap<String, String> = annotations
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let obj = map
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        self.set(POD_ANNOTATIONS, Value::Object(obj))
    }

    /// Any capability, as a JSON value.
    pub fn set(mut self, capability: impl Into<String>, value: Value) -> Self {
        self.args.insert(capability, value);
        self
    }

    /// Any capability, from any serializable value.
    ///
    /// Fails with [`Error::InvalidCapabilityArgs`] when `value`
    /// cannot be written as JSON (a map with non-string keys, a failing
    /// `Serialize` implementation).
    pub fn set_serialized<T: Serialize + ?Sized>(
        self,
        capability: impl Into<String>,
        value: &T,
    ) -> Result<Self, Error> {
        let capability = capability.into();
        let value = serde_json::to_value(value).map_err(|e| Error::InvalidCapabilityArgs {
            reason: format!("capability {capability:?}: cannot encode value: {e}"),
        })?;
        Ok(self.set(capability, value))
    }

    /// Adds every entry of `other`, replacing entries of the same key.
    pub fn merge(mut self, other: impl Into<CapabilityArgs>) -> Self {
        for (k, v) in other.into().0 {
            self.args.insert(k, v);
        }
        self
    }

    /// The arguments built so far.
    pub fn args(&self) -> &CapabilityArgs {
        &self.args
    }

    /// The arguments, for [`crate::RuntimeConf::capability_args`].
    pub fn into_args(self) -> CapabilityArgs {
        self.args
    }
}

impl From<Capabilities> for CapabilityArgs {
    fn from(caps: Capabilities) -> Self {
        caps.args
    }
}

impl From<CapabilityArgs> for Capabilities {
    fn from(args: CapabilityArgs) -> Self {
        Capabilities { args }
    }
}

/// The JSON of one of this module's types. Their `Serialize` implementations
/// write only strings, integers, lists and string-keyed objects, which
/// `serde_json` always encodes; `Null` is unreachable.
fn to_value<T: Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn invalid(field: &'static str, value: &str, reason: &str) -> Error {
    Error::InvalidParameter {
        field,
        value: value.to_owned(),
        reason: reason.to_owned(),
        code: crate::error::code::INVALID_NETWORK_CONFIG,
    }
}

fn de_from_str<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// An optional IP: missing, `null` and `""` (Go's empty string) are unset.
fn de_opt_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// Every helper writes exactly the JSON of CONVENTIONS.md and the plugins.
    #[test]
    fn helpers_write_the_conventional_json() {
        let caps = Capabilities::new()
            .port_mappings([
                PortMapping::tcp(8080, 80),
                PortMapping::udp(8000, 8001).with_host_ip(ip("127.0.0.1")),
            ])
            .ip_ranges([[IpRange {
                subnet: net("10.1.2.0/24"),
                range_start: Some(ip("10.1.2.3")),
                range_end: Some(ip("10.1.2.99")),
                gateway: Some(ip("10.1.2.254")),
            }]])
            .bandwidth(Bandwidth {
                ingress_rate: 2048,
                ingress_burst: 1600,
                egress_rate: 4096,
                egress_burst: 1600,
                ..Bandwidth::default()
            })
            .dns(Dns {
                servers: vec![ip("8.8.8.8"), ip("10.0.0.10")],
                searches: vec!["internal.yoyodyne.net".into(), "corp.tyrell.net".into()],
                options: vec!["ndots:5".into()],
            })
            .ips([
                IpRequest::from(ip("192.168.0.1")),
                IpRequest::from(net("10.10.0.1/24")),
                IpRequest::from(ip("3ffe:ffff:0:01ff::2")),
                IpRequest::from(net("3ffe:ffff:0:01ff::1/64")),
            ])
            .mac("C2:11:22:33:44:55".parse().unwrap())
            .infiniband_guid("c2:11:22:33:44:55:66:77")
            .device_id("0000:04:00.5")
            .aliases(["my-container", "primary-db"])
            .cgroup_path("/kubelet.slice/kubelet-kubepods.slice/pod28ce45bc.slice")
            .pod_annotations([("b", "2"), ("a", "1")])
            .set("custom", json!({"x": 1}));
        let expected = json!({
            "portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 8000, "containerPort": 8001, "protocol": "udp", "hostIP": "127.0.0.1"}
            ],
            "ipRanges": [[
                {"subnet": "10.1.2.0/24", "rangeStart": "10.1.2.3", "rangeEnd": "10.1.2.99", "gateway": "10.1.2.254"}
            ]],
            "bandwidth": {"ingressRate": 2048, "ingressBurst": 1600, "egressRate": 4096, "egressBurst": 1600},
            "dns": {
                "servers": ["8.8.8.8", "10.0.0.10"],
                "searches": ["internal.yoyodyne.net", "corp.tyrell.net"],
                "options": ["ndots:5"]
            },
            "ips": ["192.168.0.1", "10.10.0.1/24", "3ffe:ffff:0:1ff::2", "3ffe:ffff:0:1ff::1/64"],
            "mac": "c2:11:22:33:44:55",
            "infinibandGUID": "c2:11:22:33:44:55:66:77",
            "deviceID": "0000:04:00.5",
            "aliases": ["my-container", "primary-db"],
            "cgroupPath": "/kubelet.slice/kubelet-kubepods.slice/pod28ce45bc.slice",
            "io.kubernetes.cri.pod-annotations": {"a": "1", "b": "2"},
            "custom": {"x": 1}
        });
        let got = serde_json::to_value(caps.args()).unwrap();
        assert_eq!(got, expected);
        // Key order is insertion order (preserve_order), the text exact.
        assert_eq!(
            serde_json::to_string(&got["portMappings"]).unwrap(),
            r#"[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":8000,"containerPort":8001,"protocol":"udp","hostIP":"127.0.0.1"}]"#
        );
    }

    /// The derived `Serialize` implementations write, byte for byte, what the
    /// hand-written encoder of cni-async wrote before the move (the expected
    /// text is that encoder's output for this value): field order, omitted
    /// optionals, empty lists, exact big integers, escapes.
    #[test]
    fn derived_json_is_byte_identical_to_the_former_hand_written_encoder() {
        let caps = Capabilities::new()
            .port_mappings([
                PortMapping::tcp(8080, 80),
                PortMapping::udp(8000, 8001).with_host_ip(ip("127.0.0.1")),
                PortMapping {
                    protocol: Protocol::Sctp,
                    ..PortMapping::tcp(1, 2)
                }
                .with_host_ip(ip("::1")),
            ])
            .ip_ranges([
                vec![
                    IpRange {
                        subnet: net("10.1.2.0/24"),
                        range_start: Some(ip("10.1.2.3")),
                        range_end: Some(ip("10.1.2.99")),
                        gateway: Some(ip("10.1.2.254")),
                    },
                    IpRange::subnet(net("fd00::/64")),
                    IpRange {
                        range_end: Some(ip("10.9.0.9")),
                        ..IpRange::subnet(net("10.9.0.0/16"))
                    },
                ],
                vec![],
            ])
            .bandwidth(Bandwidth {
                unshaped_subnets: vec![net("10.0.0.0/8"), net("fd00::/8")],
                shaped_subnets: vec![net("192.168.0.0/16")],
                ..Bandwidth::symmetric(u64::MAX, 1600)
            })
            .dns(Dns {
                servers: vec![ip("8.8.8.8"), ip("2001:db8::1")],
                searches: vec!["a.example".into(), "b\"q".into()],
                options: vec!["ndots:5".into()],
            })
            .ips([
                IpRequest::from(ip("192.168.0.1")),
                IpRequest::from(net("3ffe:ffff:0:01ff::1/64")),
            ])
            .mac("C2:11:22:33:44:55".parse().unwrap())
            .infiniband_guid("c2:11:22:33:44:55:66:77")
            .device_id("0000:04:00.5")
            .aliases(["my-container", "primary-db"])
            .cgroup_path("/kubepods.slice/pod1")
            .pod_annotations([("b", "2"), ("a", "1")]);
        let expected = concat!(
            r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},"#,
            r#"{"hostPort":8000,"containerPort":8001,"protocol":"udp","hostIP":"127.0.0.1"},"#,
            r#"{"hostPort":1,"containerPort":2,"protocol":"sctp","hostIP":"::1"}],"#,
            r#""ipRanges":[[{"subnet":"10.1.2.0/24","rangeStart":"10.1.2.3","rangeEnd":"10.1.2.99","gateway":"10.1.2.254"},"#,
            r#"{"subnet":"fd00::/64"},{"subnet":"10.9.0.0/16","rangeEnd":"10.9.0.9"}],[]],"#,
            r#""bandwidth":{"ingressRate":18446744073709551615,"ingressBurst":1600,"#,
            r#""egressRate":18446744073709551615,"egressBurst":1600,"#,
            r#""unshapedSubnets":["10.0.0.0/8","fd00::/8"],"shapedSubnets":["192.168.0.0/16"]},"#,
            r#""dns":{"servers":["8.8.8.8","2001:db8::1"],"searches":["a.example","b\"q"],"options":["ndots:5"]},"#,
            r#""ips":["192.168.0.1","3ffe:ffff:0:1ff::1/64"],"mac":"c2:11:22:33:44:55","#,
            r#""infinibandGUID":"c2:11:22:33:44:55:66:77","deviceID":"0000:04:00.5","#,
            r#""aliases":["my-container","primary-db"],"cgroupPath":"/kubepods.slice/pod1","#,
            r#""io.kubernetes.cri.pod-annotations":{"a":"1","b":"2"}}"#,
        );
        assert_eq!(serde_json::to_string(caps.args()).unwrap(), expected);
        // The types on their own, as the builder writes them.
        for (got, want) in [
            (serde_json::to_string(&Dns::default()).unwrap(), "{}"),
            (
                serde_json::to_string(&Bandwidth::default()).unwrap(),
                r#"{"ingressRate":0,"ingressBurst":0,"egressRate":0,"egressBurst":0}"#,
            ),
            (
                serde_json::to_string(&IpRange::subnet(net("10.0.0.0/8"))).unwrap(),
                r#"{"subnet":"10.0.0.0/8"}"#,
            ),
            (
                serde_json::to_string(&PortMapping::tcp(1, 2)).unwrap(),
                r#"{"hostPort":1,"containerPort":2,"protocol":"tcp"}"#,
            ),
        ] {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn optional_fields_are_omitted_and_subnets_written_when_set() {
        assert_eq!(
            to_value(&IpRange::subnet(net("10.1.2.0/24"))),
            json!({"subnet": "10.1.2.0/24"})
        );
        assert_eq!(to_value(&Dns::default()), json!({}));
        let bw = Bandwidth {
            unshaped_subnets: vec![net("10.0.0.0/8")],
            ..Bandwidth::symmetric(10, 20)
        };
        assert_eq!(
            to_value(&bw),
            json!({"ingressRate": 10, "ingressBurst": 20, "egressRate": 10, "egressBurst": 20,
                   "unshapedSubnets": ["10.0.0.0/8"]})
        );
        // Large rates stay exact integers.
        let big = Bandwidth::symmetric(u64::MAX, 1);
        assert_eq!(
            serde_json::to_string(&big).unwrap(),
            format!(
                r#"{{"ingressRate":{m},"ingressBurst":1,"egressRate":{m},"egressBurst":1}}"#,
                m = u64::MAX
            )
        );
    }

    #[test]
    fn types_read_back_what_they_write_and_what_go_writes() {
        let pm = PortMapping::udp(53, 5353).with_host_ip(ip("::1"));
        let text = serde_json::to_string(&pm).unwrap();
        assert_eq!(serde_json::from_str::<PortMapping>(&text).unwrap(), pm);
        // From a Value too (arbitrary_precision numbers).
        assert_eq!(
            serde_json::from_value::<PortMapping>(to_value(&pm)).unwrap(),
            pm
        );
        // Go writes an empty hostIP and upper-case protocols.
        let go: PortMapping = serde_json::from_str(
            r#"{"hostPort":1,"containerPort":2,"protocol":"TCP","hostIP":""}"#,
        )
        .unwrap();
        assert_eq!(go, PortMapping::tcp(1, 2));
        assert!(
            serde_json::from_str::<PortMapping>(r#"{"hostPort":70000,"containerPort":2}"#).is_err()
        );
        assert!(
            serde_json::from_str::<PortMapping>(
                r#"{"hostPort":1,"containerPort":2,"protocol":"icmp"}"#
            )
            .is_err()
        );

        let bw = Bandwidth {
            shaped_subnets: vec![net("10.1.0.0/16")],
            ..Bandwidth::symmetric(2048, 1600)
        };
        assert_eq!(
            serde_json::from_value::<Bandwidth>(to_value(&bw)).unwrap(),
            bw
        );
        let dns = Dns {
            servers: vec![ip("10.0.0.10")],
            searches: vec!["a".into()],
            options: vec![],
        };
        assert_eq!(serde_json::from_value::<Dns>(to_value(&dns)).unwrap(), dns);
        let r = IpRange {
            gateway: Some(ip("10.1.2.1")),
            ..IpRange::subnet(net("10.1.2.0/24"))
        };
        assert_eq!(serde_json::from_value::<IpRange>(to_value(&r)).unwrap(), r);
        let ips: Vec<IpRequest> = serde_json::from_str(r#"["10.0.0.1","10.0.0.2/24"]"#).unwrap();
        assert_eq!(
            ips,
            vec![
                IpRequest::Addr(ip("10.0.0.1")),
                IpRequest::Net(net("10.0.0.2/24"))
            ]
        );
    }

    #[test]
    fn mac_addresses_parse_and_print() {
        let mac: MacAddr = "C2-11-22-33-44-5F".parse().unwrap();
        assert_eq!(mac.to_string(), "c2:11:22:33:44:5f");
        assert_eq!(mac, "c2:11:22:33:44:5f".parse().unwrap());
        for bad in [
            "",
            "c2:11:22:33:44",
            "c2:11:22:33:44:55:66",
            "c2:11:22:33:44:5",
            "g2:11:22:33:44:55",
            "c2:11-22:33:44:55",
        ] {
            let e = bad.parse::<MacAddr>().unwrap_err();
            assert!(
                e.to_string().contains("invalid MAC address"),
                "{bad:?}: {e}"
            );
        }
        assert!("10.0.0.1/33".parse::<IpRequest>().is_err());
        assert!("nope".parse::<IpRequest>().is_err());
    }

    #[test]
    fn set_serialized_and_merge() {
        #[derive(Serialize)]
        struct Custom {
            a: u32,
        }
        let caps = Capabilities::new()
            .set_serialized("custom", &Custom { a: 7 })
            .unwrap()
            .mac(MacAddr([2, 0, 0, 0, 0, 1]));
        let mut other = CapabilityArgs::new();
        other.insert("mac", json!("02:00:00:00:00:02"));
        let caps = caps.merge(other);
        assert_eq!(
            serde_json::to_value(CapabilityArgs::from(caps)).unwrap(),
            json!({"custom": {"a": 7}, "mac": "02:00:00:00:00:02"})
        );
        let mut bad = BTreeMap::new();
        bad.insert(vec![1u8], 1);
        let e = Capabilities::new().set_serialized("x", &bad).unwrap_err();
        assert!(e.to_string().contains("capability \"x\""), "{e}");
    }
}
