//! Plugins orphaned by a daemon that died (`kill -9`, the OOM killer, a
//! crash): found at the next start, allowed to finish within their own
//! deadline, and only then is their operation rolled back.
//!
//! Every plugin runs in a process group of its own (so that a deadline can
//! kill all it forked), which also means it outlives the daemon: a plugin
//! half way through an ADD goes on, and may allocate an IP or make an
//! interface *after* the restarted daemon rolled that ADD back from its
//! intent. Nothing would ever delete that. Killing it at once is no better:
//! plugins are not atomic, and a plugin stopped at an arbitrary instruction
//! leaves state only it could have repaired (host-local creates an
//! address's file and then writes the container ID into it: killed between
//! the two, it leaves an empty reservation that no DEL frees). So:
//!
//! - [`MarkedExec`] puts `CNID_STATE_DIR=<canonical state dir>`,
//!   `CNID_DEADLINE_MS=<its deadline>` (`CLOCK_MONOTONIC`, in ms: the same
//!   clock in every process of this boot, and orphans never outlive a
//!   boot) and `CNID_PLUGIN=<the path it runs>` in the environment of
//!   every plugin the daemon runs;
//! - [`find_orphans`], called at start while the state dir is locked (so
//!   no other live daemon uses it) and before any plugin runs, finds every
//!   plugin still running with that mark: a process that leads its own
//!   process group but not a session of its own (a plugin, as we start
//!   them), runs the command `CNID_PLUGIN` names (not a helper a plugin
//!   started in a group of its own, which inherits the environment) and is
//!   not a zombie. The start holds the queue of each one's
//!   container (and its netns and ifname; a GC's orphan holds every
//!   container's queue: its network is not known) and defers the rollback
//!   of that container's unfinished ADDs, then serves everything else;
//! - [`settle`], a task of the running daemon, lets each orphan run until
//!   its recorded deadline, as it could have under the dead daemon; one
//!   still running then gets what the executor gives a plugin at its
//!   deadline (SIGTERM to its group, SIGKILL after a grace), with a
//!   warning naming it. When the last orphan of a container is gone, that
//!   container's deferred rollbacks go first in its queue and the hold
//!   ends (`Engine::release_orphaned`). A plugin without a recorded
//!   deadline (started by an older cnid) is stopped at once.
//!
//! A process a plugin started in a session of its own (`setsid`: a daemon
//! started on purpose) is not a group leader outside its session and is
//! left alone; so is what a plugin left behind in its group after the
//! plugin itself exited (its verb was over), as the executor does.
//!
//! So a start that finds orphans serves at once: health, readiness and
//! every container no orphan works on. Requests on an orphan's container
//! (or its netns and ifname) queue behind it, within their deadlines: at
//! most the longest deadline left, plus the grace; in practice the few
//! milliseconds a plugin still needed. A start killed during that wait
//! finds the same orphans, with the same deadlines, and the same
//! unfinished ADDs, at the next one.
//!
//! # Caveats
//! Linux only (`/proc`). The mark is visible to plugins, like the rest of
//! the daemon's environment they inherit. A leader is recognised by its pid
//! and start time, so a pid reused while we wait is never taken for it.
//! A plugin that rewrites its own `argv` (a process title) is not
//! recognised as one.
//! A group is signalled only while it is seen alive and its pid is not
//! another process's (a pid stays taken while it names a live group, so
//! a reused one proves the group gone); the new daemon's own plugins run
//! meanwhile, so a group that died between that check and the signal
//! would need its pid reused at once (a full wrap of the pid space) for
//! the signal to reach one of ours.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni_async::daemon::{ProcStat, Signal, group_alive, proc_stat, signal_group};
use cni_async::exec::{ExecOutput, ExecRequest, PluginExec};
use futures::future::BoxFuture;

