//! cnitool's warnings are visible by default (decisions.md D21): a skipped
//! conf file and a corrupt cache entry moved aside are said on stderr
//! without `RUST_LOG`; `RUST_LOG` still tunes them; `--json-errors` keeps
//! stderr to the error JSON alone.

use crate::support::fake::Fake;
use crate::support::tool::Sandbox;
use serde_json::json;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("warnnet", "1.0.0", &[json!({"type": "p"})]);
    std::fs::write(sb.net_dir().join("05-broken.conflist"), "{").unwrap();
    sb
}

#[test]
fn a_skipped_conf_file_is_a_warning_by_default() {
    let sb = sandbox();
    let netns = sb.netns("warntest");
    let run = sb.run(&["add", "warnnet", &netns]).ok();
    assert!(
        run.stderr.contains("WARN") && run.stderr.contains("05-broken.conflist"),
        "stderr: {}",
        run.stderr
    );
    // The result on stdout is untouched by it.
    assert_eq!(run.stdout_json()["ips"][0]["address"], "10.1.2.3/24");

    // RUST_LOG replaces the default filter.
    let quiet = sb
        .run_env(&["del", "warnnet", &netns], &[("RUST_LOG", "error")])
        .ok();
    assert!(
        !quiet.stderr.contains("05-broken"),
        "stderr: {}",
        quiet.stderr
    );
}

#[test]
fn a_corrupt_cache_entry_moved_aside_is_a_warning_by_default() {
    let sb = sandbox();
    let netns = sb.netns("warntest");
    sb.run(&["add", "warnnet", &netns]).ok();
    let results = sb.cache_dir().join("results");
    let entry = std::fs::read_dir(&results)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .expect("a cache entry");
    std::fs::write(&entry, "not json").unwrap();
    let del = sb.run(&["del", "warnnet", &netns]).ok();
    assert!(
        del.stderr.contains("WARN") && del.stderr.contains("corrupt"),
        "stderr: {}",
        del.stderr
    );
}

#[test]
fn json_errors_keep_stderr_to_the_error_object() {
    let sb = sandbox();
    let netns = sb.netns("warntest");
    let err = sb
        .run(&["--json-errors", "check", "warnnet", &netns])
        .fails_json();
    assert_eq!(err["code"], 3, "{err}");
}
