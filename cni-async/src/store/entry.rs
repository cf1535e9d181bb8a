//! One attachment's entry in `results/`: read as that attachment sees it
//! (its record, another attachment's whose names collide with its own, a
//! corrupt file, a link), written atomically, removed only when it is that
//! attachment's.

use std::path::{Path, PathBuf};

use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::error::Chain;

use super::{CORRUPT_DIR, Names, Store, durable, durable_err, io_err, report_private_dir};
use crate::error::Error;

/// What an attachment's cache file holds, as seen by that attachment.
enum Slot {
    /// No file.
    Empty,
    /// A corrupt file, maybe what is left of an attachment made earlier.
    Corrupt,
    /// A symbolic link, always moved aside.
    Link,
    /// This attachment's record, or a legacy bare result.
    Ours(CacheEntry),
    /// The record of another attachment whose names collide with ours.
    Theirs(CacheRecord),
}

/// What an ADD's lock step found of its own attachment
/// ([`crate::cache::ResultCache::lock_for_add`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prior {
    /// No file: nothing of this attachment was recorded.
    Nothing,
    /// Its record, or a legacy bare result.
    Record,
    /// A symbolic link, moved aside at once (never followed; nobody writes
    /// one, so it is no sign of an attachment to keep in place), counted as
    /// there before all the same.
    Link,
    /// A corrupt file, left in place as evidence that something may be
    /// attached, until the ADD succeeds (its record replaces it) or a DEL
    /// moves it aside.
    Corrupt,
}

impl Prior {
    /// Something of this attachment was there before the ADD.
    pub(crate) fn existed(self) -> bool {
        self != Prior::Nothing
    }
}

impl Store {
    /// Writes `bytes` to `path` (a record file) atomically, flushed when
    /// `fsync`, into a `results/` made durable in its parents
    /// ([`durable::ensure_private_dir_durable_once`]).
    pub(crate) fn write_file(&self, path: &Path, bytes: &[u8], fsync: bool) -> Result<(), Error> {
        let (storage, results) = (&*self.storage, self.results_dir());
        report_private_dir(
            "cache directory",
            &results,
            durable::ensure_private_dir_durable_once(storage, &results, fsync, &self.dirs)
                .map_err(|e| io_err(&results, "create directory", e))?,
        );
        durable::write_atomic_on(storage, path, bytes, 0o600, fsync).map_err(durable_err)
    }

    /// Writes `rec` atomically, flushed when `fsync`.
    pub(crate) fn write_record(&self, rec: &CacheRecord, fsync: bool) -> Result<(), Error> {
        let path = self.path((&rec.network_name, &rec.container_id, &rec.if_name))?;
        self.write_file(&path, &rec.encode(), fsync)
    }

    /// Moves a corrupt entry to `corrupt/` with a warning; answers where
    /// to, `None` (with a warning) when it could not.
    fn move_aside(&self, path: &Path, reason: &str) -> Option<PathBuf> {
        match durable::move_aside(&*self.storage, path, &self.dir.join(CORRUPT_DIR)) {
            Ok(target) => {
                tracing::warn!(
                    file = %path.display(),
                    moved_to = %target.display(),
                    %reason,
                    "corrupt cache entry moved aside"
                );
                Some(target)
            }
            Err(e) => {
                tracing::warn!(
                    file = %path.display(),
                    %reason,
                    error = %Chain(&e),
                    "corrupt cache entry could not be moved aside"
                );
                None
            }
        }
    }

