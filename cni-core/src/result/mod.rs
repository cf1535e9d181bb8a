//! Results of every CNI version (0.1.0 to 1.1.0) and conversion between them.
//!
//! A plugin's `ADD` output, the `prevResult` handed down a chain and the
//! result kept in the cache all decode into a [`CniResult`], which has one
//! variant per wire shape:
//!
//! | variant | versions | shape |
//! |---|---|---|
//! | [`CniResult::V02`] ([`Result020`]) | 0.1.0, 0.2.0 | one `ip4` and one `ip6` block, `dns` |
//! | [`CniResult::V04`] ([`Result040`]) | 0.3.0, 0.3.1, 0.4.0 | `interfaces`, `ips` with `version`, `routes`, `dns` |
//! | [`CniResult::V1`] ([`Result100`]) | 1.0.0, 1.1.0 | like 0.4.0 without `version`, more optional fields |
//!
//! Every version converts to every other ([`CniResult::convert`]); the only
//! conversion that can fail is to 0.1.0/0.2.0 from a result without any IP
//! address. [`CniResult::to_current`] gives a 1.1.0 view of any result for
//! inspection. The rules are in the docs of [`CniResult::convert`].
//!
//! ```
//! use cni_core::result::CniResult;
//! use cni_core::Version;
//!
//! let old = br#"{
//!     "cniVersion": "0.2.0",
//!     "ip4": {
//!         "ip": "10.1.0.5/16",
//!         "gateway": "10.1.0.1",
//!         "routes": [{"dst": "0.0.0.0/0"}]
//!     },
//!     "dns": {"nameservers": ["10.1.0.1"]}
//! }"#;
//! let result = CniResult::parse(old, Version::V0_2_0)?;
//! assert_eq!(result.version(), Version::V0_2_0);
//!
//! let new = result.convert(Version::V1_0_0)?;
//! println!("{}", new.to_json_pretty());
//! assert_eq!(
//!     new.to_value(),
//!     serde_json::json!({
//!         "cniVersion": "1.0.0",
//!         "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
//!         "routes": [{"dst": "0.0.0.0/0"}],
//!         "dns": {"nameservers": ["10.1.0.1"]}
//!     })
//! );
//! # Ok::<(), cni_core::Error>(())
//! ```
//!
//! # Reading
//!
//! Decoding follows libcni (`pkg/types/020`, `040`, `100`) unless noted:
//!
//! - A missing, `null`, `""` or non-string (`1`) `cniVersion` means the
//!   caller's default version (libcni's `fixupResultVersion`).
//!   Any supported spelling is accepted (`"1.0"` is 1.0.0); output always uses
//!   the full `x.y.z` form.
//! - `null` anywhere means "absent"; unknown keys are ignored (and so not
//!   written back, as with libcni).
//! - Empty strings and a zero `mtu`/`advmss`/`priority` mean "unset"
//!   (libcni's `omitempty`): they are read as `None` and never written.
//!   `table`, `scope` and `interface` keep an explicit `0`.
//! - Stricter than libcni (which would produce `"<nil>"` addresses or panic
//!   later): `ips[].address`, `routes[].dst` and `ip4.ip`/`ip6.ip` are
//!   required; numbers must be unsigned 32-bit integers; `ip4` must hold an
//!   IPv4 address and `ip6` an IPv6 one; in 0.3.0 to 0.4.0, an IP's `version`
//!   must be `"4"` or `"6"` and match its address (a missing one is derived).
//! - Lenient like libcni: an `interface` index is not checked against the
//!   `interfaces` list when reading, since plugins exist that emit indices of
//!   interfaces another plugin owns; [`CniResult::validate`] checks it, and
//!   gateway families, for callers who want strictness.
//! - Errors name the version, the field and the value:
//!   `invalid 1.0.0 result: ips[0].address "10.0.0.1": not an address in CIDR notation ...`.
//!
//! # Writing
//!
//! Field names and omission follow libcni's marshalling: empty lists and
//! unset optional fields are left out; `interface` and `gateway` only when
//! set; 0.x results always carry `"dns"` (`{}` when empty), 1.x results omit
//! an empty `dns` (libcni v1.2.0 and later). Keys come in the spec's order.

mod common;
mod convert;
mod json;
pub(crate) mod parts;
mod v02;
mod v04;
mod v1;

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;
use serde_json::Value;

pub use common::{Dns, Interface, IpConfig, Route};
pub use parts::RESULT_PARTS;
pub use v1::Result100;
pub use v02::{Ip020, Result020};
pub use v04::Result040;

