//! Property tests for results: round trips through JSON, conversion up and
//! back down, and no panic on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cni_core::result::{
    CniResult, Dns, Interface, Ip020, IpConfig, Result020, Result040, Result100, Route,
};
use cni_core::version::{ResultFamily, SUPPORTED_VERSIONS, Version};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value};

// ---------------------------------------------------------------------------
// Well-formed results.

fn v4_net() -> impl Strategy<Value = IpNet> {
    (any::<u32>(), 0u8..=32)
        .prop_map(|(a, p)| IpNet::V4(Ipv4Net::new(Ipv4Addr::from(a), p).expect("prefix <= 32")))
}

fn v6_net() -> impl Strategy<Value = IpNet> {
    (any::<u128>(), 0u8..=128)
        .prop_map(|(a, p)| IpNet::V6(Ipv6Net::new(Ipv6Addr::from(a), p).expect("prefix <= 128")))
}

fn net() -> impl Strategy<Value = IpNet> {
    prop_oneof![v4_net(), v6_net()]
}

fn addr() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(a.into())),
        any::<u128>().prop_map(|a| IpAddr::V6(a.into())),
    ]
}

/// A set string (never empty: empty means unset and is read as `None`).
fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9:/._-]{1,12}", "\\PC{1,6}"]
}

/// A non-zero number (zero means unset for `omitempty` ints).
fn nonzero() -> impl Strategy<Value = Option<u32>> {
    option::of(1u32..)
}

fn interface_v1() -> impl Strategy<Value = Interface> {
    (
        prop_oneof![Just(String::new()), text()],
        option::of(text()),
        nonzero(),
        option::of(text()),
        option::of(text()),
        option::of(text()),
    )
        .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
            name,
            mac,
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
}

fn ip_config() -> impl Strategy<Value = IpConfig> {
    (option::of(any::<u32>()), net(), option::of(addr())).prop_map(
        |(interface, address, gateway)| IpConfig {
            interface,
            address,
            gateway,
        },
    )
}

fn route() -> impl Strategy<Value = Route> {
    (
        net(),
        option::of(addr()),
        nonzero(),
        nonzero(),
        nonzero(),
        option::of(any::<u32>()),
        option::of(any::<u32>()),
    )
        .prop_map(|(dst, gw, mtu, advmss, priority, table, scope)| Route {
            dst,
            gw,
            mtu,
            advmss,
            priority,
            table,
            scope,
        })
}

fn dns() -> impl Strategy<Value = Dns> {
    (
        vec(text(), 0..3),
        option::of(text()),
        vec(text(), 0..3),
        vec(text(), 0..3),
    )
        .prop_map(|(nameservers, domain, search, options)| Dns {
            nameservers,
            domain,
            search,
            options,
        })
}

fn version_of(family: ResultFamily) -> impl Strategy<Value = Version> {
    let of_family: Vec<Version> = SUPPORTED_VERSIONS
        .iter()
        .copied()
        .filter(|v| v.family() == family)
        .collect();
    proptest::sample::select(of_family)
}

fn result_v1() -> impl Strategy<Value = Result100> {
    (
        version_of(ResultFamily::V1),
        vec(interface_v1(), 0..4),
        vec(ip_config(), 0..5),
        vec(route(), 0..5),
        dns(),
    )
        .prop_map(|(cni_version, interfaces, ips, routes, dns)| Result100 {
            cni_version,
            interfaces,
            ips,
            routes,
            dns,
        })
}

fn result_v04() -> impl Strategy<Value = Result040> {
    (version_of(ResultFamily::V04), result_v1()).prop_map(|(cni_version, r)| Result040 {
        cni_version,
        // 0.3.0 to 0.4.0 interfaces have no 1.x fields.
        interfaces: r
            .interfaces
            .into_iter()
            .map(|i| Interface {
                mtu: None,
                socket_path: None,
                pci_id: None,
                ..i
            })
            .collect(),
        ips: r.ips,
        routes: r.routes,
        dns: r.dns,
    })
}

