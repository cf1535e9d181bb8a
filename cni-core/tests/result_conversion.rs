//! Table tests: every result converted between all seven versions, with the
//! exact JSON expected for each pair.
//!
//! The examples come from the spec (SPEC.md 1.1.0, appendix "Add example"),
//! from libcni's own tests (`pkg/types/020`, `040` and `100` `types_test.go`,
//! whose expected JSON is reused verbatim) and from cases that exercise the
//! conversion rules (1.1.0 route fields, several addresses per family,
//! routes without an address of their family, empty DNS).

use cni_core::result::CniResult;
use cni_core::version::{ResultFamily, SUPPORTED_VERSIONS, Version};
use serde_json::{Map, Value, json};

/// Compares JSON as values; on mismatch shows a diff of both, pretty-printed
/// with sorted keys so that key order does not clutter it.
#[track_caller]
fn assert_json_eq(actual: &Value, expected: &Value, context: &str) {
    if actual != expected {
        pretty_assertions::assert_eq!(
            pretty_sorted(actual),
            pretty_sorted(expected),
            "JSON differs: {}",
            context
        );
    }
}

fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn pretty_sorted(v: &Value) -> String {
    serde_json::to_string_pretty(&sorted(v)).unwrap()
}

/// `v` with `"cniVersion": version` as its first key.
fn labelled(v: &Value, version: Version) -> Value {
    let mut out = Map::new();
    out.insert("cniVersion".into(), Value::from(version.to_string()));
    for (k, val) in v.as_object().expect("fixtures are objects") {
        out.insert(k.clone(), val.clone());
    }
    Value::Object(out)
}

/// One result in every shape it takes. The canonical form of each family is
/// the result converted down from the richest form; the `*_from_*` forms are
/// what converting a lower canonical form up gives.
struct Scenario {
    name: &'static str,
    v1: Value,
    v04: Value,
    v02: Value,
    v1_from_v04: Value,
    v04_from_v02: Value,
    v1_from_v02: Value,
}

impl Scenario {
    fn canonical(&self, family: ResultFamily) -> &Value {
        match family {
            ResultFamily::V02 => &self.v02,
            ResultFamily::V04 => &self.v04,
            ResultFamily::V1 => &self.v1,
        }
    }

    fn expected(&self, from: ResultFamily, to: ResultFamily) -> &Value {
        use ResultFamily::*;
        match (from, to) {
            (_, V02) => &self.v02,
            (V02, V04) => &self.v04_from_v02,
            (_, V04) => &self.v04,
            (V02, V1) => &self.v1_from_v02,
            (V04, V1) => &self.v1_from_v04,
            (V1, V1) => &self.v1,
        }
    }

    /// Converts the canonical form of every version to every version.
    fn check_all_pairs(&self) {
        for &from in &SUPPORTED_VERSIONS {
            let input = labelled(self.canonical(from.family()), from);
            let parsed = CniResult::parse(input.to_string().as_bytes(), Version::V1_1_0)
                .unwrap_or_else(|e| panic!("{}: parsing the {from} form: {e}", self.name));
            assert_eq!(parsed.version(), from);
            for &to in &SUPPORTED_VERSIONS {
                let context = format!("{}: {from} -> {to}", self.name);
                let converted = parsed
                    .convert(to)
                    .unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!(converted.version(), to, "{context}");
                assert_eq!(converted.family(), to.family(), "{context}");
                let expected = labelled(self.expected(from.family(), to.family()), to);
                assert_json_eq(&converted.to_value(), &expected, &context);
                // The text forms carry the same JSON.
                let text: Value = serde_json::from_str(&converted.to_json()).unwrap();
                assert_json_eq(&text, &expected, &format!("{context} (to_json)"));
                let pretty: Value = serde_json::from_str(&converted.to_json_pretty()).unwrap();
                assert_json_eq(&pretty, &expected, &format!("{context} (to_json_pretty)"));
            }
            // The current view is the 1.1.0 conversion.
            let current = parsed.to_current();
            assert_eq!(current.cni_version, Version::V1_1_0);
            assert_json_eq(
                &current.to_value(),
                &labelled(
                    self.expected(from.family(), ResultFamily::V1),
                    Version::V1_1_0,
                ),
                &format!("{}: {from} to_current", self.name),
            );
        }
    }
}

fn libcni_dns() -> Value {
    json!({
        "nameservers": ["1.2.3.4", "1::cafe"],
        "domain": "acompany.com",
        "search": ["somedomain.com", "otherdomain.net"],
        "options": ["foo", "bar"]
    })
}

