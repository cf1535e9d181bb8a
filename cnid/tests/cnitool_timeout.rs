//! `CNI_TIMEOUT`: a deadline per operation; a plugin that hangs is killed
//! and cnitool fails with a timeout message soon after.

use crate::support;
use std::time::Duration;

use crate::support::fake::{Fake, Response};
use crate::support::gate::{Gate, LOAD_MARGIN};
use crate::support::tool::Sandbox;
use cni_async::RawExec;
use serde_json::json;

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[test]
fn a_hanging_plugin_fails_add_soon_after_the_timeout() {
    let sb = Sandbox::new();
    let netns = sb.netns("timeouttest");
    let pid_file = sb.root().join("hang.pid");
    sb.plugins.fake(
        "hang",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok("").with_shell(&format!(
                "echo $$ > '{}'; echo 'waiting forever' >&2; exec sleep 1000",
                pid_file.display()
            )),
        ),
    );
    sb.conflist("slownet", "1.0.0", &[json!({"type": "hang"})]);
    let run = sb.run_env(&["add", "slownet", &netns], &[("CNI_TIMEOUT", "1")]);
    let elapsed = run.elapsed;
    let err = run.fails();
    // The timeout, the kill (the plugin obeys SIGTERM), and what a busy
    // machine adds; not the plugin's 1000 s.
    let timeout = Duration::from_secs(1);
    assert!(
        elapsed < timeout + RawExec::DEFAULT_KILL_GRACE + LOAD_MARGIN,
        "took {elapsed:?} with CNI_TIMEOUT=1"
    );
    assert!(elapsed >= timeout, "took only {elapsed:?}");
    assert!(err.contains("plugin hang ADD timed out"), "{err}");
    assert!(err.contains("waiting forever"), "{err}");
    // The plugin is gone, not left sleeping.
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("the plugin wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    assert!(!alive(pid), "plugin {pid} still running");
    // With JSON errors: code 11 (try again later).
    let json = sb
        .run_env(
            &["--json-errors", "add", "slownet", &netns],
            &[("CNI_TIMEOUT", "0.3")],
        )
        .fails_json();
    assert_eq!(json["code"], 11);
    assert!(
        json["msg"].as_str().unwrap().contains("timed out"),
        "{json}"
    );
}

/// The timeout covers the whole chain, not each plugin: s1 holds at a
/// gate for at least `hold`, so s2 starts with what s1 left of the
/// timeout (its error names that deadline: at most the timeout less
/// `hold`); s2 then waits at a gate of its own, is killed at the chain's
/// deadline, and s3 never starts. With both gates open, a generous timeout
/// lets the chain through. Ordered by the gates alone: s1 has the rest of the timeout after
/// its release to finish (2 s), which a busy machine keeps.
#[test]
fn the_timeout_covers_the_whole_chain() {
    let sb = Sandbox::new();
    let netns = sb.netns("timeouttest");
    let gate = Gate::new(sb.root());
    let result = support::fake::result_json("1.0.0", "10.1.2.3/24");
    sb.plugins.fake(
        "s1",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(&result).with_shell(&gate.shell_wait())),
    );
    let s2_gate = Gate::new(sb.root());
    sb.plugins.fake(
        "s2",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(&result).with_shell(&s2_gate.shell_wait()),
        ),
    );
    sb.plugins.fake("s3", &Fake::new(Response::ok(&result)));
    sb.conflist(
        "chainnet",
        "1.0.0",
        &[
            json!({"type": "s1"}),
            json!({"type": "s2"}),
            json!({"type": "s3"}),
        ],
    );
    let timeout = Duration::from_secs(3);
    let hold = Duration::from_secs(1);
    let run = std::thread::scope(|scope| {
        let run = scope.spawn(|| sb.run_env(&["add", "chainnet", &netns], &[("CNI_TIMEOUT", "3")]));
        // The operation (and its deadline) began before s1 started.
        gate.wait_started_blocking(1);
        std::thread::sleep(hold);
        gate.release();
        run.join().expect("cnitool thread")
    });
    let elapsed = run.elapsed;
    let err = run.fails();
    assert!(err.contains("plugin s2 ADD timed out"), "{err}");
    let deadline_ms: u128 = err
        .split("(deadline ")
        .nth(1)
        .and_then(|rest| rest.split("ms").next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no deadline in ms in: {err}"));
    assert!(
        deadline_ms <= (timeout - hold).as_millis(),
        "s2 started with {deadline_ms} ms, more than the timeout less s1's hold: {err}"
    );
    assert!(elapsed >= timeout, "took only {elapsed:?}");
    assert!(
        elapsed < timeout + RawExec::DEFAULT_KILL_GRACE + LOAD_MARGIN,
        "took {elapsed:?}"
    );
    let started: Vec<String> = sb
        .plugins
        .invocations_of("ADD")
        .iter()
        .map(|i| i.plugin.clone())
        .collect();
    assert_eq!(started, ["s1", "s2"]);
    assert!(sb.cache_entries().is_empty(), "a failed ADD caches nothing");
    // A generous timeout lets it through.
    s2_gate.release();
    sb.run_env(&["add", "chainnet", &netns], &[("CNI_TIMEOUT", "30")])
        .ok();
}
