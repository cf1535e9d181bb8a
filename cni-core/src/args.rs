//! Runtime arguments: `CNI_ARGS` pairs, capability arguments (`CAP_ARGS`),
//! and the [`RuntimeConf`] that describes one attachment.
//!
//! ```
//! use cni_core::args::{CniArgs, CapabilityArgs};
//!
//! let args: CniArgs = "IgnoreUnknown=1;K8S_POD_NAME=web".parse().unwrap();
//! assert_eq!(args.to_string(), "IgnoreUnknown=1;K8S_POD_NAME=web");
//! assert!("novalue".parse::<CniArgs>().is_err());
//!
//! let caps = CapabilityArgs::from_json(r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#).unwrap();
//! assert!(caps.get("portMappings").is_some());
//! ```

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::Error;
use crate::validate;

/// `CNI_ARGS`: ordered `K=V` pairs, joined with `;` without escaping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CniArgs(pub Vec<(String, String)>);

impl CniArgs {
    /// No arguments.
    pub fn new() -> Self {
        CniArgs(Vec::new())
    }

    /// Parses `K=V;K=V` with the reference cnitool's rules: every pair has
    /// exactly one `=` and both sides non-empty. The empty string is no pairs.
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Ok(CniArgs::new());
        }
        let mut out = Vec::new();
        for pair in s.split(';') {
            let mut parts = pair.split('=');
            let (k, v) = match (parts.next(), parts.next(), parts.next()) {
                (Some(k), Some(v), None) => (k, v),
                _ => {
                    return Err(Error::InvalidCniArgs {
                        pair: pair.to_owned(),
                        reason: "expected exactly one '='".into(),
                    });
                }
            };
            if k.is_empty() || v.is_empty() {
                return Err(Error::InvalidCniArgs {
                    pair: pair.to_owned(),
                    reason: "key and value must be non-empty".into(),
                });
            }
            check_printable(k, v)?;
            out.push((k.to_owned(), v.to_owned()));
        }
        Ok(CniArgs(out))
    }

    /// Checks pairs built in code (not parsed): a key or value containing
    /// `;` or `=`, or an empty key, could not be read back from `CNI_ARGS`.
    pub fn validate(&self) -> Result<(), Error> {
        for (k, v) in &self.0 {
            let pair = format!("{k}={v}");
            if k.is_empty() {
                return Err(Error::InvalidCniArgs {
                    pair,
                    reason: "empty key".into(),
                });
            }
            if k.contains([';', '=', '\0']) || v.contains([';', '=', '\0']) {
                return Err(Error::InvalidCniArgs {
                    pair,
                    reason: "keys and values must not contain ';', '=' or NUL".into(),
                });
            }
            check_printable(k, v)?;
        }
        Ok(())
    }

    /// Appends a pair.
    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.push((key.into(), value.into()));
    }

    /// The value of the first pair with this key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

/// Refuses a pair holding a control or other [unprintable](validate::is_unprintable)
/// character: plugins log their `CNI_ARGS`, and so may we.
fn check_printable(k: &str, v: &str) -> Result<(), Error> {
    if k.chars().chain(v.chars()).any(validate::is_unprintable) {
        return Err(Error::InvalidCniArgs {
            pair: format!("{k}={v}"),
            reason: format!("key or value {}", validate::UNPRINTABLE),
        });
    }
    Ok(())
}

