//! Per-plugin stdin building for every verb (CNI spec, section 3: deriving the execution
//! configuration from the plugin configuration; `docs/decisions.md` D5).

use crate::support::{assert_json_eq, json};
use cni_core::stdin::{GcAttachment, StdinInput, list_plugin_stdin, plugin_stdin};
use cni_core::{NetworkConfigList, RuntimeConf, Version};
use serde_json::{Value, json};

/// The spec's example network (section 1), comments removed.
const DBNET: &str = r#"{
  "cniVersion": "1.1.0",
  "cniVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"],
  "name": "dbnet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "keyA": ["some more", "plugin specific", "configuration"],
      "ipam": {
        "type": "host-local",
        "subnet": "10.1.0.0/16",
        "gateway": "10.1.0.1",
        "routes": [{"dst": "0.0.0.0/0"}]
      },
      "dns": {"nameservers": ["10.1.0.1"]}
    },
    {"type": "tuning", "capabilities": {"mac": true}, "sysctl": {"net.core.somaxconn": "500"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}"#;

fn dbnet() -> NetworkConfigList {
    NetworkConfigList::from_bytes(DBNET.as_bytes(), None).unwrap()
}

/// The runtime of the spec's appendix: portmap and mac capability args, argA=foo.
fn spec_rt() -> RuntimeConf {
    let mut rt = RuntimeConf::new("dbcontainer", "/var/run/netns/blue", "eth0");
    rt.args = "argA=foo".parse().unwrap();
    rt.capability_args.insert(
        "portMappings",
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    rt.capability_args.insert("mac", json!("00:11:22:33:44:66"));
    rt
}

fn bridge_result() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "cni0", "mac": "00:11:22:33:44:55"},
            {"name": "veth3243", "mac": "55:44:33:22:11:11"},
            {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
        ],
        "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.1.0.1"]}
    })
}

#[test]
fn spec_appendix_add_chain() {
    let list = dbnet();
    let rt = spec_rt();
    // 1) bridge: no capabilities declared, no prevResult.
    let stdin = list_plugin_stdin(
        &list,
        0,
        StdinInput::Attachment {
            rt: &rt,
            prev_result: None,
        },
    )
    .unwrap();
    assert_json_eq(
        &json(&stdin),
        &json!({
            "type": "bridge",
            "bridge": "cni0",
            "keyA": ["some more", "plugin specific", "configuration"],
            "ipam": {"type": "host-local", "subnet": "10.1.0.0/16", "gateway": "10.1.0.1",
                     "routes": [{"dst": "0.0.0.0/0"}]},
            "dns": {"nameservers": ["10.1.0.1"]},
            "name": "dbnet",
            "cniVersion": "1.1.0"
        }),
    );
    // 2) tuning: mac only, prevResult from bridge, capabilities removed.
    let prev = bridge_result();
    let stdin = list_plugin_stdin(
        &list,
        1,
        StdinInput::Attachment {
            rt: &rt,
            prev_result: Some(&prev),
        },
    )
    .unwrap();
    assert_json_eq(
        &json(&stdin),
        &json!({
            "type": "tuning",
            "sysctl": {"net.core.somaxconn": "500"},
            "name": "dbnet",
            "cniVersion": "1.1.0",
            "runtimeConfig": {"mac": "00:11:22:33:44:66"},
            "prevResult": bridge_result()
        }),
    );
    // 3) portmap: portMappings only.
    let stdin = list_plugin_stdin(
        &list,
        2,
        StdinInput::Attachment {
            rt: &rt,
            prev_result: Some(&prev),
        },
    )
    .unwrap();
    let v = json(&stdin);
    assert_json_eq(
        &v["runtimeConfig"],
        &json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}),
    );
    assert!(v.get("capabilities").is_none());
}

#[test]
fn capability_filtering_true_false_undeclared() {
    let list = NetworkConfigList::from_bytes(
        br#"{"cniVersion":"1.0.0","name":"n","plugins":[
            {"type":"a","capabilities":{"portMappings":true,"bandwidth":false}},
            {"type":"b"},
            {"type":"c","capabilities":{"dns":true}}]}"#,
        None,
    )
    .unwrap();
    let mut rt = RuntimeConf::new("c", "/n", "eth0");
    rt.capability_args
        .insert("bandwidth", json!({"ingressRate": 1}));
    rt.capability_args.insert("portMappings", json!([]));
    rt.capability_args.insert("ips", json!(["10.0.0.1/24"]));
    let input = StdinInput::Attachment {
        rt: &rt,
        prev_result: None,
    };

    // Declared true and provided: passed. Declared false: not. Provided but undeclared: not.
    let a = json(&list_plugin_stdin(&list, 0, input).unwrap());
    assert_json_eq(&a["runtimeConfig"], &json!({"portMappings": []}));
    // No capabilities at all: no runtimeConfig key.
    let b = json(&list_plugin_stdin(&list, 1, input).unwrap());
    assert!(b.get("runtimeConfig").is_none(), "{b}");
    // Declared but not provided: no runtimeConfig key.
    let c = json(&list_plugin_stdin(&list, 2, input).unwrap());
    assert!(c.get("runtimeConfig").is_none(), "{c}");
    assert!(c.get("capabilities").is_none(), "{c}");
}

