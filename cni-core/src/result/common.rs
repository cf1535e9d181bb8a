//! The pieces results are made of: interfaces, IP configurations, routes, DNS.
//!
//! One type of each serves every version. What a version can hold is decided
//! when it is read and written ([`ResultFamily`]), as in libcni, whose
//! `types.Route` and `types.DNS` are shared by all versions too.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use super::json::{Reader, join, object_of};
use crate::error::Error;
use crate::version::ResultFamily;

/// An interface created by the attachment (0.3.0 and later).
///
/// Empty strings and a zero `mtu` are "unset", as in libcni (`omitempty`):
/// they are read as `None` and never written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Interface {
    /// The interface name (`name`), always written, even when empty.
    pub name: String,
    /// The hardware address (`mac`), if meaningful.
    pub mac: Option<String>,
    /// The MTU (`mtu`). 1.x only: dropped on conversion to 0.x.
    pub mtu: Option<u32>,
    /// The isolation domain (`sandbox`): the netns path for container-side
    /// interfaces, unset for host interfaces.
    pub sandbox: Option<String>,
    /// A socket file of this interface (`socketPath`). 1.x only.
    pub socket_path: Option<String>,
    /// The PCI device of this interface (`pciID`). 1.x only.
    pub pci_id: Option<String>,
}

impl Interface {
    /// An interface with only a name.
    pub fn new(name: impl Into<String>) -> Self {
        Interface {
            name: name.into(),
            ..Interface::default()
        }
    }

    /// This interface without the fields 0.3.0 to 0.4.0 cannot hold.
    pub(crate) fn without_v1_fields(&self) -> Interface {
        Interface {
            name: self.name.clone(),
            mac: self.mac.clone(),
            mtu: None,
            sandbox: self.sandbox.clone(),
            socket_path: None,
            pci_id: None,
        }
    }

    pub(crate) fn read(
        r: &Reader,
        value: &Value,
        path: &str,
        family: ResultFamily,
    ) -> Result<Self, Error> {
        let obj = r.object(value, path)?;
        let name = r.string(obj, path, "name")?.unwrap_or_default().to_owned();
        let mac = r.opt_string(obj, path, "mac")?;
        let sandbox = r.opt_string(obj, path, "sandbox")?;
        // libcni's 0.4.0 type has no such fields: they are ignored there.
        let (mtu, socket_path, pci_id) = if family == ResultFamily::V1 {
            (
                r.opt_u32(obj, path, "mtu", true)?,
                r.opt_string(obj, path, "socketPath")?,
                r.opt_string(obj, path, "pciID")?,
            )
        } else {
            (None, None, None)
        };
        Ok(Interface {
            name,
            mac,
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
    }

    pub(crate) fn write(&self, family: ResultFamily) -> Value {
        let v1 = family == ResultFamily::V1;
        let mut out = vec![("name", Value::from(self.name.as_str()))];
        push_str(&mut out, "mac", &self.mac);
        if v1 {
            push_u32(&mut out, "mtu", self.mtu, true);
        }
        push_str(&mut out, "sandbox", &self.sandbox);
        if v1 {
            push_str(&mut out, "socketPath", &self.socket_path);
            push_str(&mut out, "pciID", &self.pci_id);
        }
        object_of(out)
    }
}

/// An IP address assigned by the attachment (an entry of `ips`, 0.3.0 and later).
///
/// 0.3.0 to 0.4.0 also carry `"version": "4"` or `"6"`. It is not stored: it
/// is written from the address family, and checked against the address when
/// read (a missing `version` is accepted and derived, as libcni accepts it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IpConfig {
    /// The index into the result's `interfaces` (`interface`); unset for IPAM results.
    pub interface: Option<u32>,
    /// The address with its prefix length (`address`); host bits are kept:
    /// `10.1.2.3/24` stays `10.1.2.3/24`.
    pub address: IpNet,
    /// The default gateway of the subnet (`gateway`), if one exists.
    pub gateway: Option<IpAddr>,
}

impl IpConfig {
    /// An IP configuration with only an address.
    pub fn new(address: IpNet) -> Self {
        IpConfig {
            interface: None,
            address,
            gateway: None,
        }
    }

