//! Results (plugin ADD output, `prevResult`, cached results) of every
//! version, and conversion between them.
//!
//! Properties, for any input and every default version:
//! - parsing never panics; a result with its own `cniVersion` parses the
//!   same whatever the default;
//! - a parsed result is labelled with a supported version of its shape;
//! - `to_value`, `to_json` and `to_json_pretty` parse back to an equal result;
//! - conversion to every supported version succeeds, except to 0.1.0/0.2.0
//!   from a result without any IP address (then `Error::Conversion`); the
//!   converted result has the target's label and shape and round-trips too;
//! - converting to the result's own version is an equal clone;
//! - up then back down returns the original (for 0.1.0/0.2.0 results, when
//!   they are in canonical form: routes in the block of their family, with
//!   only `dst` and `gw`); down then up then down again returns the first
//!   down conversion;
//! - `to_current()` is the 1.1.0 conversion; conversion keeps `validate()` Ok.
#![no_main]

use cni_core::Error;
use cni_core::result::{CniResult, Ip020, Result020, Route};
use cni_core::version::{ResultFamily, SUPPORTED_VERSIONS, Version};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // The byte-level entry point once, then the value-level one per default.
    let first = CniResult::parse(data, Version::V1_1_0);
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        assert!(first.is_err(), "parse accepted bytes that are not JSON");
        return;
    };
    let own_version = value
        .get("cniVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    let mut outcomes = Vec::with_capacity(SUPPORTED_VERSIONS.len());
    for default in SUPPORTED_VERSIONS {
        let parsed = CniResult::from_value(&value, default);
        if let Ok(r) = &parsed {
            if !own_version {
                assert_eq!(r.version(), default, "the default version was not used");
            }
            check(r);
        }
        outcomes.push(parsed.ok());
    }
    if own_version {
        assert!(
            outcomes.windows(2).all(|w| w[0] == w[1]),
            "a result with its own cniVersion parsed differently per default"
        );
    }
    assert_eq!(first.ok(), outcomes[SUPPORTED_VERSIONS.len() - 1]);
});

fn reparse(r: &CniResult, what: &str) {
    let back = CniResult::from_value(&r.to_value(), r.version())
        .unwrap_or_else(|e| panic!("{what}: to_value does not parse back: {e}"));
    assert_eq!(&back, r, "{what}: to_value round trip");
    // Whatever the default: the written result carries its version.
    let back = CniResult::parse(r.to_json().as_bytes(), Version::V0_1_0)
        .unwrap_or_else(|e| panic!("{what}: to_json does not parse back: {e}"));
    assert_eq!(&back, r, "{what}: to_json round trip");
    let back = CniResult::parse(r.to_json_pretty().as_bytes(), Version::V1_1_0)
        .unwrap_or_else(|e| panic!("{what}: to_json_pretty does not parse back: {e}"));
    assert_eq!(&back, r, "{what}: to_json_pretty round trip");
}

fn has_ip(r: &CniResult) -> bool {
    match r {
        CniResult::V02(r) => r.ip4.is_some() || r.ip6.is_some(),
        CniResult::V04(r) => !r.ips.is_empty(),
        CniResult::V1(r) => !r.ips.is_empty(),
    }
}

/// Whether a 0.1.0/0.2.0 result survives a trip through 0.3+ unchanged:
/// at least one block, and every route in the block of its family with only
/// `dst` and `gw`. Other results always do.
fn canonical(r: &CniResult) -> bool {
    let CniResult::V02(Result020 { ip4, ip6, .. }) = r else {
        return true;
    };
    let block_ok = |b: &Option<Ip020>, v4: bool| {
        b.as_ref().is_none_or(|b| {
            b.routes.iter().all(|rt: &Route| {
                matches!(rt.dst, IpNet::V4(_)) == v4
                    && *rt
                        == Route {
                            gw: rt.gw,
                            ..Route::new(rt.dst)
                        }
            })
        })
    };
    (ip4.is_some() || ip6.is_some()) && block_ok(ip4, true) && block_ok(ip6, false)
}

fn check(r: &CniResult) {
    let v = r.version();
    assert!(v.is_supported());
    assert_eq!(
        v.family(),
        r.family(),
        "label {v} on a {:?} result",
        r.family()
    );
    reparse(r, "parsed");
    let valid = r.validate().is_ok();

    assert_eq!(
        CniResult::V1(r.to_current()),
        r.convert(Version::V1_1_0).expect("to 1.1.0 always works"),
        "to_current differs from convert(1.1.0)"
    );

    for to in SUPPORTED_VERSIONS {
        let what = format!("{v} -> {to}");
        let c = match r.convert(to) {
            Ok(c) => c,
            Err(e) => {
                assert_eq!(to.family(), ResultFamily::V02, "{what}: {e}");
                assert!(!has_ip(r), "{what} failed with an IP address: {e}");
                assert!(matches!(e, Error::Conversion { .. }), "{what}: {e:?}");
                continue;
            }
        };
        assert_eq!(c.version(), to, "{what}: label");
        assert_eq!(c.family(), to.family(), "{what}: shape");
        reparse(&c, &what);
        if valid {
            c.validate().unwrap_or_else(|e| {
                panic!("{what}: a valid result converted to an invalid one: {e}")
            });
        }
        if to == v {
            assert_eq!(&c, r, "{what}: same version is not an equal clone");
        }
        if to > v && canonical(r) {
            let down = c
                .convert(v)
                .unwrap_or_else(|e| panic!("{what} -> {v}: {e}"));
            assert_eq!(&down, r, "{what} -> {v}: up and back down lost something");
        }
        if to < v && canonical(&c) {
            let up = c
                .convert(v)
                .unwrap_or_else(|e| panic!("{what} -> {v}: {e}"));
            let down = up
                .convert(to)
                .unwrap_or_else(|e| panic!("{what} -> {v} -> {to}: {e}"));
            assert_eq!(down, c, "{what} -> {v} -> {to}: not stable");
        }
    }
}