use crate::error::Error;
use crate::version::{ResultFamily, Version};
use convert::{Rich, RichRef};
use json::{Reader, kind};

/// A result of any supported version (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CniResult {
    /// A 0.1.0 or 0.2.0 result.
    V02(Result020),
    /// A 0.3.0, 0.3.1 or 0.4.0 result.
    V04(Result040),
    /// A 1.0.0 or 1.1.0 result.
    V1(Result100),
}

impl CniResult {
    /// Parses plugin output, a `prevResult` or a cached result.
    ///
    /// A missing, empty or non-string `cniVersion` is taken to be
    /// `default_version` (use the configuration's version), as libcni does. A version we do not support is an
    /// [`Error::UnsupportedVersion`]; anything else that does not decode is an
    /// [`Error::InvalidResult`] naming the field and value. Never panics.
    pub fn parse(bytes: &[u8], default_version: Version) -> Result<CniResult, Error> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| Error::InvalidResult {
            version: default_version.to_string(),
            reason: format!("not valid JSON: {e}"),
        })?;
        CniResult::from_value(&value, default_version)
    }

    /// Like [`CniResult::parse`], from an already decoded JSON value (such as
    /// the `prevResult` of a configuration or the `result` of a cache record).
    pub fn from_value(value: &Value, default_version: Version) -> Result<CniResult, Error> {
        let Some(obj) = value.as_object() else {
            return Err(Error::InvalidResult {
                version: default_version.to_string(),
                reason: format!("expected a JSON object, got {}", kind(value)),
            });
        };
        // Not a string (`1`, `true`): libcni's `fixupResultVersion` takes
        // it as missing, and so do we (decisions.md D19).
        let version = match obj.get("cniVersion").and_then(Value::as_str) {
            None | Some("") => {
                if !default_version.is_supported() {
                    return Err(Error::UnsupportedVersion {
                        version: default_version.to_string(),
                        context: "result (default version for a result without cniVersion)".into(),
                    });
                }
                default_version
            }
            Some(text) => {
                let v = Version::parse(text)?;
                if !v.is_supported() {
                    return Err(Error::UnsupportedVersion {
                        version: text.to_owned(),
                        context: "result".into(),
                    });
                }
                v
            }
        };
        let r = Reader::new(version);
        Ok(match version.family() {
            ResultFamily::V02 => CniResult::V02(Result020::read(&r, obj)?),
            ResultFamily::V04 => CniResult::V04(Result040::read(&r, obj)?),
            ResultFamily::V1 => CniResult::V1(Result100::read(&r, obj)?),
        })
    }

    /// The result's version (its `cniVersion`).
    pub fn version(&self) -> Version {
        match self {
            CniResult::V02(r) => r.cni_version,
            CniResult::V04(r) => r.cni_version,
            CniResult::V1(r) => r.cni_version,
        }
    }

    /// The shape of this result (the variant, whatever its label says).
    pub fn family(&self) -> ResultFamily {
        match self {
            CniResult::V02(_) => ResultFamily::V02,
            CniResult::V04(_) => ResultFamily::V04,
            CniResult::V1(_) => ResultFamily::V1,
        }
    }

    /// Converts to version `to`.
    ///
    /// Converting to the result's own version returns an equal clone. The rules:
    ///
    /// - **To 0.3.0, 0.3.1, 0.4.0**: each IP gets `version` ("4"/"6") from its
    ///   address; interfaces lose `mtu`, `socketPath` and `pciID`; routes keep
    ///   every field (libcni shares one route type between 0.4 and 1.x).
    /// - **To 0.1.0, 0.2.0**: the first IPv4 and the first IPv6 address become
    ///   `ip4`/`ip6` (with their gateways); interfaces and the other addresses
    ///   are dropped; each route joins the block of its destination's family
    ///   as `dst` + `gw` (dropped when there is no such block). A result
    ///   without any IP address cannot be converted: [`Error::Conversion`]
    ///   naming both versions.
    /// - **From 0.1.0/0.2.0 up**: `ip4` then `ip6` become `ips` (no interface
    ///   index), their routes are concatenated in that order.
    /// - **From 0.x to 1.x**: `version` is dropped; nothing else changes.
    /// - **1.0.0 ↔ 1.1.0**: only the label changes; the 1.1.0 fields stay.
    ///
    /// So converting up and back down returns the original result, for
    /// every pair of versions (for 0.1.0/0.2.0, given routes whose family
    /// matches their block and have only `dst` and `gw`).
    ///
    /// Interface indices and gateways are copied unchanged, as libcni does;
    /// interface lists never change between 0.3+ versions, so valid indices
    /// stay valid. A `to` we do not support is an [`Error::UnsupportedVersion`].
    pub fn convert(&self, to: Version) -> Result<CniResult, Error> {
        if !to.is_supported() {
            return Err(Error::UnsupportedVersion {
                version: to.to_string(),
                context: "result conversion".into(),
            });
        }
        if to == self.version() && to.family() == self.family() {
            return Ok(self.clone());
        }
        Ok(match to.family() {
            ResultFamily::V02 => CniResult::V02(match self {
                CniResult::V02(r) => Result020 {
                    cni_version: to,
                    ..r.clone()
                },
                CniResult::V04(r) => convert::down_to_v02(r.rich(), to)?,
                CniResult::V1(r) => convert::down_to_v02(r.rich(), to)?,
            }),
            ResultFamily::V04 => {
                let p = match self {
                    CniResult::V02(r) => convert::up_from_v02(r),
                    CniResult::V04(r) => convert::to_v04_lists(r.rich()),
                    CniResult::V1(r) => convert::to_v04_lists(r.rich()),
                };
                CniResult::V04(Result040 {
                    cni_version: to,
                    interfaces: p.interfaces,
                    ips: p.ips,
                    routes: p.routes,
                    dns: p.dns,
                })
            }
            ResultFamily::V1 => CniResult::V1(self.to_v1(to)),
        })
    }

    /// The wire JSON of this result in its own version's shape, including
    /// `cniVersion` (see the [module docs](self#writing)).
    pub fn to_value(&self) -> Value {
        match self {
            CniResult::V02(r) => r.to_value(),
            CniResult::V04(r) => r.to_value(),
            CniResult::V1(r) => r.to_value(),
        }
    }

    /// The compact JSON text of [`CniResult::to_value`].
    pub fn to_json(&self) -> String {
        self.to_value().to_string()
    }

    /// The JSON text of [`CniResult::to_value`], indented by four spaces as
    /// libcni's `Print` (and so the reference `cnitool`) does.
    pub fn to_json_pretty(&self) -> String {
        let value = self.to_value();
        let mut buf = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
        match value.serialize(&mut ser) {
            Ok(()) => String::from_utf8(buf).unwrap_or_else(|_| format!("{value:#}")),
            // Serializing a `Value` into memory cannot fail; fall back anyway.
            Err(_) => format!("{value:#}"),
        }
    }

    /// A 1.1.0-shaped view for inspection (interfaces, ips, routes, dns),
    /// always possible: the same as `convert(Version::V1_1_0)`, labelled
    /// 1.1.0 whatever the result's own version ([`CniResult::version`] has it).
    pub fn to_current(&self) -> Result100 {
        self.to_v1(Version::V1_1_0)
    }

    /// The addresses of the result, in order, whatever its version: what a
    /// caller of a single-network ADD usually wants (`10.22.0.5/16`).
    ///
    /// ```
    /// use cni_core::Version;
    /// use cni_core::result::CniResult;
    ///
    /// let r = CniResult::parse(
    ///     br#"{"cniVersion":"0.2.0","ip4":{"ip":"10.1.2.3/24"}}"#,
    ///     Version::V1_0_0,
    /// )
    /// .unwrap();
    /// assert_eq!(r.addresses(), vec!["10.1.2.3/24".parse().unwrap()]);
    /// ```
    pub fn addresses(&self) -> Vec<IpNet> {
        self.to_current().ips.iter().map(|ip| ip.address).collect()
    }

    /// The addresses of the result's interface `ifname` (an address naming
    /// no interface counts for every name, as a single-interface plugin's).
    pub fn addresses_of(&self, ifname: &str) -> Vec<IpNet> {
        let r = self.to_current();
        r.ips
            .iter()
            .filter(|ip| match ip.interface {
                None => true,
                Some(i) => usize::try_from(i)
                    .ok()
                    .and_then(|i| r.interfaces.get(i))
                    .is_some_and(|iface| iface.name == ifname),
            })
            .map(|ip| ip.address)
            .collect()
    }

    /// Checks what reading leaves to the caller (the spec requires it, libcni
    /// checks none of it): every `interface` index points into `interfaces`;
    /// every gateway has the family of its address; `ip4`/`ip6` hold
    /// addresses of their family; the label is a supported version of this
    /// variant's shape. Reports the first problem as [`Error::InvalidResult`].
    pub fn validate(&self) -> Result<(), Error> {
        let version = self.version();
        let r = Reader::new(version);
        if !version.is_supported() || version.family() != self.family() {
            return Err(r.fail(
                "cniVersion",
                Some(&Value::from(version.to_string())),
                format_args!("not a version of the {:?} result shape", self.family()),
            ));
        }
        let gateway_matches = |path: &str, net: &IpNet, gw: Option<IpAddr>| match gw {
            Some(gw) if gw.is_ipv4() != matches!(net, IpNet::V4(_)) => Err(r.fail(
                path,
                Some(&Value::from(gw.to_string())),
                format_args!("gateway of another address family than {net}"),
            )),
            _ => Ok(()),
        };
        match self {
            CniResult::V02(res) => {
                for (key, block, v4) in [("ip4", &res.ip4, true), ("ip6", &res.ip6, false)] {
                    let Some(block) = block else { continue };
                    if matches!(block.ip, IpNet::V4(_)) != v4 {
                        return Err(r.fail(
                            &format!("{key}.ip"),
                            Some(&Value::from(block.ip.to_string())),
                            format_args!(
                                "{key} must hold an IPv{} address",
                                if v4 { 4 } else { 6 }
                            ),
                        ));
                    }
                    gateway_matches(&format!("{key}.gateway"), &block.ip, block.gateway)?;
                }
            }
            CniResult::V04(Result040 {
                interfaces, ips, ..
            })
            | CniResult::V1(Result100 {
                interfaces, ips, ..
            }) => {
                for (i, ip) in ips.iter().enumerate() {
                    if let Some(index) = ip.interface
                        && usize::try_from(index)
                            .ok()
                            .is_none_or(|x| x >= interfaces.len())
                    {
                        return Err(r.fail(
                            &format!("ips[{i}].interface"),
                            Some(&Value::from(index)),
                            format_args!(
                                "out of range (the result has {} interfaces)",
                                interfaces.len()
                            ),
                        ));
                    }
                    gateway_matches(&format!("ips[{i}].gateway"), &ip.address, ip.gateway)?;
                }
            }
        }
        Ok(())
    }

    fn to_v1(&self, to: Version) -> Result100 {
        let p: Rich = match self {
            CniResult::V02(r) => convert::up_from_v02(r),
            CniResult::V04(r) => convert::to_v1_lists(r.rich()),
            CniResult::V1(r) => convert::to_v1_lists(r.rich()),
        };
        Result100 {
            cni_version: to,
            interfaces: p.interfaces,
            ips: p.ips,
            routes: p.routes,
            dns: p.dns,
        }
    }
}

