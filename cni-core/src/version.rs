//! CNI specification versions: parsing, comparison, selection and the
//! plugin's `VERSION` reply.
//!
//! A version string is up to three dot-separated unsigned integers; the empty
//! string means `0.1.0` (the spec's rule for configurations that predate the
//! `cniVersion` field). Missing parts are zero, so `"0.3"` is `0.3.0`.
//!
//! ```
//! use cni_core::version::{Version, select_version};
//!
//! let v: Version = "0.4.0".parse().unwrap();
//! assert!(v >= Version::V0_4_0);
//! assert_eq!(Version::parse("").unwrap(), Version::V0_1_0);
//!
//! // The highest version we support out of `cniVersion` and `cniVersions`.
//! let picked = select_version(Some("0.4.0"), &["1.0.0".into(), "9.9.9".into()]).unwrap();
//! assert_eq!(picked, Version::V1_0_0);
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

/// A CNI specification version: `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
    /// Patch number.
    pub patch: u32,
}

impl Version {
    /// `0.1.0`, also what an empty version string means.
    pub const V0_1_0: Version = Version::new(0, 1, 0);
    /// `0.2.0`.
    pub const V0_2_0: Version = Version::new(0, 2, 0);
    /// `0.3.0`.
    pub const V0_3_0: Version = Version::new(0, 3, 0);
    /// `0.3.1`.
    pub const V0_3_1: Version = Version::new(0, 3, 1);
    /// `0.4.0`: the first version with CHECK and a cached `prevResult` on DEL.
    pub const V0_4_0: Version = Version::new(0, 4, 0);
    /// `1.0.0`.
    pub const V1_0_0: Version = Version::new(1, 0, 0);
    /// `1.1.0`: adds STATUS and GC.
    pub const V1_1_0: Version = Version::new(1, 1, 0);

    /// The version of the specification this crate implements.
    pub const CURRENT: Version = Version::V1_1_0;

    /// Builds a version from its parts.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses a version string (`""` is `0.1.0`; at most three integer parts).
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Ok(Version::V0_1_0);
        }
        let invalid = |reason: &str| Error::InvalidVersion {
            version: s.to_owned(),
            reason: reason.to_owned(),
        };
        let mut nums = [0u32; 3];
        for (count, part) in s.split('.').enumerate() {
            if count == 3 {
                return Err(invalid("too many parts"));
            }
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid("each part must be an unsigned integer"));
            }
            nums[count] = part.parse().map_err(|_| invalid("part out of range"))?;
        }
        Ok(Version::new(nums[0], nums[1], nums[2]))
    }

    /// Whether this version is one of [`SUPPORTED_VERSIONS`].
    pub fn is_supported(&self) -> bool {
        SUPPORTED_VERSIONS.contains(self)
    }

    /// The result family this version's results belong to.
    pub fn family(&self) -> ResultFamily {
        if *self < Version::V0_3_0 {
            ResultFamily::V02
        } else if *self < Version::V1_0_0 {
            ResultFamily::V04
        } else {
            ResultFamily::V1
        }
    }

    /// Whether CHECK exists at this version (0.4.0 and later).
    pub fn has_check(&self) -> bool {
        *self >= Version::V0_4_0
    }

    /// Whether DEL receives the cached result as `prevResult` (0.4.0 and later).
    pub fn has_prev_result_on_del(&self) -> bool {
        *self >= Version::V0_4_0
    }

    /// Whether STATUS and GC exist at this version (1.1.0 and later).
    pub fn has_status_and_gc(&self) -> bool {
        *self >= Version::V1_1_0
    }
}

/// The three shapes a result can take on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultFamily {
    /// 0.1.0 and 0.2.0: one `ip4` and one `ip6` block.
    V02,
    /// 0.3.0, 0.3.1 and 0.4.0: `interfaces`, `ips` with `version`, `routes`, `dns`.
    V04,
    /// 1.0.0 and 1.1.0: like 0.4.0 without `version` in `ips`, more optional fields.
    V1,
}

