//! Deadlines, cancellation and output caps: the call returns in bounded time
//! and no process of the plugin's group survives.
//!
//! The fakes write their pids (`$$`, the group leader, first) to a file so
//! the tests can check they are gone. A [`GroupReaper`] kills leftovers when
//! a test fails.

use crate::support;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::fake::{
    GroupReaper, PluginDir, env, our_zombie, read_pids, sh_quote, wait_for_pids, wait_gone,
    wait_group_gone,
};
use crate::support::gate::LOAD_MARGIN;
use cni_async::Error;
use cni_async::exec::{ExecOutput, ExecRequest, OutputLimits, PluginExec, RawExec};
use cni_core::Command;

const GRACE: Duration = Duration::from_millis(300);

fn exec() -> RawExec {
    RawExec::new().with_kill_grace(GRACE)
}

/// A plugin dir with script `name`, whose `$PIDS` is the returned pid file.
fn plugin(dir: &PluginDir, name: &str, body: &str) -> (PathBuf, PathBuf) {
    let pids = dir.scratch("pids");
    let script = format!(
        "PIDS={}\necho $$ >> \"$PIDS\"\n{body}",
        sh_quote(&pids.to_string_lossy())
    );
    (dir.script(name, &script), pids)
}

async fn run(
    path: &Path,
    timeout: Duration,
    limits: OutputLimits,
) -> (Result<ExecOutput, Error>, Duration) {
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req =
        ExecRequest::new(path, "fake", Command::Add, &vars, b"{}", timeout).with_limits(limits);
    let start = Instant::now();
    let r = exec().exec(req).await;
    (r, start.elapsed())
}

/// How long a test waits for the fake's pids to appear.
const STARTUP: Duration = Duration::from_secs(30);

/// Nothing of the group led by the first pid in `pids` is left, and the
/// leader (our child) was reaped. `within` covers the kernel finishing off
/// processes already sent SIGKILL (they may need a turn on a busy CPU).
async fn assert_all_gone(pids_file: &Path, within: Duration) {
    let pids = read_pids(pids_file);
    assert!(!pids.is_empty(), "the fake wrote no pids");
    let left = wait_gone(&pids, within).await;
    assert!(left.is_empty(), "processes left: {left:?}");
    // Members not in the pids file (a `sleep 0.05` the plugin's loop had
    // just forked) were killed with the group but may still be on their way
    // out on a busy CPU: wait for the group as for the pids.
    let group = wait_group_gone(pids[0], within).await;
    assert!(group.is_empty(), "group {} not empty: {group:?}", pids[0]);
    assert!(!our_zombie(pids[0]), "plugin {} not reaped", pids[0]);
}

#[tokio::test]
async fn hang_times_out_and_kills_the_group() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(
        &dir,
        "hang",
        "echo starting >&2\nsleep 1000 &\necho $! >> \"$PIDS\"\nwait",
    );
    let _reaper = GroupReaper(pids.clone());
    let timeout = Duration::from_secs(1);
    let (r, elapsed) = run(&path, timeout, OutputLimits::default()).await;
    match r {
        Err(Error::Timeout {
            plugin_type,
            command,
            elapsed: e,
            timeout: t,
            stderr_so_far,
        }) => {
            assert_eq!(plugin_type, "fake");
            assert_eq!(command, Command::Add);
            assert!(e >= timeout, "{e:?}");
            assert_eq!(t, timeout);
            assert_eq!(stderr_so_far, "starting\n");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(elapsed >= timeout, "{elapsed:?}");
    // The plugin would hang for 1000 s; it obeys SIGTERM.
    assert!(
        elapsed < timeout + LOAD_MARGIN,
        "returned after {elapsed:?}"
    );
    // exec awaited the kill: nothing may be left when it returns.
    assert_all_gone(&pids, LOAD_MARGIN).await;
}

#[tokio::test]
async fn a_group_that_ignores_sigterm_gets_sigkill_after_the_grace() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(
        &dir,
        "stubborn",
        "trap '' TERM\n(trap '' TERM; sleep 1000) &\necho $! >> \"$PIDS\"\nwhile :; do sleep 0.05; done",
    );
    let _reaper = GroupReaper(pids.clone());
    let timeout = Duration::from_secs(1);
    let (r, elapsed) = run(&path, timeout, OutputLimits::default()).await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(
        elapsed >= timeout + GRACE,
        "SIGKILL came before the grace: {elapsed:?}"
    );
    assert!(
        elapsed < timeout + GRACE + LOAD_MARGIN,
        "returned after {elapsed:?}"
    );
    assert_all_gone(&pids, LOAD_MARGIN).await;
}

