//! The storage seam: every write, flush, truncation, rename and removal of
//! cni-async's result cache and of cnid's ADD journal goes through one
//! [`Storage`], so that a test can see each I/O point, fail it, or stand a
//! simulated disk behind it that keeps only what was flushed when the
//! power goes. [`Disk`] is the real file system. The trait has the
//! primitive calls only; what is built of them is this crate's, generic
//! over the storage.
//!
//! Invariants kept by [`Disk`]: no call follows a symbolic link at the
//! last component (`O_NOFOLLOW`), every descriptor is `O_CLOEXEC`, files
//! it creates get the mode asked for (0600 where none is), subject to the
//! umask. Not behind the seam: reads, the creation and `chmod` of dirs
//! ([`crate::ensure_private_dir`]), and `flock`.
//!
//! Each method is `#[track_caller]`, and so is every function of this
//! crate that calls them: a simulated disk can name the caller's line
//! that a crash hit.

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
    /// `syncfs(2)` of the file system that holds the dir `dir`: once it
    /// returns `Ok`, every file under `dir` is durable, data and names (not
    /// `dir`'s own entry in its parent). One call for any number of files,
    /// but it writes back *everything* dirty on that file system and waits
    /// for it. `Err(Unsupported)` where a failed write-back would not be
    /// reported (see [`Disk`]): the caller flushes file by file instead.
    #[track_caller]
    fn sync_fs(&self, dir: &Path) -> io::Result<()>;
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
///
/// Its [`Storage::sync_fs`] is `syncfs(2)` on Linux 5.8 or later only
/// (before, it returned 0 whatever the write-back did), followed by a
/// check of each regular file directly in `dir` for a write-back error of
/// its own (`syncfs` reports the file system's to its first caller only,
/// which may be another program).
#[derive(Debug, Clone, Copy, Default)]
pub struct Disk;

/// Whether the running kernel's `syncfs(2)` reports write-back errors
/// (Linux 5.8 and later), read once from `uname(2)`.
pub fn syncfs_reports_errors() -> bool {
    static ANSWER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ANSWER.get_or_init(|| {
        // SAFETY: `uname` fills the struct it is given; zeroed is a valid
        // value of it.
        let mut u: libc::utsname = unsafe { std::mem::zeroed() };
        if unsafe { libc::uname(&mut u) } != 0 {
            return false;
        }
        // SAFETY: `release` is NUL-terminated by `uname`.
        let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
        kernel_at_least(&release.to_string_lossy(), (5, 8))
    })
}

/// Whether a kernel release string (`6.1.0-18-amd64`) is at least
/// `major.minor`; false when it cannot be read.
fn kernel_at_least(release: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let num = |p: Option<&str>| p.and_then(|s| s.parse::<u32>().ok());
    match (num(parts.next()), num(parts.next())) {
        (Some(a), Some(b)) => (a, b) >= (major, minor),
        _ => false,
    }
}

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
        match open_nonblocking(path) {
            Ok(f) => f.sync_all().map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir).and_then(|d| d.sync_all())
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        if !syncfs_reports_errors() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "syncfs does not report write-back errors before Linux 5.8",
            ));
        }
        let d = no_follow()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_DIRECTORY)
            .open(dir)?;
        // SAFETY: `d` is an open descriptor for the duration of the call.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) } != 0 {
            return Err(io::Error::last_os_error());
        }
        written_back(dir)
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

/// `path` opened for reading, never through a link, without blocking on a
/// FIFO.
pub(crate) fn open_nonblocking(path: &Path) -> io::Result<File> {
    no_follow()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
}

/// Whether each regular file directly in `dir` was written back without
/// error, as far as its own record says: `sync_file_range(2)` waiting on
/// its pages (nothing is dirty after a `syncfs`) returns the write-back
/// error the file's mapping keeps until an `fsync` or this check takes it.
/// Entries gone meanwhile, links and other kinds are skipped.
fn written_back(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let f = match open_nonblocking(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: `f` is an open descriptor for the duration of the call.
        if unsafe { libc::sync_file_range(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, flags) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("write-back of {} failed: {e}", path.display()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_are_compared_by_major_and_minor() {
        for (release, want) in [
            ("5.8.0", true),
            ("5.10.0-28-amd64", true),
            ("6.1.0-18-amd64", true),
            ("6.18.44-fc-v1272", true),
            ("5.7.19", false),
            ("4.19.0-26-amd64", false),
            ("5", false),
            ("", false),
        ] {
            assert_eq!(kernel_at_least(release, (5, 8)), want, "{release}");
        }
    }

    /// On a kernel that reports write-back errors, `sync_fs` of a dir
    /// succeeds; a path that is not a dir, or a link to one, is refused.
    #[test]
    fn sync_fs_takes_a_dir_and_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        if !syncfs_reports_errors() {
            let e = Disk.sync_fs(dir.path()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
            return;
        }
        Disk.sync_fs(dir.path()).unwrap();
        assert!(Disk.sync_fs(&file).is_err(), "not a dir");
        assert!(Disk.sync_fs(&link).is_err(), "a link");
    }
}
