//! What a plugin prints that is not a result: the `VERSION` reply and the
//! error object; and the version strings of configurations and replies.
//!
//! Properties, for any input:
//! - `PluginInfo::decode` never panics; a decoded reply has a non-empty
//!   `cniVersion` and `supportedVersions`, round-trips through its own JSON,
//!   and `supports(v)` agrees with its list;
//! - `ErrorObject::decode` never panics; a decoded object round-trips
//!   through `to_json`;
//! - `Version::parse` (on the whole input and on each line) agrees with an
//!   independent model of the grammar; a parsed version re-parses from its
//!   `Display` and from its JSON, and `Display` gives back a canonical input;
//!   errors quote the input;
//! - `select_version` (first line `cniVersion`, `~` for none; other lines
//!   `cniVersions`) agrees with a model of the rule;
//! - `compare` is antisymmetric; `Command::from_str` accepts exactly the six
//!   verbs in any case.
#![no_main]

use std::str::FromStr;

use cni_core::error::ErrorObject;
use cni_core::version::{PluginInfo, SUPPORTED_VERSIONS, Version, compare, select_version};
use cni_core::{Command, Error};
use cni_core_fuzz::text;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check_reply(data);
    check_error_object(data);

    let s = text(data);
    check_version(&s);
    let lines: Vec<&str> = s.split('\n').collect();
    for line in &lines {
        check_version(line);
    }
    check_select(&lines);
    if let [a, b, ..] = lines.as_slice() {
        match (compare(a, b), compare(b, a)) {
            (Ok(x), Ok(y)) => assert_eq!(x, y.reverse(), "compare({a:?}, {b:?})"),
            (Err(_), Err(_)) => {}
            (x, y) => panic!("compare not symmetric in failure: {x:?} {y:?}"),
        }
    }
    check_command(&s);
});

fn check_reply(data: &[u8]) {
    let Ok(info) = PluginInfo::decode(data) else {
        return;
    };
    assert!(!info.cni_version.is_empty());
    assert!(!info.supported_versions.is_empty());
    let json = serde_json::to_vec(&info).expect("a reply serializes");
    assert_eq!(PluginInfo::decode(&json).expect("own JSON decodes"), info);
    for v in SUPPORTED_VERSIONS {
        let listed = info
            .supported_versions
            .iter()
            .any(|s| model_parse(s) == Some(v));
        assert_eq!(info.supports(v), listed, "supports({v})");
    }
}

fn check_error_object(data: &[u8]) {
    let Some(obj) = ErrorObject::decode(data) else {
        return;
    };
    let back = ErrorObject::decode(obj.to_json().as_bytes()).expect("own JSON decodes");
    assert_eq!(back, obj);
    // Display never panics, whatever the message holds.
    let _ = obj.to_string();
}

/// The version grammar, written independently: `""` is 0.1.0, otherwise one
/// to three dot-separated non-empty runs of ASCII digits, each below 2^32.
fn model_parse(s: &str) -> Option<Version> {
    if s.is_empty() {
        return Some(Version::V0_1_0);
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 3 {
        return None;
    }
    let mut n = [0u32; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Leading zeros are allowed; the value must fit.
        let digits = p.trim_start_matches('0');
        if digits.len() > 10 {
            return None;
        }
        let value: u64 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        n[i] = u32::try_from(value).ok()?;
    }
    Some(Version::new(n[0], n[1], n[2]))
}

fn check_version(s: &str) {
    let parsed = Version::parse(s);
    assert_eq!(
        parsed.as_ref().ok(),
        model_parse(s).as_ref(),
        "Version::parse({s:?})"
    );
    assert_eq!(Version::from_str(s).ok(), parsed.as_ref().ok().copied());
    match parsed {
        Ok(v) => {
            let shown = v.to_string();
            assert_eq!(Version::parse(&shown).ok(), Some(v), "Display of {v:?}");
            let canonical =
                s.split('.').count() == 3 && s.split('.').all(|p| p == "0" || !p.starts_with('0'));
            if canonical {
                assert_eq!(shown, s, "Display changed a canonical version");
            }
            let json = serde_json::to_string(&v).expect("a version serializes");
            assert_eq!(serde_json::from_str::<Version>(&json).ok(), Some(v));
        }
        Err(e) => {
            assert!(matches!(e, Error::InvalidVersion { .. }), "{e:?}");
            assert!(
                e.to_string().contains(&format!("{s:?}")),
                "{e} does not quote {s:?}"
            );
        }
    }
}

/// The selection rule, written independently: every entry must parse;
/// entries newer than 1.1.0 are ignored; the highest remaining one must be
/// supported; no entries at all is 0.1.0.
fn model_select(cni_version: Option<&str>, cni_versions: &[String]) -> Option<Version> {
    let all: Vec<&str> = cni_version
        .into_iter()
        .chain(cni_versions.iter().map(String::as_str))
        .collect();
    if all.is_empty() {
        return Some(Version::V0_1_0);
    }
    let parsed: Option<Vec<Version>> = all.iter().map(|s| model_parse(s)).collect();
    let best = parsed?
        .into_iter()
        .filter(|v| *v <= Version::CURRENT)
        .max()?;
    SUPPORTED_VERSIONS.contains(&best).then_some(best)
}

fn check_select(lines: &[&str]) {
    let (first, rest) = lines.split_first().expect("split yields one line at least");
    let cni_version = (*first != "~").then_some(*first);
    let cni_versions: Vec<String> = rest.iter().map(|s| (*s).to_owned()).collect();
    let got = select_version(cni_version, &cni_versions);
    let want = model_select(cni_version, &cni_versions);
    assert_eq!(
        got.as_ref().ok(),
        want.as_ref(),
        "select_version({cni_version:?}, {cni_versions:?}) = {got:?}"
    );
    if let Ok(v) = got {
        assert!(v.is_supported());
    }
    // The empty list of versions without cniVersion.
    let _ = select_version(None, &cni_versions);
}

fn check_command(s: &str) {
    const VERBS: [&str; 6] = ["ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION"];
    let upper = s.to_ascii_uppercase();
    match s.parse::<Command>() {
        Ok(c) => {
            assert_eq!(c.as_str(), upper, "Command::from_str({s:?})");
            assert_eq!(c.to_string().parse::<Command>().ok(), Some(c));
        }
        Err(_) => assert!(!VERBS.contains(&upper.as_str()), "{s:?} refused"),
    }
}
