//! Network configuration lists (`.conflist`) and single plugin
//! configurations (`.conf`, `.json`, and the spec 1.1.0 per-network plugin
//! files), parsed without losing anything.
//!
//! Both types keep the JSON object exactly as written (key order, unknown
//! fields, big integers, unicode) and the source bytes. Only the fields the
//! runtime needs are read out: `name`, `cniVersion`, `cniVersions`,
//! `disableCheck`, `disableGC`, `loadOnlyInlinedPlugins`, `plugins`, and per
//! plugin `type`, `name`, `cniVersion`, `capabilities`.
//!
//! This module parses bytes and values only; reading files (a `.conflist`
//! with its plugin files, a `.conf`) is [`crate::confdir`]'s, which adds
//! `NetworkConfigList::from_file` and `PluginConfig::from_file`.
//!
//! ```
//! use cni_core::config::NetworkConfigList;
//! use cni_core::Version;
//!
//! let list = NetworkConfigList::from_bytes(br#"{
//!     "cniVersion": "1.0.0", "cniVersions": ["0.4.0", "1.1.0"],
//!     "name": "dbnet", "disableCheck": "TRUE",
//!     "plugins": [
//!         {"type": "bridge", "bridge": "cni0", "big": 9007199254740993},
//!         {"type": "portmap", "capabilities": {"portMappings": true}}
//!     ]
//! }"#, None).unwrap();
//! assert_eq!(list.name(), "dbnet");
//! assert_eq!(list.version(), Version::V1_1_0);
//! assert!(list.disable_check());
//! assert_eq!(list.plugins()[1].plugin_type(), "portmap");
//! assert!(list.plugins()[1].capability_enabled("portMappings"));
//! assert_eq!(list.plugins()[0].raw()["big"].to_string(), "9007199254740993");
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::args::json_kind;
use crate::error::Error;
use crate::version::{Version, offers_only_newer, select_version};

/// Where a configuration came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read from this file.
    File(PathBuf),
    /// Plugin number `index` of a list that came from `list`.
    Inline {
        /// The list's origin.
        list: Box<Origin>,
        /// Index in `plugins`.
        index: usize,
    },
    /// Given as bytes in memory.
    Bytes,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Inline { list, index } => write!(f, "{list} plugins[{index}]"),
            Origin::Bytes => f.write_str("<bytes>"),
        }
    }
}

impl Origin {
    fn from_path(path: Option<&Path>) -> Origin {
        path.map_or(Origin::Bytes, |p| Origin::File(p.to_owned()))
    }
}

/// One plugin's configuration: an element of a list's `plugins`, a `.conf`
/// file, or a plugin file from `<confdir>/<network>/`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    raw: Map<String, Value>,
    bytes: Vec<u8>,
    plugin_type: String,
    name: Option<String>,
    cni_version: Option<String>,
    capabilities: Vec<(String, bool)>,
    origin: Origin,
}

