//! A restart right after `kill -9`, as a supervisor (systemd `Restart=`, a
//! DaemonSet) makes it: it must not fail.
//!
//! Regression (issue 27): about one immediate restart in 20 to 200 failed
//! with "locked by another cnid", and clients that connected meanwhile were
//! accepted and then reset. A plugin being spawned (between `fork` and
//! `exec`) holds copies of all the daemon's descriptors: killed then, the
//! daemon's `flock` (which belongs to the open file, not the process) and
//! its listening socket lived on in that child for a moment. Here the test
//! itself takes such copies (`pidfd_getfd`, the same open file and socket
//! the child would hold) and keeps them across the restart.
//!
//! Also: a lock held by a live process is waited for (bounded), and when
//! it is still held then, the error names the holder.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, get};
use crate::support::gate::LOAD_MARGIN;
use crate::support::require_root;

/// A copy of descriptor `fd` of process `pid` (`pidfd_getfd`): the same
/// open file description, as a child between fork and exec holds it.
fn steal_fd(pid: i32, fd: i32) -> OwnedFd {
    // SAFETY: plain system calls; the descriptors returned are owned here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        assert!(
            pidfd >= 0,
            "pidfd_open({pid}): {}",
            std::io::Error::last_os_error()
        );
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        assert!(
            copy >= 0,
            "pidfd_getfd({pid}, {fd}): {}",
            std::io::Error::last_os_error()
        );
        OwnedFd::from_raw_fd(copy as i32)
    }
}

/// The descriptor number of process `pid` whose link is `target`.
fn fd_of(pid: i32, target: impl Fn(&str) -> bool) -> Option<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| target(&l.display().to_string())))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
}

/// The inode of the listening socket bound at `path` (`/proc/net/unix`).
/// Only the line flagged listening (`__SO_ACCEPTCON`, flags `00010000`):
/// a connection the daemon accepted on it (the readiness probe's, say)
/// shows the same path, and may be closed by the time its fd is looked for.
fn socket_inode(path: &Path) -> String {
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    let want = path.display().to_string();
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.get(7) == Some(&want.as_str()) && f.get(3) == Some(&"00010000"))
        .and_then(|f| f.get(6).map(|inode| (*inode).to_owned()))
        .unwrap_or_else(|| panic!("no listening socket bound at {want}"))
}

#[test]
fn a_copy_of_the_killed_daemons_lock_and_socket_does_not_stop_the_restart() {
    require_root!();
    let dirs = Dirs::new();
    // A network, so that the restarted daemon logs `cnid ready` (with none
    // it serves but is not ready).
    dirs.recording_network("10-net.conflist", "net", "1.0.0");
    let mut daemon = Daemon::start(&dirs, &[]);
    let lock_path = dirs.state.join("cnid.lock");
    let lock_fd = fd_of(daemon.pid(), |l| {
        Path::new(l) == lock_path.canonicalize().unwrap()
    })
    .expect("cnid holds cnid.lock open");
    let inode = socket_inode(&dirs.socket);
    let sock_fd = fd_of(daemon.pid(), |l| l == format!("socket:[{inode}]"))
        .expect("cnid holds its listening socket");
    let copies = [
        steal_fd(daemon.pid(), lock_fd),
        steal_fd(daemon.pid(), sock_fd),
    ];
    daemon.kill9();

    // The copies still hold the dead daemon's lock file and listening
    // socket, as a child between fork and exec would. Until the new daemon
    // binds its own, the path leads to that socket, where a client waits
    // for an answer as long as the copy lives (a moment for a real child,
    // then the connection is reset): wait for the new one's log first.
    let started = Instant::now();
    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    daemon.wait_log("cnid ready", Duration::from_secs(15));
    let took = started.elapsed();
    daemon.wait_ready(Duration::from_secs(15));
    // Clients reach the new daemon, never the dead one's socket.
    for _ in 0..20 {
        assert_eq!(get(&dirs.socket, "/v1/health").status, 200);
    }
    println!(
        "restart: ready {} ms after start with copies of the dead daemon's lock and socket held",
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(5) + LOAD_MARGIN,
        "the restart waited for the copies: {took:?}"
    );
    assert!(!daemon.log().contains("waiting for it"), "{}", daemon.log());
    drop(copies);
}

/// A POSIX write lock on the whole of `path`, as cnid takes it.
fn hold_lock(path: &Path) -> File {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open the lock file");
    let lock = libc::flock {
        l_type: libc::F_WRLCK as i16,
        l_whence: libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: fcntl with a valid descriptor and a valid flock.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
    assert_eq!(
        r,
        0,
        "lock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    file
}

#[test]
fn a_held_state_dir_lock_is_waited_for() {
    require_root!();
    let dirs = Dirs::new();
    std::fs::create_dir_all(&dirs.state).unwrap();
    let held = hold_lock(&dirs.state.join("cnid.lock"));
    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    let end = Instant::now() + Duration::from_secs(5);
    while !daemon.log().contains("waiting for it") {
        assert!(
            daemon.try_status().is_none(),
            "cnid gave up:\n{}",
            daemon.log()
        );
        assert!(Instant::now() < end, "cnid never waited:\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Released within the wait: cnid starts.
    drop(held);
    daemon.wait_ready(Duration::from_secs(15));
    let log = daemon.log();
    assert!(
        log.contains(&format!("pid {}", std::process::id())),
        "the wait names the holder:\n{log}"
    );
    assert!(log.contains("state dir lock taken"), "{log}");
}

#[test]
fn a_state_dir_lock_held_past_the_wait_is_an_error_naming_its_holder() {
    require_root!();
    let dirs = Dirs::new();
    std::fs::create_dir_all(&dirs.state).unwrap();
    let _held = hold_lock(&dirs.state.join("cnid.lock"));
    let started = Instant::now();
    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    let status = daemon
        .wait(Duration::from_secs(5) + LOAD_MARGIN * 2)
        .expect("cnid gives up after its wait");
    let took = started.elapsed();
    let log = daemon.log();
    println!(
        "lock: cnid gave up after {} ms: {}",
        took.as_millis(),
        log.lines().last().unwrap_or("")
    );
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        took >= Duration::from_secs(5),
        "gave up before its wait: {took:?}"
    );
    assert!(log.contains("locked by another cnid"), "{log}");
    assert!(
        log.contains(&format!("pid {} (", std::process::id())),
        "the error names the holding process:\n{log}"
    );
}
