//! Network-namespace syscalls on nix: setns, unshare, mount, umount (feature
//! `netns`); the `NS_GET_NSTYPE` check lives in `nsfs`, which every build has.
//!
//! `setns` and `unshare` change the namespace of the *calling thread* only.
//! Callers ([`crate::netns`]) make them on a dedicated OS thread that exits
//! afterwards; nothing here may run on a tokio worker or a caller's thread.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::{Mode, fstat, stat};

/// Moves the calling thread into the network namespace `fd` refers to.
pub(crate) fn setns_net(fd: BorrowedFd<'_>) -> io::Result<()> {
    setns(fd, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Moves the calling thread into a new, empty network namespace.
pub(crate) fn unshare_net() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// `mount --make-rshared path`. Fails with `EINVAL` when `path` is not a
/// mount point.
pub(crate) fn make_rshared(path: &Path) -> Result<(), Errno> {
    mount(
        None::<&str>,
        path,
        Some("none"),
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
}

/// `mount --rbind path path`: makes `path` a mount point of its own.
pub(crate) fn rbind_onto_itself(path: &Path) -> io::Result<()> {
    mount(
        Some(path),
        path,
        Some("none"),
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(io::Error::from)
}

/// `mount --bind src dst`.
pub(crate) fn bind_mount(src: &Path, dst: &Path) -> io::Result<()> {
    mount(Some(src), dst, Some("none"), MsFlags::MS_BIND, None::<&str>).map_err(io::Error::from)
}

/// `umount --lazy path` (`MNT_DETACH`).
pub(crate) fn umount_detach(path: &Path) -> Result<(), Errno> {
    umount2(path, MntFlags::MNT_DETACH)
}

/// Creates `path` as an empty file with mode 0, failing when it exists
/// (`O_CREAT | O_EXCL`), as iproute2 does for a namespace's mount target.
pub(crate) fn create_empty_exclusive(path: &Path) -> io::Result<()> {
    open(
        path,
        OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(drop::<OwnedFd>)
    .map_err(io::Error::from)
}

/// Opens a namespace file read-only, close-on-exec.
pub(crate) fn open_ns(path: &Path) -> io::Result<OwnedFd> {
    open(path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).map_err(io::Error::from)
}

pub(crate) use super::nsfs::is_net_ns;

/// The (device, inode) pair that identifies the namespace behind `fd`.
pub(crate) fn fd_identity(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = fstat(fd).map_err(io::Error::from)?;
    Ok((st.st_dev, st.st_ino))
}

/// The (device, inode) pair of what `path` resolves to (for a mounted
/// namespace file: the namespace).
pub(crate) fn path_identity(path: &Path) -> io::Result<(u64, u64)> {
    let st = stat(path).map_err(io::Error::from)?;
    Ok((st.st_dev, st.st_ino))
}
