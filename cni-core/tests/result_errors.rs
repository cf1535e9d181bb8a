//! Results that must be refused, and the messages that say why.

use cni_core::Error;
use cni_core::error::code;
use cni_core::result::{CniResult, Ip020, Result020, Result040, Result100};
use cni_core::version::{SUPPORTED_VERSIONS, Version};
use serde_json::{Value, json};

fn parse(v: &Value) -> Result<CniResult, Error> {
    CniResult::from_value(v, Version::V1_1_0)
}

fn message(v: Value) -> String {
    match parse(&v) {
        Ok(r) => panic!("accepted {v}: {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_ip_cannot_go_to_v02_from_any_richer_version() {
    let body = json!({
        "interfaces": [{"name": "eth0"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.0.0.1"]}
    });
    for &from in SUPPORTED_VERSIONS.iter().filter(|v| **v >= Version::V0_3_0) {
        let mut input = body.clone();
        input["cniVersion"] = Value::from(from.to_string());
        let r = parse(&input).unwrap();
        for to in [Version::V0_1_0, Version::V0_2_0] {
            let err = r.convert(to).unwrap_err();
            assert!(matches!(err, Error::Conversion { .. }), "{err:?}");
            assert_eq!(
                err.to_string(),
                format!(
                    "cannot convert result from {from} to {to}: the result has no IP address, and a {to} result needs at least one (ip4 or ip6)"
                )
            );
            assert_eq!(err.code(), code::INCOMPATIBLE_VERSION);
        }
        // Every other direction works.
        for &to in SUPPORTED_VERSIONS.iter().filter(|v| **v >= Version::V0_3_0) {
            r.convert(to).unwrap();
        }
    }
}

/// A 0.2.0 result without any address converts up, but not back down.
#[test]
fn v02_without_ip_goes_up_but_not_back() {
    let r = parse(&json!({"cniVersion": "0.2.0", "dns": {"domain": "x"}})).unwrap();
    let up = r.convert(Version::V1_0_0).unwrap();
    assert_eq!(
        up.to_value(),
        json!({"cniVersion": "1.0.0", "dns": {"domain": "x"}})
    );
    assert!(matches!(
        up.convert(Version::V0_2_0),
        Err(Error::Conversion { .. })
    ));
    // Within the 0.2 family it is only a relabel.
    assert_eq!(
        r.convert(Version::V0_1_0).unwrap().version(),
        Version::V0_1_0
    );
}

#[test]
fn unknown_versions_are_refused() {
    for v in ["0.5.0", "1.2.0", "2.0.0", "0.3.2"] {
        let err = parse(&json!({"cniVersion": v})).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedVersion { .. }),
            "{v}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("unsupported CNI version {v} in result")
        );
        assert_eq!(err.code(), code::INCOMPATIBLE_VERSION);
    }
    for v in ["x", "1.0.0.0", "v1.0.0", " 1.0.0"] {
        let err = parse(&json!({"cniVersion": v})).unwrap_err();
        assert!(matches!(err, Error::InvalidVersion { .. }), "{v}: {err:?}");
        assert!(err.to_string().contains(&format!("{v:?}")), "{err}");
    }
    let r = parse(&json!({"cniVersion": "1.0.0"})).unwrap();
    for to in [Version::new(0, 5, 0), Version::new(1, 2, 0)] {
        let err = r.convert(to).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { .. }), "{err:?}");
        assert!(err.to_string().contains(&to.to_string()), "{err}");
    }
}