/// Every version this crate can produce and consume, oldest first.
pub const SUPPORTED_VERSIONS: [Version; 7] = [
    Version::V0_1_0,
    Version::V0_2_0,
    Version::V0_3_0,
    Version::V0_3_1,
    Version::V0_4_0,
    Version::V1_0_0,
    Version::V1_1_0,
];

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Version::parse(s)
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Version::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Compares two version strings as the reference library does (`""` is `0.1.0`).
pub fn compare(a: &str, b: &str) -> Result<Ordering, Error> {
    Ok(Version::parse(a)?.cmp(&Version::parse(b)?))
}

/// Picks the version a network configuration list runs at: the highest
/// supported version among `cniVersion` and the entries of `cniVersions`.
///
/// Entries newer than [`Version::CURRENT`] are ignored, as libcni does, so a
/// configuration can announce versions a newer runtime would use. An entry
/// that does not parse is an error. The result must be one of
/// [`SUPPORTED_VERSIONS`]; a list whose best version is unknown to us (such
/// as `0.5.0`) is refused here rather than by every plugin later.
pub fn select_version(
    cni_version: Option<&str>,
    cni_versions: &[String],
) -> Result<Version, Error> {
    let mut best: Option<Version> = None;
    let mut consider = |raw: &str| -> Result<(), Error> {
        let v = Version::parse(raw)?;
        if v <= Version::CURRENT && best.is_none_or(|b| v > b) {
            best = Some(v);
        }
        Ok(())
    };
    if let Some(v) = cni_version {
        consider(v)?;
    }
    for v in cni_versions {
        consider(v)?;
    }
    let picked = match (best, cni_version) {
        (Some(v), _) => v,
        // Nothing given at all: the spec's "no version" means 0.1.0.
        (None, None) if cni_versions.is_empty() => Version::V0_1_0,
        (None, _) => {
            let offered = cni_version
                .into_iter()
                .map(str::to_owned)
                .chain(cni_versions.iter().cloned())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Error::UnsupportedVersion {
                version: offered,
                context: "network configuration (all offered versions are newer than 1.1.0)".into(),
            });
        }
    };
    if !picked.is_supported() {
        return Err(Error::UnsupportedVersion {
            version: picked.to_string(),
            context: "network configuration".into(),
        });
    }
    Ok(picked)
}

/// Whether a list offers versions (in `cniVersion` and `cniVersions`) and
/// every one of them parses and is newer than [`Version::CURRENT`]: the
/// case [`select_version`] refuses because a newer runtime is needed.
pub fn offers_only_newer(cni_version: Option<&str>, cni_versions: &[String]) -> bool {
    let mut offered = cni_version
        .into_iter()
        .chain(cni_versions.iter().map(String::as_str));
    let mut any = false;
    let all = offered.all(|raw| {
        any = true;
        Version::parse(raw).is_ok_and(|v| v > Version::CURRENT)
    });
    any && all
}

/// What a plugin answered to `VERSION`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    /// The version the reply itself is written in.
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    /// The specification versions the plugin supports, as it spelled them.
    #[serde(rename = "supportedVersions")]
    pub supported_versions: Vec<String>,
}