/// libcni's `testResult()` of `pkg/types/100/types_test.go` and the JSON its
/// tests expect for 1.1.0, 0.4.0 and 0.1.0.
fn libcni_test_result() -> Scenario {
    let routes = json!([
        {"dst": "15.5.6.0/24", "gw": "15.5.6.8"},
        {"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}
    ]);
    Scenario {
        name: "libcni testResult",
        v1: json!({
            "interfaces": [{
                "name": "eth0",
                "mac": "00:11:22:33:44:55",
                "mtu": 1500,
                "sandbox": "/proc/3553/ns/net",
                "pciID": "8086:9a01",
                "socketPath": "/path/to/vhost/fd"
            }],
            "ips": [
                {"interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"interface": 0, "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"}
            ],
            "routes": routes,
            "dns": libcni_dns()
        }),
        v04: json!({
            "interfaces": [{
                "name": "eth0",
                "mac": "00:11:22:33:44:55",
                "sandbox": "/proc/3553/ns/net"
            }],
            "ips": [
                {"interface": 0, "version": "4", "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"interface": 0, "version": "6", "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"}
            ],
            "routes": routes,
            "dns": libcni_dns()
        }),
        v02: json!({
            "ip4": {
                "ip": "1.2.3.30/24",
                "gateway": "1.2.3.1",
                "routes": [{"dst": "15.5.6.0/24", "gw": "15.5.6.8"}]
            },
            "ip6": {
                "ip": "abcd:1234:ffff::cdde/64",
                "gateway": "abcd:1234:ffff::1",
                "routes": [{"dst": "1111:dddd::/80", "gw": "1111:dddd::aaaa"}]
            },
            "dns": libcni_dns()
        }),
        v1_from_v04: json!({
            "interfaces": [{
                "name": "eth0",
                "mac": "00:11:22:33:44:55",
                "sandbox": "/proc/3553/ns/net"
            }],
            "ips": [
                {"interface": 0, "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"interface": 0, "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"}
            ],
            "routes": routes,
            "dns": libcni_dns()
        }),
        v04_from_v02: json!({
            "ips": [
                {"version": "4", "address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"version": "6", "address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"}
            ],
            "routes": routes,
            "dns": libcni_dns()
        }),
        v1_from_v02: json!({
            "ips": [
                {"address": "1.2.3.30/24", "gateway": "1.2.3.1"},
                {"address": "abcd:1234:ffff::cdde/64", "gateway": "abcd:1234:ffff::1"}
            ],
            "routes": routes,
            "dns": libcni_dns()
        }),
    }
}

/// The `bridge` result of the spec's appendix ("Add example").
fn spec_bridge_result() -> Scenario {
    let interfaces = json!([
        {"name": "cni0", "mac": "00:11:22:33:44:55"},
        {"name": "veth3243", "mac": "55:44:33:22:11:11"},
        {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
    ]);
    let routes = json!([{"dst": "0.0.0.0/0"}]);
    let dns = json!({"nameservers": ["10.1.0.1"]});
    Scenario {
        name: "spec bridge result",
        v1: json!({
            "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
            "routes": routes,
            "interfaces": interfaces,
            "dns": dns
        }),
        v04: json!({
            "interfaces": interfaces,
            "ips": [{"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
            "routes": routes,
            "dns": dns
        }),
        v02: json!({
            "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1", "routes": routes},
            "dns": dns
        }),
        v1_from_v04: json!({
            "interfaces": interfaces,
            "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 2}],
            "routes": routes,
            "dns": dns
        }),
        v04_from_v02: json!({
            "ips": [{"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
            "routes": routes,
            "dns": dns
        }),
        v1_from_v02: json!({
            "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
            "routes": routes,
            "dns": dns
        }),
    }
}

/// The `host-local` (IPAM) result of the spec's appendix: no interfaces.
fn spec_host_local_result() -> Scenario {
    let v1 = json!({
        "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.1.0.1"]}
    });
    let v04 = json!({
        "ips": [{"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.1.0.1"]}
    });
    Scenario {
        name: "spec host-local result",
        v1: v1.clone(),
        v04: v04.clone(),
        v02: json!({
            "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
            "dns": {"nameservers": ["10.1.0.1"]}
        }),
        v1_from_v04: v1.clone(),
        v04_from_v02: v04,
        v1_from_v02: v1,
    }
}

/// A 1.1.0 result using every 1.1.0 field, several addresses of one family,
/// an IPv6 address without gateway or interface, and a route to a family
/// that only the first address of each family carries to 0.2.0.
fn rich_v11_result() -> Scenario {
    let v11_routes = json!([
        {"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 100, "table": 0, "scope": 0},
        {"dst": "fd00::/8"},
        {"dst": "192.168.0.0/16", "table": 254, "scope": 253}
    ]);
    let dns = json!({"domain": "example.test"});
    Scenario {
        name: "1.1.0 with every field",
        v1: json!({
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {
                    "name": "eth0",
                    "mac": "99:88:77:66:55:44",
                    "mtu": 9000,
                    "sandbox": "/var/run/netns/blue",
                    "socketPath": "/run/vhost/eth0.sock",
                    "pciID": "0000:3b:00.1"
                }
            ],
            "ips": [
                {"interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"interface": 1, "address": "10.1.0.6/16"},
                {"address": "fd00::5/64"},
                {"interface": 0, "address": "fd00::6/64", "gateway": "fd00::1"}
            ],
            "routes": v11_routes,
            "dns": dns
        }),
        v04: json!({
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
            ],
            "ips": [
                {"version": "4", "interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"version": "4", "interface": 1, "address": "10.1.0.6/16"},
                {"version": "6", "address": "fd00::5/64"},
                {"version": "6", "interface": 0, "address": "fd00::6/64", "gateway": "fd00::1"}
            ],
            "routes": v11_routes,
            "dns": dns
        }),
        v02: json!({
            "ip4": {
                "ip": "10.1.0.5/16",
                "gateway": "10.1.0.1",
                "routes": [
                    {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                    {"dst": "192.168.0.0/16"}
                ]
            },
            "ip6": {"ip": "fd00::5/64", "routes": [{"dst": "fd00::/8"}]},
            "dns": dns
        }),
        v1_from_v04: json!({
            "interfaces": [
                {"name": "cni0", "mac": "00:11:22:33:44:55"},
                {"name": "eth0", "mac": "99:88:77:66:55:44", "sandbox": "/var/run/netns/blue"}
            ],
            "ips": [
                {"interface": 1, "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"interface": 1, "address": "10.1.0.6/16"},
                {"address": "fd00::5/64"},
                {"interface": 0, "address": "fd00::6/64", "gateway": "fd00::1"}
            ],
            "routes": v11_routes,
            "dns": dns
        }),
        v04_from_v02: json!({
            "ips": [
                {"version": "4", "address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"version": "6", "address": "fd00::5/64"}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                {"dst": "192.168.0.0/16"},
                {"dst": "fd00::/8"}
            ],
            "dns": dns
        }),
        v1_from_v02: json!({
            "ips": [
                {"address": "10.1.0.5/16", "gateway": "10.1.0.1"},
                {"address": "fd00::5/64"}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "10.1.0.1"},
                {"dst": "192.168.0.0/16"},
                {"dst": "fd00::/8"}
            ],
            "dns": dns
        }),
    }
}

/// IPv6 only, no DNS: the IPv4 route has nowhere to go in 0.2.0, and 1.x
/// leaves out the empty `dns` that 0.x always writes.
fn v6_only_without_dns() -> Scenario {
    Scenario {
        name: "IPv6 only, empty DNS",
        v1: json!({
            "interfaces": [{"name": "net1", "sandbox": "/proc/42/ns/net"}],
            "ips": [{"interface": 0, "address": "2001:db8::2/64", "gateway": "2001:db8::1"}],
            "routes": [{"dst": "::/0", "gw": "2001:db8::1"}, {"dst": "10.0.0.0/8"}]
        }),
        v04: json!({
            "interfaces": [{"name": "net1", "sandbox": "/proc/42/ns/net"}],
            "ips": [{"version": "6", "interface": 0, "address": "2001:db8::2/64", "gateway": "2001:db8::1"}],
            "routes": [{"dst": "::/0", "gw": "2001:db8::1"}, {"dst": "10.0.0.0/8"}],
            "dns": {}
        }),
        v02: json!({
            "ip6": {
                "ip": "2001:db8::2/64",
                "gateway": "2001:db8::1",
                "routes": [{"dst": "::/0", "gw": "2001:db8::1"}]
            },
            "dns": {}
        }),
        v1_from_v04: json!({
            "interfaces": [{"name": "net1", "sandbox": "/proc/42/ns/net"}],
            "ips": [{"interface": 0, "address": "2001:db8::2/64", "gateway": "2001:db8::1"}],
            "routes": [{"dst": "::/0", "gw": "2001:db8::1"}, {"dst": "10.0.0.0/8"}]
        }),
        v04_from_v02: json!({
            "ips": [{"version": "6", "address": "2001:db8::2/64", "gateway": "2001:db8::1"}],
            "routes": [{"dst": "::/0", "gw": "2001:db8::1"}],
            "dns": {}
        }),
        v1_from_v02: json!({
            "ips": [{"address": "2001:db8::2/64", "gateway": "2001:db8::1"}],
            "routes": [{"dst": "::/0", "gw": "2001:db8::1"}]
        }),
    }
}

#[test]
fn libcni_test_result_converts_between_all_versions() {
    libcni_test_result().check_all_pairs();
}

#[test]
fn spec_bridge_result_converts_between_all_versions() {
    spec_bridge_result().check_all_pairs();
}

#[test]
fn spec_host_local_result_converts_between_all_versions() {
    spec_host_local_result().check_all_pairs();
}

#[test]
fn rich_v11_result_converts_between_all_versions() {
    rich_v11_result().check_all_pairs();
}

#[test]
fn v6_only_result_converts_between_all_versions() {
    v6_only_without_dns().check_all_pairs();
}

/// The spec's examples carry no `cniVersion`: they are read as the version
/// the caller says (the configuration's).
#[test]
fn spec_examples_without_version_take_the_default() {
    let bridge_text = r#"{
    "ips": [
        {
          "address": "10.1.0.5/16",
          "gateway": "10.1.0.1",
          "interface": 2
        }
    ],
    "routes": [
      {
        "dst": "0.0.0.0/0"
      }
    ],
    "interfaces": [
        {
            "name": "cni0",
            "mac": "00:11:22:33:44:55"
        },
        {
            "name": "veth3243",
            "mac": "55:44:33:22:11:11"
        },
        {
            "name": "eth0",
            "mac": "99:88:77:66:55:44",
            "sandbox": "/var/run/netns/blue"
        }
    ],
    "dns": {
      "nameservers": [ "10.1.0.1" ]
    }
}"#;
    let scenario = spec_bridge_result();
    for &default in &SUPPORTED_VERSIONS {
        if default.family() == ResultFamily::V02 {
            continue;
        }
        let r = CniResult::parse(bridge_text.as_bytes(), default).unwrap();
        assert_eq!(r.version(), default);
        let expected = labelled(
            scenario.expected(ResultFamily::V1, default.family()),
            default,
        );
        assert_json_eq(&r.to_value(), &expected, &format!("default {default}"));
    }
    // Read as 0.2.0, the rich shape has no `ip4`/`ip6`: an empty 0.2.0 result.
    let r = CniResult::parse(bridge_text.as_bytes(), Version::V0_2_0).unwrap();
    assert_json_eq(
        &r.to_value(),
        &json!({"cniVersion": "0.2.0", "dns": {"nameservers": ["10.1.0.1"]}}),
        "default 0.2.0",
    );
}

/// libcni's 0.2.0 test JSON (`pkg/types/020/types_test.go`), with `""`,
/// `0.1.0` and `0.2.0` as version: 0.2.0 and 0.1.0 convert into each other
/// unchanged, and `""` means 0.1.0.
#[test]
fn libcni_v020_examples() {
    let body = libcni_test_result().v02;
    for (label, version) in [
        ("0.2.0", Version::V0_2_0),
        ("0.1.0", Version::V0_1_0),
        ("", Version::V0_1_0),
    ] {
        let mut input = body.clone();
        input["cniVersion"] = Value::from(label);
        let r = CniResult::from_value(&input, Version::V0_1_0).unwrap();
        assert_eq!(r.version(), version);
        assert_json_eq(&r.to_value(), &labelled(&body, version), label);
    }
}

/// The exact text of a 1.1.0 result: keys in the spec's order, no empty
/// lists, `interface` 0 kept, four-space indentation like libcni's `Print`.
#[test]
fn text_output_is_stable() {
    let r = CniResult::from_value(
        &json!({
            "dns": {},
            "routes": [],
            "ips": [{"gateway": "10.0.0.1", "address": "10.0.0.2/24", "interface": 0}],
            "interfaces": [{"sandbox": "/n", "name": "eth0"}],
            "cniVersion": "1.1.0"
        }),
        Version::V1_1_0,
    )
    .unwrap();
    assert_eq!(
        r.to_json(),
        r#"{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/n"}],"ips":[{"interface":0,"address":"10.0.0.2/24","gateway":"10.0.0.1"}]}"#
    );
    let down = r.convert(Version::V0_4_0).unwrap();
    assert_eq!(
        down.to_json_pretty(),
        r#"{
    "cniVersion": "0.4.0",
    "interfaces": [
        {
            "name": "eth0",
            "sandbox": "/n"
        }
    ],
    "ips": [
        {
            "version": "4",
            "interface": 0,
            "address": "10.0.0.2/24",
            "gateway": "10.0.0.1"
        }
    ],
    "dns": {}
}"#
    );
}
