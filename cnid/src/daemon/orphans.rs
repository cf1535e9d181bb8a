//! Plugins orphaned by a daemon that died (`kill -9`, the OOM killer, a
//! crash): found and stopped at the next start, before anything else runs.
//!
//! Every plugin runs in a process group of its own (so that a deadline can
//! kill all it forked), which also means it outlives the daemon: a plugin
//! half way through an ADD goes on, and may allocate an IP or make an
//! interface *after* the restarted daemon rolled that ADD back from its
//! intent. Nothing would ever delete that. So:
//!
//! - [`MarkedExec`] puts `CNID_STATE_DIR=<canonical state dir>` in the
//!   environment of every plugin the daemon runs;
//! - [`stop_orphans`], called at start while the state dir is locked (so no
//!   other live daemon uses it) and before recovery or any request, finds
//!   every plugin still running with that mark: a process that leads its own
//!   process group but not a session of its own (a plugin, as we start them)
//!   and is not a zombie. Each group gets SIGTERM, then SIGKILL after a
//!   grace, and the daemon waits (bounded) until they are gone.
//!
//! A process a plugin started in a session of its own (`setsid`: a daemon
//! started on purpose) is not a group leader outside its session and is
//! left alone; so is what a plugin left behind in its group after the
//! plugin itself exited (its verb was over), as the executor does.
//!
//! # Caveats
//! Linux only (`/proc`). The mark is visible to plugins, like the rest of
//! the daemon's environment they inherit.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_async::exec::{ExecOutput, ExecRequest, PluginExec};
use cni_async::sys::{Signal, group_alive, signal_group};
use futures::future::BoxFuture;

/// The variable marking the plugins of the daemon of one state dir.
pub(crate) const MARK: &str = "CNID_STATE_DIR";
/// How often the orphans' groups are checked while waiting for them.
const POLL: Duration = Duration::from_millis(20);
/// How long we wait after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The mark's value for a state dir: its canonical path.
pub(crate) fn mark_value(state_dir: &Path) -> String {
    std::fs::canonicalize(state_dir)
        .unwrap_or_else(|_| state_dir.to_owned())
        .display()
        .to_string()
}

/// A [`PluginExec`] that adds the mark to every plugin's environment.
#[derive(Debug)]
pub(crate) struct MarkedExec {
    inner: Arc<dyn PluginExec>,
    value: String,
}

impl MarkedExec {
    pub(crate) fn new(inner: Arc<dyn PluginExec>, value: String) -> Self {
        MarkedExec { inner, value }
    }
}

impl PluginExec for MarkedExec {
    fn exec<'a>(
        &'a self,
        req: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, cni_async::Error>> {
        Box::pin(async move {
            let mut env = Vec::with_capacity(req.env.len() + 1);
            env.extend(req.env.iter().filter(|(k, _)| k != MARK).cloned());
            env.push((MARK.to_owned(), self.value.clone()));
            let marked = ExecRequest::new(
                req.plugin_path,
                req.plugin_type,
                req.command,
                &env,
                req.stdin,
                req.timeout,
            )
            .with_limits(req.limits);
            self.inner.exec(marked).await
        })
    }

    fn find_plugin(
        &self,
        plugin_type: &str,
        dirs: &[std::path::PathBuf],
    ) -> Result<std::path::PathBuf, cni_async::Error> {
        self.inner.find_plugin(plugin_type, dirs)
    }
}

/// `(state, pgrp, session)` of a process, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u32, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp session ...`; comm may hold anything.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgrp = f.next()?.parse().ok()?;
    let session = f.next()?.parse().ok()?;
    Some((state, pgrp, session))
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn has_mark(pid: u32, entry: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|e| e == entry))
        .unwrap_or(false)
}

/// The running plugins (group leaders, not session leaders) with our mark.
fn find(value: &str) -> Vec<u32> {
    let entry = format!("{MARK}={value}").into_bytes();
    let me = std::process::id();
    pids()
        .into_iter()
        .filter(|&pid| pid != me && pid > 1)
        .filter(|&pid| {
            matches!(stat(pid), Some((state, pgrp, session))
                if pgrp == pid && session != pid && state != 'Z' && state != 'X')
        })
        .filter(|&pid| has_mark(pid, &entry))
        .collect()
}

fn signal(groups: &[u32], sig: Signal) {
    let ours = cni_async::sys::own_process_group();
    for &g in groups {
        // signal_group refuses 0 and 1 itself.
        if g != ours {
            let _ = signal_group(g, sig);
        }
    }
}

async fn wait_gone(groups: &mut Vec<u32>, until: Instant) {
    loop {
        groups.retain(|g| group_alive(*g));
        if groups.is_empty() || Instant::now() >= until {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Stops the plugins a dead daemon of this state dir left running: SIGTERM
/// to each one's process group, SIGKILL after `grace`, then waits (at most
/// a few seconds) until they are gone. Returns how many there were.
///
/// Call it only while holding the state dir's lock and before running any
/// plugin: every marked plugin is then an orphan.
pub(crate) async fn stop_orphans(value: &str, grace: Duration) -> usize {
    let found = tokio::task::spawn_blocking({
        let value = value.to_owned();
        move || find(&value)
    })
    .await
    .unwrap_or_default();
    if found.is_empty() {
        return 0;
    }
    tracing::warn!(pgids = ?found, "stopping orphaned plugins of a previous cnid (killed while they ran)");
    let mut left = found.clone();
    signal(&left, Signal::SIGTERM);
    wait_gone(&mut left, Instant::now() + grace).await;
    if !left.is_empty() {
        tracing::warn!(pgids = ?left, "orphaned plugins survived SIGTERM; sending SIGKILL");
        signal(&left, Signal::SIGKILL);
        wait_gone(&mut left, Instant::now() + KILL_WAIT).await;
    }
    if !left.is_empty() {
        tracing::error!(pgids = ?left, "orphaned plugins still alive after SIGKILL");
    }
    found.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_never_an_orphan() {
        // The test process is a group leader only sometimes, and never
        // carries the mark; nothing in a clean environment is found.
        assert!(find("/nonexistent/state/dir/for/tests").is_empty());
        let me = std::process::id();
        let (_, pgrp, _) = stat(me).expect("our own stat");
        assert!(group_alive(pgrp));
    }
}