impl fmt::Display for CniArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl FromStr for CniArgs {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        CniArgs::parse(s)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for CniArgs {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        CniArgs(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

/// Capability arguments: a JSON object whose keys are capability names
/// (`portMappings`, `bandwidth`, ...) and whose values are passed to plugins
/// that declare the capability, inside `runtimeConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CapabilityArgs(pub Map<String, Value>);

impl CapabilityArgs {
    /// No capability arguments.
    pub fn new() -> Self {
        CapabilityArgs(Map::new())
    }

    /// Parses `CAP_ARGS`: a JSON object (the empty string is no arguments).
    pub fn from_json(s: &str) -> Result<Self, Error> {
        if s.trim().is_empty() {
            return Ok(CapabilityArgs::new());
        }
        let value: Value = serde_json::from_str(s).map_err(|e| Error::InvalidCapabilityArgs {
            reason: format!("not valid JSON: {e}"),
        })?;
        CapabilityArgs::from_value(value)
    }

    /// Takes a JSON value that must be an object (or `null`, meaning none).
    pub fn from_value(value: Value) -> Result<Self, Error> {
        match value {
            Value::Object(map) => Ok(CapabilityArgs(map)),
            Value::Null => Ok(CapabilityArgs::new()),
            other => Err(Error::InvalidCapabilityArgs {
                reason: format!("expected a JSON object, got {}", json_kind(&other)),
            }),
        }
    }

    /// Sets one capability argument.
    pub fn insert(&mut self, capability: impl Into<String>, value: Value) {
        self.0.insert(capability.into(), value);
    }

    /// The argument of one capability.
    pub fn get(&self, capability: &str) -> Option<&Value> {
        self.0.get(capability)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The underlying JSON object.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Everything about one attachment that is not the network configuration:
/// libcni's `RuntimeConf`.
///
/// An attachment is identified by (`container_id`, `ifname`) on a network.
///
/// For a Kubernetes pod, `cni_async` builds one with the `CNI_ARGS`
/// containerd's CRI plugin sets (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
/// `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`, with `IgnoreUnknown=1`):
/// `cni_async::Sandbox::new(id, netns).with_kubernetes_pod(&pod).runtime_conf("eth0")`
/// (see `cni_async::Sandbox::with_kubernetes_pod` and `cni_async::KubernetesPod`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeConf {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: a path such as `/run/netns/NAME` or `/proc/PID/ns/net`;
    /// may be empty for DEL when the namespace is gone.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    #[serde(default)]
    pub args: CniArgs,
    /// Capability arguments, filtered per plugin into `runtimeConfig`.
    #[serde(default)]
    pub capability_args: CapabilityArgs,
}

/// A netns path as the string `CNI_NETNS` carries: the path itself when it
/// is UTF-8, else its lossy form, which [`validate::netns_path`] refuses.
pub fn netns_string(path: &Path) -> String {
    match path.to_str() {
        Some(s) => s.to_owned(),
        None => path.to_string_lossy().into_owned(),
    }
}

impl RuntimeConf {
    /// A runtime configuration with no `CNI_ARGS` and no capability arguments.
    ///
    /// `netns` is a path (`&str`, `String`, `&Path`, `PathBuf`, ...), kept
    /// as the string plugins get in `CNI_NETNS`. A path that is not valid
    /// UTF-8 cannot be passed that way: it is kept with U+FFFD in place of
    /// the bad bytes, and [`RuntimeConf::validate`] (run by every verb)
    /// refuses it.
    pub fn new(
        container_id: impl Into<String>,
        netns: impl AsRef<Path>,
        ifname: impl Into<String>,
    ) -> Self {
        RuntimeConf {
            container_id: container_id.into(),
            netns: netns_string(netns.as_ref()),
            ifname: ifname.into(),
            args: CniArgs::new(),
            capability_args: CapabilityArgs::new(),
        }
    }

    /// The netns as a path (empty when none was given).
    pub fn netns_path(&self) -> &Path {
        Path::new(&self.netns)
    }

    /// Checks the container ID, interface name, `CNI_ARGS` and the netns
    /// path's characters ([`validate::netns_path`]). We do this on every verb
    /// (libcni only on ADD) because these values end up in cache file paths,
    /// plugin environments and logs.
    pub fn validate(&self) -> Result<(), Error> {
        validate::container_id(&self.container_id)?;
        validate::interface_name(&self.ifname)?;
        self.args.validate()?;
        validate::netns_path(&self.netns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_args_round_trip() {
        let a = CniArgs::parse("A=1;B=two;C=x.y").unwrap();
        assert_eq!(a.get("B"), Some("two"));
        assert_eq!(a.to_string(), "A=1;B=two;C=x.y");
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::new());
    }

    #[test]
    fn cni_args_errors_match_cnitool() {
        for (input, pair) in [
            ("A", "A"),
            ("A=1;B", "B"),
            ("A=1=2", "A=1=2"),
            ("=1", "=1"),
            ("A=", "A="),
            ("A=1;", ""),
            (";A=1", ""),
        ] {
            let e = CniArgs::parse(input).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("invalid CNI_ARGS pair {pair:?}")),
                "{input}: {e}"
            );
            assert_eq!(e.code(), 4);
        }
    }

    #[test]
    fn built_args_validated() {
        let ok: CniArgs = [("K8S_POD_NAME", "web")].into_iter().collect();
        ok.validate().unwrap();
        let bad: CniArgs = [("A", "x;B=y")].into_iter().collect();
        assert!(bad.validate().is_err());
    }

    #[test]
    fn control_characters_in_cni_args_are_refused() {
        for c in [
            '\u{1b}', '\u{7}', '\n', '\u{7f}', '\u{9b}', '\u{202e}', '\u{feff}',
        ] {
            for text in [format!("K{c}=v"), format!("K=v{c}"), format!("A=1;K=a{c}b")] {
                let e = CniArgs::parse(&text).unwrap_err();
                assert_eq!(e.code(), 4, "{text:?}");
                let msg = e.to_string();
                assert!(msg.starts_with("invalid CNI_ARGS pair "), "{msg}");
                assert!(msg.contains("non-printable"), "{msg}");
                assert!(!msg.contains(c), "raw {c:?} in {msg:?}");
            }
            let built: CniArgs = [("K", format!("x{c}"))].into_iter().collect();
            assert!(built.validate().is_err(), "{c:?}");
            let mut rt = RuntimeConf::new("c1", "/run/netns/x", "eth0");
            rt.args = built;
            assert!(rt.validate().is_err(), "{c:?}");
        }
        CniArgs::parse("K8S_POD_NAME=wéb-0;IgnoreUnknown=1").unwrap();
    }

    #[test]
    fn netns_is_a_path_and_non_utf8_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let rt = RuntimeConf::new("c1", Path::new("/run/netns/a"), "eth0");
        assert_eq!(rt.netns, "/run/netns/a");
        assert_eq!(rt.netns_path(), Path::new("/run/netns/a"));
        rt.validate().unwrap();
        let bad = Path::new(std::ffi::OsStr::from_bytes(b"/run/netns/\xff"));
        let e = RuntimeConf::new("c1", bad, "eth0").validate().unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("not valid UTF-8"), "{e}");
    }