    /// The 0.3.0 to 0.4.0 `version` label of this address: `"4"` or `"6"`.
    pub fn ip_version(&self) -> &'static str {
        family_label(&self.address)
    }

    pub(crate) fn read(
        r: &Reader,
        value: &Value,
        path: &str,
        family: ResultFamily,
    ) -> Result<Self, Error> {
        let obj = r.object(value, path)?;
        let address = r.ipnet(obj, path, "address")?;
        if family == ResultFamily::V04 {
            let derived = family_label(&address);
            match r.string(obj, path, "version")? {
                None => {}
                Some(v) if v == derived => {}
                Some(v @ ("4" | "6")) => {
                    return Err(r.fail(
                        &join(path, "version"),
                        obj.get("version"),
                        format_args!(
                            "does not match address {address}, which is IPv{derived} (expected \"{derived}\", not \"{v}\")"
                        ),
                    ));
                }
                Some(_) => {
                    return Err(r.fail(
                        &join(path, "version"),
                        obj.get("version"),
                        "expected \"4\" or \"6\"",
                    ));
                }
            }
        }
        Ok(IpConfig {
            interface: r.opt_u32(obj, path, "interface", false)?,
            address,
            gateway: r.opt_ip(obj, path, "gateway")?,
        })
    }

    pub(crate) fn write(&self, family: ResultFamily) -> Value {
        let mut out = Vec::with_capacity(4);
        if family == ResultFamily::V04 {
            out.push(("version", Value::from(self.ip_version())));
        }
        push_u32(&mut out, "interface", self.interface, false);
        out.push(("address", Value::from(self.address.to_string())));
        push_ip(&mut out, "gateway", self.gateway);
        object_of(out)
    }
}

/// A route created by the attachment.
///
/// The same type serves every version, as libcni's `types.Route` does, and
/// 0.3.0 to 0.4.0 results keep the 1.1.0 fields (`mtu`, `advmss`, `priority`,
/// `table`, `scope`) both when read and when converted from 1.x, exactly as
/// libcni does, so a 1.1.0 result survives a trip through 0.4.0 unchanged.
/// Only conversion to 0.1.0/0.2.0 reduces a route to `dst` and `gw`.
///
/// `mtu`, `advmss` and `priority` of `0` are "unset" (libcni's `omitempty`
/// ints); `table` and `scope` keep an explicit `0` (pointers in libcni).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    /// The destination (`dst`) in CIDR notation; host bits are kept.
    pub dst: IpNet,
    /// The next hop (`gw`); unset means the `gateway` of the matching IP may be used.
    pub gw: Option<IpAddr>,
    /// The path MTU (`mtu`, 1.1.0).
    pub mtu: Option<u32>,
    /// The MSS to advertise (`advmss`, 1.1.0).
    pub advmss: Option<u32>,
    /// The route priority, lower is preferred (`priority`, 1.1.0).
    pub priority: Option<u32>,
    /// The routing table (`table`, 1.1.0).
    pub table: Option<u32>,
    /// The route scope: 0 global, 253 link, 254 host (`scope`, 1.1.0).
    pub scope: Option<u32>,
}

