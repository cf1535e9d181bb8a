//! The storage seam: every write, flush, truncation, rename and removal of
//! the result cache ([`crate::cache`], through [`crate::durable`]) and of
//! cnid's ADD journal goes through one [`Storage`], so that a test can see
//! each I/O point, fail it, or stand a simulated disk behind it (cnid's
//! crash-point enumeration does: its simulated disk keeps only what was
//! flushed when the power goes). [`Disk`] is the real file system, the
//! default everywhere.
//!
//! The trait has the primitive calls only; what is built of them has one
//! implementation, in [`crate::durable`] (the atomic write: temp file,
//! `fdatasync`, `rename`, `fsync` of the dir; the flush of created dirs;
//! the removal of temp files), generic over the storage.
//!
//! Invariants kept by [`Disk`]: no call follows a symbolic link at the
//! last component (`O_NOFOLLOW`), every descriptor is `O_CLOEXEC`, files
//! it creates get the mode asked for (0600 where none is), subject to the
//! umask. Not behind the seam: reads (they change nothing on disk), the
//! creation and `chmod` of dirs ([`crate::durable::ensure_private_dir`];
//! the flush of a created dir, and its removal when that flush fails, are
//! behind it) and `flock`.
//!
//! Each method is `#[track_caller]` (a hidden argument, no I/O), and so is
//! every function of [`crate::durable`] that calls them: a simulated disk
//! can name the call site in the caller's code that a crash hit.
//!
//! # Cost
//! The cache holds one `Arc<dyn Storage>`: one indirect call per system
//! call, nothing next to the system call itself.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The I/O calls of the result cache and of cnid's journal (see the
/// module docs). Each acts on the real path or descriptor given; a
/// simulated disk acts on the real file system too, and keeps a shadow of
/// what is durable.
pub trait Storage: std::fmt::Debug + Send + Sync {
    /// Creates a new file (`O_EXCL`, never through a link) with `mode`,
    /// open for writing.
    #[track_caller]
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<File>;
    /// Opens `path` for appending (`O_APPEND`), created 0600 when missing.
    #[track_caller]
    fn open_append(&self, path: &Path) -> io::Result<File>;
    /// Opens an existing `path` for writing (to empty it).
    #[track_caller]
    fn open_write(&self, path: &Path) -> io::Result<File>;
    /// Opens a lock file for reading and writing, created 0600 when
    /// missing (never truncated).
    #[track_caller]
    fn open_lock(&self, path: &Path) -> io::Result<File>;
    /// Writes all of `bytes` at the file's offset (one `write` for what
    /// the kernel takes whole: an `O_APPEND` line).
    #[track_caller]
    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()>;
    /// Cuts the file to `len` bytes.
    #[track_caller]
    fn truncate(&self, file: &File, len: u64) -> io::Result<()>;
    /// `fdatasync`.
    #[track_caller]
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// `fsync`.
    #[track_caller]
    fn sync_all(&self, file: &File) -> io::Result<()>;
    /// `fsync` of the regular file at `path`, opened without following a
    /// link; `Ok(false)` when there is none.
    #[track_caller]
    fn sync_file(&self, path: &Path) -> io::Result<bool>;
    /// `fsync` of a dir: its creations, renames and removals become
    /// durable.
    #[track_caller]
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// `rename`.
    #[track_caller]
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file (`unlink`, not flushed).
    #[track_caller]
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty dir (`rmdir`, not flushed).
    #[track_caller]
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct Disk;

/// `O_NOFOLLOW | O_CLOEXEC` options, for the calls that open files.
pub fn no_follow() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

impl Storage for Disk {
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<File> {
        no_follow()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
    }

    fn open_append(&self, path: &Path) -> io::Result<File> {
        no_follow().append(true).create(true).mode(0o600).open(path)
    }

    fn open_write(&self, path: &Path) -> io::Result<File> {
        no_follow().write(true).open(path)
    }

    fn open_lock(&self, path: &Path) -> io::Result<File> {
        no_follow()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
    }

    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        (&*file).write_all(bytes)
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_all(&self, file: &File) -> io::Result<()> {
        file.sync_all()
    }

    fn sync_file(&self, path: &Path) -> io::Result<bool> {
        let f = match no_follow()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        f.sync_all().map(|()| true)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir).and_then(|d| d.sync_all())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
}
