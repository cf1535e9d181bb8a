//! A reader that goes away is no crash: `cnitool ... | head`,
//! `cnitool batch up ... 2>&1 | jq` that quits early. stdout and stderr are
//! pipes whose read end is already closed, so every write gets EPIPE: the
//! process ends with status 1 (or 0 when it wrote nothing), never a panic
//! (101), and leaves nothing behind.

use std::process::{Command, Stdio};

use crate::support::fake::Fake;
use crate::support::netns::{NETNS_DIR, unique_id};
use crate::support::require_root;
use crate::support::tool::Sandbox;
use serde_json::json;

/// Runs `cmd` with stdout and stderr on a pipe nobody reads any more.
fn run_into_closed_pipe(mut cmd: Command) -> Option<i32> {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let err = writer.try_clone().expect("dup the pipe");
    cmd.stdout(Stdio::from(writer)).stderr(Stdio::from(err));
    let status = cmd.status().expect("run cnitool");
    status.code()
}

#[test]
fn version_and_a_failure_into_a_closed_pipe_end_quietly() {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("pipenet", "1.0.0", &[json!({"type": "p"})]);
    // A result to print: EPIPE on stdout.
    assert_eq!(run_into_closed_pipe(sb.cnitool(&["version", "p"])), Some(1));
    // A failure to report: EPIPE on stderr.
    assert_eq!(
        run_into_closed_pipe(sb.cnitool(&["check", "pipenet", "/run/netns/pipes"])),
        Some(1)
    );
    // A usage error too.
    assert_eq!(run_into_closed_pipe(sb.cnitool(&["frobnicate"])), Some(1));
}

#[test]
fn batch_up_into_a_closed_pipe_does_not_panic() {
    require_root!();
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("pipebatch", "1.0.0", &[json!({"type": "p"})]);
    let prefix = format!("pipe{}-", unique_id());
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for e in std::fs::read_dir(NETNS_DIR).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&self.0) {
                    let _ = Command::new("ip").args(["netns", "del", &name]).status();
                }
            }
        }
    }
    let _cleanup = Cleanup(prefix.clone());
    let code = run_into_closed_pipe(sb.cnitool(&[
        "batch",
        "up",
        "pipebatch",
        "--count",
        "2",
        "--prefix",
        &prefix,
    ]));
    assert!(matches!(code, Some(0 | 1)), "exit status {code:?}");
    // What it set up is still there for `down`, which cleans it.
    sb.run(&["batch", "down", "pipebatch", "--prefix", &prefix, "-q"])
        .ok();
    let left: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