#[test]
fn bad_addresses_name_field_and_value() {
    let cases = [
        (
            json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1"}]}),
            r#"invalid 1.0.0 result: ips[0].address "10.0.0.1": not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)"#,
        ),
        (
            json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.1/24"}, {"address": "10.0.0.1/33"}]}),
            r#"invalid 1.1.0 result: ips[1].address "10.0.0.1/33": not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)"#,
        ),
        (
            json!({"cniVersion": "1.0.0", "ips": [{"address": 5}]}),
            "invalid 1.0.0 result: ips[0].address 5: expected a string, got a number",
        ),
        (
            json!({"cniVersion": "1.0.0", "ips": [{"gateway": "10.0.0.1"}]}),
            "invalid 1.0.0 result: ips[0].address: missing (an address in CIDR notation is required)",
        ),
        (
            json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.256"}]}),
            r#"invalid 0.4.0 result: ips[0].gateway "10.0.0.256": not an IP address (expected e.g. 10.1.2.1 or fd00::1)"#,
        ),
        (
            json!({"cniVersion": "0.3.1", "routes": [{"dst": "default"}]}),
            r#"invalid 0.3.1 result: routes[0].dst "default": not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)"#,
        ),
        (
            json!({"cniVersion": "0.2.0", "ip6": {"ip": "fd00::1/129"}}),
            r#"invalid 0.2.0 result: ip6.ip "fd00::1/129": not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)"#,
        ),
        (
            json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/8", "routes": [{"dst": "10.0.0.0/8", "gw": 7}]}}),
            "invalid 0.2.0 result: ip4.routes[0].gw 7: expected a string, got a number",
        ),
        (
            json!({"cniVersion": "0.1.0", "ip6": {"ip": "10.0.0.2/8"}}),
            r#"invalid 0.1.0 result: ip6.ip "10.0.0.2/8": ip6 must hold an IPv6 address"#,
        ),
    ];
    for (input, expected) in cases {
        let err = parse(&input).unwrap_err();
        assert!(matches!(err, Error::InvalidResult { .. }), "{err:?}");
        assert_eq!(err.to_string(), expected);
        assert_eq!(err.code(), code::DECODING_FAILURE);
    }
}

#[test]
fn ip_version_must_match_the_address() {
    assert_eq!(
        message(
            json!({"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "10.0.0.2/24"}]})
        ),
        r#"invalid 0.4.0 result: ips[0].version "6": does not match address 10.0.0.2/24, which is IPv4 (expected "4", not "6")"#
    );
    assert_eq!(
        message(json!({"cniVersion": "0.3.0", "ips": [{"version": "4", "address": "fd00::2/64"}]})),
        r#"invalid 0.3.0 result: ips[0].version "4": does not match address fd00::2/64, which is IPv6 (expected "6", not "4")"#
    );
    assert_eq!(
        message(
            json!({"cniVersion": "0.3.1", "ips": [{"version": "IPv4", "address": "10.0.0.2/24"}]})
        ),
        r#"invalid 0.3.1 result: ips[0].version "IPv4": expected "4" or "6""#
    );
    // Missing: derived from the address (libcni accepts it too).
    let r = parse(&json!({"cniVersion": "0.4.0", "ips": [{"address": "fd00::2/64"}]})).unwrap();
    assert_eq!(r.to_value()["ips"][0]["version"], "6");
    // In 1.x `version` is not a field: ignored, and not written.
    let r =
        parse(&json!({"cniVersion": "1.0.0", "ips": [{"version": "4", "address": "fd00::2/64"}]}))
            .unwrap();
    assert_eq!(r.to_value()["ips"][0], json!({"address": "fd00::2/64"}));
}

#[test]
fn interface_index_out_of_range() {
    // Huge, negative and fractional numbers do not decode.
    for (n, shown, why) in [
        (
            "4294967296",
            "4294967296",
            "not an unsigned integer below 2^32",
        ),
        (
            "18446744073709551616",
            "18446744073709551616",
            "not an unsigned integer below 2^32",
        ),
        ("1e400", "1e+400", "not an unsigned integer below 2^32"),
        ("-1", "-1", "not an unsigned integer below 2^32"),
        ("0.5", "0.5", "not an unsigned integer below 2^32"),
        (
            "\"0\"",
            "\"0\"",
            "expected an unsigned integer, got a string",
        ),
    ] {
        let text = format!(
            r#"{{"cniVersion":"1.0.0","ips":[{{"address":"10.0.0.2/24","interface":{n}}}]}}"#
        );
        let err = CniResult::parse(text.as_bytes(), Version::V1_0_0).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid 1.0.0 result: ips[0].interface {shown}: {why}")
        );
    }
    // An index past the interface list is read (libcni reads it too, and
    // plugins emit such results) but `validate` refuses it.
    let r = parse(&json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0"}, {"name": "eth1"}],
        "ips": [
            {"version": "4", "address": "10.0.0.2/24", "interface": 1},
            {"version": "4", "address": "10.0.0.3/24", "interface": 2}
        ]
    }))
    .unwrap();
    let err = r.validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid 0.4.0 result: ips[1].interface 2: out of range (the result has 2 interfaces)"
    );
    // Conversion keeps indices and interfaces together, so it neither
    // fixes nor breaks them.
    let up = r.convert(Version::V1_1_0).unwrap();
    assert_eq!(up.to_value()["ips"][1]["interface"], 2);
    assert!(up.validate().is_err());
    // Down to 0.2.0, indices (and interfaces) are gone.
    r.convert(Version::V0_2_0).unwrap().validate().unwrap();
}

