//! Conversion between the three result shapes.
//!
//! Every function here is total except the way down to 0.1.0/0.2.0, which
//! needs at least one address. The rules, and where they differ from libcni
//! (`pkg/types/040`, `pkg/types/100`, `pkg/types/internal/convert.go`):
//!
//! - 0.2 → 0.3+: `ip4` then `ip6` become `ips` (without an `interface`
//!   index, there are no interfaces), their routes are concatenated in the
//!   same order, DNS is kept.
//! - 0.3+ → 0.2: the first IPv4 and the first IPv6 address become `ip4` and
//!   `ip6` with their gateways; interfaces and interface indices are dropped;
//!   each route goes to the block of its `dst` family, reduced to `dst` and
//!   `gw`, and is dropped when there is no block of that family. libcni picks
//!   addresses by their `version` string, so a 0.4.0 IP without `version`
//!   is silently skipped there; here the family always comes from the address.
//! - 1.x → 0.3/0.4: `version` is added to each IP (written from the address
//!   family), the 1.x interface fields are dropped, routes keep all fields.
//! - 0.3/0.4 → 1.x and 1.0 ↔ 1.1: nothing is lost; only the label changes.
//! - Interface indices are copied unchanged between 0.3+ versions, whose
//!   interface lists are identical, so an index valid before is valid after;
//!   libcni does not check them and neither does conversion (see
//!   [`CniResult::validate`](super::CniResult::validate)). Gateways are copied
//!   as they are, as in libcni.

use ipnet::IpNet;

use super::common::{Dns, Interface, IpConfig, Route};
use super::v02::{Ip020, Result020};
use crate::error::Error;
use crate::version::Version;

/// The lists of a 0.3+ result, borrowed from a 0.4 or 1.x result.
pub(crate) struct RichRef<'a> {
    pub(crate) version: Version,
    pub(crate) interfaces: &'a [Interface],
    pub(crate) ips: &'a [IpConfig],
    pub(crate) routes: &'a [Route],
    pub(crate) dns: &'a Dns,
}

/// The lists of a 0.3+ result.
pub(crate) struct Rich {
    pub(crate) interfaces: Vec<Interface>,
    pub(crate) ips: Vec<IpConfig>,
    pub(crate) routes: Vec<Route>,
    pub(crate) dns: Dns,
}

/// 0.1.0/0.2.0 up to the 0.3+ lists.
pub(crate) fn up_from_v02(from: &Result020) -> Rich {
    let blocks = [&from.ip4, &from.ip6];
    let ips = blocks
        .iter()
        .filter_map(|b| b.as_ref())
        .map(|b| IpConfig {
            interface: None,
            address: b.ip,
            gateway: b.gateway,
        })
        .collect();
    let routes = blocks
        .iter()
        .filter_map(|b| b.as_ref())
        .flat_map(|b| b.routes.iter().cloned())
        .collect();
    Rich {
        interfaces: Vec::new(),
        ips,
        routes,
        dns: from.dns.clone(),
    }
}

/// The 0.3+ lists down to 0.1.0/0.2.0.
pub(crate) fn down_to_v02(from: RichRef<'_>, to: Version) -> Result<Result020, Error> {
    let block = |ip: &IpConfig| Ip020 {
        ip: ip.address,
        gateway: ip.gateway,
        routes: Vec::new(),
    };
    let mut ip4 = from
        .ips
        .iter()
        .find(|ip| matches!(ip.address, IpNet::V4(_)))
        .map(block);
    let mut ip6 = from
        .ips
        .iter()
        .find(|ip| matches!(ip.address, IpNet::V6(_)))
        .map(block);
    if ip4.is_none() && ip6.is_none() {
        return Err(Error::Conversion {
            from: from.version.to_string(),
            to: to.to_string(),
            reason: format!(
                "the result has no IP address, and a {to} result needs at least one (ip4 or ip6)"
            ),
        });
    }
    for route in from.routes {
        let target = match route.dst {
            IpNet::V4(_) => ip4.as_mut(),
            IpNet::V6(_) => ip6.as_mut(),
        };
        if let Some(target) = target {
            target.routes.push(route.dst_and_gw());
        }
    }
    Ok(Result020 {
        cni_version: to,
        ip4,
        ip6,
        dns: from.dns.clone(),
    })
}

/// The 0.3+ lists as 0.3.0 to 0.4.0 can hold them.
pub(crate) fn to_v04_lists(from: RichRef<'_>) -> Rich {
    Rich {
        interfaces: from
            .interfaces
            .iter()
            .map(Interface::without_v1_fields)
            .collect(),
        ips: from.ips.to_vec(),
        routes: from.routes.to_vec(),
        dns: from.dns.clone(),
    }
}

/// The 0.3+ lists unchanged (to 1.x).
pub(crate) fn to_v1_lists(from: RichRef<'_>) -> Rich {
    Rich {
        interfaces: from.interfaces.to_vec(),
        ips: from.ips.to_vec(),
        routes: from.routes.to_vec(),
        dns: from.dns.clone(),
    }
}
