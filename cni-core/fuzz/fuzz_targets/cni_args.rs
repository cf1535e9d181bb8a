//! Runtime arguments from outside: `CNI_ARGS`, `CAP_ARGS`, and the
//! container ID, interface name, network name and plugin type checks.
//!
//! Properties, for any input (whole, and each line):
//! - `CniArgs::parse` agrees with an independent model of cnitool's rule;
//!   what it accepts (never an unprintable character) prints back to the same text and re-parses to the same
//!   pairs; parsed pairs pass `validate()` unless the text holds NUL;
//! - pairs built from the lines (`key<TAB>value`) that pass `validate()` and
//!   have non-empty values print to text that parses back to them;
//! - `CapabilityArgs::from_json` accepts objects, `null` and blank text only,
//!   and round-trips through its JSON;
//! - `validate::container_id` and `network_name` accept exactly the spec's
//!   pattern; no validator accepts `/`, NUL, `.` or `..`; `interface_name`
//!   accepts at most 15 bytes, no `:` or whitespace;
//! - `RuntimeConf::validate` (lines: container ID, netns, ifname, CNI_ARGS)
//!   implies valid parts and round-trips through serde; `cache::file_name`
//!   of three lines is a safe file name whenever it is accepted.
#![no_main]

use cni_core::args::{CapabilityArgs, CniArgs, RuntimeConf};
use cni_core::{cache, validate};
use cni_core_fuzz::{assert_safe_component, matches_name_pattern, text};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let s = text(data);
    let lines: Vec<&str> = s.split('\n').collect();

    check_cni_args(&s);
    check_cap_args(&s);
    check_names(&s);
    for line in &lines {
        check_cni_args(line);
        check_names(line);
    }
    check_built_pairs(&lines);
    check_runtime_conf(&lines);
});

/// cnitool's rule: `""` is no pairs; otherwise `;`-separated pairs, each
/// with exactly one `=` and both sides non-empty; and ours on top: no
/// control or other unprintable character (they would reach plugins' logs).
fn model_cni_args(s: &str) -> Option<Vec<(String, String)>> {
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(';')
        .map(|pair| {
            let eq = pair.find('=')?;
            let (k, v) = (&pair[..eq], &pair[eq + 1..]);
            (!k.is_empty()
                && !v.is_empty()
                && !v.contains('=')
                && !pair.chars().any(validate::is_unprintable))
                .then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn check_cni_args(s: &str) {
    let parsed = CniArgs::parse(s);
    assert_eq!(
        parsed.as_ref().ok().map(|a| a.pairs().to_vec()),
        model_cni_args(s),
        "CniArgs::parse({s:?})"
    );
    assert_eq!(s.parse::<CniArgs>().ok(), parsed.as_ref().ok().cloned());
    match parsed {
        Ok(args) => {
            let printed = args.to_string();
            assert_eq!(printed, s, "parsed CNI_ARGS print differently");
            let again = CniArgs::parse(&printed).expect("printed CNI_ARGS re-parse");
            assert_eq!(again, args);
            assert_eq!(
                args.validate().is_ok(),
                !s.contains('\0'),
                "validate() of parsed {s:?}"
            );
            for (k, _) in args.pairs() {
                assert!(args.get(k).is_some());
            }
        }
        Err(e) => {
            assert_eq!(e.code(), 4, "{e}");
            assert!(e.to_string().starts_with("invalid CNI_ARGS pair"), "{e}");
        }
    }
}

fn check_built_pairs(lines: &[&str]) {
    let args: CniArgs = lines
        .iter()
        .map(|l| l.split_once('\t').unwrap_or((l, "v")))
        .collect();
    if args.validate().is_err() {
        return;
    }
    for (k, v) in args.pairs() {
        assert!(
            !k.is_empty() && !k.contains([';', '=', '\0']),
            "validate() passed key {k:?}"
        );
        assert!(
            !v.contains([';', '=', '\0']),
            "validate() passed value {v:?}"
        );
    }
    if args.pairs().iter().all(|(_, v)| !v.is_empty()) {
        let back = CniArgs::parse(&args.to_string())
            .unwrap_or_else(|e| panic!("validated pairs {args:?} do not read back: {e}"));
        assert_eq!(back, args);
    }
}

fn check_cap_args(s: &str) {
    match CapabilityArgs::from_json(s) {
        Ok(caps) => {
            let blank = s.trim().is_empty();
            let is_object_or_null =
                serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object() || v.is_null());
            assert!(blank || is_object_or_null, "CAP_ARGS {s:?} accepted");
            let json = serde_json::to_string(&caps).expect("capability args serialize");
            assert_eq!(CapabilityArgs::from_json(&json).ok(), Some(caps));
        }
        Err(_) => {
            let is_object_or_null =
                serde_json::from_str::<Value>(s).is_ok_and(|v| v.is_object() || v.is_null());
            assert!(
                !is_object_or_null && !s.trim().is_empty(),
                "CAP_ARGS {s:?} refused"
            );
        }
    }
}

fn check_names(s: &str) {
    let id = validate::container_id(s).is_ok();
    assert_eq!(id, matches_name_pattern(s), "container_id({s:?})");
    let net = validate::network_name(s).is_ok();
    assert_eq!(net, matches_name_pattern(s), "network_name({s:?})");
    if id {
        assert_safe_component("container_id", s);
    }
    if net {
        assert_safe_component("network_name", s);
    }
    if validate::interface_name(s).is_ok() {
        assert_safe_component("interface_name", s);
        assert!(
            s.len() <= validate::MAX_INTERFACE_NAME_LEN,
            "ifname {s:?} too long"
        );
        assert!(
            !s.contains(':') && !s.chars().any(char::is_whitespace),
            "ifname {s:?}"
        );
    }
    if validate::plugin_type(s).is_ok() {
        assert_safe_component("plugin_type", s);
        assert!(!s.contains('\\'), "plugin type {s:?}");
    }
}

fn check_runtime_conf(lines: &[&str]) {
    let line = |i: usize| lines.get(i).copied().unwrap_or_default();
    let mut rt = RuntimeConf::new(line(0), line(1), line(2));
    if let Ok(args) = CniArgs::parse(line(3)) {
        rt.args = args;
    }
    if rt.validate().is_ok() {
        assert!(matches_name_pattern(&rt.container_id));
        assert_safe_component("RuntimeConf container ID", &rt.container_id);
        assert_safe_component("RuntimeConf ifname", &rt.ifname);
        assert!(!rt.netns.contains('\0'));
        let name = cache::file_name("net", &rt.container_id, &rt.ifname)
            .expect("a validated attachment has a cache file name");
        assert_safe_component("cache::file_name", &name);
    }
    let json = serde_json::to_string(&rt).expect("a RuntimeConf serializes");
    let back: RuntimeConf = serde_json::from_str(&json).expect("own JSON decodes");
    assert_eq!(back, rt);

    if let Ok(name) = cache::file_name(line(0), line(1), line(2)) {
        assert_safe_component("cache::file_name", &name);
        assert_eq!(name, format!("{}-{}-{}", line(0), line(1), line(2)));
    }
}
