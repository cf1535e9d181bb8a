//! Building the JSON a plugin reads on stdin (spec section 3, "Deriving
//! request configuration from plugin configuration").
//!
//! Starting from the plugin's object exactly as written:
//! - `name` is set to the network's name and `cniVersion` to the version the
//!   list runs at, replacing the plugin's own (in place, so key order holds);
//! - every key starting with `cni.dev/` is removed (reserved for the
//!   runtime: a config cannot forge `cni.dev/valid-attachments`);
//! - ADD, DEL, CHECK: `capabilities` is removed (the spec says it must not
//!   be set for the attachment operations; libcni forgets,
//!   `docs/decisions.md` D5); GC and STATUS pass it through unaltered, as
//!   the spec says of every other field and libcni does;
//! - ADD, DEL, CHECK: `runtimeConfig` is set to exactly those capability
//!   arguments whose capability the plugin declares `true`, in the plugin's
//!   declaration order, and only when at least one matches (then it replaces
//!   a static `runtimeConfig`; otherwise a static one passes through);
//!   `prevResult` is appended when given;
//! - GC: `cni.dev/valid-attachments` and, as libcni does for plugins written
//!   against the first 1.1.0 draft, `cni.dev/attachments`, with the same list;
//! - STATUS: nothing more.
//!
//! Everything else passes through unaltered: unknown fields, big integers,
//! unicode and HTML characters (serde_json does not escape `<`, `>`, `&`).
//!
//! ```
//! use cni_core::config::NetworkConfigList;
//! use cni_core::args::RuntimeConf;
//! use cni_core::stdin::{plugin_stdin, StdinInput};
//!
//! let list = NetworkConfigList::from_bytes(br#"{"cniVersion":"1.0.0","name":"net1",
//!   "plugins":[{"type":"portmap","capabilities":{"portMappings":true},"snat":true}]}"#, None).unwrap();
//! let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
//! rt.capability_args.insert("portMappings", serde_json::json!([{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]));
//! rt.capability_args.insert("bandwidth", serde_json::json!({"ingressRate":1000}));
//!
//! let stdin = plugin_stdin(list.name(), list.version(), &list.plugins()[0],
//!     StdinInput::Attachment { rt: &rt, prev_result: None }).unwrap();
//! assert_eq!(std::str::from_utf8(&stdin).unwrap(),
//!   r#"{"type":"portmap","snat":true,"name":"net1","cniVersion":"1.0.0","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}}"#);
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::args::RuntimeConf;
use crate::config::{NetworkConfigList, PluginConfig};
use crate::error::Error;
use crate::version::Version;

/// The GC key the spec defines.
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The key of the first 1.1.0 draft, still sent by libcni
/// (containernetworking/cni#1101).
pub const LEGACY_ATTACHMENTS_KEY: &str = "cni.dev/attachments";
/// Keys with this prefix are reserved for the runtime.
pub const RESERVED_PREFIX: &str = "cni.dev/";

/// An attachment that is still valid, for GC.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GcAttachment {
    /// The `CNI_CONTAINERID` given at ADD. Written `containerID` (the
    /// spec's key); read as `containerID` or `containerId` (cnid's API
    /// spells it so everywhere else).
    #[serde(rename = "containerID", alias = "containerId")]
    pub container_id: String,
    /// The `CNI_IFNAME` given at ADD.
    #[serde(rename = "ifname")]
    pub ifname: String,
}

/// What the stdin is for, with the verb-specific inputs.
#[derive(Debug, Clone, Copy)]
pub enum StdinInput<'a> {
    /// ADD, DEL or CHECK of one attachment.
    Attachment {
        /// The attachment's runtime parameters (capability args are used here).
        rt: &'a RuntimeConf,
        /// The previous result, already in the list's version (none for the
        /// first ADD; the cached result for DEL and CHECK).
        prev_result: Option<&'a Value>,
    },
    /// STATUS.
    Status,
    /// GC, with the attachments that are still valid.
    Gc {
        /// The still-valid attachments.
        valid_attachments: &'a [GcAttachment],
    },
}

