//! Network configuration lists and plugin configurations (`.conflist`,
//! `.conf`, the `config` of a cache record): parsing, and the stdin built
//! from them for every verb.
//!
//! Properties, for any input:
//! - parsing never panics;
//! - a parsed list runs at a supported version and keeps its bytes;
//! - the stdin of every plugin for ADD, DEL, CHECK, STATUS and GC is valid
//!   JSON, equal to `plugin_stdin_value`, with `name` and `cniVersion` as
//!   injected, no `capabilities` for ADD, DEL and CHECK (unchanged for
//!   STATUS and GC), no `cni.dev/` key except the two GC keys
//!   (GC only), every other key of the plugin unchanged, `runtimeConfig`
//!   exactly the enabled capabilities that have arguments (or the static one),
//!   `prevResult` as given;
//! - `cache_bytes()` and the re-serialized object re-parse to the same
//!   network (name, version, flags, plugins);
//! - a single plugin configuration upconverts to a list exactly when its
//!   version is one we can run, and that list holds the plugin unchanged.
#![no_main]

use cni_core::args::RuntimeConf;
use cni_core::config::{NetworkConfigList, PluginConfig};
use cni_core::stdin::{
    GcAttachment, LEGACY_ATTACHMENTS_KEY, RESERVED_PREFIX, StdinInput, VALID_ATTACHMENTS_KEY,
    list_plugin_stdin, plugin_stdin, plugin_stdin_value,
};
use cni_core::version::{Version, select_version};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

/// Capabilities for which the runtime always has arguments; the list's own
/// capabilities at even positions are added per input, so plugins see
/// both matching and unmatched capabilities.
const FIXED_CAPS: [&str; 4] = ["portMappings", "mac", "bandwidth", "ips"];

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = NetworkConfigList::from_bytes(data, None) {
        check_list(&list, data);
    }
    if let Ok(plugin) = PluginConfig::from_bytes(data, None) {
        check_plugin(&plugin, data);
    }
});

fn runtime_conf(list: &NetworkConfigList) -> RuntimeConf {
    let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    for cap in FIXED_CAPS {
        rt.capability_args.insert(cap, json!({"from": cap}));
    }
    for cap in list.capabilities().into_iter().step_by(2) {
        let value = json!([cap.clone(), 1]);
        rt.capability_args.insert(cap, value);
    }
    rt
}

fn check_list(list: &NetworkConfigList, data: &[u8]) {
    assert!(list.version().is_supported(), "{}", list.version());
    assert_eq!(list.bytes(), data);
    assert_eq!(list.raw().get("name"), Some(&Value::from(list.name())));
    let caps = list.capabilities();
    for (i, c) in caps.iter().enumerate() {
        assert!(!caps[..i].contains(c), "capability {c:?} listed twice");
    }

    let rt = runtime_conf(list);
    let prev =
        json!({"cniVersion": list.version().to_string(), "ips": [{"address": "10.0.0.2/24"}]});
    let valid = [GcAttachment {
        container_id: "c1".into(),
        ifname: "eth0".into(),
    }];
    let inputs = [
        (
            "ADD",
            StdinInput::Attachment {
                rt: &rt,
                prev_result: None,
            },
        ),
        (
            "DEL",
            StdinInput::Attachment {
                rt: &rt,
                prev_result: Some(&prev),
            },
        ),
        (
            "CHECK",
            StdinInput::Attachment {
                rt: &rt,
                prev_result: Some(&prev),
            },
        ),
        ("STATUS", StdinInput::Status),
        (
            "GC",
            StdinInput::Gc {
                valid_attachments: &valid,
            },
        ),
    ];
    for (index, plugin) in list.plugins().iter().enumerate() {
        for (verb, input) in inputs {
            let bytes = list_plugin_stdin(list, index, input)
                .unwrap_or_else(|e| panic!("{verb} stdin of plugin {index}: {e}"));
            let value = plugin_stdin_value(list.name(), list.version(), plugin, input);
            check_stdin(
                verb,
                &bytes,
                &value,
                list.name(),
                list.version(),
                plugin,
                &rt,
                input,
            );
        }
    }

    // What the cache stores reads back as the same network.
    let cached = NetworkConfigList::from_bytes(&list.cache_bytes(), None)
        .unwrap_or_else(|e| panic!("cache_bytes() do not re-parse: {e}"));
    assert_same_network(list, &cached);
    // So does the object as we hold it, serialized again.
    let again = NetworkConfigList::from_value(&Value::Object(list.raw().clone()))
        .unwrap_or_else(|e| panic!("the parsed object does not re-parse: {e}"));
    assert_same_network(list, &again);
}

fn assert_same_network(a: &NetworkConfigList, b: &NetworkConfigList) {
    assert_eq!(a.name(), b.name());
    assert_eq!(a.version(), b.version());
    assert_eq!(a.disable_check(), b.disable_check());
    assert_eq!(a.disable_gc(), b.disable_gc());
    assert_eq!(a.load_only_inlined_plugins(), b.load_only_inlined_plugins());
    assert_eq!(a.plugins().len(), b.plugins().len());
    for (p, q) in a.plugins().iter().zip(b.plugins()) {
        assert_eq!(p.plugin_type(), q.plugin_type());
        assert_eq!(p.raw(), q.raw());
        assert_eq!(p.capabilities(), q.capabilities());
    }
    assert_eq!(a.capabilities(), b.capabilities());
}

