//! Opt-in rollback of a failed ADD: the plugins that ran, including the one
//! that failed, get DEL last to first, with the last good result as
//! prevResult and a fresh deadline.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::fake::{
    Fake, GroupReaper, Invocation, RIG_KILL_GRACE, Response, Rig, assert_json_eq, conflist,
    read_pids, sh_quote, wait_group_gone,
};
use crate::support::gate::LOAD_MARGIN;
use cni_async::{CallOptions, Error};
use cni_core::RuntimeConf;
use serde_json::{Value, json};

fn result(n: u8) -> Value {
    json!({"cniVersion":"1.0.0","ips":[{"address": format!("10.214.0.{n}/24")}]})
}

/// p1 and p2 succeed (results 1 and 2); p3 answers ADD with `p3_add`;
/// DEL answers are given per plugin.
fn rig(p3_add: Response, del: [Response; 3]) -> Rig {
    let rig = Rig::new();
    let [d1, d2, d3] = del;
    rig.fake(
        "p1",
        &Fake::new(d1).on("ADD", Response::ok(&result(1).to_string())),
    );
    rig.fake(
        "p2",
        &Fake::new(d2).on("ADD", Response::ok(&result(2).to_string())),
    );
    rig.fake("p3", &Fake::new(d3).on("ADD", p3_add));
    rig
}

/// Like [`rig`], but p3's ADD succeeds and, while it runs, makes the cache
/// write fail by putting a file where the results dir goes.
fn rig_with_sabotage(rig: Rig, del: [Response; 3]) -> Rig {
    let [d1, d2, d3] = del;
    rig.fake(
        "p1",
        &Fake::new(d1).on("ADD", Response::ok(&result(1).to_string())),
    );
    rig.fake(
        "p2",
        &Fake::new(d2).on("ADD", Response::ok(&result(2).to_string())),
    );
    let results = rig.cache_dir.join("results");
    let sabotage = format!(
        "rm -rf {p}; mkdir -p {parent}; echo 'in the way' > {p}",
        p = support::fake::sh_quote(&results.to_string_lossy()),
        parent = support::fake::sh_quote(&rig.cache_dir.to_string_lossy()),
    );
    rig.fake(
        "p3",
        &Fake::new(d3).on(
            "ADD",
            Response::ok(&result(3).to_string()).with_shell(&sabotage),
        ),
    );
    rig
}

fn list() -> cni_core::NetworkConfigList {
    conflist(
        json!({"cniVersion":"1.0.0","name":"rb","plugins":[{"type":"p1"},{"type":"p2"},{"type":"p3"}]}),
    )
}

fn rt() -> RuntimeConf {
    RuntimeConf::new("c1", "/run/netns/c1", "eth0")
}

fn steps(calls: &[Invocation]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.command(), c.plugin))
        .collect()
}

fn oks() -> [Response; 3] {
    [Response::ok(""), Response::ok(""), Response::ok("")]
}

#[tokio::test]
async fn failed_add_is_rolled_back_last_to_first_with_the_last_good_result() {
    let rig = rig(Response::cni_error(110, "p3 broke", ""), oks());
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list(), &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(110), "the ADD's error comes back: {err}");
    let calls = rig.dir.invocations();
    assert_eq!(
        steps(&calls),
        ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
    );
    for call in &calls[3..] {
        assert_eq!(call.var("CNI_CONTAINERID"), Some("c1"));
        assert_json_eq(
            &call.stdin_json(),
            &json!({"type": call.plugin, "name":"rb", "cniVersion":"1.0.0", "prevResult": result(2)}),
            &format!("rollback DEL {}", call.plugin),
        );
    }
    assert!(
        rig.result_files().is_empty(),
        "no cache entry after a failed ADD"
    );
}

#[tokio::test]
async fn without_rollback_nothing_is_deleted() {
    let rig = rig(Response::cni_error(110, "p3 broke", ""), oks());
    let err = rig
        .cni()
        .add_network_list(&list(), &rt())
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(110), "{err}");
    assert_eq!(
        steps(&rig.dir.invocations()),
        ["ADD p1", "ADD p2", "ADD p3"]
    );
    assert!(rig.result_files().is_empty());
}

