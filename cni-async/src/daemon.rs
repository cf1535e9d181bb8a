//! What only a daemon needs of the library (feature `daemon`, which cnid
//! enables): the store's storage seam and durable-file functions (for a
//! journal of its own over the same seam), the cache's deferred flushes and
//! incremental scans, and the few process and boot helpers it calls itself.
//!
//! # Caveats
//! - Everything named `_blocking` here runs file system calls on the
//!   calling thread: call it from a blocking context.

use std::sync::Arc;
use std::time::Duration;

use cni_core::cache::{CacheEntry, CacheRecord};

use crate::cache::{ListPage, ResultCache};
use crate::error::Error;

pub use crate::store::durable;
pub use crate::store::durable::{Disk, Storage};
pub use crate::store::{
    AttachmentKey, CORRUPT_DIR, LOCKS_DIR, RecordScan, ScanChanges, ScannedRecord,
};
pub use crate::sys::{
    ProcStat, Signal, boot_id, boot_time, group_alive, on_memory_fs, own_process_group, proc_stat,
    sees_host_mounts, signal_group,
};

impl ResultCache {
    /// Makes the dirs of ours that exist (`results/`, `locks/`, `corrupt/`)
    /// 0700, with a warning for each found open to others, and warns when
    /// the cache dir itself (whose mode is left alone: other tools keep
    /// data in it) can be written by others. Blocking (a few `stat` calls).
    pub fn tighten_dirs(&self) {
        self.store.tighten_dirs();
    }

    /// Makes every write, flush, rename and removal of the cache through
    /// `storage` instead of the real [`Disk`]: for tests that fail or crash
    /// each I/O point in turn.
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.store = self.store.with_storage(storage);
        self
    }

    /// Whether writes are flushed (default true). Turned off, writes stay
    /// atomic but not durable across a power loss: the caller owes
    /// [`ResultCache::sync_records_blocking`] (or the `syncfs` form) before
    /// it forgets which records it wrote.
    pub fn with_durable(mut self, durable: bool) -> Self {
        self.store.durable = durable;
        self
    }

    /// [`ResultCache::read`] on the calling thread, for a caller already
    /// off the async workers (inside `spawn_blocking`).
    pub fn read_blocking(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, Error> {
        self.store.read(network, container_id, ifname, true)
    }

    /// [`ResultCache::read_blocking`], but a corrupt file is left where it
    /// is (and reads as none): for a check made before an ADD, whose own
    /// lock step must still find it as evidence.
    pub fn read_in_place_blocking(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, Error> {
        self.store.read(network, container_id, ifname, false)
    }

    /// Writes `rec` atomically and durably (temp file, `fdatasync`,
    /// `rename`, `fsync` of the dir) on the calling thread, whatever
    /// [`ResultCache::with_durable`] says: for restoring a record.
    pub fn write_durable_blocking(&self, rec: &CacheRecord) -> Result<(), Error> {
        self.store.write_record(rec, true)
    }

    /// Makes the records of these attachments durable: an `fsync` of each
    /// record file there is (a missing one is skipped: a DEL removed it),
    /// then of `results/` for the renames, and of the dirs above for their
    /// own entries (once per `results/`). Returns how many files were
    /// flushed.
    pub fn sync_records_blocking<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> Result<usize, Error> {
        self.store.sync_records(attachments)
    }

    /// [`ResultCache::sync_records_blocking`] with one [`Storage::sync_fs`]
    /// of `results/` for all the files, for many records at once; it waits
    /// for the write-back of whatever else is dirty on that file system.
    /// Where that cannot report write-back errors (Linux before 5.8), file
    /// by file. Returns whether `results/` was there.
    pub fn sync_records_at_once_blocking<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)> + Clone,
    ) -> Result<bool, Error> {
        self.store.sync_records_at_once(attachments)
    }

    /// Removes what processes killed mid-operation left: temp files of
    /// record writes whose writer is dead and that are at least `min_age`
    /// old, and lock files of attachments without a record (removed while
    /// held). Returns how many files went.
    pub fn remove_abandoned(&self, min_age: Duration) -> Result<usize, Error> {
        self.store.remove_abandoned(min_age)
    }

    /// See [`RecordScan`].
    pub fn scan_blocking(&self, scan: &mut RecordScan) -> Result<ScanChanges, Error> {
        self.store.scan(scan)
    }

    /// Largest record file [`ResultCache::scan_few`] reads; a bigger one
    /// leaves the scan to [`ResultCache::scan_blocking`].
    pub const SCAN_FEW_MAX_BYTES: u64 = crate::store::Store::SCAN_FEW_MAX_BYTES;

    /// [`ResultCache::scan_blocking`] when the watch makes it a few system
    /// calls (at most `max` names changed, none bigger than
    /// [`ResultCache::SCAN_FEW_MAX_BYTES`]); otherwise `None`, the changes
    /// kept for the next scan.
    pub fn scan_few(&self, scan: &mut RecordScan, max: usize) -> Option<ScanChanges> {
        self.store.scan_few(scan, max)
    }

    /// [`ResultCache::list_page`] of the records named by `names(after, n)`:
    /// up to `n` file names sorting after `after`, in byte order (for
    /// example [`RecordScan::names_after`] of a current scan).
    pub fn list_page_from_blocking(
        &self,
        container_id: Option<&str>,
        page: &ListPage,
        names: impl FnMut(Option<&str>, usize) -> Vec<String>,
    ) -> (Vec<CacheRecord>, Option<String>) {
        self.store.page_from(container_id, page, names)
    }
}
