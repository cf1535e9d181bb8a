//! The store: everything the result cache keeps on disk, and nothing
//! else. [`crate::cache::ResultCache`] is its public face (async, one
//! attachment at a time); the daemon API ([`crate::daemon`], feature
//! `daemon`) reaches the rest (the storage seam, deferred flushes, the
//! index of attachments by netns and interface).
//!
//! One concept per file. Invariants, each kept in the file named:
//! - Every write, flush, rename and removal goes through the store's
//!   [`Storage`] (`durable.rs`, [`Disk`] but in tests): a simulated disk
//!   sees every I/O point.
//! - A record is written whole or not at all, into a dir made durable in
//!   its parents (`entry.rs`, `durable.rs`); removals are not flushed.
//! - A record is trusted only for the attachment its fields name
//!   (`entry.rs`, `listed.rs`); a corrupt one is moved aside, never
//!   trusted, except by an ADD's lock step, which keeps it in place as
//!   evidence (`entry.rs`, [`Prior::Corrupt`]).
//! - A lock file lives as long as its attachment's record, and only a
//!   holder removes it (`lock.rs`).
//! - An attachment holds its netns and ifname in the owner index until
//!   its record is seen gone; a refresh that fails or a record that cannot
//!   be read takes nobody out (`owners.rs`, `scan.rs`).
//!
//! # Caveats
//! - Everything here blocks: the async face runs it on tokio's blocking
//!   pool or, on request, inline.
//! - A store without flushes ([`Store::durable`] false) owes those of
//!   `flush.rs` later.

// Without the feature `daemon`, the parts only a daemon reaches (deferred
// flushes, the sweep, the few-changes scan, the seam's re-exports) are
// compiled, and tested, but not public.
#![cfg_attr(
    not(feature = "daemon"),
    allow(dead_code, unreachable_pub, unused_imports)
)]

pub mod durable;
mod entry;
mod flush;
mod listed;
mod lock;
mod owners;
mod page;
mod scan;
#[cfg(test)]
pub(crate) mod traced;
#[cfg(feature = "watch")]
mod watch;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cni_core::cache as record;

pub(crate) use durable::{Disk, DurableDirs, PrivateDir, Storage, ensure_private_dir};
pub(crate) use entry::Prior;
pub use listed::AttachmentKey;
pub(crate) use listed::ScannedRecord;
pub use lock::AttachmentLock;
pub use owners::Holder;
pub(crate) use owners::others;
pub use page::ListPage;
pub(crate) use scan::RecordScan;

use crate::error::Error;

/// Subdirectory of the cache dir holding lock files.
pub const LOCKS_DIR: &str = "locks";
/// Subdirectory of the cache dir where corrupt entries are moved.
pub const CORRUPT_DIR: &str = "corrupt";

/// An attachment by its names: network, container ID, interface.
pub(crate) type Names<'a> = (&'a str, &'a str, &'a str);

/// The result cache's files under one dir (default `/var/lib/cni`).
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pub(crate) dir: PathBuf,
    /// Whether writes are flushed (`fdatasync`, dir `fsync`).
    pub(crate) durable: bool,
    /// Every write, flush, rename and removal ([`Disk`] but in tests).
    pub(crate) storage: Arc<dyn Storage>,
    /// Whether `results/` and the cache dir are known durable in their
    /// parents (shared by the clones: flushed once, not per write).
    pub(crate) dirs: Arc<DurableDirs>,
    /// Which attachments hold which namespace's interface (`owners.rs`;
    /// shared by the clones, made at first use).
    pub(crate) owners: owners::SharedOwners,
}

impl Store {
    pub(crate) fn new(dir: PathBuf) -> Self {
        Store {
            dir,
            durable: true,
            storage: Arc::new(Disk),
            dirs: Arc::default(),
            owners: Arc::default(),
        }
    }

    setters! {
        /// Every write, flush, rename and removal through `storage`.
        pub(crate) fn with_storage(storage: Arc<dyn Storage>);
    }

    /// `<dir>/results`.
    pub(crate) fn results_dir(&self) -> PathBuf {
        record::results_dir(&self.dir)
    }

    /// The record file of an attachment (names validated).
    pub(crate) fn path(&self, (network, cid, ifname): Names<'_>) -> Result<PathBuf, Error> {
        Ok(record::file_path(&self.dir, network, cid, ifname)?)
    }

    /// See [`crate::cache::ResultCache::tighten_dirs`].
    pub(crate) fn tighten_dirs(&self) {
        for sub in [record::RESULTS_DIR, LOCKS_DIR, CORRUPT_DIR] {
            let dir = self.dir.join(sub);
            if dir.is_dir()
                && let Err(e) = create_private_dir(&dir)
            {
                tracing::warn!(error = %e, "cannot check the mode of a cache directory");
            }
        }
        if let Ok(meta) = std::fs::metadata(&self.dir)
            && meta.mode() & 0o022 != 0
        {
            tracing::warn!(
                dir = %self.dir.display(),
                mode = %format_args!("{:04o}", meta.mode() & 0o7777),
                "the cache directory can be written by other users, who can then replace its records"
            );
        }
    }
}

pub(crate) fn io_err(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::Cache {
        path: path.to_owned(),
        op,
        source,
    }
}

pub(crate) fn durable_err(f: durable::Failure) -> Error {
    io_err(&f.path, f.op, f.source)
}

/// Makes `dir` private ([`ensure_private_dir`]), warning about what it
/// found wrong.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), Error> {
    report_private_dir(
        "cache directory",
        dir,
        ensure_private_dir(dir).map_err(|e| io_err(dir, "create directory", e))?,
    );
    Ok(())
}

/// Warns about what [`ensure_private_dir`] found wrong with `dir` (`what`
/// names it: `cache directory`).
pub(crate) fn report_private_dir(what: &str, dir: &Path, found: PrivateDir) {
    match found {
        PrivateDir::Private => {}
        PrivateDir::Tightened { was } => tracing::warn!(
            dir = %dir.display(),
            was = %format_args!("{was:04o}"),
            "{what} was open to other users; made it 0700"
        ),
        PrivateDir::Foreign { owner, mode } => tracing::warn!(
            dir = %dir.display(),
            owner,
            mode = %format_args!("{mode:04o}"),
            "{what} belongs to another user, who can plant files in it; left as it is"
        ),
        _ => {}
    }
}