    /// Reads the file at `path` as seen by one attachment; a corrupt or
    /// symlinked file is moved aside when `move_corrupt`, else left where
    /// it is (an ADD's lock step: see [`Prior::Corrupt`]).
    fn read_slot(
        &self,
        path: &Path,
        (network, container_id, ifname): Names<'_>,
        move_corrupt: bool,
    ) -> Result<Slot, Error> {
        let corrupt = |reason: &str| {
            if move_corrupt {
                self.move_aside(path, reason);
            } else {
                tracing::warn!(file = %path.display(), %reason, "corrupt cache entry kept in place until an ADD replaces it or a DEL moves it aside");
            }
            Ok(Slot::Corrupt)
        };
        let bytes = match durable::read_nofollow(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Slot::Empty),
            Err(e) if durable::is_symlink_refusal(&e) => {
                self.move_aside(path, "is a symbolic link");
                return Ok(Slot::Link);
            }
            Err(e) => return Err(io_err(path, "read", e)),
        };
        match CacheEntry::decode(&bytes, &path.display().to_string()) {
            Ok(CacheEntry::Record(rec)) => match rec.check_matches(network, container_id, ifname) {
                Ok(()) => Ok(Slot::Ours(CacheEntry::Record(rec))),
                Err(e) => {
                    tracing::debug!(file = %path.display(), error = %Chain(&e), "cache file belongs to another attachment");
                    Ok(Slot::Theirs(rec))
                }
            },
            Ok(legacy) => Ok(Slot::Ours(legacy)),
            Err(e) => corrupt(&e.to_string()),
        }
    }

    /// The check of an ADD's lock step (see
    /// [`crate::cache::ResultCache::lock_for_add`]); a corrupt file is moved
    /// aside unless `keep_corrupt`.
    pub(crate) fn check_not_taken(
        &self,
        path: &Path,
        (network, container_id, ifname): Names<'_>,
        fresh: bool,
        keep_corrupt: bool,
    ) -> Result<Prior, Error> {
        let already = || Error::AlreadyAttached {
            network: network.to_owned(),
            container_id: container_id.to_owned(),
            ifname: ifname.to_owned(),
        };
        match self.read_slot(path, (network, container_id, ifname), !keep_corrupt)? {
            Slot::Theirs(rec) => Err(Error::AttachmentCollision {
                path: path.to_owned(),
                occupant: format!(
                    "network {:?} container {:?} interface {:?}",
                    rec.network_name, rec.container_id, rec.if_name
                ),
            }),
            // In doubt, a corrupt record (kept in place) is an attachment
            // too, which a sandbox's undo must not take down.
            Slot::Ours(_) if fresh => Err(already()),
            Slot::Corrupt if fresh && keep_corrupt => Err(already()),
            Slot::Empty => Ok(Prior::Nothing),
            Slot::Ours(_) => Ok(Prior::Record),
            Slot::Corrupt => Ok(Prior::Corrupt),
            Slot::Link => Ok(Prior::Link),
        }
    }

    /// This attachment's entry at `path`, if any; a corrupt file reads as
    /// none and is moved aside when `move_corrupt`.
    pub(crate) fn read_entry(
        &self,
        path: &Path,
        attachment: Names<'_>,
        move_corrupt: bool,
    ) -> Result<Option<CacheEntry>, Error> {
        Ok(match self.read_slot(path, attachment, move_corrupt)? {
            Slot::Ours(entry) => Some(entry),
            Slot::Empty | Slot::Corrupt | Slot::Link | Slot::Theirs(_) => None,
        })
    }

    /// This attachment's entry, by names; see [`Store::read_entry`].
    pub(crate) fn read(
        &self,
        names: Names<'_>,
        move_corrupt: bool,
    ) -> Result<Option<CacheEntry>, Error> {
        self.read_entry(&self.path(names)?, names, move_corrupt)
    }

    /// Removes an attachment's record, if the file holds that attachment's
    /// record (or a legacy bare result). A missing file is fine.
    pub(crate) fn remove(&self, names: Names<'_>) -> Result<(), Error> {
        let path = self.path(names)?;
        // Check ownership first: never delete another attachment's record.
        if self.read_entry(&path, names, true)?.is_none() {
            return Ok(());
        }
        // Not flushed (see the module docs of `store`).
        match self.storage.remove(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&path, "remove", e)),
            _ => Ok(()),
        }
    }
}
