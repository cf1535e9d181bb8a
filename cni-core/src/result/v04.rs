//! The 0.3.0, 0.3.1 and 0.4.0 result: `interfaces`, `ips` with `version`, `routes`, `dns`.

use serde_json::Value;

use super::common::{Dns, Interface, IpConfig, Route, push_items, read_list};
use super::json::{Object, Reader, object_of};
use crate::error::Error;
use crate::version::{ResultFamily, Version};

/// A 0.3.0, 0.3.1 or 0.4.0 result.
///
/// Written as `{"cniVersion", "interfaces"?, "ips"?, "routes"?, "dns"}`:
/// empty lists are omitted and `dns` is always written (`{}` when empty),
/// exactly as libcni's `types040.Result` marshals.
///
/// Each IP is written with `"version": "4"` or `"6"` derived from its
/// address. Interfaces never carry the 1.x fields (`mtu`, `socketPath`,
/// `pciID`): they are neither read nor written in this shape. Routes keep
/// every field, 1.1.0 ones included (see [`Route`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Result040 {
    /// `0.3.0`, `0.3.1` or `0.4.0`.
    pub cni_version: Version,
    /// Interfaces created by the attachment (`interfaces`).
    pub interfaces: Vec<Interface>,
    /// Addresses assigned (`ips`).
    pub ips: Vec<IpConfig>,
    /// Routes created (`routes`).
    pub routes: Vec<Route>,
    /// DNS settings (`dns`).
    pub dns: Dns,
}

/// The four lists shared by the 0.3+ shapes.
pub(crate) struct Parts {
    pub(crate) interfaces: Vec<Interface>,
    pub(crate) ips: Vec<IpConfig>,
    pub(crate) routes: Vec<Route>,
    pub(crate) dns: Dns,
}

impl Parts {
    pub(crate) fn read(r: &Reader, obj: &Object, family: ResultFamily) -> Result<Self, Error> {
        Ok(Parts {
            interfaces: read_list(r, obj, "interfaces", |v, p| {
                Interface::read(r, v, p, family)
            })?,
            ips: read_list(r, obj, "ips", |v, p| IpConfig::read(r, v, p, family))?,
            routes: read_list(r, obj, "routes", |v, p| Route::read(r, v, p))?,
            dns: Dns::read_field(r, obj)?,
        })
    }
}

/// Writes a 0.3+ result; `dns` is omitted when empty only in the 1.x shape.
pub(crate) fn write_rich(
    version: Version,
    family: ResultFamily,
    interfaces: &[Interface],
    ips: &[IpConfig],
    routes: &[Route],
    dns: &Dns,
) -> Value {
    let mut out = vec![("cniVersion", Value::from(version.to_string()))];
    push_items(&mut out, "interfaces", interfaces, |i| i.write(family));
    push_items(&mut out, "ips", ips, |ip| ip.write(family));
    push_items(&mut out, "routes", routes, Route::write);
    if family != ResultFamily::V1 || !dns.is_empty() {
        out.push(("dns", dns.write()));
    }
    object_of(out)
}

impl Result040 {
    pub(crate) fn read(r: &Reader, obj: &Object) -> Result<Self, Error> {
        let p = Parts::read(r, obj, ResultFamily::V04)?;
        Ok(Result040 {
            cni_version: r.version,
            interfaces: p.interfaces,
            ips: p.ips,
            routes: p.routes,
            dns: p.dns,
        })
    }

    /// The wire JSON of this result, including `cniVersion`.
    pub fn to_value(&self) -> Value {
        write_rich(
            self.cni_version,
            ResultFamily::V04,
            &self.interfaces,
            &self.ips,
            &self.routes,
            &self.dns,
        )
    }
}
