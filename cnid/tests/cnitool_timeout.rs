//! `CNI_TIMEOUT`: a deadline per operation; a plugin that hangs is killed
//! and cnitool fails with a timeout message soon after.

mod support;

use std::time::Duration;

use serde_json::json;
use support::fake::{Fake, Response};
use support::tool::Sandbox;

const NETNS: &str = "/run/netns/timeouttest";

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[test]
fn a_hanging_plugin_fails_add_within_the_timeout_plus_one_second() {
    let sb = Sandbox::new();
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
    let run = sb.run_env(&["add", "slownet", NETNS], &[("CNI_TIMEOUT", "1")]);
    let elapsed = run.elapsed;
    let err = run.fails();
    assert!(
        elapsed < Duration::from_secs(2),
        "took {elapsed:?} with CNI_TIMEOUT=1"
    );
    assert!(
        elapsed >= Duration::from_millis(900),
        "took only {elapsed:?}"
    );
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
            &["--json-errors", "add", "slownet", NETNS],
            &[("CNI_TIMEOUT", "0.3")],
        )
        .fails_json();
    assert_eq!(json["code"], 11);
    assert!(
        json["msg"].as_str().unwrap().contains("timed out"),
        "{json}"
    );
}

#[test]
fn the_timeout_covers_the_whole_chain() {
    let sb = Sandbox::new();
    // Each plugin takes 0.4 s: the chain of three needs 1.2 s.
    let slow = Fake::new(Response::ok("")).on(
        "ADD",
        Response::ok(&support::fake::result_json("1.0.0", "10.1.2.3/24")).with_shell("sleep 0.4"),
    );
    for name in ["s1", "s2", "s3"] {
        sb.plugins.fake(name, &slow);
    }
    sb.conflist(
        "chainnet",
        "1.0.0",
        &[
            json!({"type": "s1"}),
            json!({"type": "s2"}),
            json!({"type": "s3"}),
        ],
    );
    let run = sb.run_env(&["add", "chainnet", NETNS], &[("CNI_TIMEOUT", "0.7")]);
    let elapsed = run.elapsed;
    let err = run.fails();
    // s2 normally; s1 on a loaded machine. Never s3: the deadline is spent.
    assert!(err.contains("ADD timed out"), "{err}");
    assert!(elapsed < Duration::from_millis(1700), "took {elapsed:?}");
    let started: Vec<String> = sb
        .plugins
        .invocations_of("ADD")
        .iter()
        .map(|i| i.plugin.clone())
        .collect();
    assert!(!started.contains(&"s3".to_owned()), "{started:?}");
    assert!(sb.cache_entries().is_empty(), "a failed ADD caches nothing");
    // A generous timeout lets it through.
    sb.run_env(&["add", "chainnet", NETNS], &[("CNI_TIMEOUT", "30")])
        .ok();
}