#[tokio::test]
async fn hang_with_a_grandchild_holding_the_pipes_returns_in_time() {
    let dir = PluginDir::new();
    // The grandchild ignores SIGTERM and keeps stdout and stderr open; the
    // plugin itself hangs too.
    let (path, pids) = plugin(
        &dir,
        "holder",
        "(trap '' TERM; exec sleep 1000) &\necho $! >> \"$PIDS\"\nsleep 1000",
    );
    let _reaper = GroupReaper(pids.clone());
    let timeout = Duration::from_secs(1);
    let (r, elapsed) = run(&path, timeout, OutputLimits::default()).await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    // Not waiting for the grandchild (1000 s) to close the pipes.
    assert!(
        elapsed < timeout + GRACE + LOAD_MARGIN,
        "returned after {elapsed:?}"
    );
    assert_all_gone(&pids, LOAD_MARGIN).await;
}

/// libcni waits for pipe EOF here and hangs as long as the grandchild lives.
/// We read for the drain window after the plugin exited, return its output,
/// and kill the group.
#[tokio::test]
async fn exit_0_with_a_grandchild_holding_stdout_returns_the_output_promptly() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(
        &dir,
        "leaky",
        "sleep 1000 &\necho $! >> \"$PIDS\"\nprintf '{\"cniVersion\":\"1.1.0\"}'\nexit 0",
    );
    let _reaper = GroupReaper(pids.clone());
    let timeout = Duration::from_secs(10);
    let (r, elapsed) = run(&path, timeout, OutputLimits::default()).await;
    let out = r.expect("the plugin's own exit status decides");
    assert_eq!(out.stdout, br#"{"cniVersion":"1.1.0"}"#);
    // Neither the grandchild's 1000 s nor the 10 s deadline.
    assert!(
        elapsed < RawExec::DEFAULT_DRAIN_WINDOW + GRACE + LOAD_MARGIN,
        "returned after {elapsed:?}"
    );
    assert_all_gone(&pids, LOAD_MARGIN).await;
}

#[tokio::test]
async fn exit_1_with_a_grandchild_holding_stderr_is_still_a_plugin_error() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(
        &dir,
        "leaky",
        "sleep 1000 >/dev/null &\necho $! >> \"$PIDS\"\necho 'bad thing' >&2\nexit 1",
    );
    let _reaper = GroupReaper(pids.clone());
    let (r, elapsed) = run(&path, Duration::from_secs(10), OutputLimits::default()).await;
    let err = r.expect_err("exit 1");
    assert_eq!(
        err.to_string(),
        "plugin fake ADD failed (exit status 1): bad thing"
    );
    // Neither the grandchild's 1000 s nor the 10 s deadline.
    assert!(
        elapsed < RawExec::DEFAULT_DRAIN_WINDOW + GRACE + LOAD_MARGIN,
        "returned after {elapsed:?}"
    );
    assert_all_gone(&pids, LOAD_MARGIN).await;
}

