//! The CNI error object, its well-known codes, and this crate's error type.
//!
//! Plugins report failures as `{"cniVersion", "code", "msg", "details"}` on
//! stdout ([`ErrorObject`]). Every [`Error`] of this crate maps to one of the
//! spec's codes ([`Error::code`]), so a CLI or daemon can answer with the same
//! JSON a plugin would.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The well-known CNI error codes (spec section "Error").
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables, like `CNI_COMMAND` or `CNI_CONTAINERID`.
    pub const INVALID_ENVIRONMENT_VARIABLES: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODING_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin is not available (cannot ADD).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: the plugin is not available and existing containers may have limited connectivity.
    pub const PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY: u32 = 51;
    /// Codes from here up are the plugin's own.
    pub const PLUGIN_SPECIFIC_MIN: u32 = 100;
    /// Not in the spec: an internal failure of the runtime itself (code 999 as
    /// used by libcni's skel for unexpected errors).
    pub const INTERNAL: u32 = 999;

    /// A short name for a well-known code, for logs and messages.
    pub fn name(code: u32) -> &'static str {
        match code {
            INCOMPATIBLE_VERSION => "incompatible CNI version",
            UNSUPPORTED_FIELD => "unsupported field in network configuration",
            UNKNOWN_CONTAINER => "unknown container",
            INVALID_ENVIRONMENT_VARIABLES => "invalid environment variables",
            IO_FAILURE => "I/O failure",
            DECODING_FAILURE => "failed to decode content",
            INVALID_NETWORK_CONFIG => "invalid network config",
            TRY_AGAIN_LATER => "try again later",
            PLUGIN_NOT_AVAILABLE => "plugin not available",
            PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY => {
                "plugin not available, existing containers may have limited connectivity"
            }
            c if c >= PLUGIN_SPECIFIC_MIN => "plugin-specific error",
            _ => "unknown error code",
        }
    }
}

/// The error JSON a plugin prints on failure (and that we print in turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// The version the error is written in; may be absent in old plugins.
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub cni_version: String,
    /// The error code ([`code`]).
    pub code: u32,
    /// A short message.
    #[serde(default)]
    pub msg: String,
    /// Longer details, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl ErrorObject {
    /// Builds an error object.
    pub fn new(
        cni_version: impl Into<String>,
        code: u32,
        msg: impl Into<String>,
        details: impl Into<String>,
    ) -> Self {
        ErrorObject {
            cni_version: cni_version.into(),
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// Decodes a plugin's error output. Returns `None` unless the bytes are a
    /// JSON object with a numeric `code` (a result or garbage is not an error object).
    pub fn decode(stdout: &[u8]) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_slice(stdout).ok()?;
        let obj = value.as_object()?;
        let code = obj.get("code")?.as_u64()?;
        let text = |k: &str| {
            obj.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        Some(ErrorObject {
            cni_version: text("cniVersion"),
            code: u32::try_from(code).ok()?,
            msg: text("msg"),
            details: text("details"),
        })
    }

    /// Decodes the output of a plugin that *succeeded* (exit status 0):
    /// `Some` when it is an error object all the same, which is an error
    /// whatever the exit status (`docs/decisions.md` D18; libcni would read it as an
    /// empty result).
    ///
    /// Stricter than [`ErrorObject::decode`], so that no result is misread:
    /// the output must be a JSON object with a numeric `code` and none of the
    /// keys of a result of any version or of a VERSION reply (`interfaces`,
    /// `ips`, `routes`, `dns`, `ip4`, `ip6`, `supportedVersions`). A result
    /// that happens to carry a `code` key stays a result.
    ///
    /// ```
    /// use cni_core::ErrorObject;
    ///
    /// let e = ErrorObject::decode_on_success(br#"{"cniVersion":"1.1.0","code":11,"msg":"busy"}"#);
    /// assert_eq!(e.map(|e| e.code), Some(11));
    /// assert_eq!(ErrorObject::decode_on_success(br#"{"code":7,"ips":[]}"#), None);
    /// assert_eq!(ErrorObject::decode_on_success(br#"{"cniVersion":"1.1.0"}"#), None);
    /// assert_eq!(ErrorObject::decode_on_success(b""), None);
    /// ```
    pub fn decode_on_success(stdout: &[u8]) -> Option<Self> {
        // Most successful runs print a result without any `code`: do not
        // decode their JSON twice. A key spelt with escapes (`"\u0063ode"`)
        // still gets the full check.
        let has = |needle: &[u8]| stdout.windows(needle.len()).any(|w| w == needle);
        if !has(b"code") && !has(b"\\u") {
            return None;
        }
        let value: serde_json::Value = serde_json::from_slice(stdout).ok()?;
        let obj = value.as_object()?;
        // Keys only a result (0.1.0 to 1.1.0) or a VERSION reply has.
        if crate::result::parts::RESULT_PARTS
            .iter()
            .chain(&["supportedVersions"])
            .any(|k| obj.contains_key(*k))
        {
            return None;
        }
        ErrorObject::decode(stdout)
    }

    /// The JSON text of this object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an error object always serializes")
    }
}