impl PluginConfig {
    /// Parses one plugin configuration object.
    pub fn from_bytes(bytes: &[u8], path: Option<&Path>) -> Result<Self, Error> {
        let origin = Origin::from_path(path);
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid_config(&origin, format!("not valid JSON: {e}")))?;
        PluginConfig::from_value_with_bytes(value, bytes.to_vec(), origin)
    }

    /// Builds a plugin configuration from a JSON value (bytes are its serialization).
    pub fn from_value(value: Value) -> Result<Self, Error> {
        let bytes = serde_json::to_vec(&value).map_err(|e| Error::Encode {
            what: "plugin configuration".into(),
            source: e,
        })?;
        PluginConfig::from_value_with_bytes(value, bytes, Origin::Bytes)
    }

    fn from_value_with_bytes(value: Value, bytes: Vec<u8>, origin: Origin) -> Result<Self, Error> {
        let raw = match value {
            Value::Object(m) => m,
            other => {
                return Err(Error::invalid_config(
                    &origin,
                    format!("expected a JSON object, got {}", json_kind(&other)),
                ));
            }
        };
        let plugin_type = match raw.get("type") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) | None => {
                return Err(Error::invalid_config(&origin, "missing 'type'"));
            }
            Some(other) => {
                return Err(Error::invalid_config(
                    &origin,
                    format!("field 'type' must be a string, got {}", json_kind(other)),
                ));
            }
        };
        crate::validate::plugin_type(&plugin_type)
            .map_err(|e| Error::invalid_config(&origin, format!("field 'type': {e}")))?;
        let name = optional_string(&raw, "name", &origin)?;
        let cni_version = optional_string(&raw, "cniVersion", &origin)?;
        let capabilities = match raw.get("capabilities") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Object(caps)) => {
                let mut out = Vec::with_capacity(caps.len());
                for (k, v) in caps {
                    match v {
                        Value::Bool(b) => out.push((k.clone(), *b)),
                        other => {
                            return Err(Error::invalid_config(
                                &origin,
                                format!(
                                    "field 'capabilities.{k}' must be a boolean, got {}",
                                    json_kind(other)
                                ),
                            ));
                        }
                    }
                }
                out
            }
            Some(other) => {
                return Err(Error::invalid_config(
                    &origin,
                    format!(
                        "field 'capabilities' must be an object, got {}",
                        json_kind(other)
                    ),
                ));
            }
        };
        Ok(PluginConfig {
            raw,
            bytes,
            plugin_type,
            name,
            cni_version,
            capabilities,
            origin,
        })
    }

    /// The plugin `type`: the binary's file name.
    pub fn plugin_type(&self) -> &str {
        &self.plugin_type
    }

    /// The plugin's own `name`, if it has one (lists override it).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The plugin's own `cniVersion`, if it has one (lists override it).
    pub fn cni_version(&self) -> Option<&str> {
        self.cni_version.as_deref()
    }

    /// The declared capabilities, in file order (`true` = enabled).
    pub fn capabilities(&self) -> &[(String, bool)] {
        &self.capabilities
    }

    /// Whether the plugin declares `capability` as `true`.
    pub fn capability_enabled(&self, capability: &str) -> bool {
        self.capabilities
            .iter()
            .any(|(k, on)| *on && k == capability)
    }

    /// The JSON object exactly as parsed.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// The source bytes (for inline plugins: the serialization of the object).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Where this configuration came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// A short description for messages: `type="bridge" name="x"`, as libcni prints it.
    pub fn describe(&self) -> String {
        match &self.name {
            Some(n) if !n.is_empty() => format!("type={:?} name={n:?}", self.plugin_type),
            _ => format!("type={:?}", self.plugin_type),
        }
    }
}

/// A network configuration list: the network's name, the selected version,
/// its flags and the plugins in order.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    raw: Map<String, Value>,
    bytes: Vec<u8>,
    name: String,
    cni_version: Option<String>,
    cni_versions: Vec<String>,
    version: Version,
    disable_check: bool,
    disable_gc: bool,
    load_only_inlined_plugins: bool,
    plugins: Vec<PluginConfig>,
    inline_plugins: usize,
    origin: Origin,
}

impl NetworkConfigList {
    /// Parses a configuration list with its inline plugins only (no plugin
    /// files are read; see [`NetworkConfigList::from_file`]).
    ///
    /// A list without `plugins` parses (with none) unless
    /// `loadOnlyInlinedPlugins` is true; an empty `plugins` array is an error.
    pub fn from_bytes(bytes: &[u8], path: Option<&Path>) -> Result<Self, Error> {
        NetworkConfigList::parse(bytes, Origin::from_path(path))
    }