#[test]
fn validate_refuses_hand_built_inconsistencies() {
    let v4 = "10.0.0.2/24".parse().unwrap();
    let bad_block = CniResult::V02(Result020 {
        cni_version: Version::V0_2_0,
        ip4: None,
        ip6: Some(Ip020::new(v4)),
        dns: Default::default(),
    });
    assert!(
        bad_block
            .validate()
            .unwrap_err()
            .to_string()
            .contains("ip6 must hold an IPv6 address")
    );
    let mislabelled = CniResult::V04(Result040 {
        cni_version: Version::V1_0_0,
        interfaces: vec![],
        ips: vec![],
        routes: vec![],
        dns: Default::default(),
    });
    assert!(mislabelled.validate().is_err());
    // A mislabelled result still converts by its shape, and the label of
    // the conversion is right.
    let fixed = mislabelled.convert(Version::V1_0_0).unwrap();
    assert_eq!(fixed, CniResult::V1(Result100::new(Version::V1_0_0)));
    fixed.validate().unwrap();
}

#[test]
fn wrong_types_are_refused_with_their_path() {
    let cases = [
        (
            json!("1.0.0"),
            "invalid 1.1.0 result: expected a JSON object, got a string",
        ),
        (
            json!(null),
            "invalid 1.1.0 result: expected a JSON object, got null",
        ),
        (
            json!({"ips": {}}),
            "invalid 1.1.0 result: ips {}: expected an array, got an object",
        ),
        (
            json!({"interfaces": [1]}),
            "invalid 1.1.0 result: interfaces[0] 1: expected an object, got a number",
        ),
        (
            json!({"interfaces": [{"name": true}]}),
            "invalid 1.1.0 result: interfaces[0].name true: expected a string, got a boolean",
        ),
        (
            json!({"interfaces": [{"name": "a", "mtu": "1500"}]}),
            r#"invalid 1.1.0 result: interfaces[0].mtu "1500": expected an unsigned integer, got a string"#,
        ),
        (
            json!({"routes": [{"dst": "0.0.0.0/0", "table": -3}]}),
            "invalid 1.1.0 result: routes[0].table -3: not an unsigned integer below 2^32",
        ),
        (
            json!({"dns": []}),
            "invalid 1.1.0 result: dns []: expected an object, got an array",
        ),
        (
            json!({"dns": {"search": "a.b"}}),
            r#"invalid 1.1.0 result: dns.search "a.b": expected an array, got a string"#,
        ),
        (
            json!({"cniVersion": "0.2.0", "ip4": []}),
            "invalid 0.2.0 result: ip4 []: expected an object, got an array",
        ),
    ];
    for (input, expected) in cases {
        assert_eq!(message(input), expected);
    }
}