/// The variable marking the plugins of the daemon of one state dir.
pub(crate) const MARK: &str = "CNID_STATE_DIR";
/// The variable holding a plugin's deadline: `CLOCK_MONOTONIC` in ms.
pub(crate) const DEADLINE: &str = "CNID_DEADLINE_MS";
/// The variable holding the path the daemon ran the plugin by: what it
/// left running with its environment is a plugin only when that path is
/// its command (not a helper it started in a group of its own).
pub(crate) const PLUGIN: &str = "CNID_PLUGIN";
/// How often the orphans are checked while waiting for them.
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

/// `CLOCK_MONOTONIC` now, in ms: comparable across the processes of a boot.
fn monotonic_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1000
            + u64::try_from(t.tv_nsec()).unwrap_or(0) / 1_000_000
    })
}

/// A [`PluginExec`] that adds the mark and the deadline to every plugin's
/// environment.
#[derive(Debug)]
pub(crate) struct MarkedExec {
    pub(crate) inner: Arc<dyn PluginExec>,
    pub(crate) value: String,
}

impl PluginExec for MarkedExec {
    fn exec<'a>(
        &'a self,
        req: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, cni_async::Error>> {
        Box::pin(async move {
            // The executor's clock starts a moment later: what is recorded
            // is at most that moment early.
            let timeout_ms = u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX);
            let deadline = monotonic_ms().saturating_add(timeout_ms);
            let mut env = Vec::with_capacity(req.env.len() + 3);
            env.extend(
                req.env
                    .iter()
                    .filter(|(k, _)| k != MARK && k != DEADLINE && k != PLUGIN)
                    .cloned(),
            );
            env.push((MARK.to_owned(), self.value.clone()));
            env.push((DEADLINE.to_owned(), deadline.to_string()));
            env.push((
                PLUGIN.to_owned(),
                req.plugin_path.to_string_lossy().into_owned(),
            ));
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

/// What `/proc/PID/stat` says of `pid` (the library's one reader of it);
/// `None` when it is gone or cannot be read.
fn stat(pid: u32) -> Option<ProcStat> {
    proc_stat(pid).ok().flatten()
}

fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A plugin a dead daemon of this state dir left running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Orphan {
    /// Its pid, which is also its process group's id.
    pub(crate) pid: u32,
    start: u64,
    /// `CNID_DEADLINE_MS`; `None` when not recorded (an older cnid).
    deadline_ms: Option<u64>,
    pub(crate) command: String,
    pub(crate) container_id: String,
    pub(crate) ifname: String,
    /// `CNI_NETNS`.
    pub(crate) netns: String,
    /// The plugin's binary (its `argv[0]`).
    pub(crate) plugin: String,
}

impl Orphan {
    /// Whether the plugin (this very process, not a later one with its
    /// pid) still runs.
    fn alive(&self) -> bool {
        matches!(stat(self.pid), Some(s) if s.start_time == self.start && !s.is_dead())
    }

    /// Whether its process group is gone: no process in it, or its pid
    /// taken by another process (a pid is never reused while a group of
    /// that id lives), which must not be signalled for it.
    fn group_gone(&self) -> bool {
        !group_alive(self.pid) || stat(self.pid).is_some_and(|s| s.start_time != self.start)
    }

    fn overdue(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_none_or(|d| now_ms >= d)
    }
}

/// The orphan with `pid`, if that process is one: a running group leader,
/// not a session leader, with our mark.
fn orphan(pid: u32, entry: &[u8]) -> Option<Orphan> {
    let s = stat(pid)?;
    if s.pgrp != pid || s.session == pid || s.is_dead() {
        return None;
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
    if !vars.contains(&entry) {
        return None;
    }
    let raw = |name: &str| -> Option<&[u8]> {
        let prefix = format!("{name}=");
        vars.iter().find_map(|v| v.strip_prefix(prefix.as_bytes()))
    };
    let var = |name: &str| raw(name).map(|v| String::from_utf8_lossy(v).into_owned());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    // The daemon ran the plugin by its path: its `argv[0]`, or a later
    // argument when an interpreter runs it (`#!/bin/sh`, `#!/usr/bin/env
    // sh`). A process with the environment and another command is what a
    // plugin started in a group of its own: no plugin of ours. (Without
    // the variable, a plugin of an older cnid: taken as one.)
    if let Some(path) = raw(PLUGIN)
        && !argv.iter().take(3).any(|a| *a == path)
    {
        return None;
    }
    let plugin = argv
        .first()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .unwrap_or_default();
    Some(Orphan {
        pid,
        start: s.start_time,
        deadline_ms: var(DEADLINE).and_then(|d| d.parse().ok()),
        command: var("CNI_COMMAND").unwrap_or_default(),
        container_id: var("CNI_CONTAINERID").unwrap_or_default(),
        ifname: var("CNI_IFNAME").unwrap_or_default(),
        netns: var("CNI_NETNS").unwrap_or_default(),
        plugin,
    })
}

/// The running plugins (group leaders, not session leaders) with our mark.
fn find(value: &str) -> Vec<Orphan> {
    let entry = format!("{MARK}={value}").into_bytes();
    let me = std::process::id();
    pids()
        .into_iter()
        .filter(|&pid| pid != me && pid > 1)
        .filter_map(|pid| orphan(pid, &entry))
        .collect()
}

/// Signals process group `g`, unless it is ours (`signal_group` refuses 0
/// and 1 itself).
fn signal(g: u32, sig: Signal) {
    if g != cni_async::daemon::own_process_group() {
        let _ = signal_group(g, sig);
    }
}

/// What [`settle`] saw: the orphans that finished, and those killed.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// The plugins that finished on their own, within their deadline.
    pub(crate) finished: Vec<Orphan>,
    /// The plugins still running at their deadline (or with none
    /// recorded), killed.
    pub(crate) killed: Vec<Orphan>,
}

/// The plugins a dead daemon of this state dir left running (a scan of
/// `/proc`).
///
/// Call it only while holding the state dir's lock and before running any
/// plugin: every marked plugin is then an orphan.
pub(crate) async fn find_orphans(value: &str) -> Vec<Orphan> {
    let found = tokio::task::spawn_blocking({
        let value = value.to_owned();
        move || find(&value)
    })
    .await
    .unwrap_or_default();
    if !found.is_empty() {
        let now = monotonic_ms();
        let longest_ms = found
            .iter()
            .map(|o| o.deadline_ms.map_or(0, |d| d.saturating_sub(now)))
            .max()
            .unwrap_or(0);
        tracing::warn!(pgids = ?found.iter().map(|o| o.pid).collect::<Vec<_>>(), longest_ms,
            containers = ?found.iter().map(|o| o.container_id.as_str()).collect::<Vec<_>>(),
            "waiting for orphaned plugins of a previous cnid (killed while they ran) to finish within their deadlines; \
             their containers wait, the rest is served");
    }
    found
}

/// What an orphan holds until it is gone: its container's queue (and its
/// netns and ifname); `""` for a GC (its network is not known here, and
/// a GC may delete what another operation on it makes): every
/// container's; `None` for what changes nothing (STATUS, VERSION).
pub(crate) fn hold_key(o: &Orphan) -> Option<&str> {
    if !o.container_id.is_empty() {
        Some(&o.container_id)
    } else if o.command == "GC" {
        Some("")
    } else {
        None
    }
}

/// Where an orphan is in its settling.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Running, before its deadline.
    Running,
    /// Sent SIGTERM at its deadline (its group), at this instant.
    Terminated(Instant),
    /// Sent SIGKILL after the grace, at this instant.
    Killed(Instant),
}

/// Waits for the orphans [`find_orphans`] found: each may finish until
/// its recorded deadline; one still running then (or with none recorded)
/// is killed as the executor kills a plugin at its deadline: SIGTERM to
/// its process group, SIGKILL after `grace`. `gone(orphan, killed)` is
/// called for each once it is gone (a killed one: once its group is, or
/// bounded after SIGKILL), so that its container can be released while
/// the others still run. Returns what it saw, or `None` when `stop` came
/// first (the next start finds those still running, with the same
/// deadlines).
pub(crate) async fn settle(
    found: Vec<Orphan>,
    grace: Duration,
    stop: tokio_util::sync::CancellationToken,
    mut gone: impl FnMut(&Orphan, bool),
) -> Option<Settled> {
    let mut settled = Settled::default();
    let mut running: Vec<(Orphan, Phase)> =
        found.into_iter().map(|o| (o, Phase::Running)).collect();
    loop {
        let now_ms = monotonic_ms();
        let now = Instant::now();
        let mut left = Vec::with_capacity(running.len());
        for (o, phase) in running {
            match phase {
                Phase::Running if !o.alive() => {
                    gone(&o, false);
                    settled.finished.push(o);
                }
                Phase::Running if o.overdue(now_ms) => {
                    tracing::warn!(pgid = o.pid, plugin = %o.plugin, command = %o.command, container = %o.container_id, ifname = %o.ifname,
                        deadline_recorded = o.deadline_ms.is_some(),
                        "orphaned plugin still running at its deadline: killing its process group; \
                         what it left half made may outlive the rollback (docs/reliability.md)");
                    signal(o.pid, Signal::SIGTERM);
                    left.push((o, Phase::Terminated(now)));
                }
                Phase::Running => left.push((o, phase)),
                Phase::Terminated(_) | Phase::Killed(_) if o.group_gone() => {
                    gone(&o, true);
                    settled.killed.push(o);
                }
                Phase::Terminated(at) if now.duration_since(at) >= grace => {
                    tracing::warn!(
                        pgid = o.pid,
                        "orphaned plugin survived SIGTERM; sending SIGKILL"
                    );
                    signal(o.pid, Signal::SIGKILL);
                    left.push((o, Phase::Killed(now)));
                }
                Phase::Killed(at) if now.duration_since(at) >= KILL_WAIT => {
                    tracing::error!(pgid = o.pid, "orphaned plugin still alive after SIGKILL");
                    gone(&o, true);
                    settled.killed.push(o);
                }
                _ => left.push((o, phase)),
            }
        }
        running = left;
        if running.is_empty() {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = stop.cancelled() => return None,
        }
    }
    if !settled.finished.is_empty() || !settled.killed.is_empty() {
        tracing::warn!(
            finished = settled.finished.len(),
            killed = settled.killed.len(),
            "orphaned plugins of a previous cnid are gone"
        );
    }
    Some(settled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_pid_reused_by_another_group_leader_is_not_the_orphans_group() {
        // A group leader (as every plugin of the new daemon is) with the
        // pid of an orphan whose group died: its start time differs.
        let mut child = std::process::Command::new("sleep")
            .arg("1000")
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let s = stat(pid).expect("its stat");
        let orphan = |start| Orphan {
            pid,
            start,
            deadline_ms: Some(0),
            command: "ADD".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            netns: String::new(),
            plugin: "sleep".into(),
        };
        assert!(!orphan(s.start_time).group_gone(), "the orphan itself");
        assert!(
            group_alive(pid),
            "the group lives: a bare group check would signal it"
        );
        assert!(
            orphan(s.start_time.saturating_sub(1)).group_gone(),
            "another process with the orphan's pid: its group is gone"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn our_own_process_is_never_an_orphan() {
        // The test process is a group leader only sometimes, and never
        // carries the mark; nothing in a clean environment is found.
        assert!(find("/nonexistent/state/dir/for/tests").is_empty());
        let me = std::process::id();
        let s = stat(me).expect("our own stat");
        assert!(group_alive(s.pgrp));
        assert!(s.start_time > 0);
    }
}
