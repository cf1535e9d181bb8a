//! A plugin that exits 0 with no result or with garbage: a PluginOutput
//! error naming the plugin and keeping stdout and stderr; nothing cached.

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::Error;
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.217.0.2/24"}]}"#;

async fn add_with_second(second: Response) -> (Rig, Error) {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(second));
    let list = conflist(
        json!({"cniVersion":"1.0.0","name":"out","plugins":[{"type":"first"},{"type":"second"}]}),
    );
    let err = rig
        .cni()
        .add_network_list(&list, &RuntimeConf::new("c1", "/run/netns/c1", "eth0"))
        .await
        .unwrap_err()
        .into_innermost();
    (rig, err)
}

#[tokio::test]
async fn empty_stdout_on_add_success_is_an_error() {
    for stdout in ["", " \n\t\n"] {
        let mut resp = Response::ok(stdout);
        resp.stderr = b"did nothing\n".to_vec();
        let (rig, err) = add_with_second(resp).await;
        match &err {
            Error::PluginOutput {
                plugin_type,
                command,
                reason,
                stdout: out,
                stderr,
            } => {
                assert_eq!(plugin_type, "second");
                assert_eq!(*command, cni_core::Command::Add);
                assert!(reason.contains("no result"), "{reason}");
                assert_eq!(out, stdout);
                assert_eq!(stderr, "did nothing\n");
            }
            other => panic!("expected PluginOutput, got {other}"),
        }
        assert_eq!(err.code(), 6);
        let msg = err.to_string();
        assert!(
            msg.contains("plugin second ADD") && msg.contains("did nothing"),
            "{msg}"
        );
        assert!(rig.result_files().is_empty());
    }
}

#[tokio::test]
async fn garbage_stdout_is_an_error_keeping_stdout_and_stderr() {
    for garbage in [
        "this is not json",
        r#"{"cniVersion":"1.0.0","ips":"nope"}"#,
        r#"{"cniVersion":"9.9.9"}"#,
        "[]",
    ] {
        let mut resp = Response::ok(garbage);
        resp.stderr = b"warning: something\n".to_vec();
        let (rig, err) = add_with_second(resp).await;
        match &err {
            Error::PluginOutput {
                plugin_type,
                stdout,
                stderr,
                reason,
                ..
            } => {
                assert_eq!(plugin_type, "second", "{garbage}");
                assert_eq!(stdout, garbage);
                assert_eq!(stderr, "warning: something\n");
                assert!(!reason.is_empty());
            }
            other => panic!("{garbage}: expected PluginOutput, got {other}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("plugin second ADD printed an invalid reply"),
            "{msg}"
        );
        assert!(
            msg.contains(garbage) || msg.contains(&format!("{garbage:?}")),
            "{msg}"
        );
        assert!(rig.result_files().is_empty());
    }
}

/// A failed plugin's error object passes through as a plugin error (not a
/// PluginOutput): code, msg and details as the plugin wrote them.
#[tokio::test]
async fn a_plugin_error_object_passes_through() {
    let (_rig, err) = add_with_second(Response::cni_error(
        107,
        "no leases",
        "pool 10.217.0.0/24 full",
    ))
    .await;
    assert!(err.is_plugin_code(107), "{err}");
    let obj = err.to_error_object("1.0.0");
    assert_eq!(
        (obj.code, obj.msg.as_str(), obj.details.as_str()),
        (107, "no leases", "pool 10.217.0.0/24 full")
    );
}

/// Defect: a result whose `cniVersion` is not a string
/// (`"cniVersion": 1`) was refused ("expected a string, got a number");
/// libcni's `fixupResultVersion` takes it as the config's version, as for
/// a missing or empty one (decisions.md D19), and so do we: the next plugin,
/// the caller and the cache see the config's version.
#[tokio::test]
async fn a_non_string_cni_version_is_the_configs_version() {
    let rig = Rig::new();
    rig.fake(
        "numbered",
        &Fake::new(Response::ok(
            r#"{"cniVersion":1,"ips":[{"address":"10.217.0.3/24"}]}"#,
        )),
    );
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    let list = conflist(json!({
        "cniVersion":"1.0.0","name":"numv",
        "plugins":[{"type":"numbered"},{"type":"second"}]
    }));
    let result = rig
        .cni()
        .add_network_list(&list, &RuntimeConf::new("c1", "/run/netns/c1", "eth0"))
        .await
        .expect("a number is taken as the config's version");
    assert_eq!(result.version(), cni_core::Version::V1_0_0);
    let adds = rig.dir.invocations_of("ADD");
    let second = adds
        .iter()
        .find(|i| i.stdin_json()["type"] == "second")
        .expect("second ran");
    assert_eq!(
        second.stdin_json()["prevResult"],
        json!({"cniVersion":"1.0.0","ips":[{"address":"10.217.0.3/24"}]})
    );
    let cached = rig.cache_json("numv", "c1", "eth0").expect("cached");
    assert_eq!(cached["result"]["cniVersion"], "1.0.0");
}
