//! The failure contract: exit status 1, nothing on stdout, a message on
//! stderr naming the value at fault; with `--json-errors` (or
//! `CNITOOL_JSON_ERRORS=1`) the spec's error JSON on stderr.

use crate::support::fake::{Fake, Response};
use crate::support::tool::Sandbox;
use serde_json::json;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("errnet", "1.0.0", &[json!({"type": "p"})]);
    sb
}

#[test]
fn bad_cni_args_names_the_pair() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    for (value, pair) in [("A=1;broken", "broken"), ("A=1=2", "A=1=2"), ("=v", "=v")] {
        let err = sb
            .run_env(&["add", "errnet", &netns], &[("CNI_ARGS", value)])
            .fails();
        assert!(
            err.contains(&format!("invalid CNI_ARGS pair \"{pair}\"")),
            "{value}: {err}"
        );
        let json = sb
            .run_env(
                &["add", "--json-errors", "errnet", &netns],
                &[("CNI_ARGS", value)],
            )
            .fails_json();
        assert_eq!(json["code"], 4, "{json}");
    }
    assert!(sb.plugins.invocations().is_empty(), "no plugin ran");
}

#[test]
fn bad_cap_args_names_the_value() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    for value in ["{not json", "[1,2]", "\"text\""] {
        let err = sb
            .run_env(&["add", "errnet", &netns], &[("CAP_ARGS", value)])
            .fails();
        assert!(err.contains(&format!("CAP_ARGS {value:?}")), "{err}");
        assert!(err.contains("invalid capability arguments"), "{err}");
        let json = sb
            .run_env(
                &["add", "errnet", &netns],
                &[("CAP_ARGS", value), ("CNITOOL_JSON_ERRORS", "1")],
            )
            .fails_json();
        assert_eq!(json["code"], 7, "{json}");
        assert!(json["msg"].as_str().unwrap().contains("CAP_ARGS"), "{json}");
    }
    assert!(sb.plugins.invocations().is_empty());
}

#[test]
fn unknown_network_names_the_network_and_the_dir() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    for verb in ["add", "check", "gc", "status"] {
        let err = sb.run(&[verb, "nosuch", &netns]).fails();
        assert!(
            err.contains(&format!(
                "no network configuration with name \"nosuch\" in {}",
                sb.net_dir().display()
            )),
            "{verb}: {err}"
        );
    }
    let json = sb
        .run(&["--json-errors", "add", "nosuch", &netns])
        .fails_json();
    assert_eq!(json["code"], 7);
    assert_eq!(
        json["cniVersion"], "1.1.0",
        "no network loaded: our version"
    );
}

#[test]
fn unparsable_files_are_named_when_the_network_is_missing() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    std::fs::write(sb.net_dir().join("10-broken.conflist"), "{ nope").unwrap();
    // Other networks still load.
    sb.run(&["add", "errnet", &netns]).ok();
    let err = sb.run(&["add", "nosuch", &netns]).fails();
    assert!(err.contains("10-broken.conflist"), "{err}");
}

#[test]
fn empty_conf_dir_names_the_dir() {
    let sb = Sandbox::new();
    let netns = sb.netns("errtest");
    let err = sb.run(&["add", "errnet", &netns]).fails();
    assert!(
        err.contains(&format!(
            "no network configurations found in {}",
            sb.net_dir().display()
        )),
        "{err}"
    );
    let missing = sb.root().join("missing");
    let err = sb
        .run_env(
            &["add", "errnet", &netns],
            &[("NETCONFPATH", missing.to_str().unwrap())],
        )
        .fails();
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

#[test]
fn bad_cni_timeout_is_a_clear_error() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    for value in ["soon", "-3", "0", "1s"] {
        let err = sb
            .run_env(&["add", "errnet", &netns], &[("CNI_TIMEOUT", value)])
            .fails();
        assert!(
            err.contains(&format!("invalid CNI_TIMEOUT {value:?}")),
            "{value}: {err}"
        );
    }
    assert!(sb.plugins.invocations().is_empty());
}

