//! Per-attachment locks (see [`crate::cache`]). A lock file lives only as
//! long as the attachment's record: the holder releasing a lock when there
//! is no record unlinks the file *while still holding it*. A locker checks
//! after `flock` that the file it locked is still the one at the path
//! (device and inode) and starts over when it is not, so two lockers never
//! hold "the" lock at once.
//!
//! # Caveats
//! - A `kill -9` leaves no lock held, but may leave its file:
//!   [`Store::remove_abandoned`] sweeps those.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cni_core::cache as record;

use super::{LOCKS_DIR, Storage, Store, create_private_dir, durable, durable_err, io_err};
use crate::error::Error;

/// An attachment's lock; released when dropped, after removing the lock
/// file (while still held) when the attachment has no record.
#[derive(Debug)]
pub struct AttachmentLock {
    path: PathBuf,
    /// The attachment's record file: the lock file stays while it exists.
    pub(crate) record: PathBuf,
    file: Option<File>,
    /// The cache's: the lock file is removed through it.
    storage: Arc<dyn Storage>,
}

impl AttachmentLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases the lock and removes the lock file whether or not a record
    /// exists (after a successful DEL).
    pub fn release_and_remove(mut self) {
        if let Some(file) = self.file.take() {
            let _ = self.storage.remove(&self.path);
            unlock(file);
        }
    }
}

impl Drop for AttachmentLock {
    fn drop(&mut self) {
        let Some(file) = self.file.take() else {
            return;
        };
        // Anything at the record's path (a record, a legacy result, a file
        // not yet moved aside) keeps the lock file: it may be DELed later.
        let unused = matches!(
            std::fs::symlink_metadata(&self.record),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        if unused
            && let Err(e) = self.storage.remove(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(file = %self.path.display(), error = %e, "cannot remove an unused lock file");
        }
        // Unlocks: only now, after the unlink.
        unlock(file);
    }
}

/// Releases a held lock file's `flock` now, then closes it: closing alone
/// leaves it taken in a child forked meanwhile (a plugin being spawned)
/// until that child execs; `LOCK_UN` releases every copy at once.
fn unlock(file: File) {
    if let Err(e) = file.unlock() {
        tracing::debug!(error = %e, "cannot unlock an attachment lock file; closing it");
    }
}

/// Where an attachment's lock lives: its lock file and its record.
#[derive(Debug, Clone)]
pub(crate) struct LockPaths {
    pub(crate) path: PathBuf,
    record: PathBuf,
}

impl Store {
    /// The lock file and record file of an attachment (names validated).
    pub(crate) fn lock_paths(&self, names: super::Names<'_>) -> Result<LockPaths, Error> {
        let name = record::file_name(names.0, names.1, names.2)?;
        Ok(LockPaths {
            path: self.dir.join(LOCKS_DIR).join(format!("{name}.lock")),
            record: self.path(names)?,
        })
    }

    /// One try at an attachment's lock: `None` when someone holds it.
    pub(crate) fn try_lock(&self, at: &LockPaths) -> Result<Option<AttachmentLock>, Error> {
        let locks = self.dir.join(LOCKS_DIR);
        Ok(
            try_lock_once(&*self.storage, &locks, &at.path)?.map(|file| AttachmentLock {
                path: at.path.clone(),
                record: at.record.clone(),
                file: Some(file),
                storage: self.storage.clone(),
            }),
        )
    }

    /// See [`crate::cache::ResultCache::remove_abandoned`]: the temp files
    /// of [`durable::remove_abandoned`] in `results/`, then the lock files
    /// of attachments without a record, each taken first and removed while
    /// held, as a holder removes it. Returns how many files went.
    pub(crate) fn remove_abandoned(&self, min_age: Duration) -> Result<usize, Error> {
        let temps = durable::remove_abandoned(&*self.storage, &self.results_dir(), min_age)
            .map_err(durable_err)?;
        Ok(temps + self.remove_unused_locks()?)
    }