impl Result040 {
    fn rich(&self) -> RichRef<'_> {
        RichRef {
            version: self.cni_version,
            interfaces: &self.interfaces,
            ips: &self.ips,
            routes: &self.routes,
            dns: &self.dns,
        }
    }
}

impl Result100 {
    fn rich(&self) -> RichRef<'_> {
        RichRef {
            version: self.cni_version,
            interfaces: &self.interfaces,
            ips: &self.ips,
            routes: &self.routes,
            dns: &self.dns,
        }
    }
}

impl From<Result020> for CniResult {
    fn from(r: Result020) -> Self {
        CniResult::V02(r)
    }
}

impl From<Result040> for CniResult {
    fn from(r: Result040) -> Self {
        CniResult::V04(r)
    }
}

impl From<Result100> for CniResult {
    fn from(r: Result100) -> Self {
        CniResult::V1(r)
    }
}

/// Serializes as [`CniResult::to_value`], so a result can sit in a derived
/// `Serialize` struct (a cache record, a daemon reply).
impl Serialize for CniResult {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<CniResult, Error> {
        CniResult::from_value(&v, Version::V1_0_0)
    }

    #[test]
    fn missing_or_empty_version_is_the_default() {
        for v in [
            json!({}),
            json!({"cniVersion": ""}),
            json!({"cniVersion": null}),
            // Not a string: libcni takes it as missing too (D19).
            json!({"cniVersion": 1}),
            json!({"cniVersion": 0.4}),
            json!({"cniVersion": true}),
            json!({"cniVersion": ["1.0.0"]}),
        ] {
            let r = CniResult::from_value(&v, Version::V0_3_1).unwrap();
            assert_eq!(r.version(), Version::V0_3_1);
            assert_eq!(r.to_value(), json!({"cniVersion": "0.3.1", "dns": {}}));
        }
        let r = CniResult::from_value(&json!({"cniVersion": "0.1"}), Version::V1_0_0).unwrap();
        assert_eq!(r.version(), Version::V0_1_0);
        assert_eq!(r.family(), ResultFamily::V02);
    }

