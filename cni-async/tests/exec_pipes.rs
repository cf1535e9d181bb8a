//! stdin is written while stdout and stderr are read: no pipe deadlock, and
//! a plugin that does not read its stdin is not an error by itself.

use std::time::Duration;

use crate::support::fake::{PluginDir, env};
use cni_async::exec::{ExecRequest, PluginExec, RawExec};
use cni_core::Command;

/// Bigger than a pipe buffer (64 KiB by default, 1 MiB at most by default).
const BIG: usize = 2 * 1024 * 1024;

fn big_stdin() -> Vec<u8> {
    (0..BIG).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn plugin_writing_big_stdout_before_reading_big_stdin_does_not_deadlock() {
    let dir = PluginDir::new();
    // Writes 2 MiB, then reads all of stdin and reports its size on stderr.
    let path = dir.script("fake", &format!("head -c {BIG} /dev/zero\nwc -c >&2"));
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let stdin = big_stdin();
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Add,
        &vars,
        &stdin,
        Duration::from_secs(10),
    );
    let out = RawExec::new().exec(req).await.expect("plugin succeeds");
    assert_eq!(out.stdout.len(), BIG);
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), BIG.to_string());
}

#[tokio::test]
async fn plugin_that_never_reads_stdin_and_writes_big_stdout_succeeds() {
    let dir = PluginDir::new();
    let path = dir.script("fake", &format!("head -c {BIG} /dev/zero\nexit 0"));
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let stdin = big_stdin();
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Add,
        &vars,
        &stdin,
        Duration::from_secs(10),
    );
    let out = RawExec::new()
        .exec(req)
        .await
        .expect("EPIPE on stdin is not an error");
    assert_eq!(out.stdout.len(), BIG);
}

#[tokio::test]
async fn plugin_that_closes_stdin_early_is_judged_by_its_exit_status() {
    let dir = PluginDir::new();
    let path = dir.script("fake", "exec 0<&-\necho nope >&2\nexit 2");
    let vars = env(&[("CNI_COMMAND", "DEL")]);
    let stdin = big_stdin();
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Del,
        &vars,
        &stdin,
        Duration::from_secs(10),
    );
    let err = RawExec::new().exec(req).await.expect_err("exit 2");
    assert_eq!(
        err.to_string(),
        "plugin fake DEL failed (exit status 2): nope"
    );
}

#[tokio::test]
async fn echo_plugin_returns_big_stdin_exactly() {
    let dir = PluginDir::new();
    let path = dir.script("cat", "exec cat");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let stdin = big_stdin();
    let req = ExecRequest::new(
        &path,
        "cat",
        Command::Add,
        &vars,
        &stdin,
        Duration::from_secs(10),
    );
    let out = RawExec::new().exec(req).await.expect("plugin succeeds");
    assert!(out.stdout == stdin, "stdout differs from stdin");
}

#[tokio::test]
async fn empty_stdin_is_an_immediate_eof() {
    let dir = PluginDir::new();
    let path = dir.script("fake", "wc -c");
    let vars = env(&[("CNI_COMMAND", "VERSION")]);
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Version,
        &vars,
        b"",
        Duration::from_secs(5),
    );
    let out = RawExec::new().exec(req).await.expect("plugin succeeds");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}
