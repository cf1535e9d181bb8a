//! The 0.1.0 and 0.2.0 result: one `ip4` and one `ip6` block.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use super::common::{Dns, Route, push_items};
use super::json::{Object, Reader, join, object_of, present};
use crate::error::Error;
use crate::version::Version;

/// A 0.1.0 or 0.2.0 result.
///
/// Written as `{"cniVersion", "ip4"?, "ip6"?, "dns"}`; `dns` is always
/// written, `{}` when empty, like libcni.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Result020 {
    /// `0.1.0` or `0.2.0`.
    pub cni_version: Version,
    /// The IPv4 configuration (`ip4`).
    pub ip4: Option<Ip020>,
    /// The IPv6 configuration (`ip6`).
    pub ip6: Option<Ip020>,
    /// DNS settings (`dns`).
    pub dns: Dns,
}

/// One IP block of a 0.1.0/0.2.0 result (`ip4` or `ip6`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ip020 {
    /// The address with its prefix length (`ip`); host bits are kept.
    pub ip: IpNet,
    /// The default gateway of the subnet (`gateway`).
    pub gateway: Option<IpAddr>,
    /// Routes of this address family (`routes`).
    ///
    /// Only `dst` and `gw` are 0.2.0 fields; conversion to 0.2.0 keeps only
    /// those (libcni does the same). Other route fields found in a 0.2.0
    /// result are kept while it stays 0.2.0 (libcni parses them too).
    pub routes: Vec<Route>,
}

impl Ip020 {
    /// An IP block with only an address.
    pub fn new(ip: IpNet) -> Self {
        Ip020 {
            ip,
            gateway: None,
            routes: Vec::new(),
        }
    }

    fn read(r: &Reader, obj: &Object, key: &'static str) -> Result<Option<Self>, Error> {
        let Some(value) = present(obj, key) else {
            return Ok(None);
        };
        let block = r.object(value, key)?;
        let ip = r.ipnet(block, key, "ip")?;
        let want_v4 = key == "ip4";
        if matches!(ip, IpNet::V4(_)) != want_v4 {
            return Err(r.fail(
                &join(key, "ip"),
                block.get("ip"),
                format_args!(
                    "{key} must hold an IPv{} address",
                    if want_v4 { 4 } else { 6 }
                ),
            ));
        }
        let routes = r
            .array(block, key, "routes")?
            .iter()
            .enumerate()
            .map(|(i, v)| Route::read(r, v, &format!("{key}.routes[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Ip020 {
            ip,
            gateway: r.opt_ip(block, key, "gateway")?,
            routes,
        }))
    }

    fn write(&self) -> Value {
        let mut out = vec![("ip", Value::from(self.ip.to_string()))];
        if let Some(gw) = self.gateway {
            out.push(("gateway", Value::from(gw.to_string())));
        }
        push_items(&mut out, "routes", &self.routes, Route::write);
        object_of(out)
    }
}

impl Result020 {
    pub(crate) fn read(r: &Reader, obj: &Object) -> Result<Self, Error> {
        Ok(Result020 {
            cni_version: r.version,
            ip4: Ip020::read(r, obj, "ip4")?,
            ip6: Ip020::read(r, obj, "ip6")?,
            dns: Dns::read_field(r, obj)?,
        })
    }

    /// The wire JSON of this result, including `cniVersion`.
    pub fn to_value(&self) -> Value {
        let mut out = vec![("cniVersion", Value::from(self.cni_version.to_string()))];
        if let Some(ip4) = &self.ip4 {
            out.push(("ip4", ip4.write()));
        }
        if let Some(ip6) = &self.ip6 {
            out.push(("ip6", ip6.write()));
        }
        out.push(("dns", self.dns.write()));
        object_of(out)
    }
}