impl PluginInfo {
    /// Decodes a plugin's `VERSION` output.
    ///
    /// A reply without `supportedVersions` is accepted only from a 0.2.0
    /// plugin, which then supports 0.1.0 and 0.2.0 (libcni's legacy rule).
    pub fn decode(stdout: &[u8]) -> Result<Self, Error> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(rename = "cniVersion", default)]
            cni_version: Option<String>,
            #[serde(rename = "supportedVersions", default)]
            supported_versions: Option<Vec<String>>,
        }
        let bad = |reason: String| Error::InvalidVersionReply { reason };
        let raw: Raw = serde_json::from_slice(stdout).map_err(|e| bad(e.to_string()))?;
        let cni_version = match raw.cni_version {
            Some(v) if !v.is_empty() => v,
            _ => return Err(bad("missing field cniVersion".into())),
        };
        let supported_versions = match raw.supported_versions {
            Some(v) if !v.is_empty() => v,
            _ if cni_version == "0.2.0" => vec!["0.1.0".into(), "0.2.0".into()],
            _ => return Err(bad("missing field supportedVersions".into())),
        };
        Ok(PluginInfo {
            cni_version,
            supported_versions,
        })
    }

    /// Whether the plugin supports `v`. Entries are compared as versions, so
    /// `"1.0"` in a reply matches `1.0.0`; entries that do not parse are ignored.
    pub fn supports(&self, v: Version) -> bool {
        self.supported_versions
            .iter()
            .any(|s| Version::parse(s).is_ok_and(|p| p == v))
    }

    /// The reply we give for our own `VERSION` (a runtime or a fake plugin).
    pub fn ours() -> Self {
        PluginInfo {
            cni_version: Version::CURRENT.to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms() {
        assert_eq!(Version::parse("").unwrap(), Version::V0_1_0);
        assert_eq!(Version::parse("1").unwrap(), Version::new(1, 0, 0));
        assert_eq!(Version::parse("0.3").unwrap(), Version::V0_3_0);
        assert_eq!(Version::parse("0.3.1").unwrap(), Version::V0_3_1);
        assert_eq!(
            Version::parse("10.20.30").unwrap(),
            Version::new(10, 20, 30)
        );
        for bad in [
            "1.2.3.4", "a.b", "1..2", ".1", "1.", "-1.0.0", "+1", "1.0.0 ", " 1",
        ] {
            let err = Version::parse(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn ordering_is_numeric_not_lexical() {
        assert!(Version::parse("0.10.0").unwrap() > Version::parse("0.9.0").unwrap());
        assert_eq!(compare("0.4.0", "1.0.0").unwrap(), Ordering::Less);
        assert_eq!(compare("", "0.1.0").unwrap(), Ordering::Equal);
    }

    #[test]
    fn families() {
        assert_eq!(Version::V0_1_0.family(), ResultFamily::V02);
        assert_eq!(Version::V0_2_0.family(), ResultFamily::V02);
        assert_eq!(Version::V0_3_0.family(), ResultFamily::V04);
        assert_eq!(Version::V0_4_0.family(), ResultFamily::V04);
        assert_eq!(Version::V1_0_0.family(), ResultFamily::V1);
        assert_eq!(Version::V1_1_0.family(), ResultFamily::V1);
    }

    #[test]
    fn select_highest_of_both_fields() {
        let vs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(select_version(Some("0.4.0"), &[]).unwrap(), Version::V0_4_0);
        assert_eq!(
            select_version(Some("0.4.0"), &vs(&["1.0.0", "0.3.1"])).unwrap(),
            Version::V1_0_0
        );
        assert_eq!(
            select_version(Some("1.1.0"), &vs(&["1.0.0"])).unwrap(),
            Version::V1_1_0
        );
        // Newer than we implement: ignored.
        assert_eq!(
            select_version(None, &vs(&["1.0.0", "2.0.0"])).unwrap(),
            Version::V1_0_0
        );
        assert_eq!(select_version(None, &[]).unwrap(), Version::V0_1_0);
        assert_eq!(select_version(Some(""), &[]).unwrap(), Version::V0_1_0);
        assert!(select_version(None, &vs(&["2.0.0"])).is_err());
        assert!(select_version(Some("0.5.0"), &[]).is_err());
        assert!(select_version(Some("1.0.0"), &vs(&["x"])).is_err());
    }

    #[test]
    fn version_reply_decoding() {
        let info = PluginInfo::decode(
            br#"{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}"#,
        )
        .unwrap();
        assert!(info.supports(Version::V0_4_0));
        assert!(!info.supports(Version::V1_1_0));

        let legacy = PluginInfo::decode(br#"{"cniVersion":"0.2.0"}"#).unwrap();
        assert_eq!(legacy.supported_versions, ["0.1.0", "0.2.0"]);

        for bad in [
            &br#"{"cniVersion":"0.3.0"}"#[..],
            br#"{"supportedVersions":["0.3.0"]}"#,
            br#"{"cniVersion":""}"#,
            b"not json",
            b"",
        ] {
            assert!(PluginInfo::decode(bad).is_err());
        }
    }
}
