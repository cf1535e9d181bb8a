//! The 1.0.0 and 1.1.0 result.

use serde_json::Value;

use super::common::{Dns, Interface, IpConfig, Route};
use super::json::{Object, Reader};
use super::v04::{Parts, write_rich};
use crate::error::Error;
use crate::version::{ResultFamily, Version};

/// A 1.0.0 or 1.1.0 result, also the "current" view of any result
/// ([`CniResult::to_current`](super::CniResult::to_current)).
///
/// Written as `{"cniVersion", "interfaces"?, "ips"?, "routes"?, "dns"?}`:
/// empty lists are omitted, and `dns` is omitted when empty, as libcni does
/// for 1.x results since v1.2.0 (0.x results always carry `"dns": {}`).
/// IPs carry no `version`; a `version` key found in a 1.x result is ignored.
///
/// 1.0.0 and 1.1.0 share this shape: the 1.1.0 fields (interface `mtu`,
/// `socketPath`, `pciID`; route `mtu`, `advmss`, `priority`, `table`,
/// `scope`) are optional and kept when converting 1.1.0 to 1.0.0, as libcni
/// does, so nothing is lost between the two.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Result100 {
    /// `1.0.0` or `1.1.0`.
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

impl Result100 {
    /// An empty result of version `cni_version` (no interfaces, IPs, routes or DNS).
    pub fn new(cni_version: Version) -> Self {
        Result100 {
            cni_version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: Dns::default(),
        }
    }

    pub(crate) fn read(r: &Reader, obj: &Object) -> Result<Self, Error> {
        let p = Parts::read(r, obj, ResultFamily::V1)?;
        Ok(Result100 {
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
            ResultFamily::V1,
            &self.interfaces,
            &self.ips,
            &self.routes,
            &self.dns,
        )
    }
}