#[tokio::test]
async fn dropping_the_future_kills_the_group() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(&dir, "hang", "sleep 1000 &\necho $! >> \"$PIDS\"\nwait");
    let _reaper = GroupReaper(pids.clone());
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let exec = exec();
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Add,
        &vars,
        b"{}",
        Duration::from_secs(30),
    );
    // Dropped once both processes run.
    let started = tokio::select! {
        r = exec.exec(req) => panic!("the plugin cannot have finished: {r:?}"),
        p = wait_for_pids(&pids, 2, STARTUP) => p,
    };
    assert_eq!(started.len(), 2, "both processes had started");
    // SIGTERM was sent from the drop; the reaper task finishes the job.
    assert_all_gone(&pids, GRACE + LOAD_MARGIN).await;
}

#[tokio::test]
async fn dropping_the_future_escalates_to_sigkill() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(
        &dir,
        "stubborn",
        "trap '' TERM\nsleep 1000 &\necho $! >> \"$PIDS\"\nwhile :; do sleep 0.05; done",
    );
    let _reaper = GroupReaper(pids.clone());
    let vars = env(&[("CNI_COMMAND", "DEL")]);
    // A grace long enough to look at the processes during it, busy machine
    // or not.
    let grace = Duration::from_secs(5);
    let exec = RawExec::new().with_kill_grace(grace);
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Del,
        &vars,
        b"{}",
        Duration::from_secs(30),
    );
    tokio::select! {
        r = exec.exec(req) => panic!("the plugin cannot have finished: {r:?}"),
        _ = wait_for_pids(&pids, 2, STARTUP) => {}
    }
    let dropped = Instant::now();
    let all = read_pids(&pids);
    assert_eq!(all.len(), 2);
    // Still alive a second into the grace: they ignore SIGTERM, and
    // SIGKILL waits for the grace to end.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alive = all.iter().all(|p| support::fake::alive(*p));
    let looked = dropped.elapsed();
    assert!(looked < grace, "looked only after the grace: {looked:?}");
    assert!(alive, "killed before the grace");
    assert_all_gone(&pids, grace + LOAD_MARGIN).await;
}

/// A future dropped outside any runtime: the kill runs on a thread.
#[test]
#[allow(clippy::async_yields_async)] // the un-awaited future is the point
fn dropping_the_future_outside_a_runtime_kills_the_group() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(&dir, "hang", "sleep 1000 &\necho $! >> \"$PIDS\"\nwait");
    let _reaper = GroupReaper(pids.clone());
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let exec = exec();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fut = rt.block_on(async {
        let req = ExecRequest::new(
            &path,
            "fake",
            Command::Add,
            &vars,
            b"{}",
            Duration::from_secs(30),
        );
        let mut fut = exec.exec(req);
        let started = tokio::select! {
            r = &mut fut => panic!("the plugin cannot have finished: {r:?}"),
            p = wait_for_pids(&pids, 2, STARTUP) => p,
        };
        assert_eq!(started.len(), 2, "both processes had started");
        fut
    });
    drop(rt);
    assert!(tokio::runtime::Handle::try_current().is_err());
    drop(fut);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(assert_all_gone(&pids, GRACE + LOAD_MARGIN));
}

#[tokio::test]
async fn stdout_over_the_cap_is_an_error_and_kills_the_group() {
    let dir = PluginDir::new();
    let (path, pids) = plugin(&dir, "flood", "head -c 67108864 /dev/zero\nsleep 1000");
    let _reaper = GroupReaper(pids.clone());
    let limits = OutputLimits {
        stdout: 256 * 1024,
        ..OutputLimits::default()
    };
    let (r, elapsed) = run(&path, Duration::from_secs(30), limits).await;
    match r {
        Err(Error::OutputTooLarge {
            limit, plugin_type, ..
        }) => {
            assert_eq!(limit, 256 * 1024);
            assert_eq!(plugin_type, "fake");
        }
        other => panic!("expected the output cap error, got {other:?}"),
    }
    // At the cap, not at the 30 s deadline (nor after the plugin's 1000 s).
    assert!(elapsed < GRACE + LOAD_MARGIN, "returned after {elapsed:?}");
    assert_all_gone(&pids, LOAD_MARGIN).await;
}