    /// The lock files of [`Store::remove_abandoned`].
    fn remove_unused_locks(&self) -> Result<usize, Error> {
        let locks = self.dir.join(LOCKS_DIR);
        let entries = match std::fs::read_dir(&locks) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(&locks, "read directory", e)),
        };
        let results = self.results_dir();
        let mut n = 0;
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let Some(record) = name.strip_suffix(".lock") else {
                continue;
            };
            let record = results.join(record);
            if name.starts_with('.')
                || !entry.file_type().is_ok_and(|t| t.is_file())
                || std::fs::symlink_metadata(&record).is_ok()
            {
                continue;
            }
            let at = LockPaths {
                path: locks.join(&name),
                record,
            };
            if let Some(lock) = self.try_lock(&at)? {
                // Dropped: removed while held, as the record is missing.
                drop(lock);
                if std::fs::symlink_metadata(&at.path).is_err() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// One try at an attachment's lock: `None` when someone holds it.
fn try_lock_once(storage: &dyn Storage, locks: &Path, path: &Path) -> Result<Option<File>, Error> {
    loop {
        let file = match storage.open_lock(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                create_private_dir(locks)?;
                storage
                    .open_lock(path)
                    .map_err(|e| io_err(path, "open lock file", e))?
            }
            Err(e) => return Err(io_err(path, "open lock file", e)),
        };
        match lock_opened(file, path)? {
            Attempt::Held(file) => return Ok(Some(file)),
            Attempt::Busy => return Ok(None),
            Attempt::Stale => continue,
        }
    }
}

/// What `flock` on an opened lock file gave.
#[derive(Debug)]
enum Attempt {
    /// Locked, and it is the file at the path.
    Held(File),
    /// Someone else holds it.
    Busy,
    /// Locked, but the previous holder unlinked it meanwhile (its
    /// attachment is gone): a lock on an orphaned inode, worth nothing.
    Stale,
}

fn lock_opened(file: File, path: &Path) -> Result<Attempt, Error> {
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(Attempt::Busy),
        Err(std::fs::TryLockError::Error(e)) => return Err(io_err(path, "lock", e)),
    }
    let ours = file
        .metadata()
        .map_err(|e| io_err(path, "stat lock file", e))?;
    match std::fs::symlink_metadata(path) {
        Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => Ok(Attempt::Held(file)),
        Ok(_) => Ok(Attempt::Stale),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Attempt::Stale),
        Err(e) => Err(io_err(path, "stat lock file", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Disk;
    use cni_core::cache::CacheRecord;

    fn lock_at(store: &Store, path: &Path) -> Option<AttachmentLock> {
        store
            .try_lock(&LockPaths {
                path: path.to_owned(),
                record: store.path(("n", "c1", "eth0")).unwrap(),
            })
            .unwrap()
    }

    /// The race, one step at a time: B opens the lock file while A holds
    /// it; A releases it and, the attachment having no record, unlinks it;
    /// C creates a fresh file and locks it. B's `flock` on the old inode now
    /// succeeds, but B must see that it is not the file at the path, and
    /// then finds C holding the real one.
    #[test]
    fn a_locker_on_an_unlinked_file_starts_over() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let path = tmp.path().join(LOCKS_DIR).join("n-c1-eth0.lock");

        let a = lock_at(&store, &path).expect("A locks");
        let b_file = Disk.open_lock(&path).expect("B opens the same file");
        let old = b_file.metadata().unwrap().ino();
        drop(a);
        assert!(!path.exists(), "A left its unused lock file");
        let c = lock_at(&store, &path).expect("C locks a fresh file");
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), old);

        match lock_opened(b_file, &path).unwrap() {
            Attempt::Stale => {}
            other => panic!("B locked an unlinked file and took it for the lock: {other:?}"),
        }
        assert!(lock_at(&store, &path).is_none(), "B shares C's lock");
        drop(c);
        let b = lock_at(&store, &path).expect("B after C");
        assert!(b.path().exists());
    }

    /// Found by cnid's crash-point enumeration: a CHECK of an attachment
    /// with no record killed between creating its lock file and removing
    /// it left the file for good (nothing DELs an attachment never
    /// added). The sweep removes such a file; one held, or one whose
    /// attachment has a record, stays.
    #[test]
    fn unused_lock_files_are_swept_held_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let locks = tmp.path().join(LOCKS_DIR);
        create_private_dir(&locks).unwrap();
        let orphan = locks.join("n-gone-eth0.lock");
        drop(Disk.open_lock(&orphan).unwrap());
        let held_path = locks.join("n-c1-eth0.lock");
        let held = lock_at(&store, &held_path).expect("locked");
        let rt = cni_core::RuntimeConf::new("c2", "/proc/self/ns/net", "eth0");
        store
            .write_record(&CacheRecord::new("n", &rt, b"{}".to_vec(), None), true)
            .unwrap();
        let recorded = locks.join("n-c2-eth0.lock");
        drop(Disk.open_lock(&recorded).unwrap());
        assert_eq!(store.remove_abandoned(Duration::from_secs(300)).unwrap(), 1);
        assert!(!orphan.exists());
        assert!(held_path.exists() && recorded.exists());
        drop(held);
        assert_eq!(store.remove_abandoned(Duration::from_secs(300)).unwrap(), 0);
    }

    /// While a record exists, releasing keeps the file: a waiter that
    /// opened it gets the lock on it without starting over.
    #[test]
    fn a_lock_file_with_a_record_is_kept_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let path = tmp.path().join(LOCKS_DIR).join("n-c1-eth0.lock");
        let record = store.path(("n", "c1", "eth0")).unwrap();
        create_private_dir(record.parent().unwrap()).unwrap();
        std::fs::write(&record, b"{}").unwrap();

        let a = lock_at(&store, &path).expect("A locks");
        let b_file = Disk.open_lock(&path).unwrap();
        assert!(matches!(lock_opened(b_file, &path).unwrap(), Attempt::Busy));
        let b_file = Disk.open_lock(&path).unwrap();
        drop(a);
        assert!(path.exists());
        assert!(matches!(
            lock_opened(b_file, &path).unwrap(),
            Attempt::Held(_)
        ));
    }
}
