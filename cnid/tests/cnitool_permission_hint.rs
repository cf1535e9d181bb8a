//! A cnitool without access to the result cache (not root, cache dir owned
//! by root with mode 0700) fails with "Permission denied" on a file of the
//! cache: the message then says what to do about it (root, access to the
//! named dir, or `CNI_CACHE_DIR`), as text and in the error JSON's details.
//! Runs cnitool as uid/gid 65534 (`nobody`), so it needs root.

use crate::support::nobody;
use crate::support::require_root;

const NETNS: &str = "/proc/self/ns/net";

#[test]
fn add_without_access_to_the_cache_dir_says_what_to_do() {
    require_root!();
    let sb = nobody::sandbox();
    let dir = sb.cache_dir().display().to_string();

    let err = nobody::run(&sb, &["add", "permnet", NETNS]).fails();
    assert!(err.contains("Permission denied"), "{err}");
    let hint = err
        .lines()
        .find(|l| l.starts_with("hint: "))
        .unwrap_or_else(|| panic!("no hint line: {err}"));
    assert!(hint.contains("needs root"), "{hint}");
    assert!(hint.contains(&format!("cache dir {dir} ")), "{hint}");
    assert!(hint.contains("CNI_CACHE_DIR"), "{hint}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");

    // The error JSON carries it in `details`.
    let json = nobody::run(&sb, &["add", "--json-errors", "permnet", NETNS]).fails_json();
    let details = json["details"].as_str().unwrap_or_default();
    assert!(details.contains("needs root"), "{json}");
    assert!(details.contains(&dir), "{json}");

    // GC reads the cache dir too.
    let err = nobody::run(&sb, &["gc", "permnet"]).fails();
    assert!(err.contains("Permission denied"), "{err}");
    assert!(err.contains("\nhint: cnitool needs root"), "{err}");
}

/// No hint when the failure has nothing to do with the cache dir.
#[test]
fn other_failures_get_no_cache_hint() {
    require_root!();
    let sb = nobody::sandbox();
    let err = nobody::run(&sb, &["add", "nosuchnet", NETNS]).fails();
    assert!(!err.contains("hint:"), "{err}");
}
