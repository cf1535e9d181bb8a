//! What only a daemon needs of the library (feature `daemon`, which cnid
//! enables): the store's storage seam and durable-file functions (for a
//! journal of its own over the same seam), the cache's deferred flushes and
//! its index of attachments by netns and interface, and the few process and
//! boot helpers it calls itself.
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
pub use crate::store::{AttachmentKey, CORRUPT_DIR, Holder, LOCKS_DIR};
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

    setters! {
        /// Whether writes are flushed (default true). Turned off, writes stay
        /// atomic but not durable across a power loss: the caller owes
        /// [`ResultCache::sync_records_blocking`] (or the `syncfs` form) before
        /// it forgets which records it wrote.
        pub fn with_durable(store.durable: bool);
    }

    /// [`ResultCache::read`] on the calling thread, for a caller already
    /// off the async workers (inside `spawn_blocking`).
    pub fn read_blocking(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, Error> {
        self.store.read((network, container_id, ifname), true)
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
        self.store.read((network, container_id, ifname), false)
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

    /// Brings the cache's attachment index up to date with `results/`:
    /// the index a rollback asks before it DELs in a netns (shared by the
    /// clones of this cache, made at first use; the first refresh lists
    /// `results/`, the next ones read only the record files changed since,
    /// watched with inotify under the feature `watch`). Up to `inline`
    /// changed files, none bigger than 64 KiB, are read on the calling
    /// thread when no other refresh runs (a request's own ADDs and DELs:
    /// a hop to the blocking pool would cost more); anything else on the
    /// pool. Sees every record written or removed before the call.
    pub async fn refresh_attachments(&self, inline: usize) -> Result<(), Error> {
        self.refresh_owners(inline).await
    }

    /// The attachments on `netns`'s `ifname` in the index as last
    /// refreshed ([`ResultCache::refresh_attachments`]), by network and
    /// container. No I/O.
    pub fn attachments_on(&self, netns: &str, ifname: &str) -> Vec<Holder> {
        self.store.owners().holders(netns, ifname)
    }

    /// Enters an attachment in the index (a successful ADD's, before the
    /// next refresh reads its record); `netns` empty: none.
    pub fn note_attachment(&self, network: &str, container_id: &str, ifname: &str, netns: &str) {
        let key = crate::cache::owned((network, container_id, ifname));
        self.store.owners().insert(key, netns.to_owned());
    }

    /// Takes an attachment out of the index (a successful DEL's).
    pub fn forget_attachment(&self, network: &str, container_id: &str, ifname: &str) {
        let key = crate::cache::owned((network, container_id, ifname));
        self.store.owners().remove(&key);
    }

    /// How many times a refresh of the index listed `results/` whole.
    pub fn attachment_listings(&self) -> u64 {
        self.store.owners().listings()
    }

    /// One page, as [`ResultCache::list_page`] gives it, from the file
    /// names of the index's last refresh instead of a listing and sort of
    /// `results/`: a page costs its own records. Every record present
    /// throughout a paging, each page after a refresh, is listed once.
    /// Blocking.
    pub fn list_page_indexed_blocking(
        &self,
        container_id: Option<&str>,
        page: &ListPage,
    ) -> (Vec<CacheRecord>, Option<String>) {
        // The index's lock only while names are taken, not while the
        // records are read.
        self.store.page_from(container_id, page, |after, n| {
            self.store.owners().names_after(after, container_id, n)
        })
    }
}
