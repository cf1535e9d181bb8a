//! cnitool passes the stderr of plugins that succeed through to its own
//! stderr, as libcni does: whole (300 KB too, without a
//! deadlock), stdout left to the result JSON; with `--json-errors` it comes
//! out on success and is held back on failure, so stderr is then the error
//! JSON alone.

use std::time::Duration;

use crate::support::fake::{Fake, Response, write_file};
use crate::support::gate::LOAD_MARGIN;
use crate::support::tool::Sandbox;
use cni_async::RawExec;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.7.3/24"}]}"#;

fn noisy(stdout: &str, stderr: &str) -> Response {
    Response {
        stderr: stderr.as_bytes().to_vec(),
        ..Response::ok(stdout)
    }
}

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake(
        "talker",
        &Fake::new(noisy("", "warning: on del\n")).on("ADD", noisy(RESULT, "warning: x\n")),
    );
    sb.conflist("stderrnet", "1.0.0", &[json!({"type": "talker"})]);
    sb
}

#[test]
fn a_successful_plugins_stderr_reaches_cnitools_stderr() {
    let sb = sandbox();
    let netns = sb.netns("stderrtest");
    let run = sb.run(&["add", "stderrnet", &netns]).ok();
    assert!(
        run.stderr.contains("warning: x\n"),
        "stderr: {}",
        run.stderr
    );
    // stdout is the result JSON and nothing else.
    assert_eq!(run.stdout_json()["ips"][0]["address"], "10.1.7.3/24");
    let del = sb.run(&["del", "stderrnet", &netns]).ok();
    assert_eq!(del.stdout, "");
    assert!(
        del.stderr.contains("warning: on del\n"),
        "stderr: {}",
        del.stderr
    );
}

#[test]
fn json_errors_pass_it_on_success_and_keep_stderr_to_the_error_json_on_failure() {
    let sb = sandbox();
    let netns = sb.netns("stderrtest");
    let run = sb.run(&["--json-errors", "add", "stderrnet", &netns]).ok();
    assert_eq!(run.stderr, "warning: x\n");
    assert_eq!(run.stdout_json()["ips"][0]["address"], "10.1.7.3/24");

    // A chain whose first plugin talks and whose second fails: stderr is
    // the error JSON alone (the talker's line is not mixed into it).
    sb.plugins.fake(
        "bad",
        &Fake::new(Response::cni_error(101, "no good", "details")),
    );
    sb.conflist(
        "failnet",
        "1.0.0",
        &[json!({"type": "talker"}), json!({"type": "bad"})],
    );
    let err = sb
        .run(&["--json-errors", "add", "failnet", &netns])
        .fails_json();
    assert_eq!(err["code"], 101, "{err}");
}

#[test]
fn three_hundred_kb_of_stderr_pass_through_whole_without_deadlock() {
    const BIG: usize = 300 * 1024;
    let sb = Sandbox::new();
    let netns = sb.netns("stderrtest");
    let blob: String = (0..BIG)
        .map(|i| if i % 64 == 63 { '\n' } else { 'w' })
        .collect();
    let file = write_file(&sb.root().join("big-stderr"), blob.as_bytes(), 0o644);
    // stderr first, far more than a pipe buffer, then the result.
    sb.plugins.fake(
        "big",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(RESULT).with_shell(&format!("cat '{}' >&2", file.display())),
        ),
    );
    sb.conflist("bignet", "1.0.0", &[json!({"type": "big"})]);
    let timeout = Duration::from_secs(20);
    let run = sb
        .run_env(&["add", "bignet", &netns], &[("CNI_TIMEOUT", "20")])
        .ok();
    // A deadlock would have ended in the plugin's timeout (a failure), or
    // not at all; the bound is the deadline, the kill and a busy machine.
    assert!(
        run.elapsed < timeout + RawExec::DEFAULT_KILL_GRACE + LOAD_MARGIN,
        "took {:?}",
        run.elapsed
    );
    assert!(
        run.stderr.contains(&blob),
        "stderr lacks the plugin's {BIG} bytes: it has {} bytes",
        run.stderr.len()
    );
    assert_eq!(run.stdout_json()["ips"][0]["address"], "10.1.7.3/24");
}