    fn parse(bytes: &[u8], origin: Origin) -> Result<Self, Error> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid_config(&origin, format!("not valid JSON: {e}")))?;
        let raw = match value {
            Value::Object(m) => m,
            other => {
                return Err(Error::invalid_config(
                    &origin,
                    format!("expected a JSON object, got {}", json_kind(&other)),
                ));
            }
        };
        let name = match raw.get("name") {
            Some(Value::String(s)) => s.clone(),
            None => return Err(Error::invalid_config(&origin, "missing 'name'")),
            Some(other) => {
                return Err(Error::invalid_config(
                    &origin,
                    format!("field 'name' must be a string, got {}", json_kind(other)),
                ));
            }
        };
        let cni_version = optional_string(&raw, "cniVersion", &origin)?;
        let cni_versions = match raw.get("cniVersions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => out.push(s.clone()),
                        other => {
                            return Err(Error::invalid_config(
                                &origin,
                                format!(
                                    "field 'cniVersions[{i}]' must be a string, got {}",
                                    json_kind(other)
                                ),
                            ));
                        }
                    }
                }
                out
            }
            Some(other) => {
                return Err(Error::invalid_config(
                    &origin,
                    format!(
                        "field 'cniVersions' must be an array, got {}",
                        json_kind(other)
                    ),
                ));
            }
        };
        let version = select_version(cni_version.as_deref(), &cni_versions).map_err(|e| {
            if offers_only_newer(cni_version.as_deref(), &cni_versions) {
                return Error::VersionsTooNew {
                    origin: origin.to_string(),
                    network: name.clone(),
                    offered: cni_version.iter().chain(&cni_versions).cloned().collect(),
                    highest: Version::CURRENT.to_string(),
                };
            }
            let field = if cni_versions.is_empty() {
                "cniVersion"
            } else {
                "cniVersions"
            };
            Error::invalid_config(&origin, format!("field '{field}': {e}"))
        })?;
        let disable_check = read_bool(&raw, "disableCheck", &origin)?;
        let disable_gc = read_bool(&raw, "disableGC", &origin)?;
        let load_only_inlined_plugins = read_bool(&raw, "loadOnlyInlinedPlugins", &origin)?;

        let mut plugins = Vec::new();
        match raw.get("plugins") {
            None if load_only_inlined_plugins => {
                return Err(Error::invalid_config(
                    &origin,
                    "'loadOnlyInlinedPlugins' is true and there is no 'plugins' field",
                ));
            }
            None => {}
            Some(Value::Array(items)) => {
                if items.is_empty() {
                    return Err(Error::invalid_config(&origin, "no plugins in list"));
                }
                for (index, item) in items.iter().enumerate() {
                    let plugin_origin = Origin::Inline {
                        list: Box::new(origin.clone()),
                        index,
                    };
                    let bytes = serde_json::to_vec(item).map_err(|e| Error::Encode {
                        what: format!("{plugin_origin}"),
                        source: e,
                    })?;
                    plugins.push(PluginConfig::from_value_with_bytes(
                        item.clone(),
                        bytes,
                        plugin_origin,
                    )?);
                }
            }
            Some(other) => {
                return Err(Error::invalid_config(
                    &origin,
                    format!("field 'plugins' must be an array, got {}", json_kind(other)),
                ));
            }
        }
        let inline_plugins = plugins.len();
        Ok(NetworkConfigList {
            raw,
            bytes: bytes.to_vec(),
            name,
            cni_version,
            cni_versions,
            version,
            disable_check,
            disable_gc,
            load_only_inlined_plugins,
            plugins,
            inline_plugins,
            origin,
        })
    }

    /// Appends a plugin after the inline ones: the spec 1.1.0 plugin files
    /// of `<confdir>/<network>/`, which [`crate::confdir`] reads.
    pub(crate) fn push_plugin(&mut self, plugin: PluginConfig) {
        self.plugins.push(plugin);
    }

    /// Refuses a list that has no plugin at all, inline or from plugin files.
    pub(crate) fn require_plugins(self) -> Result<Self, Error> {
        if self.plugins.is_empty() {
            return Err(Error::invalid_config(
                &self.origin,
                "no plugin configs found (no 'plugins' and no plugin files)",
            ));
        }
        Ok(self)
    }

    /// Upconverts a single plugin configuration (a `.conf` or `.json` file)
    /// into a list of one, as libcni's `ConfListFromConf` does: the list's
    /// `name` and `cniVersion` are the plugin's own.
    pub fn from_plugin(plugin: PluginConfig) -> Result<Self, Error> {
        let mut raw = Map::new();
        raw.insert(
            "cniVersion".into(),
            Value::String(plugin.cni_version.clone().unwrap_or_default()),
        );
        raw.insert(
            "name".into(),
            Value::String(plugin.name.clone().unwrap_or_default()),
        );
        raw.insert(
            "plugins".into(),
            Value::Array(vec![Value::Object(plugin.raw.clone())]),
        );
        let bytes = serde_json::to_vec(&raw).map_err(|e| Error::Encode {
            what: format!("{}", plugin.origin),
            source: e,
        })?;
        let mut list = NetworkConfigList::parse(&bytes, plugin.origin.clone())?;
        // Keep the original plugin (its bytes and origin) rather than the re-parsed copy.
        list.plugins = vec![plugin];
        Ok(list)
    }

    /// Builds a list from a JSON value (bytes are its serialization).
    pub fn from_value(value: &Value) -> Result<Self, Error> {
        let bytes = serde_json::to_vec(value).map_err(|e| Error::Encode {
            what: "network configuration list".into(),
            source: e,
        })?;
        NetworkConfigList::from_bytes(&bytes, None)
    }

    /// The network name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version the list runs at: the highest supported of `cniVersion`
    /// and `cniVersions` (see [`select_version`]).
    pub fn version(&self) -> Version {
        self.version
    }

    /// `cniVersion` as written, if present.
    pub fn cni_version_field(&self) -> Option<&str> {
        self.cni_version.as_deref()
    }

    /// `cniVersions` as written.
    pub fn cni_versions_field(&self) -> &[String] {
        &self.cni_versions
    }

    /// `disableCheck`: CHECK is a no-op.
    pub fn disable_check(&self) -> bool {
        self.disable_check
    }

    /// `disableGC`: GC is a no-op.
    pub fn disable_gc(&self) -> bool {
        self.disable_gc
    }

    /// `loadOnlyInlinedPlugins`: plugin files are not read.
    pub fn load_only_inlined_plugins(&self) -> bool {
        self.load_only_inlined_plugins
    }

    /// The plugins, in ADD order.
    pub fn plugins(&self) -> &[PluginConfig] {
        &self.plugins
    }

    /// The JSON object of the list exactly as parsed.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// The source bytes of the list (the file as read).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Where the list came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The bytes to store in the result cache: the file's bytes when all
    /// plugins are inline (byte-identical to what libcni stores), otherwise a
    /// self-contained list with the plugin files' objects appended to
    /// `plugins` and `loadOnlyInlinedPlugins` set, so that reading the cache
    /// back (DEL after the conf dir changed) yields the same plugins.
    pub fn cache_bytes(&self) -> Vec<u8> {
        if self.plugins.len() == self.inline_plugins {
            return self.bytes.clone();
        }
        let mut raw = self.raw.clone();
        raw.insert(
            "plugins".into(),
            Value::Array(
                self.plugins
                    .iter()
                    .map(|p| Value::Object(p.raw.clone()))
                    .collect(),
            ),
        );
        raw.insert("loadOnlyInlinedPlugins".into(), Value::Bool(true));
        serde_json::to_vec(&raw).unwrap_or_else(|_| self.bytes.clone())
    }

    /// All capabilities that some plugin enables, deduplicated, in order of
    /// first appearance.
    pub fn capabilities(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for p in &self.plugins {
            for (cap, on) in &p.capabilities {
                if *on && !out.contains(cap) {
                    out.push(cap.clone());
                }
            }
        }
        out
    }
}