impl fmt::Display for ErrorObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.msg)?;
        if !self.details.is_empty() {
            write!(f, "; {}", self.details)?;
        }
        write!(f, " (CNI code {})", self.code)
    }
}

impl std::error::Error for ErrorObject {}

/// A configuration file that was skipped while scanning a conf dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedFile {
    /// The file.
    pub path: PathBuf,
    /// Why it was skipped.
    pub reason: String,
    /// The network the file names, when it parsed far enough to tell (a
    /// list refused for the versions it asks for): a lookup of that name
    /// says why the file is refused instead of "no network configuration".
    pub network: Option<String>,
}

impl SkippedFile {
    /// A file skipped for `reason`, its network unknown.
    pub fn new(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        SkippedFile {
            path: path.into(),
            reason: reason.into(),
            network: None,
        }
    }

    /// A file skipped because loading it failed with `error`.
    pub fn from_error(path: impl Into<PathBuf>, error: &Error) -> Self {
        SkippedFile {
            path: path.into(),
            reason: Chain(error).to_string(),
            network: match error {
                Error::VersionsTooNew { network, .. } => Some(network.clone()),
                _ => None,
            },
        }
    }
}

impl fmt::Display for SkippedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

fn fmt_no_configs(dir: &std::path::Path, missing: bool) -> String {
    if missing {
        format!(
            "no network configurations: the conf dir {} does not exist",
            dir.display()
        )
    } else {
        format!("no network configurations found in {}", dir.display())
    }
}

/// What a "no network configuration with name X" message adds about the
/// networks there are: `; did you mean "near"? (networks there: "a",
/// "b")`, or ` (networks there: ...)` when none is near; empty without
/// networks. One wording for the library, cnitool and cnid.
pub fn fmt_available(name: &str, available: &[String]) -> String {
    if available.is_empty() {
        return String::new();
    }
    let names: Vec<String> = available.iter().map(|n| format!("{n:?}")).collect();
    match closest(name, available) {
        Some(near) => format!(
            "; did you mean {near:?}? (networks there: {})",
            names.join(", ")
        ),
        None => format!(" (networks there: {})", names.join(", ")),
    }
}

/// The candidate nearest to `wanted` by edit distance, if it is near
/// enough to be a typo (at most a third of the longer name, and at least
/// one edit allowed).
pub fn closest<'a>(wanted: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(wanted, c), c))
        .filter(|(d, c)| *d > 0 && *d <= (wanted.chars().count().max(c.chars().count()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

/// Levenshtein distance between `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diag
            } else {
                1 + diag.min(above).min(row[j])
            };
            diag = above;
        }
    }
    row[b.len()]
}

fn fmt_not_found(
    name: &str,
    dir: &std::path::Path,
    available: &[String],
    skipped: &[SkippedFile],
) -> String {
    if let Some(own) = skipped.iter().find(|s| s.network.as_deref() == Some(name)) {
        return format!(
            "network configuration with name {name:?} in {} is not usable: {}",
            dir.display(),
            own.reason
        );
    }
    format!(
        "no network configuration with name {name:?} in {}{}{}",
        dir.display(),
        fmt_available(name, available),
        list_skipped(skipped)
    )
}

fn fmt_offered(offered: &[String]) -> String {
    offered.join(", ")
}

fn list_skipped(skipped: &[SkippedFile]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let files: Vec<String> = skipped.iter().map(|s| s.to_string()).collect();
    format!(" (unparsable files skipped: {})", files.join("; "))
}

