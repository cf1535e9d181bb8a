//! The commands the reference cnitool lacks: `version <plugin>` and
//! `validate <network>`.

use crate::support::fake::{Fake, Response};
use crate::support::tool::Sandbox;
use pretty_assertions::assert_eq;
use serde_json::json;

#[test]
fn version_prints_the_plugins_reply() {
    let sb = Sandbox::new();
    sb.plugins.fake(
        "vp",
        &Fake::new(Response::ok("")).on(
            "VERSION",
            Response::ok(r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#),
        ),
    );
    let run = sb.run(&["version", "vp"]).ok();
    assert_eq!(
        run.stdout_json(),
        json!({"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]})
    );
    assert!(
        run.stdout.starts_with("{\n    \"cniVersion\""),
        "{}",
        run.stdout
    );
    let call = &sb.plugins.invocations_of("VERSION")[0];
    assert_eq!(call.stdin_json(), json!({"cniVersion": "1.1.0"}));
    assert_eq!(
        call.var("CNI_PATH"),
        Some(sb.plugins.bin().to_str().unwrap())
    );
}

#[test]
fn version_errors_name_the_plugin() {
    let sb = Sandbox::new();
    let err = sb.run(&["version", "missing"]).fails();
    assert!(err.contains("plugin \"missing\" not found in"), "{err}");
    sb.plugins
        .fake("garbled", &Fake::new(Response::ok("not json")));
    let err = sb.run(&["version", "garbled"]).fails();
    assert!(
        err.contains("plugin garbled VERSION printed an invalid reply"),
        "{err}"
    );
    let err = sb.run(&["version", "../bin/sh"]).fails();
    assert!(err.contains("../bin/sh"), "{err}");
}

#[test]
fn validate_prints_the_enabled_capabilities() {
    let sb = Sandbox::new();
    sb.plugins.fake("a", &Fake::plugin("1.1.0", "10.1.2.3/24"));
    sb.plugins.fake("b", &Fake::plugin("1.1.0", "10.1.2.3/24"));
    sb.conflist(
        "valnet",
        "1.1.0",
        &[
            json!({"type": "a", "capabilities": {"portMappings": true, "mac": false}}),
            json!({"type": "b", "capabilities": {"bandwidth": true, "portMappings": true}}),
        ],
    );
    let run = sb.run(&["validate", "valnet"]).ok();
    assert_eq!(run.stdout, "portMappings\nbandwidth\n");
    assert_eq!(sb.plugins.invocations_of("VERSION").len(), 2);
    // No capabilities: nothing printed, success.
    sb.conflist("plainnet", "1.1.0", &[json!({"type": "a"})]);
    let run = sb.run(&["validate", "plainnet"]).ok();
    assert_eq!(run.stdout, "");
}

#[test]
fn validate_lists_every_failing_plugin() {
    let sb = Sandbox::new();
    sb.plugins
        .fake("good", &Fake::plugin("1.1.0", "10.1.2.3/24"));
    sb.plugins.fake(
        "old",
        &Fake::new(Response::ok("")).on(
            "VERSION",
            Response::ok(r#"{"cniVersion":"0.4.0","supportedVersions":["0.3.1","0.4.0"]}"#),
        ),
    );
    sb.conflist(
        "badnet",
        "1.0.0",
        &[
            json!({"type": "good"}),
            json!({"type": "old"}),
            json!({"type": "absent"}),
        ],
    );
    let err = sb.run(&["validate", "badnet"]).fails();
    assert!(err.contains("2 error(s)"), "{err}");
    assert!(err.contains("plugin old (supports 0.3.1, 0.4.0)"), "{err}");
    assert!(err.contains("plugin \"absent\" not found"), "{err}");
    assert!(!err.contains("good"), "{err}");
    let json = sb
        .run(&["--json-errors", "validate", "badnet"])
        .fails_json();
    assert_eq!(
        json["code"], 1,
        "the first error's code (incompatible version)"
    );
    assert_eq!(json["cniVersion"], "1.0.0");
    let err = sb.run(&["validate", "nosuch"]).fails();
    assert!(err.contains("\"nosuch\""), "{err}");
}
