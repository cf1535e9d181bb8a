//! A CNI error object on stdout is an error whatever the exit status
//! (`docs/decisions.md` D18): libcni takes it as an empty result when the plugin
//! exits 0, caches that, and drops the error. Here it is the plugin's error
//! (the same [`Error::Plugin`] as a non-zero exit with an error object:
//! plugin type, verb, exit status 0, the object, stderr) on every verb, and
//! nothing is cached. Also: a result without `cniVersion` has the version of
//! the configuration the plugin was given (`docs/decisions.md` D19).

use crate::support::fake::{Fake, Response, Rig, conflist, runtime};
use cni_async::{Error, PluginExit};
use cni_core::stdin::GcAttachment;
use cni_core::{Command, ErrorObject, Version};
use pretty_assertions::assert_eq;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.1.0","ips":[{"address":"10.217.0.2/24"}]}"#;

/// Exit 0, an error object on stdout, a line on stderr.
fn error_object_exit_0(code: u32) -> Response {
    Response {
        stderr: b"diagnostics\n".to_vec(),
        ..Response::ok(
            &json!({"cniVersion": "1.1.0", "code": code, "msg": "no leases", "details": "pool full"})
                .to_string(),
        )
    }
}

/// Asserts `err` is the plugin error of `plugin` running `command` that
/// exited 0 with [`error_object_exit_0`]`(code)`.
#[track_caller]
fn assert_plugin_error(err: &Error, plugin: &str, command: Command, code: u32) {
    let err = err.innermost();
    match err {
        Error::Plugin {
            plugin_type,
            command: c,
            status,
            error,
            stdout,
            stderr,
        } => {
            assert_eq!(plugin_type, plugin);
            assert_eq!(*c, command);
            assert_eq!(*status, PluginExit::Code(0));
            assert_eq!(
                error.as_deref(),
                Some(&ErrorObject::new("1.1.0", code, "no leases", "pool full"))
            );
            assert_eq!(stdout, "");
            assert_eq!(stderr, "diagnostics\n");
        }
        other => panic!("expected the plugin's error, got {other:?}"),
    }
    assert_eq!(err.code(), code);
    assert!(err.is_plugin_code(code), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "plugin {plugin} {command} failed (exit status 0): no leases; pool full \
             (CNI code {code}); stderr: \"diagnostics\""
        )
    );
}

fn two_plugins(version: &str) -> cni_core::NetworkConfigList {
    conflist(json!({
        "cniVersion": version,
        "name": "errobj",
        "plugins": [{"type": "first"}, {"type": "second"}]
    }))
}

#[tokio::test]
async fn add_error_object_with_exit_0_is_the_plugins_error_and_nothing_is_cached() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(error_object_exit_0(107)));
    let err = rig
        .cni()
        .add_network_list(&two_plugins("1.1.0"), &runtime("c1", "eth0"))
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "second", Command::Add, 107);
    assert_eq!(rig.result_files(), Vec::<String>::new());
    // The spec's error JSON passes the plugin's object on.
    assert_eq!(
        err.to_error_object("1.1.0"),
        ErrorObject::new("1.1.0", 107, "no leases", "pool full")
    );
}

#[tokio::test]
async fn add_error_object_with_exit_0_rolls_back_like_any_failure() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake(
        "second",
        &Fake::new(Response::ok("")).on("ADD", error_object_exit_0(11)),
    );
    let opts = cni_async::CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&two_plugins("1.1.0"), &runtime("c1", "eth0"))
        .options(&opts)
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "second", Command::Add, 11);
    let calls: Vec<(String, String)> = rig
        .dir
        .invocations()
        .iter()
        .map(|i| (i.plugin.clone(), i.command().to_owned()))
        .collect();
    let call = |p: &str, c: &str| (p.to_owned(), c.to_owned());
    assert_eq!(
        calls,
        [
            call("first", "ADD"),
            call("second", "ADD"),
            call("second", "DEL"),
            call("first", "DEL")
        ]
    );
    assert_eq!(rig.result_files(), Vec::<String>::new());
}

#[tokio::test]
async fn del_error_object_with_exit_0_fails_and_keeps_the_cache_entry() {
    let rig = Rig::new();
    rig.fake(
        "first",
        &Fake::new(error_object_exit_0(3)).on("ADD", Response::ok(RESULT)),
    );
    rig.fake(
        "second",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    let (cni, list, rt) = (rig.cni(), two_plugins("1.1.0"), runtime("c1", "eth0"));
    cni.add_network_list(&list, &rt).await.expect("ADD");
    let err = cni
        .del_network_list(&list, &rt)
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "first", Command::Del, 3);
    assert!(rig.cache_json("errobj", "c1", "eth0").is_some());
}

#[tokio::test]
async fn check_error_object_with_exit_0_fails() {
    let rig = Rig::new();
    rig.fake(
        "first",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    rig.fake(
        "second",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(RESULT))
            .on("CHECK", error_object_exit_0(101)),
    );
    let (cni, list, rt) = (rig.cni(), two_plugins("1.1.0"), runtime("c1", "eth0"));
    cni.add_network_list(&list, &rt).await.expect("ADD");
    let err = cni
        .check_network_list(&list, &rt)
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "second", Command::Check, 101);
}