/// p3 hangs past the ADD deadline: the ADD times out, and the rollback DELs
/// still run (they get the DEL deadline, not the expired ADD one).
#[tokio::test]
async fn rollback_after_a_timeout_gets_a_fresh_deadline() {
    let pids = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let _reaper = GroupReaper(pids.to_path_buf());
    let shell = format!(
        "echo $$ >> {}\nsleep 1000",
        sh_quote(&pids.to_string_lossy())
    );
    let rig = rig(Response::ok("{}").with_shell(&shell), oks());
    // Plenty for p1 and p2 on a busy machine; p3 hangs.
    let timeout = Duration::from_secs(3);
    let opts = CallOptions {
        timeout: Some(timeout),
        rollback: true,
    };
    let started = Instant::now();
    let err = rig
        .cni()
        .add_network_list(&list(), &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    let elapsed = started.elapsed();
    match &err {
        Error::Timeout {
            plugin_type,
            command,
            ..
        } => {
            assert_eq!(plugin_type, "p3");
            assert_eq!(*command, cni_core::Command::Add);
        }
        other => panic!("expected a timeout of p3, got {other}"),
    }
    let calls = rig.dir.invocations();
    assert_eq!(
        steps(&calls),
        ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
    );
    for call in &calls[3..] {
        assert_json_eq(
            &call.stdin_json()["prevResult"],
            &result(2),
            "rollback prevResult",
        );
    }
    // The ADD's deadline, the kill, three quick DELs: not p3's 1000 s.
    assert!(elapsed >= timeout, "returned early: {elapsed:?}");
    assert!(
        elapsed < timeout + RIG_KILL_GRACE + LOAD_MARGIN,
        "took {elapsed:?}"
    );
    let p3 = read_pids(&pids);
    assert_eq!(p3.len(), 1);
    let left = wait_group_gone(p3[0], LOAD_MARGIN).await;
    assert!(left.is_empty(), "p3's group survived its timeout: {left:?}");
}

#[tokio::test]
async fn failing_rollback_reports_both_errors() {
    let rig = rig(
        Response::cni_error(110, "p3 broke", ""),
        [
            Response::ok(""),
            Response::cni_error(111, "p2 DEL broke", ""),
            Response::ok(""),
        ],
    );
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list(), &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    match &err {
        Error::RollbackFailed { error, rollback } => {
            assert!(error.is_plugin_code(110), "{error}");
            assert!(rollback.is_plugin_code(111), "{rollback}");
        }
        other => panic!("expected RollbackFailed, got {other}"),
    }
    assert_eq!(err.code(), 110, "the ADD's code");
    let msg = err.to_string();
    assert!(
        msg.contains("p3 broke")
            && msg.contains("rollback also failed")
            && msg.contains("p2 DEL broke"),
        "{msg}"
    );
    // Unlike DEL, the rollback goes on past a failing plugin: it is
    // cleanup, and p1 still gets its DEL.
    assert_eq!(
        steps(&rig.dir.invocations()),
        ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
    );
}

/// The first plugin failing: only it is rolled back, without prevResult.
#[tokio::test]
async fn first_plugin_failing_is_rolled_back_without_prev_result() {
    let rig = Rig::new();
    rig.fake(
        "p1",
        &Fake::new(Response::ok("")).on("ADD", Response::cni_error(7, "bad config", "")),
    );
    rig.fake("p2", &Fake::new(Response::ok("")));
    let list =
        conflist(json!({"cniVersion":"1.0.0","name":"rb","plugins":[{"type":"p1"},{"type":"p2"}]}));
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list, &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(7), "{err}");
    let calls = rig.dir.invocations();
    assert_eq!(steps(&calls), ["ADD p1", "DEL p1"]);
    assert!(calls[1].stdin_json().get("prevResult").is_none());
}

/// Regression: a plugin that is not installed never ran, so the rollback
/// must not DEL it (that DEL fails the same way and used to stop the
/// rollback before the plugins that did run).
#[tokio::test]
async fn a_plugin_that_never_started_is_not_rolled_back() {
    let rig = Rig::new();
    rig.fake(
        "p1",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result(1).to_string())),
    );
    rig.fake(
        "p2",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result(2).to_string())),
    );
    let list = conflist(
        json!({"cniVersion":"1.0.0","name":"rb","plugins":[{"type":"p1"},{"type":"p2"},{"type":"absent"}]}),
    );
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list, &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    let calls = rig.dir.invocations();
    assert_eq!(steps(&calls), ["ADD p1", "ADD p2", "DEL p2", "DEL p1"]);
    for call in &calls[2..] {
        assert_json_eq(
            &call.stdin_json()["prevResult"],
            &result(2),
            "rollback prevResult",
        );
    }
}

/// `<cache>/results` is a regular file, so the cache write fails after the
/// whole chain ran: the error is the cache's; with rollback every plugin
/// gets DEL with the final result, without it none does.
#[tokio::test]
async fn a_failed_cache_write_is_reported_and_rolled_back_on_request() {
    for rollback in [false, true] {
        // p3 puts a file where the results dir goes while it runs: after the
        // ADD's up-front cache checks, before the final write.
        let rig = Rig::new();
        let rig = rig_with_sabotage(rig, oks());
        let opts = CallOptions {
            rollback,
            ..Default::default()
        };
        let err = rig
            .cni()
            .add_network_list(&list(), &rt())
            .options(&opts)
            .await
            .unwrap_err();
        // Without rollback the attachment stands unrecorded: owed a DEL.
        assert_eq!(err.del_owed(), !rollback, "{err:?}");
        let err = err.into_innermost();
        assert!(
            matches!(err, Error::Cache { .. }),
            "rollback {rollback}: {err}"
        );
        assert_eq!(err.code(), 5);
        let calls = rig.dir.invocations();
        if rollback {
            assert_eq!(
                steps(&calls),
                ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
            );
            for call in &calls[3..] {
                assert_json_eq(
                    &call.stdin_json()["prevResult"],
                    &result(3),
                    "rollback prevResult",
                );
            }
        } else {
            assert_eq!(steps(&calls), ["ADD p1", "ADD p2", "ADD p3"]);
        }
    }
}

/// Regression: when the cache write fails and so does the rollback after
/// it, both errors are reported (the rollback error used to be dropped).
#[tokio::test]
async fn a_failed_rollback_after_a_failed_cache_write_is_reported() {
    let rig = rig_with_sabotage(
        Rig::new(),
        [
            Response::ok(""),
            Response::cni_error(111, "p2 DEL broke", ""),
            Response::ok(""),
        ],
    );
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list(), &rt())
        .options(&opts)
        .await
        .unwrap_err()
        .into_innermost();
    match &err {
        Error::RollbackFailed { error, rollback } => {
            assert!(matches!(**error, Error::Cache { .. }), "{error}");
            assert!(rollback.is_plugin_code(111), "{rollback}");
        }
        other => panic!("expected RollbackFailed, got {other}"),
    }
}