impl Route {
    /// A route to `dst` with no other field set.
    pub fn new(dst: IpNet) -> Self {
        Route {
            dst,
            gw: None,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }

    /// This route with `dst` and `gw` only (all 0.1.0 and 0.2.0 know).
    pub(crate) fn dst_and_gw(&self) -> Route {
        Route {
            gw: self.gw,
            ..Route::new(self.dst)
        }
    }

    pub(crate) fn read(r: &Reader, value: &Value, path: &str) -> Result<Self, Error> {
        let obj = r.object(value, path)?;
        Ok(Route {
            dst: r.ipnet(obj, path, "dst")?,
            gw: r.opt_ip(obj, path, "gw")?,
            mtu: r.opt_u32(obj, path, "mtu", true)?,
            advmss: r.opt_u32(obj, path, "advmss", true)?,
            priority: r.opt_u32(obj, path, "priority", true)?,
            table: r.opt_u32(obj, path, "table", false)?,
            scope: r.opt_u32(obj, path, "scope", false)?,
        })
    }

    pub(crate) fn write(&self) -> Value {
        let mut out = vec![("dst", Value::from(self.dst.to_string()))];
        push_ip(&mut out, "gw", self.gw);
        push_u32(&mut out, "mtu", self.mtu, true);
        push_u32(&mut out, "advmss", self.advmss, true);
        push_u32(&mut out, "priority", self.priority, true);
        push_u32(&mut out, "table", self.table, false);
        push_u32(&mut out, "scope", self.scope, false);
        object_of(out)
    }
}

/// DNS settings of the network (`dns`). Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Dns {
    /// Name servers in priority order (`nameservers`).
    pub nameservers: Vec<String>,
    /// The local domain for short names (`domain`); `""` is unset.
    pub domain: Option<String>,
    /// Search domains in priority order (`search`).
    pub search: Vec<String>,
    /// Resolver options (`options`).
    pub options: Vec<String>,
}

impl Dns {
    /// Whether no field is set (then 1.x results omit `dns`, as libcni does).
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().is_none_or(str::is_empty)
            && self.search.is_empty()
            && self.options.is_empty()
    }

    /// Reads `obj.dns`; missing or `null` is empty.
    pub(crate) fn read_field(r: &Reader, obj: &super::json::Object) -> Result<Self, Error> {
        let Some(value) = super::json::present(obj, "dns") else {
            return Ok(Dns::default());
        };
        let dns = r.object(value, "dns")?;
        Ok(Dns {
            nameservers: r.string_list(dns, "dns", "nameservers")?,
            domain: r.opt_string(dns, "dns", "domain")?,
            search: r.string_list(dns, "dns", "search")?,
            options: r.string_list(dns, "dns", "options")?,
        })
    }

    pub(crate) fn write(&self) -> Value {
        let mut out = Vec::with_capacity(4);
        push_list(&mut out, "nameservers", &self.nameservers);
        push_str(&mut out, "domain", &self.domain);
        push_list(&mut out, "search", &self.search);
        push_list(&mut out, "options", &self.options);
        object_of(out)
    }
}

/// `"4"` or `"6"`.
pub(crate) fn family_label(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "4",
        IpNet::V6(_) => "6",
    }
}