    #[test]
    fn netns_with_control_characters_is_refused() {
        for netns in [
            "/run/netns/\u{1b}[2Jx",
            "/run/netns/a\nb",
            "/proc/1/ns/net\u{202e}",
        ] {
            let e = RuntimeConf::new("c1", netns, "eth0")
                .validate()
                .unwrap_err();
            assert_eq!(e.code(), 4);
            assert!(e.to_string().starts_with("invalid netns path "), "{e}");
        }
    }

    #[test]
    fn capability_args() {
        let c =
            CapabilityArgs::from_json(r#"{"mac":"aa:bb:cc:dd:ee:ff","n":18446744073709551617}"#)
                .unwrap();
        // Big numbers pass through exactly.
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"mac":"aa:bb:cc:dd:ee:ff","n":18446744073709551617}"#
        );
        assert!(CapabilityArgs::from_json("[1]").is_err());
        assert!(CapabilityArgs::from_json("{").is_err());
        assert!(CapabilityArgs::from_json("").unwrap().is_empty());
        assert!(CapabilityArgs::from_json("null").unwrap().is_empty());
    }

    #[test]
    fn runtime_conf_validation() {
        RuntimeConf::new("c1", "/run/netns/x", "eth0")
            .validate()
            .unwrap();
        assert!(RuntimeConf::new("../c1", "", "eth0").validate().is_err());
        assert!(RuntimeConf::new("c1", "", "eth/0").validate().is_err());
        // DEL may run without a netns.
        RuntimeConf::new("c1", "", "eth0").validate().unwrap();
    }
}
