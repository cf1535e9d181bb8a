//! Crash-safe files, blocking, on `std` and `libc` alone: the one
//! implementation behind cni-async's result cache, cnid's ADD journal and
//! cnid-shim's installed conf list (which must not pull in an async
//! runtime).
//!
//! Every write, flush, rename and removal goes through a [`Storage`] (the
//! caller's; [`write_atomic`] uses the real [`Disk`]). The atomic write
//! ([`write_atomic_on`]): a temp file in the target's dir, written,
//! `fdatasync`ed, renamed over the target, then the dir `fsync`ed. A crash
//! at any point leaves the old file or the new one, never half of one;
//! with `fsync` on, the new one also survives a power loss once the call
//! returned.
//!
//! Removals are not `fsync`ed here: every user of this crate makes a file
//! that reappears after a power loss harmless (a repeated DEL). What a
//! writer owes the dirs above its files is cni-async's (its store's
//! `durable`).
//!
//! # Caveats
//! - Everything here blocks (file system calls); async callers run it on
//!   a blocking pool.
//! - [`write_atomic`] makes the file durable, not the dir it is in: a dir
//!   just made must be flushed into its parent too, or a power loss can
//!   take it with the file (cni-async's `ensure_private_dir_durable`).
//! - [`remove_leftovers`] removes *every* temp file in the dir: call it only
//!   when no writer can be active there (cnid's intents dir, at start). Not
//!   for a dir shared with other processes, such as the result cache:
//!   there [`remove_abandoned`] removes only what no live writer can own.
//!
//! ```no_run
//! let path = std::path::Path::new("/var/lib/app/state.json");
//! cni_durable::write_atomic(path, b"{}", 0o600, true)?;
//! assert_eq!(cni_durable::read_nofollow(path)?, b"{}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

use std::io;
use std::path::{Path, PathBuf};

mod dir;
mod read;
mod remove;
mod storage;
mod write;

pub use dir::{PrivateDir, ensure_private_dir, move_into};
pub use read::{is_symlink_refusal, read_nofollow};
pub use remove::{ABANDONED_AFTER, remove_abandoned, remove_leftovers};
pub use storage::{Disk, Storage, no_follow, syncfs_reports_errors};
pub use write::{is_temp_name, sync_dir, sync_file, temp_path, write_atomic, write_atomic_on};

/// A step of a durable operation that failed: what was done, to which
/// path, and the system's error. Callers put it in their own error type
/// (cni-async's `Error::Cache` has the same three fields).
#[derive(Debug)]
pub struct Failure {
    /// What was being done (`"fsync directory"`, ...).
    pub op: &'static str,
    /// The file or dir it was done to.
    pub path: PathBuf,
    /// The underlying error.
    pub source: io::Error,
}

impl Failure {
    /// A failure of `op` on `path`.
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        Failure {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<Failure> for io::Error {
    fn from(f: Failure) -> io::Error {
        io::Error::new(f.source.kind(), f.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The names in `dir`, sorted (for the tests of what a call left).
    pub(crate) fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }
}