/// Everything that can go wrong in `cni-core`.
///
/// Messages are lower-case and name the file, field or value at fault.
/// [`Error::code`] gives the CNI error code that fits each variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A configuration (file or bytes) is not valid.
    #[error("invalid network configuration {origin}: {reason}")]
    InvalidConfig {
        /// Where it came from: a file path, or a description such as `<bytes>`.
        origin: String,
        /// What is wrong, naming the field.
        reason: String,
    },

    /// A version string does not parse.
    #[error("invalid CNI version {version:?}: {reason}")]
    InvalidVersion {
        /// The string as given.
        version: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A version parses but is not one we can work with here.
    #[error("unsupported CNI version {version} in {context}")]
    UnsupportedVersion {
        /// The version(s) offered.
        version: String,
        /// Where it was met.
        context: String,
    },

    /// A network configuration list asks only for versions newer than
    /// this runtime supports (in `cniVersion` and `cniVersions`): refused,
    /// saying what it asks for and the highest version supported.
    #[error(
        "network configuration {origin} (network {network:?}) asks only for CNI versions newer than this runtime supports: {} (the highest supported is {highest})",
        fmt_offered(offered)
    )]
    VersionsTooNew {
        /// Where it came from: a file path, or a description such as `<bytes>`.
        origin: String,
        /// The network's name.
        network: String,
        /// The versions it offers, as written (`cniVersion` first).
        offered: Vec<String>,
        /// The highest version this runtime supports.
        highest: String,
    },

    /// A plugin's `VERSION` reply does not decode.
    #[error("invalid VERSION reply: {reason}")]
    InvalidVersionReply {
        /// What is wrong with it.
        reason: String,
    },

    /// The conf dir holds no configuration file at all, or does not exist.
    #[error("{}", fmt_no_configs(dir, *missing))]
    NoConfigs {
        /// The conf dir.
        dir: PathBuf,
        /// The conf dir does not exist.
        missing: bool,
    },

    /// No configuration in the conf dir has this network name.
    #[error("{}", fmt_not_found(name, dir, available, skipped))]
    NetworkNotFound {
        /// The name looked for.
        name: String,
        /// The conf dir.
        dir: PathBuf,
        /// Files that could not be parsed (one of them may have been it).
        skipped: Vec<SkippedFile>,
        /// The names of the networks the conf dir does hold, in conf-dir
        /// order (the message lists them and suggests the closest).
        available: Vec<String>,
    },

    /// A name, ID or other runtime parameter is not valid.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidParameter {
        /// Which parameter: `container ID`, `network name`, `interface name`, `plugin type`, ...
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
        /// The CNI code the spec gives this failure (3, 4 or 7).
        code: u32,
    },

    /// A `CNI_ARGS` string does not decode.
    #[error("invalid CNI_ARGS pair {pair:?}: {reason}")]
    InvalidCniArgs {
        /// The offending `K=V` pair.
        pair: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Capability arguments (`CAP_ARGS`) are not a JSON object.
    #[error("invalid capability arguments: {reason}")]
    InvalidCapabilityArgs {
        /// What is wrong.
        reason: String,
    },

    /// A result (from a plugin, `prevResult` or the cache) does not decode.
    #[error("invalid {version} result: {reason}")]
    InvalidResult {
        /// The version the result was read as.
        version: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A result cannot be expressed in the requested version.
    #[error("cannot convert result from {from} to {to}: {reason}")]
    Conversion {
        /// Source version.
        from: String,
        /// Target version.
        to: String,
        /// Why not.
        reason: String,
    },

    /// A cache record does not decode or does not belong to the attachment asked for.
    #[error("invalid cache record {origin}: {reason}")]
    InvalidCacheRecord {
        /// The cache file (or a description).
        origin: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Building JSON failed (only for inputs that cannot be serialized).
    #[error("cannot encode {what}")]
    Encode {
        /// What was being encoded.
        what: String,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// The CNI error code that fits this error.
    pub fn code(&self) -> u32 {
        match self {
            Error::Io { .. } => code::IO_FAILURE,
            Error::InvalidConfig { .. } => code::INVALID_NETWORK_CONFIG,
            Error::InvalidVersion { .. }
            | Error::UnsupportedVersion { .. }
            | Error::VersionsTooNew { .. } => code::INCOMPATIBLE_VERSION,
            Error::InvalidVersionReply { .. } => code::DECODING_FAILURE,
            Error::NoConfigs { .. } | Error::NetworkNotFound { .. } => code::INVALID_NETWORK_CONFIG,
            Error::InvalidParameter { code, .. } => *code,
            Error::InvalidCniArgs { .. } => code::INVALID_ENVIRONMENT_VARIABLES,
            Error::InvalidCapabilityArgs { .. } => code::INVALID_NETWORK_CONFIG,
            Error::InvalidResult { .. } | Error::InvalidCacheRecord { .. } => {
                code::DECODING_FAILURE
            }
            Error::Conversion { .. } => code::INCOMPATIBLE_VERSION,
            Error::Encode { .. } => code::INTERNAL,
        }
    }

    /// This error as the spec's error JSON object.
    pub fn to_error_object(&self, cni_version: &str) -> ErrorObject {
        let details = match self {
            Error::InvalidParameter { value, .. } => value.clone(),
            _ => String::new(),
        };
        ErrorObject::new(cni_version, self.code(), Chain(self).to_string(), details)
    }

    pub(crate) fn invalid_config(origin: impl fmt::Display, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            origin: origin.to_string(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_round_trip_and_decode() {
        let e = ErrorObject::new("1.0.0", 7, "bad config", "field x");
        let json = e.to_json();
        assert_eq!(
            json,
            r#"{"cniVersion":"1.0.0","code":7,"msg":"bad config","details":"field x"}"#
        );
        assert_eq!(ErrorObject::decode(json.as_bytes()), Some(e));
        assert_eq!(
            ErrorObject::decode(br#"{"code":101,"msg":"x"}"#),
            Some(ErrorObject::new("", 101, "x", ""))
        );
        assert_eq!(
            ErrorObject::decode(br#"{"cniVersion":"1.0.0","ips":[]}"#),
            None
        );
        assert_eq!(ErrorObject::decode(b"garbage"), None);
        assert_eq!(ErrorObject::decode(br#"{"code":-1}"#), None);
    }

    #[test]
    fn error_objects_on_success_are_never_results() {
        let obj = |s: &str| ErrorObject::decode_on_success(s.as_bytes());
        assert_eq!(
            obj(r#"{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"d"}"#),
            Some(ErrorObject::new("1.0.0", 7, "bad", "d"))
        );
        assert_eq!(
            obj(r#" {"code":0} "#),
            Some(ErrorObject::new("", 0, "", ""))
        );
        // Escaped key names are still key names.
        assert_eq!(
            obj(r#"{"\u0063ode":101,"msg":"x"}"#),
            Some(ErrorObject::new("", 101, "x", ""))
        );
        for not_error in [
            "",
            "garbage code",
            r#"{"cniVersion":"1.0.0"}"#,
            r#"{"cniVersion":"1.0.0","code":"7"}"#,
            r#"{"code":-1}"#,
            r#"{"code":4294967296}"#,
            r#"[{"code":7}]"#,
            r#"{"code":7,"ips":[]}"#,
            r#"{"code":7,"interfaces":[]}"#,
            r#"{"code":7,"routes":[]}"#,
            r#"{"code":7,"dns":{}}"#,
            r#"{"code":7,"ip4":{"ip":"10.0.0.1/24"}}"#,
            r#"{"code":7,"ip6":{"ip":"fd00::1/64"}}"#,
            r#"{"code":7,"supportedVersions":["1.0.0"]}"#,
        ] {
            assert_eq!(obj(not_error), None, "{not_error}");
        }
    }

    #[test]
    fn codes_of_errors() {
        let e = Error::InvalidParameter {
            field: "container ID",
            value: "../x".into(),
            reason: "invalid characters".into(),
            code: code::INVALID_ENVIRONMENT_VARIABLES,
        };
        assert_eq!(e.code(), 4);
        let obj = e.to_error_object("1.1.0");
        assert_eq!(obj.details, "../x");
        assert_eq!(
            obj.msg,
            r#"invalid container ID "../x": invalid characters"#
        );
        assert_eq!(code::name(50), "plugin not available");
        assert_eq!(code::name(120), "plugin-specific error");
    }

    #[test]
    fn not_found_names_skipped_files() {
        let e = Error::NetworkNotFound {
            name: "net".into(),
            dir: "/etc/cni/net.d".into(),
            skipped: vec![SkippedFile::new(
                "/etc/cni/net.d/10-bad.conflist",
                "expected value at line 1 column 1",
            )],
            available: Vec::new(),
        };
        let msg = e.to_string();
        assert!(msg.contains("10-bad.conflist"), "{msg}");
        assert!(msg.starts_with(r#"no network configuration with name "net" in /etc/cni/net.d"#));
    }

    #[test]
    fn closest_names_are_typos_only() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let have = names(&["cnirs-bridge", "cnirs-ptp", "mynet"]);
        assert_eq!(closest("cnirs-brige", &have), Some("cnirs-bridge"));
        assert_eq!(closest("cnirs-pt", &have), Some("cnirs-ptp"));
        assert_eq!(
            closest("mynet", &have),
            None,
            "an exact name is no suggestion"
        );
        assert_eq!(closest("kube", &have), None);
        assert_eq!(closest("", &have), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}

/// An error and its causes on one line, `error: cause: cause`: for the
/// places that have one line for it (a CNI error object's `msg`, a log
/// field). Each message names only its own part (the cause is reached
/// through `source()`), so this and anyhow's `{:#}` print every part once.
#[derive(Debug, Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}