fn optional_string(
    raw: &Map<String, Value>,
    key: &str,
    origin: &Origin,
) -> Result<Option<String>, Error> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Error::invalid_config(
            origin,
            format!("field '{key}' must be a string, got {}", json_kind(other)),
        )),
    }
}

/// A boolean that may also be written as the string "true"/"false" in any case.
fn read_bool(raw: &Map<String, Value>, key: &str, origin: &Origin) -> Result<bool, Error> {
    match raw.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(Value::String(s)) => Err(Error::invalid_config(
            origin,
            format!("field '{key}' has invalid value {s:?} (expected true or false)"),
        )),
        Some(other) => Err(Error::invalid_config(
            origin,
            format!("field '{key}' must be a boolean, got {}", json_kind(other)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bool_or_string_flags() {
        for (v, want) in [
            ("true", Some(true)),
            ("false", Some(false)),
            ("\"true\"", Some(true)),
            ("\"TRUE\"", Some(true)),
            ("\"False\"", Some(false)),
            ("\"yes\"", None),
            ("1", None),
            ("null", None),
        ] {
            let json = format!(
                r#"{{"name":"n","cniVersion":"1.0.0","disableCheck":{v},"disableGC":{v},"plugins":[{{"type":"x"}}]}}"#
            );
            match (NetworkConfigList::from_bytes(json.as_bytes(), None), want) {
                (Ok(l), Some(w)) => {
                    assert_eq!(l.disable_check(), w, "{v}");
                    assert_eq!(l.disable_gc(), w, "{v}");
                }
                (Err(e), None) => assert!(e.to_string().contains("disableCheck"), "{e}"),
                (r, w) => panic!("{v}: got {r:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn list_errors_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("[]", "expected a JSON object"),
            ("{", "not valid JSON"),
            (r#"{"cniVersion":"1.0.0"}"#, "missing 'name'"),
            (r#"{"name":1}"#, "field 'name' must be a string"),
            (
                r#"{"name":"n","cniVersion":1}"#,
                "field 'cniVersion' must be a string",
            ),
            (r#"{"name":"n","cniVersion":"0.5.0"}"#, "field 'cniVersion'"),
            (
                r#"{"name":"n","cniVersions":"1.0.0"}"#,
                "field 'cniVersions' must be an array",
            ),
            (r#"{"name":"n","cniVersions":[1]}"#, "cniVersions[0]"),
            (r#"{"name":"n","plugins":[]}"#, "no plugins in list"),
            (
                r#"{"name":"n","plugins":{}}"#,
                "field 'plugins' must be an array",
            ),
            (
                r#"{"name":"n","plugins":[{}]}"#,
                "plugins[0]: missing 'type'",
            ),
            (r#"{"name":"n","plugins":[{"type":""}]}"#, "missing 'type'"),
            (
                r#"{"name":"n","plugins":[{"type":"../x"}]}"#,
                "path separator",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"x","capabilities":[]}]}"#,
                "field 'capabilities' must be an object",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"x","capabilities":{"mac":1}}]}"#,
                "capabilities.mac",
            ),
            (
                r#"{"name":"n","loadOnlyInlinedPlugins":true}"#,
                "no 'plugins' field",
            ),
        ];
        for (json, want) in cases {
            let e =
                NetworkConfigList::from_bytes(json.as_bytes(), Some(Path::new("/x/10-n.conflist")))
                    .unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(want), "{json}: {msg}");
            assert!(msg.contains("/x/10-n.conflist"), "{json}: {msg}");
            assert_eq!(e.code(), 7);
        }
    }

    #[test]
    fn raw_is_kept_exactly() {
        let src = r#"{"name":"n","cniVersion":"1.0.0","z":1,"a":{"deep":[1,2.50,"<&>\u00e9"]},"plugins":[{"type":"x","n":123456789012345678901234567890,"k":"ü"}]}"#;
        let l = NetworkConfigList::from_bytes(src.as_bytes(), None).unwrap();
        assert_eq!(l.bytes(), src.as_bytes());
        let keys: Vec<&String> = l.raw().keys().collect();
        assert_eq!(keys, ["name", "cniVersion", "z", "a", "plugins"]);
        assert_eq!(
            String::from_utf8(l.plugins()[0].bytes().to_vec()).unwrap(),
            r#"{"type":"x","n":123456789012345678901234567890,"k":"ü"}"#
        );
        assert_eq!(l.raw()["a"]["deep"][1].to_string(), "2.50");
    }

    #[test]
    fn upconversion_of_a_single_conf() {
        let p = PluginConfig::from_bytes(
            br#"{"cniVersion":"0.4.0","name":"single","type":"bridge","bridge":"br9"}"#,
            Some(Path::new("/c/10-single.conf")),
        )
        .unwrap();
        let l = NetworkConfigList::from_plugin(p).unwrap();
        assert_eq!(l.name(), "single");
        assert_eq!(l.version(), Version::V0_4_0);
        assert_eq!(l.plugins().len(), 1);
        assert_eq!(l.plugins()[0].raw()["bridge"], "br9");
        assert_eq!(
            String::from_utf8(l.bytes().to_vec()).unwrap(),
            r#"{"cniVersion":"0.4.0","name":"single","plugins":[{"cniVersion":"0.4.0","name":"single","type":"bridge","bridge":"br9"}]}"#
        );
        assert_eq!(l.origin(), &Origin::File("/c/10-single.conf".into()));
    }

    #[test]
    fn capabilities_union() {
        let l = NetworkConfigList::from_bytes(
            br#"{"name":"n","cniVersion":"1.0.0","plugins":[
                {"type":"a","capabilities":{"portMappings":true,"mac":false}},
                {"type":"b","capabilities":{"bandwidth":true,"portMappings":true}}]}"#,
            None,
        )
        .unwrap();
        assert_eq!(l.capabilities(), ["portMappings", "bandwidth"]);
        assert!(!l.plugins()[0].capability_enabled("mac"));
    }
}