    #[test]
    fn unsupported_versions_are_refused() {
        let err = parse(json!({"cniVersion": "0.5.0"})).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err:?}");
        assert_eq!(err.to_string(), "unsupported CNI version 0.5.0 in result");
        let err = parse(json!({"cniVersion": "one"})).unwrap_err();
        assert!(matches!(err, Error::InvalidVersion { .. }), "{err:?}");
        let err = CniResult::from_value(&json!({}), Version::new(2, 0, 0)).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err:?}");
        let r = parse(json!({"cniVersion": "1.0.0"})).unwrap();
        assert!(matches!(
            r.convert(Version::new(0, 5, 0)),
            Err(Error::UnsupportedVersion { .. })
        ));
    }

    #[test]
    fn non_objects_and_bad_json_are_errors() {
        let err = CniResult::parse(b"[1,2]", Version::V1_0_0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid 1.0.0 result: expected a JSON object, got an array"
        );
        let err = CniResult::parse(b"{", Version::V0_4_0).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid 0.4.0 result: not valid JSON: "),
            "{err}"
        );
        assert_eq!(err.code(), crate::error::code::DECODING_FAILURE);
    }

    #[test]
    fn errors_name_field_and_value() {
        let err = parse(json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1"}]}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            r#"invalid 1.0.0 result: ips[0].address "10.0.0.1": not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)"#
        );
        let err = parse(json!({"ips": [{"address": "10.0.0.1/8", "interface": -1}]}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ips[0].interface -1: not an unsigned integer"),
            "{err}"
        );
        let err = parse(json!({"routes": [{"dst": "10.0.0.0/8", "gw": "10.0.0.300"}]}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(r#"routes[0].gw "10.0.0.300": not an IP address"#),
            "{err}"
        );
        let err = parse(json!({"interfaces": [null]}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("interfaces[0] null: expected an object, got null"),
            "{err}"
        );
        let err = parse(json!({"cniVersion": "0.2.0", "ip4": {"ip": "fd00::1/64"}}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            r#"invalid 0.2.0 result: ip4.ip "fd00::1/64": ip4 must hold an IPv4 address"#
        );
        let err = parse(json!({"dns": {"nameservers": ["1.1.1.1", 8]}}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dns.nameservers[1] 8: expected a string"),
            "{err}"
        );
    }

    #[test]
    fn host_bits_are_kept() {
        let r =
            parse(json!({"ips": [{"address": "10.1.2.3/24"}], "routes": [{"dst": "10.9.9.9/8"}]}))
                .unwrap();
        let out = r.to_value();
        assert_eq!(out["ips"][0]["address"], "10.1.2.3/24");
        assert_eq!(out["routes"][0]["dst"], "10.9.9.9/8");
    }

    #[test]
    fn same_version_is_an_equal_clone() {
        let r =
            parse(json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mtu": 9000}]}))
                .unwrap();
        assert_eq!(r.convert(Version::V1_1_0).unwrap(), r);
    }

    #[test]
    fn validate_checks_indices_and_gateways() {
        let ok = parse(json!({
            "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}]
        }))
        .unwrap();
        ok.validate().unwrap();

        let out_of_range = parse(json!({
            "interfaces": [{"name": "eth0"}],
            "ips": [{"address": "10.0.0.2/24", "interface": 1}]
        }))
        .unwrap();
        assert_eq!(
            out_of_range.validate().unwrap_err().to_string(),
            "invalid 1.0.0 result: ips[0].interface 1: out of range (the result has 1 interfaces)"
        );
        let huge = parse(json!({"ips": [{"address": "10.0.0.2/24", "interface": 4294967295u32}]}))
            .unwrap();
        assert!(huge.validate().is_err());

        let bad_gw =
            parse(json!({"ips": [{"address": "10.0.0.2/24", "gateway": "fd00::1"}]})).unwrap();
        assert_eq!(
            bad_gw.validate().unwrap_err().to_string(),
            r#"invalid 1.0.0 result: ips[0].gateway "fd00::1": gateway of another address family than 10.0.0.2/24"#
        );

        let mislabelled = CniResult::V1(Result100::new(Version::V0_4_0));
        assert!(mislabelled.validate().is_err());
    }

    #[test]
    fn pretty_json_uses_four_spaces() {
        let r = parse(json!({"cniVersion": "0.2.0"})).unwrap();
        assert_eq!(
            r.to_json_pretty(),
            "{\n    \"cniVersion\": \"0.2.0\",\n    \"dns\": {}\n}"
        );
        assert_eq!(r.to_json(), r#"{"cniVersion":"0.2.0","dns":{}}"#);
        assert_eq!(serde_json::to_value(&r).unwrap(), r.to_value());
    }
}