/// A 0.2 route: `dst` of the block's family and `gw`, nothing else.
fn route_020(dst: BoxedStrategy<IpNet>) -> impl Strategy<Value = Route> {
    (dst, option::of(addr())).prop_map(|(dst, gw)| Route {
        gw,
        ..Route::new(dst)
    })
}

fn ip_020(ip: BoxedStrategy<IpNet>) -> impl Strategy<Value = Ip020> {
    (ip.clone(), option::of(addr()), vec(route_020(ip), 0..3)).prop_map(|(ip, gateway, routes)| {
        Ip020 {
            ip,
            gateway,
            routes,
        }
    })
}

/// A 0.1.0/0.2.0 result holding at least one address (a 0.2.0 result
/// without any cannot come back down from a richer version).
fn result_v02() -> impl Strategy<Value = Result020> {
    (
        version_of(ResultFamily::V02),
        option::of(ip_020(v4_net().boxed())),
        option::of(ip_020(v6_net().boxed())),
        dns(),
    )
        .prop_filter("at least one address", |(_, ip4, ip6, _)| {
            ip4.is_some() || ip6.is_some()
        })
        .prop_map(|(cni_version, ip4, ip6, dns)| Result020 {
            cni_version,
            ip4,
            ip6,
            dns,
        })
}

fn any_result() -> impl Strategy<Value = CniResult> {
    prop_oneof![
        result_v02().prop_map(CniResult::V02),
        result_v04().prop_map(CniResult::V04),
        result_v1().prop_map(CniResult::V1),
    ]
}

/// A result of exactly `version`.
fn result_at(version: Version) -> BoxedStrategy<CniResult> {
    match version.family() {
        ResultFamily::V02 => result_v02()
            .prop_map(move |r| {
                CniResult::V02(Result020 {
                    cni_version: version,
                    ..r
                })
            })
            .boxed(),
        ResultFamily::V04 => result_v04()
            .prop_map(move |r| {
                CniResult::V04(Result040 {
                    cni_version: version,
                    ..r
                })
            })
            .boxed(),
        ResultFamily::V1 => result_v1()
            .prop_map(move |r| {
                CniResult::V1(Result100 {
                    cni_version: version,
                    ..r
                })
            })
            .boxed(),
    }
}

// ---------------------------------------------------------------------------
// Arbitrary JSON, biased towards the keys and values results use.

const KEYS: &[&str] = &[
    "cniVersion",
    "interfaces",
    "ips",
    "routes",
    "dns",
    "ip4",
    "ip6",
    "ip",
    "gateway",
    "address",
    "interface",
    "version",
    "dst",
    "gw",
    "mtu",
    "advmss",
    "priority",
    "table",
    "scope",
    "name",
    "mac",
    "sandbox",
    "socketPath",
    "pciID",
    "nameservers",
    "domain",
    "search",
    "options",
];

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        // Numbers beyond every integer type, kept exactly (arbitrary_precision).
        "-?[1-9][0-9]{19,40}(\\.[0-9]{1,3})?(e[+-]?[0-9]{1,4})?"
            .prop_map(|s| serde_json::from_str::<Value>(&s).expect("a JSON number")),
        prop_oneof![
            Just("0.1.0"),
            Just("0.2.0"),
            Just("0.3.0"),
            Just("0.3.1"),
            Just("0.4.0"),
            Just("1.0.0"),
            Just("1.1.0"),
            Just(""),
            Just("4"),
            Just("6"),
            Just("9.9.9"),
        ]
        .prop_map(Value::from),
        net().prop_map(|n| Value::from(n.to_string())),
        addr().prop_map(|a| Value::from(a.to_string())),
        "[0-9a-f:./]{0,20}".prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ]
}

fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_owned),
        1 => "\\PC{0,6}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            vec((json_key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Replaces the value at a random spot of `v` (walking `path` as choices).
fn mutate(v: &mut Value, path: &[usize], replacement: Value) {
    let Some((&first, rest)) = path.split_first() else {
        *v = replacement;
        return;
    };
    match v {
        Value::Object(m) if !m.is_empty() => {
            let i = first % m.len();
            if let Some((_, child)) = m.iter_mut().nth(i) {
                mutate(child, rest, replacement);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = first % a.len();
            mutate(&mut a[i], rest, replacement);
        }
        _ => *v = replacement,
    }
}

/// Everything a caller may do with a parsed result; none of it may panic.
fn exercise(r: &CniResult) {
    let _ = r.to_json();
    let _ = r.to_json_pretty();
    let _ = r.validate();
    let _ = r.to_current();
    for &to in &SUPPORTED_VERSIONS {
        if let Ok(c) = r.convert(to) {
            assert_eq!(c.version(), to);
            // A converted result reads back as itself.
            match CniResult::from_value(&c.to_value(), to) {
                Ok(back) => assert_eq!(back, c),
                Err(e) => panic!("converted result to {to} does not read back: {e}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// parse → to_value → parse is the identity, whatever the default version.
    #[test]
    fn json_round_trip_is_identity(r in any_result(), default in proptest::sample::select(SUPPORTED_VERSIONS.to_vec())) {
        let value = r.to_value();
        prop_assert_eq!(&CniResult::from_value(&value, default).unwrap(), &r);
        prop_assert_eq!(&CniResult::parse(r.to_json().as_bytes(), default).unwrap(), &r);
        prop_assert_eq!(&CniResult::parse(r.to_json_pretty().as_bytes(), default).unwrap(), &r);
        // Writing is deterministic.
        let reparsed = CniResult::from_value(&value, default).unwrap();
        prop_assert_eq!(reparsed.to_value(), value);
    }

    /// Converting up to any higher version and back down gives back the
    /// original: every field the lower version can hold survives (checked
    /// for every pair lower < higher).
    #[test]
    fn up_and_back_down_keeps_everything(
        (lower, r) in proptest::sample::select(SUPPORTED_VERSIONS[..SUPPORTED_VERSIONS.len() - 1].to_vec())
            .prop_flat_map(|v| (Just(v), result_at(v)))
    ) {
        for &higher in SUPPORTED_VERSIONS.iter().filter(|v| **v > lower) {
            let up = r.convert(higher).unwrap();
            prop_assert_eq!(up.version(), higher);
            let down = up.convert(lower).unwrap();
            prop_assert_eq!(&down, &r, "{} -> {} -> {}", lower, higher, lower);
        }
    }

    /// Down then up loses only what the lower version cannot hold: from
    /// 1.x through 0.3/0.4 only the 1.x interface fields.
    #[test]
    fn v1_through_v04_loses_only_interface_fields(r in result_v1(), mid in version_of(ResultFamily::V04)) {
        let back = CniResult::V1(r.clone()).convert(mid).unwrap().convert(r.cni_version).unwrap();
        let expected = Result100 {
            interfaces: r.interfaces.iter().map(|i| Interface { mtu: None, socket_path: None, pci_id: None, ..i.clone() }).collect(),
            ..r
        };
        prop_assert_eq!(back, CniResult::V1(expected));
    }

    /// Conversion to 0.2 keeps the first address of each family and routes
    /// by destination family, reduced to dst and gw.
    #[test]
    fn down_to_v02_picks_first_of_each_family(r in result_v1()) {
        let res = CniResult::V1(r.clone()).convert(Version::V0_2_0);
        let first4 = r.ips.iter().find(|ip| ip.address.addr().is_ipv4());
        let first6 = r.ips.iter().find(|ip| ip.address.addr().is_ipv6());
        match res {
            Err(_) => prop_assert!(first4.is_none() && first6.is_none()),
            Ok(CniResult::V02(down)) => {
                prop_assert_eq!(down.ip4.as_ref().map(|b| (b.ip, b.gateway)), first4.map(|ip| (ip.address, ip.gateway)));
                prop_assert_eq!(down.ip6.as_ref().map(|b| (b.ip, b.gateway)), first6.map(|ip| (ip.address, ip.gateway)));
                let routes_of = |v4: bool| r.routes.iter()
                    .filter(|rt| rt.dst.addr().is_ipv4() == v4)
                    .map(|rt| Route { gw: rt.gw, ..Route::new(rt.dst) })
                    .collect::<Vec<_>>();
                if let Some(b) = &down.ip4 { prop_assert_eq!(&b.routes, &routes_of(true)); }
                if let Some(b) = &down.ip6 { prop_assert_eq!(&b.routes, &routes_of(false)); }
                prop_assert_eq!(&down.dns, &r.dns);
            }
            Ok(other) => prop_assert!(false, "not a 0.2 result: {:?}", other),
        }
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn parse_never_panics_on_bytes(bytes in vec(any::<u8>(), 0..256), default in proptest::sample::select(SUPPORTED_VERSIONS.to_vec())) {
        if let Ok(r) = CniResult::parse(&bytes, default) {
            exercise(&r);
        }
    }

    /// Arbitrary JSON-looking text never panics.
    #[test]
    fn parse_never_panics_on_json_like_text(text in "[\\[\\]{}\",:0-9a-z.eE+\\- ]{0,80}") {
        if let Ok(r) = CniResult::parse(text.as_bytes(), Version::V1_1_0) {
            exercise(&r);
        }
    }

    /// Arbitrary JSON values never panic.
    #[test]
    fn parse_never_panics_on_json_values(value in arb_json(), default in proptest::sample::select(SUPPORTED_VERSIONS.to_vec())) {
        if let Ok(r) = CniResult::from_value(&value, default) {
            exercise(&r);
        }
    }

    /// A valid result with one spot replaced by arbitrary JSON: an error or
    /// a result, never a panic; and a result still round-trips.
    #[test]
    fn parse_never_panics_on_damaged_results(r in any_result(), path in vec(any::<usize>(), 0..5), replacement in arb_json()) {
        let mut value = r.to_value();
        mutate(&mut value, &path, replacement);
        if let Ok(parsed) = CniResult::from_value(&value, Version::V1_0_0) {
            exercise(&parsed);
            prop_assert_eq!(CniResult::from_value(&parsed.to_value(), Version::V1_0_0).unwrap(), parsed);
        }
    }
}

/// The convenience a single-network ADD's caller wants: the addresses,
/// whatever the result's version, and those of one interface.
#[test]
fn addresses_of_a_result_of_any_version() {
    use cni_core::Version;
    use cni_core::result::CniResult;
    let v1 = CniResult::parse(
        br#"{"cniVersion":"1.0.0","interfaces":[{"name":"br0"},{"name":"eth0","sandbox":"/run/netns/x"}],
             "ips":[{"interface":1,"address":"10.1.2.3/24"},{"interface":0,"address":"10.1.2.1/24"},{"address":"fd00::3/64"}]}"#,
        Version::V1_0_0,
    )
    .unwrap();
    let all: Vec<String> = v1.addresses().iter().map(ToString::to_string).collect();
    assert_eq!(all, ["10.1.2.3/24", "10.1.2.1/24", "fd00::3/64"]);
    let eth0: Vec<String> = v1
        .addresses_of("eth0")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(eth0, ["10.1.2.3/24", "fd00::3/64"]);
    let old = CniResult::parse(
        br#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.9.0.2/16"}]}"#,
        Version::V1_0_0,
    )
    .unwrap();
    assert_eq!(old.addresses(), vec!["10.9.0.2/16".parse().unwrap()]);
}