#[tokio::test]
async fn status_error_object_with_exit_0_is_not_ready() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(error_object_exit_0(50)));
    rig.fake("second", &Fake::new(Response::ok("")));
    let err = rig
        .cni()
        .status_network_list(&two_plugins("1.1.0"))
        .await
        .expect_err("an error object is an error");
    match &err {
        Error::NotReady {
            plugin_type,
            error,
            stderr,
            ..
        } => {
            assert_eq!(plugin_type, "first");
            assert_eq!(
                **error,
                ErrorObject::new("1.1.0", 50, "no leases", "pool full")
            );
            assert_eq!(stderr, "diagnostics\n");
        }
        other => panic!("expected NotReady, got {other:?}"),
    }
    // Any other code: the plugin's error.
    rig.fake("first", &Fake::new(error_object_exit_0(102)));
    let err = rig
        .cni()
        .status_network_list(&two_plugins("1.1.0"))
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "first", Command::Status, 102);
}

#[tokio::test]
async fn gc_error_object_with_exit_0_is_reported() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok("")));
    rig.fake("second", &Fake::new(error_object_exit_0(104)));
    let keep = [GcAttachment {
        container_id: "c1".into(),
        ifname: "eth0".into(),
    }];
    let err = rig
        .cni()
        .gc_network_list(&two_plugins("1.1.0"), &keep)
        .await
        .expect_err("an error object is an error");
    match &err {
        Error::Multiple { errors, .. } => {
            assert_eq!(errors.len(), 1, "{err}");
            assert_plugin_error(&errors[0], "second", Command::Gc, 104);
        }
        other => panic!("expected Multiple, got {other:?}"),
    }
}

#[tokio::test]
async fn version_error_object_with_exit_0_is_the_plugins_error() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(error_object_exit_0(1)));
    let err = rig
        .cni()
        .version_info("first")
        .await
        .expect_err("an error object is an error");
    assert_plugin_error(&err, "first", Command::Version, 1);
}

/// Things that are not error objects stay results (or are ignored for
/// verbs that print nothing): a result that happens to carry a `code` key,
/// a `code` that is not a number, an empty result.
#[tokio::test]
async fn results_are_not_misread_as_error_objects() {
    for (stdout, want) in [
        (
            r#"{"cniVersion":"1.1.0","code":7,"ips":[{"address":"10.217.0.2/24"}]}"#,
            json!({"cniVersion":"1.1.0","ips":[{"address":"10.217.0.2/24"}]}),
        ),
        (
            r#"{"cniVersion":"1.1.0","code":7,"interfaces":[{"name":"eth0"}]}"#,
            json!({"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}]}),
        ),
        (
            r#"{"cniVersion":"1.1.0","code":7,"dns":{"nameservers":["10.0.0.1"]}}"#,
            json!({"cniVersion":"1.1.0","dns":{"nameservers":["10.0.0.1"]}}),
        ),
        (
            r#"{"cniVersion":"0.2.0","code":7,"ip4":{"ip":"10.217.0.2/24"}}"#,
            json!({"cniVersion":"1.1.0","ips":[{"address":"10.217.0.2/24"}]}),
        ),
        (
            r#"{"cniVersion":"1.1.0","code":"7"}"#,
            json!({"cniVersion":"1.1.0"}),
        ),
        (r#"{"cniVersion":"1.1.0"}"#, json!({"cniVersion":"1.1.0"})),
    ] {
        let rig = Rig::new();
        rig.fake("first", &Fake::new(Response::ok(stdout)));
        let list =
            conflist(json!({"cniVersion":"1.1.0","name":"res","plugins":[{"type":"first"}]}));
        let result = rig
            .cni()
            .add_network_list(&list, &runtime("c1", "eth0"))
            .await
            .unwrap_or_else(|e| panic!("{stdout}: {e}"));
        assert_eq!(result.to_value(), want, "{stdout}");
        assert_eq!(rig.cache_json("res", "c1", "eth0").unwrap()["result"], want);
        // DEL printing the same thing still succeeds.
        rig.cni()
            .del_network_list(&list, &runtime("c1", "eth0"))
            .await
            .unwrap_or_else(|e| panic!("DEL printing {stdout}: {e}"));
    }
}

/// libcni (since 1.0) reads a result without `cniVersion` as the version of
/// the configuration the plugin was given.
#[tokio::test]
async fn a_result_without_cni_version_has_the_config_version() {
    for (version, want) in [
        (
            "1.1.0",
            json!({"cniVersion":"1.1.0","ips":[{"address":"10.217.0.2/24","gateway":"10.217.0.1"}]}),
        ),
        (
            "1.0.0",
            json!({"cniVersion":"1.0.0","ips":[{"address":"10.217.0.2/24","gateway":"10.217.0.1"}]}),
        ),
        (
            "0.4.0",
            json!({"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.217.0.2/24","gateway":"10.217.0.1"}],"dns":{}}),
        ),
    ] {
        let rig = Rig::new();
        rig.fake(
            "first",
            &Fake::new(Response::ok(
                r#"{"ips":[{"address":"10.217.0.2/24","gateway":"10.217.0.1"}]}"#,
            )),
        );
        rig.fake(
            "second",
            &Fake::new(Response::ok("")).on("ADD", Response::ok(r#"{}"#)),
        );
        let list = two_plugins(version);
        let result = rig
            .cni()
            .add_network_list(&list, &runtime("c1", "eth0"))
            .await
            .unwrap_or_else(|e| panic!("{version}: {e}"));
        // The second plugin printed `{}`: an empty result of the list's version.
        assert_eq!(result.version(), Version::parse(version).unwrap());
        let calls = rig.dir.invocations();
        assert_eq!(
            calls[1].stdin_json()["prevResult"],
            want,
            "{version}: prevResult of the second plugin"
        );
        let cached = rig.cache_json("errobj", "c1", "eth0").expect("cached");
        assert_eq!(cached["result"]["cniVersion"], version);
    }
}