/// Builds the JSON object for one plugin call (see the module docs).
pub fn plugin_stdin_value(
    network_name: &str,
    version: Version,
    plugin: &PluginConfig,
    input: StdinInput<'_>,
) -> Map<String, Value> {
    let mut out = Map::with_capacity(plugin.raw().len() + 3);
    let attachment = matches!(input, StdinInput::Attachment { .. });
    for (k, v) in plugin.raw() {
        if (attachment && k == "capabilities") || k.starts_with(RESERVED_PREFIX) {
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    out.insert("name".into(), Value::String(network_name.to_owned()));
    out.insert("cniVersion".into(), Value::String(version.to_string()));
    match input {
        StdinInput::Attachment { rt, prev_result } => {
            let mut rc = Map::new();
            for (cap, enabled) in plugin.capabilities() {
                if !*enabled {
                    continue;
                }
                if let Some(v) = rt.capability_args.get(cap) {
                    rc.insert(cap.clone(), v.clone());
                }
            }
            if !rc.is_empty() {
                out.insert("runtimeConfig".into(), Value::Object(rc));
            }
            if let Some(prev) = prev_result {
                out.insert("prevResult".into(), prev.clone());
            }
        }
        StdinInput::Status => {}
        StdinInput::Gc { valid_attachments } => {
            let list = serde_json::to_value(valid_attachments)
                .unwrap_or_else(|_| Value::Array(Vec::new()));
            out.insert(VALID_ATTACHMENTS_KEY.into(), list.clone());
            out.insert(LEGACY_ATTACHMENTS_KEY.into(), list);
        }
    }
    out
}

/// Builds the bytes a plugin reads on stdin for one call.
pub fn plugin_stdin(
    network_name: &str,
    version: Version,
    plugin: &PluginConfig,
    input: StdinInput<'_>,
) -> Result<Vec<u8>, Error> {
    let value = plugin_stdin_value(network_name, version, plugin, input);
    serde_json::to_vec(&value).map_err(|e| Error::Encode {
        what: format!("stdin for plugin {}", plugin.describe()),
        source: e,
    })
}

/// The stdin for plugin `index` of `list` (its name and selected version).
///
/// # Panics
/// If `index` is out of range.
pub fn list_plugin_stdin(
    list: &NetworkConfigList,
    index: usize,
    input: StdinInput<'_>,
) -> Result<Vec<u8>, Error> {
    plugin_stdin(list.name(), list.version(), &list.plugins()[index], input)
}

/// The stdin of a `VERSION` call: `{"cniVersion": "<version>"}`.
pub fn version_stdin(version: Version) -> Vec<u8> {
    format!(r#"{{"cniVersion":"{version}"}}"#).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plugin(json: &str) -> PluginConfig {
        PluginConfig::from_bytes(json.as_bytes(), None).unwrap()
    }

    #[test]
    fn reserved_keys_are_dropped() {
        let p = plugin(
            r#"{"type":"x","cni.dev/valid-attachments":[{"containerID":"forged","ifname":"eth0"}],"cni.devices":1}"#,
        );
        let v = plugin_stdin_value(
            "n",
            Version::V1_1_0,
            &p,
            StdinInput::Gc {
                valid_attachments: &[],
            },
        );
        assert_eq!(v[VALID_ATTACHMENTS_KEY], json!([]));
        assert_eq!(v[LEGACY_ATTACHMENTS_KEY], json!([]));
        assert_eq!(v["cni.devices"], json!(1));
    }

    #[test]
    fn gc_keys_carry_the_list() {
        let p = plugin(r#"{"type":"x","capabilities":{"a":true}}"#);
        let valid = [GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }];
        let v = plugin_stdin_value(
            "n",
            Version::V1_1_0,
            &p,
            StdinInput::Gc {
                valid_attachments: &valid,
            },
        );
        assert_eq!(
            Value::Object(v),
            json!({"type":"x","capabilities":{"a":true},"name":"n","cniVersion":"1.1.0",
                "cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"c1","ifname":"eth0"}]})
        );
    }

    #[test]
    fn status_gets_name_and_version_only() {
        let p = plugin(
            r#"{"type":"x","name":"own","cniVersion":"0.4.0","runtimeConfig":{"k":1},"capabilities":{"mac":true}}"#,
        );
        let v = plugin_stdin_value("net", Version::V1_1_0, &p, StdinInput::Status);
        assert_eq!(
            Value::Object(v),
            json!({"type":"x","name":"net","cniVersion":"1.1.0","runtimeConfig":{"k":1},
                "capabilities":{"mac":true}})
        );
    }

    #[test]
    fn capabilities_are_removed_for_attachment_verbs_only() {
        let p = plugin(r#"{"type":"x","capabilities":{"mac":true}}"#);
        let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
        let add = plugin_stdin_value(
            "n",
            Version::V1_1_0,
            &p,
            StdinInput::Attachment {
                rt: &rt,
                prev_result: None,
            },
        );
        assert!(!add.contains_key("capabilities"), "{add:?}");
        for input in [
            StdinInput::Status,
            StdinInput::Gc {
                valid_attachments: &[],
            },
        ] {
            let v = plugin_stdin_value("n", Version::V1_1_0, &p, input);
            assert_eq!(v["capabilities"], json!({"mac":true}), "{input:?}");
        }
    }

    #[test]
    fn version_request() {
        assert_eq!(version_stdin(Version::V1_1_0), br#"{"cniVersion":"1.1.0"}"#);
    }
}
