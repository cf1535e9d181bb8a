//! Processes a test started, directly or through a plugin: whether they are
//! gone (`/proc` based; a zombie counts as gone, since a re-parented zombie
//! is init's to reap), and killing what a failed test left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// State, parent and process group of `pid` from `/proc`, if it exists.
pub fn proc_stat(pid: u32) -> Option<(char, u32, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// A pid no process can have: one above the kernel's `pid_max`. A reaped
/// child's pid would do only until the kernel hands it out again, which a
/// machine busy forking does soon (`pid_max` may be as low as 32768).
pub fn unused_pid() -> u32 {
    let max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    max + 1
}

/// Whether `pid` is a running (not zombie) process.
pub fn alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((s, _, _)) if s != 'Z' && s != 'X')
}

/// Whether `pid` is a zombie child of this test process (one we failed to reap).
pub fn our_zombie(pid: u32) -> bool {
    matches!(proc_stat(pid), Some(('Z', ppid, _)) if ppid == std::process::id())
}

/// Live (not zombie) processes of group `pgid`.
pub fn live_in_group(pgid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(
            |pid| matches!(proc_stat(*pid), Some((s, _, g)) if g == pgid && s != 'Z' && s != 'X'),
        )
        .collect()
}

/// The pids written (whitespace-separated) to `path`; empty if it is missing.
pub fn read_pids(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits until `path` lists at least `n` pids (a fake writes them as it starts).
pub async fn wait_for_pids(path: &Path, n: usize, within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let pids = read_pids(path);
        if pids.len() >= n || Instant::now() >= end {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until no pid of `pids` is alive (and none is our zombie); returns
/// the ones still there after `within`.
pub async fn wait_gone(pids: &[u32], within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| alive(*p) || our_zombie(*p))
            .collect();
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until group `pgid` has no live process; returns the ones still
/// there after `within`.
pub async fn wait_group_gone(pgid: u32, within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let left = live_in_group(pgid);
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SIGKILLs the group `pgid` (test cleanup on failure); never our own group.
pub fn kill_group(pgid: u32) {
    let ours = nix::unistd::getpgrp().as_raw();
    if let Ok(raw) = i32::try_from(pgid)
        && raw > 1
        && raw != ours
    {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// On drop, SIGKILLs the groups of the pids in a pid file, so a failing
/// test leaves nothing behind.
#[derive(Debug)]
pub struct GroupReaper(pub PathBuf);

impl Drop for GroupReaper {
    fn drop(&mut self) {
        for pid in read_pids(&self.0) {
            if let Some((_, _, pgid)) = proc_stat(pid) {
                kill_group(pgid);
            }
        }
    }
}

/// The variable that tells a copy of the test binary it is the one
/// [`alone`] started.
const ALONE: &str = "CNIRS_TEST_ALONE";

/// Runs test `name` (its full path, `module::test`) again in a process of
/// its own: this test binary with `--exact name --test-threads=1`, where no
/// other test's thread forks. Returns `true` in that copy, which then does
/// the test's work, and `false` in the test that called it, after the copy
/// passed (its output is in the panic message when it did not).
///
/// For a test that counts every child of the process: another test's
/// child may be a zombie for a moment before its test reaps it, and a
/// zombie has no command line to tell whose it is. (A lock released by
/// closing its file is another reason to be alone: a fork in another
/// test's thread holds a copy of the open file until its child execs;
/// the cache and the subnet leases unlock explicitly, which needs none.)
pub fn alone(name: &str) -> bool {
    if std::env::var(ALONE).is_ok_and(|v| v == name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, name)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{name} in a process of its own: {}\n{text}",
        out.status
    );
    false
}
