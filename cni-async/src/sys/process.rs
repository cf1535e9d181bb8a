//! Process-group signalling and the executable check, on nix.
//!
//! Every plugin runs as the leader of its own process group (pgid = its pid),
//! so one `killpg` reaches the plugin and everything it forked that did not
//! leave the group (a daemon that calls `setsid` is out of reach, on purpose).

use std::io;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{AccessFlags, Pid, access};

pub(crate) use nix::sys::signal::Signal::{SIGKILL, SIGTERM};

/// Sends `signal` to every process of group `pgid`.
///
/// Returns `Ok(false)` when the group no longer has any process (ESRCH),
/// `Ok(true)` when the signal was delivered. Refuses (EINVAL) pgid 0 and 1,
/// which would signal our own group or every process.
pub fn signal_group(pgid: u32, signal: Signal) -> io::Result<bool> {
    send(pgid, Some(signal))
}

/// Whether group `pgid` still has a process that is not a zombie.
///
/// `killpg(pgid, 0)` alone also counts zombies, and a zombie that was
/// re-parented to an init that never reaps stays one forever; so when the
/// group exists we look at `/proc` for a member that is still running.
pub fn group_alive(pgid: u32) -> bool {
    match send(pgid, None) {
        Ok(false) => false,
        // EPERM: a member we may not signal exists; count it.
        Err(_) => true,
        Ok(true) => live_group_members(pgid).map_or(true, |m| !m.is_empty()),
    }
}

/// The process group of this process (`getpgrp`).
pub fn own_process_group() -> u32 {
    nix::unistd::getpgrp().as_raw().unsigned_abs()
}

/// The pids of the processes of group `pgid` that are not zombies, from `/proc`.
pub(crate) fn live_group_members(pgid: u32) -> io::Result<Vec<u32>> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // The process may be gone by now: skip what cannot be read.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(s) = super::procstat::parse(&stat)
            && s.pgrp == pgid
            && !s.is_dead()
        {
            members.push(pid);
        }
    }
    Ok(members)
}

fn send(pgid: u32, signal: Option<Signal>) -> io::Result<bool> {
    // pgid 0 or 1 would signal our own group or every process: never.
    let Some(raw) = i32::try_from(pgid).ok().filter(|raw| *raw > 1) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    match killpg(Pid::from_raw(raw), signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Whether we may execute `path` (`access(2)` with `X_OK`, which for root
/// means: at least one execute bit set).
pub(crate) fn is_executable(path: &Path) -> bool {
    access(path, AccessFlags::X_OK).is_ok()
}

/// The name of a signal number, for messages (`SIGKILL`), if it is one.
pub(crate) fn signal_name(signo: i32) -> Option<&'static str> {
    Signal::try_from(signo).ok().map(|s| s.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_our_own_group_and_init() {
        assert!(signal_group(0, SIGKILL).is_err());
        assert!(signal_group(1, SIGKILL).is_err());
        assert!(signal_group(u32::MAX, SIGKILL).is_err());
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert_eq!(signal_name(11), Some("SIGSEGV"));
        assert_eq!(signal_name(0), None);
    }

    #[test]
    fn own_group_is_alive() {
        let me = std::process::id();
        let ours = nix::unistd::getpgrp().as_raw() as u32;
        assert!(live_group_members(ours).unwrap().contains(&me));
        assert!(group_alive(ours));
    }

    #[test]
    fn executables() {
        assert!(is_executable(Path::new("/bin/sh")));
        assert!(!is_executable(Path::new("/nonexistent/plugin")));
    }
}
