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