#[allow(clippy::too_many_arguments)]
fn check_stdin(
    verb: &str,
    bytes: &[u8],
    value: &Map<String, Value>,
    network: &str,
    version: Version,
    plugin: &PluginConfig,
    rt: &RuntimeConf,
    input: StdinInput<'_>,
) {
    let parsed: Value =
        serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{verb} stdin is not JSON: {e}"));
    let Value::Object(obj) = parsed else {
        panic!("{verb} stdin is not an object");
    };
    assert_eq!(
        &obj, value,
        "{verb}: stdin bytes and plugin_stdin_value differ"
    );
    assert_eq!(obj.get("name"), Some(&Value::from(network)), "{verb}: name");
    assert_eq!(
        obj.get("cniVersion"),
        Some(&Value::from(version.to_string())),
        "{verb}: cniVersion"
    );
    // `capabilities` must not be set for the attachment verbs; STATUS and
    // GC get it as the plugin has it (SPEC.md, "Deriving request
    // configuration from plugin configuration").
    if matches!(input, StdinInput::Attachment { .. }) {
        assert!(
            !obj.contains_key("capabilities"),
            "{verb}: capabilities passed"
        );
    } else {
        assert_eq!(
            obj.get("capabilities"),
            plugin.raw().get("capabilities"),
            "{verb}: capabilities altered"
        );
    }
    for key in obj.keys().filter(|k| k.starts_with(RESERVED_PREFIX)) {
        let gc_key = key == VALID_ATTACHMENTS_KEY || key == LEGACY_ATTACHMENTS_KEY;
        assert!(
            gc_key && matches!(input, StdinInput::Gc { .. }),
            "{verb}: reserved key {key:?} in stdin"
        );
    }
    // Every other key of the plugin passes through unchanged.
    const SET_BY_RUNTIME: [&str; 4] = ["name", "cniVersion", "runtimeConfig", "prevResult"];
    for (k, v) in plugin.raw() {
        if k == "capabilities"
            || k.starts_with(RESERVED_PREFIX)
            || SET_BY_RUNTIME.contains(&k.as_str())
        {
            continue;
        }
        assert_eq!(obj.get(k), Some(v), "{verb}: key {k:?} altered");
    }
    match input {
        StdinInput::Attachment { rt: _, prev_result } => {
            let mut want = Map::new();
            for (cap, on) in plugin.capabilities() {
                if let (true, Some(arg)) = (*on, rt.capability_args.get(cap)) {
                    want.insert(cap.clone(), arg.clone());
                }
            }
            let want = if want.is_empty() {
                plugin.raw().get("runtimeConfig").cloned()
            } else {
                Some(Value::Object(want))
            };
            assert_eq!(
                obj.get("runtimeConfig"),
                want.as_ref(),
                "{verb}: runtimeConfig"
            );
            let want_prev = prev_result.or_else(|| plugin.raw().get("prevResult"));
            assert_eq!(obj.get("prevResult"), want_prev, "{verb}: prevResult");
        }
        StdinInput::Status => {
            assert_eq!(obj.get("runtimeConfig"), plugin.raw().get("runtimeConfig"));
            assert_eq!(obj.get("prevResult"), plugin.raw().get("prevResult"));
        }
        StdinInput::Gc { valid_attachments } => {
            let list = serde_json::to_value(valid_attachments).expect("attachments serialize");
            assert_eq!(obj.get(VALID_ATTACHMENTS_KEY), Some(&list));
            assert_eq!(obj.get(LEGACY_ATTACHMENTS_KEY), Some(&list));
        }
    }
}

fn check_plugin(plugin: &PluginConfig, data: &[u8]) {
    assert_eq!(plugin.bytes(), data);
    assert!(!plugin.plugin_type().is_empty());
    assert!(cni_core::validate::plugin_type(plugin.plugin_type()).is_ok());

    // The object re-serialized parses to the same plugin.
    let again = PluginConfig::from_value(Value::Object(plugin.raw().clone()))
        .unwrap_or_else(|e| panic!("the parsed plugin does not re-parse: {e}"));
    assert_eq!(again.raw(), plugin.raw());
    assert_eq!(again.plugin_type(), plugin.plugin_type());
    assert_eq!(again.name(), plugin.name());
    assert_eq!(again.cni_version(), plugin.cni_version());
    assert_eq!(again.capabilities(), plugin.capabilities());

    // Upconversion to a list of one (libcni's ConfListFromConf) works exactly
    // when the plugin's own version is one we can run.
    let runnable = select_version(plugin.cni_version(), &[]);
    match (NetworkConfigList::from_plugin(plugin.clone()), runnable) {
        (Ok(list), Ok(v)) => {
            assert_eq!(list.version(), v);
            assert_eq!(list.name(), plugin.name().unwrap_or_default());
            assert_eq!(list.plugins(), std::slice::from_ref(plugin));
            let cached = NetworkConfigList::from_bytes(&list.cache_bytes(), None)
                .unwrap_or_else(|e| panic!("cache_bytes() of an upconverted plugin: {e}"));
            assert_same_network(&list, &cached);
            for verb in [
                StdinInput::Status,
                StdinInput::Gc {
                    valid_attachments: &[],
                },
            ] {
                let bytes = plugin_stdin(list.name(), v, plugin, verb).expect("stdin builds");
                let obj: Value = serde_json::from_slice(&bytes).expect("stdin is JSON");
                assert_eq!(obj["cniVersion"], Value::from(v.to_string()));
                assert_eq!(obj.get("capabilities"), plugin.raw().get("capabilities"));
            }
        }
        (Err(_), Err(_)) => {}
        (Ok(list), Err(e)) => panic!("upconverted at {} although {e}", list.version()),
        (Err(e), Ok(v)) => panic!("upconversion failed although {v} is runnable: {e}"),
    }
}