#[test]
fn invalid_interface_names_are_refused_before_any_plugin_runs() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    let err = sb
        .run(&["add", "-i", "eth0/../x", "errnet", &netns])
        .fails();
    assert!(err.contains("eth0/../x"), "{err}");
    let err = sb
        .run(&["add", "-i", "a-very-long-interface-name", "errnet", &netns])
        .fails();
    assert!(err.contains("a-very-long-interface-name"), "{err}");
    assert!(sb.plugins.invocations().is_empty());
}

#[test]
fn plugin_errors_keep_their_evidence_and_code() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    sb.plugins.fake(
        "p",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::cni_error(117, "address pool exhausted", "range 10.1.2.0/24")
                .with_shell("echo 'allocator trace' >&2"),
        ),
    );
    let err = sb.run(&["add", "errnet", &netns]).fails();
    // The network, interface and verb lead; cnitool runs no rollback, so
    // the error says the DEL is owed (the reference leaves that unsaid).
    assert!(
        err.starts_with(
            "error: network \"errnet\" (ifname eth0) ADD (not rolled back: what its plugins \
             made, such as an address, stays until this attachment is DELed): \
             plugin p ADD failed (exit status 1)"
        ),
        "{err}"
    );
    assert!(err.contains("address pool exhausted"), "{err}");
    assert!(err.contains("range 10.1.2.0/24"), "{err}");
    assert!(err.contains("allocator trace"), "{err}");
    // The plugin's error object is passed on as it wrote it.
    let json = sb
        .run(&["--json-errors", "add", "errnet", &netns])
        .fails_json();
    assert_eq!(
        json,
        json!({"cniVersion": "1.0.0", "code": 117, "msg": "address pool exhausted", "details": "range 10.1.2.0/24"})
    );
    // A failed ADD writes no cache entry.
    assert!(sb.cache_entries().is_empty());
}

#[test]
fn plugin_crash_without_output_reports_stderr_or_status() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    sb.plugins
        .fake("p", &Fake::new(Response::fail(3, "", "segfault-ish\n")));
    let err = sb.run(&["add", "errnet", &netns]).fails();
    assert!(
        err.contains("plugin p ADD failed (exit status 3): segfault-ish"),
        "{err}"
    );
    let json = sb
        .run(&["--json-errors", "add", "errnet", &netns])
        .fails_json();
    assert_eq!(json["details"], "segfault-ish");
}

#[test]
fn usage_errors_exit_1_and_help_exits_0() {
    let sb = sandbox();
    let err = sb.run(&["add", "errnet"]).fails();
    assert!(err.contains("<NETNS>"), "{err}");
    let json = sb.run(&["--json-errors", "add", "errnet"]).fails_json();
    assert_eq!(json["code"], 4);
    let json = sb
        .run_env(&["frobnicate"], &[("CNITOOL_JSON_ERRORS", "1")])
        .fails_json();
    assert!(
        json["msg"].as_str().unwrap().contains("frobnicate"),
        "{json}"
    );
    let help = sb.run(&["--help"]).ok();
    assert!(help.stdout.contains("NETCONFPATH"), "{}", help.stdout);
    assert!(help.stdout.contains("CNI_TIMEOUT"), "{}", help.stdout);
}

#[test]
fn json_errors_env_accepts_only_true_values() {
    let sb = sandbox();
    let netns = sb.netns("errtest");
    let err = sb
        .run_env(&["add", "nosuch", &netns], &[("CNITOOL_JSON_ERRORS", "0")])
        .fails();
    assert!(err.starts_with("error: "), "{err}");
    let json = sb
        .run_env(
            &["add", "nosuch", &netns],
            &[("CNITOOL_JSON_ERRORS", "true")],
        )
        .fails_json();
    assert_eq!(json["code"], 7);
}