type Entries = Vec<(&'static str, Value)>;

fn push_str(out: &mut Entries, key: &'static str, value: &Option<String>) {
    if let Some(s) = value.as_deref().filter(|s| !s.is_empty()) {
        out.push((key, Value::from(s)));
    }
}

fn push_u32(out: &mut Entries, key: &'static str, value: Option<u32>, zero_is_unset: bool) {
    if let Some(n) = value.filter(|n| !(zero_is_unset && *n == 0)) {
        out.push((key, Value::from(n)));
    }
}

fn push_ip(out: &mut Entries, key: &'static str, value: Option<IpAddr>) {
    if let Some(ip) = value {
        out.push((key, Value::from(ip.to_string())));
    }
}

fn push_list(out: &mut Entries, key: &'static str, value: &[String]) {
    if !value.is_empty() {
        out.push((key, Value::from(value.to_vec())));
    }
}

/// Reads an array of items at `obj[key]`, naming each by index.
pub(crate) fn read_list<T>(
    r: &Reader,
    obj: &super::json::Object,
    key: &str,
    mut item: impl FnMut(&Value, &str) -> Result<T, Error>,
) -> Result<Vec<T>, Error> {
    r.array(obj, "", key)?
        .iter()
        .enumerate()
        .map(|(i, v)| item(v, &format!("{key}[{i}]")))
        .collect()
}

/// Writes a non-empty list under `key`.
pub(crate) fn push_items<T>(
    out: &mut Entries,
    key: &'static str,
    items: &[T],
    write: impl Fn(&T) -> Value,
) {
    if !items.is_empty() {
        out.push((key, Value::Array(items.iter().map(write).collect())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::Version;
    use serde_json::json;

    fn r() -> Reader {
        Reader::new(Version::V0_4_0)
    }

    #[test]
    fn ip_version_is_checked_against_the_address() {
        let ok = IpConfig::read(
            &r(),
            &json!({"version": "4", "address": "10.1.2.3/24", "interface": 0}),
            "ips[0]",
            ResultFamily::V04,
        )
        .unwrap();
        assert_eq!(ok.address.to_string(), "10.1.2.3/24");
        assert_eq!(ok.interface, Some(0));

        let err = IpConfig::read(
            &r(),
            &json!({"version": "6", "address": "10.1.2.3/24"}),
            "ips[1]",
            ResultFamily::V04,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            r#"invalid 0.4.0 result: ips[1].version "6": does not match address 10.1.2.3/24, which is IPv4 (expected "4", not "6")"#
        );

        let err = IpConfig::read(
            &r(),
            &json!({"version": 4, "address": "10.1.2.3/24"}),
            "ips[0]",
            ResultFamily::V04,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("ips[0].version 4: expected a string"), "{err}");

        // Missing: derived. In 1.x: not a field at all, ignored.
        let derived = IpConfig::read(
            &r(),
            &json!({"address": "fd00::1/64"}),
            "x",
            ResultFamily::V04,
        )
        .unwrap();
        assert_eq!(derived.ip_version(), "6");
        assert!(
            IpConfig::read(
                &r(),
                &json!({"version": "4", "address": "fd00::1/64"}),
                "x",
                ResultFamily::V1
            )
            .is_ok()
        );
    }

    #[test]
    fn v1_interface_fields_exist_only_in_1x() {
        let v = json!({"name": "eth0", "mac": "", "mtu": 1500, "socketPath": "/s", "pciID": "0000:00:01.0"});
        let i04 = Interface::read(&r(), &v, "interfaces[0]", ResultFamily::V04).unwrap();
        assert_eq!(i04, Interface::new("eth0"));
        assert_eq!(i04.write(ResultFamily::V04), json!({"name": "eth0"}));
        let i1 = Interface::read(&r(), &v, "interfaces[0]", ResultFamily::V1).unwrap();
        assert_eq!(i1.mtu, Some(1500));
        assert_eq!(
            i1.write(ResultFamily::V1),
            json!({"name": "eth0", "mtu": 1500, "socketPath": "/s", "pciID": "0000:00:01.0"})
        );
        // A 1.x interface written in the 0.4 shape loses its 1.x fields.
        assert_eq!(i1.write(ResultFamily::V04), json!({"name": "eth0"}));
    }

    #[test]
    fn route_zero_fields_follow_libcni() {
        let v = json!({"dst": "0.0.0.0/0", "gw": "", "mtu": 0, "advmss": 0, "priority": 0, "table": 0, "scope": 0});
        let route = Route::read(&r(), &v, "routes[0]").unwrap();
        assert_eq!(route.gw, None);
        assert_eq!(route.mtu, None);
        assert_eq!(route.table, Some(0));
        assert_eq!(
            route.write(),
            json!({"dst": "0.0.0.0/0", "table": 0, "scope": 0})
        );
    }

    #[test]
    fn dns_emptiness() {
        assert!(Dns::default().is_empty());
        let dns = Dns {
            domain: Some(String::new()),
            ..Dns::default()
        };
        assert!(dns.is_empty());
        assert_eq!(dns.write(), json!({}));
    }
}