#[test]
fn static_runtime_config_kept_or_replaced() {
    let list = NetworkConfigList::from_bytes(
        br#"{"cniVersion":"1.0.0","name":"n","plugins":[
            {"type":"a","capabilities":{"mac":true},"runtimeConfig":{"static":1}}]}"#,
        None,
    )
    .unwrap();
    let none = RuntimeConf::new("c", "/n", "eth0");
    let v = json(
        &list_plugin_stdin(
            &list,
            0,
            StdinInput::Attachment {
                rt: &none,
                prev_result: None,
            },
        )
        .unwrap(),
    );
    assert_json_eq(&v["runtimeConfig"], &json!({"static": 1}));

    let mut mac = RuntimeConf::new("c", "/n", "eth0");
    mac.capability_args
        .insert("mac", json!("aa:bb:cc:dd:ee:ff"));
    let v = json(
        &list_plugin_stdin(
            &list,
            0,
            StdinInput::Attachment {
                rt: &mac,
                prev_result: None,
            },
        )
        .unwrap(),
    );
    assert_json_eq(&v["runtimeConfig"], &json!({"mac": "aa:bb:cc:dd:ee:ff"}));
}

#[test]
fn prev_result_present_or_absent() {
    let list = dbnet();
    let rt = RuntimeConf::new("c", "/n", "eth0");
    let v = json(
        &list_plugin_stdin(
            &list,
            0,
            StdinInput::Attachment {
                rt: &rt,
                prev_result: None,
            },
        )
        .unwrap(),
    );
    assert!(v.get("prevResult").is_none());
    let prev = json!({"cniVersion": "1.1.0", "ips": []});
    let v = json(
        &list_plugin_stdin(
            &list,
            0,
            StdinInput::Attachment {
                rt: &rt,
                prev_result: Some(&prev),
            },
        )
        .unwrap(),
    );
    assert_json_eq(&v["prevResult"], &prev);
}

#[test]
fn name_and_version_override_the_plugins_own_in_place() {
    let list = NetworkConfigList::from_bytes(
        br#"{"cniVersion":"0.4.0","cniVersions":["1.0.0"],"name":"listname","plugins":[
            {"cniVersion":"0.3.1","type":"a","name":"own","x":1}]}"#,
        None,
    )
    .unwrap();
    let rt = RuntimeConf::new("c", "/n", "eth0");
    let stdin = list_plugin_stdin(
        &list,
        0,
        StdinInput::Attachment {
            rt: &rt,
            prev_result: None,
        },
    )
    .unwrap();
    // Key order is kept: overridden keys stay where the file had them.
    assert_eq!(
        std::str::from_utf8(&stdin).unwrap(),
        r#"{"cniVersion":"1.0.0","type":"a","name":"listname","x":1}"#
    );
}

#[test]
fn numbers_unicode_and_html_pass_exactly() {
    // 2^53 + 1 is the first integer float64 cannot hold; libcni rounds it to 2^53.
    let src = r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a",
        "big":9007199254740993,"huge":123456789012345678901234567890,"neg":-9223372036854775809,
        "float":1.10,"exp":1e400,"html":"<script>&amp;</script>","uni":"zürich ☃ \u00e9 \ud83d\ude00",
        "esc":"tab\tquote\"slash\\"}]}"#;
    let list = NetworkConfigList::from_bytes(src.as_bytes(), None).unwrap();
    let rt = RuntimeConf::new("c", "/n", "eth0");
    let stdin = list_plugin_stdin(
        &list,
        0,
        StdinInput::Attachment {
            rt: &rt,
            prev_result: None,
        },
    )
    .unwrap();
    let text = std::str::from_utf8(&stdin).unwrap();
    for want in [
        r#""big":9007199254740993"#,
        r#""huge":123456789012345678901234567890"#,
        r#""neg":-9223372036854775809"#,
        r#""float":1.10"#,
        // The exponent's sign is spelled out but the value stays exact (Go's
        // float64 cannot even parse 1e400).
        r#""exp":1e+400"#,
        r#""html":"<script>&amp;</script>""#,
        "\"uni\":\"zürich ☃ é 😀\"",
        r#""esc":"tab\tquote\"slash\\""#,
    ] {
        assert!(text.contains(want), "missing {want} in {text}");
    }
}

#[test]
fn gc_and_status_inputs() {
    let list = dbnet();
    let valid = vec![
        GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        },
        GcAttachment {
            container_id: "c2".into(),
            ifname: "net1".into(),
        },
    ];
    let v = json(
        &list_plugin_stdin(
            &list,
            2,
            StdinInput::Gc {
                valid_attachments: &valid,
            },
        )
        .unwrap(),
    );
    let want =
        json!([{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1"}]);
    assert_json_eq(&v["cni.dev/valid-attachments"], &want);
    assert_json_eq(&v["cni.dev/attachments"], &want);
    assert!(v.get("runtimeConfig").is_none());
    assert!(v.get("prevResult").is_none());

    let v = json(&list_plugin_stdin(&list, 1, StdinInput::Status).unwrap());
    assert_json_eq(
        &v,
        &json!({"type": "tuning", "capabilities": {"mac": true},
            "sysctl": {"net.core.somaxconn": "500"}, "name": "dbnet", "cniVersion": "1.1.0"}),
    );
}

#[test]
fn single_plugin_form_uses_given_name_and_version() {
    let p = cni_core::PluginConfig::from_bytes(
        br#"{"type":"x","name":"own","cniVersion":"0.3.1"}"#,
        None,
    )
    .unwrap();
    let rt = RuntimeConf::new("c", "/n", "eth0");
    let v = json(
        &plugin_stdin(
            "own",
            Version::V0_3_1,
            &p,
            StdinInput::Attachment {
                rt: &rt,
                prev_result: None,
            },
        )
        .unwrap(),
    );
    assert_json_eq(
        &v,
        &json!({"type": "x", "name": "own", "cniVersion": "0.3.1"}),
    );
}
