//! Is this path a network namespace? `statfs` and `NS_GET_NSTYPE` on nix.
//!
//! Used on every ADD and CHECK whose caller asked for the check (cnid does):
//! a namespace file is a bind mount of nsfs (`/run/netns/NAME`) or a
//! `/proc/PID/ns/net` link into it. The path is opened `O_PATH` first, which
//! opens nothing for real (no device is touched, no FIFO blocks), and only a
//! file on nsfs is reopened read-only to ask the kernel for its type.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

/// Whether `path` (symbolic links followed, as `/proc/PID/ns/net` is one)
/// is a network namespace: a file on nsfs whose namespace type is
/// `CLONE_NEWNET`. Every failure on the way (missing, a regular file, a
/// directory, another namespace type, no permission) is `false`: callers
/// answer them all alike.
pub(crate) fn is_network_namespace(path: &Path) -> bool {
    network_namespace(path).unwrap_or(false)
}

/// [`is_network_namespace`], telling "not one" (`Ok(false)`: missing, a
/// path through a non-directory, a file that is no network namespace)
/// from "cannot tell" (`Err`: no permission, out of descriptors, ...):
/// what deciding that a namespace is gone needs.
pub(crate) fn network_namespace(path: &Path) -> io::Result<bool> {
    let fd = match open(path, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ENOTDIR) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if fstatfs(&fd)?.filesystem_type() != NSFS_MAGIC {
        return Ok(false);
    }
    // An O_PATH descriptor takes no ioctl: reopen the very same file.
    let reopen = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let ns = open(
        reopen.as_str(),
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    is_net_ns(ns.as_fd())
}

/// Whether `fd` refers to a network namespace (`ioctl(NS_GET_NSTYPE)`,
/// Linux 4.11+). A file that is not a namespace at all gives `ENOTTY`,
/// which is answered as `Ok(false)`.
pub(crate) fn is_net_ns(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd, which
    // the borrow keeps open for the duration of the call.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if ret >= 0 {
        return Ok(ret == libc::CLONE_NEWNET);
    }
    match Errno::last() {
        Errno::ENOTTY | Errno::EINVAL => Ok(false),
        e => Err(e.into()),
    }
}
