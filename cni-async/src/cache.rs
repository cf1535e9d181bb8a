//! The on-disk result cache, shared with libcni: [`ResultCache`], the
//! public face of the crate's store (its files, locks, flushes and scans
//! live in the crate-private `store` module, one concept per file).
//!
//! Layout and format are libcni's (`<dir>/results/<network>-<containerID>-<ifname>`,
//! a `cniCacheV1` JSON record, dir mode 0700, file mode 0600; see
//! [`cni_core::cache`]), so an attachment made by a Go runtime on the same
//! host can be deleted by us and the other way round. On top of that:
//!
//! - **Atomic writes**: a temp file in the same dir, `fdatasync`, `rename`
//!   over the target, `fsync` of the dir; the first durable write also makes
//!   `results/` and the cache dir durable in their parents. A crash leaves
//!   the old record or the new one, never half of one.
//! - **Per-attachment locks**: `<dir>/locks/<network>-<containerID>-<ifname>.lock`
//!   with `flock` ([`AttachmentLock`]), so two processes (cnitool and cnid,
//!   say) never run an operation on the same attachment at once.
//! - **Private dirs**: `results/`, `locks/` and `corrupt/` are made 0700 and
//!   tightened to 0700 when found open to others; libcni leaves an existing
//!   dir as it is (`docs/decisions.md` D22). An existing cache dir keeps its
//!   mode: other tools keep their data in it.
//! - **Corrupt entries** (unparsable, a symlink, wrong kind) are moved aside to
//!   `<dir>/corrupt/` with a warning and treated as absent, never trusted;
//!   only an ADD leaves one in place, as evidence that something may be
//!   attached, until its own record replaces it.
//! - **Records are checked** against the attachment asked for: file names are
//!   ambiguous when names contain `-`, the fields inside are not. A record for
//!   another attachment is left alone.
//!
//! # Caveats
//! - Disk work runs on tokio's blocking pool (`spawn_blocking`). If the future
//!   is dropped mid-write the blocking task still completes: the write is
//!   atomic either way. [`ResultCache::with_inline_io`] runs it on the
//!   calling thread instead (for a CLI: no pool thread to start); the
//!   future then cannot be dropped mid-write at all.
//! - Removals are not flushed: a record a power loss brings back only earns
//!   its attachment a repeat DEL, which must succeed.
//! - Locks are advisory (`flock`) and held by an open file: they die with the
//!   process, so a `kill -9` never leaves a lock behind. libcni takes no lock.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use cni_async::cache::ResultCache;
//! use std::time::Duration;
//!
//! let cache = ResultCache::new("/var/lib/cni");
//! let _lock = cache.lock("mynet", "c1", "eth0", Duration::from_secs(5)).await?;
//! if let Some(entry) = cache.read("mynet", "c1", "eth0").await? {
//!     println!("cached result: {:?}", entry.result());
//! }
//! # Ok(()) }
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_core::cache::{self as record, CacheEntry, CacheRecord};

use crate::error::Error;
use crate::store::{AttachmentKey, Names, Prior, Store, io_err};
pub use crate::store::{AttachmentLock, ListPage};

/// The result cache rooted at one directory (default `/var/lib/cni`).
#[derive(Debug, Clone)]
pub struct ResultCache {
    pub(crate) store: Store,
    inline: bool,
}

impl Default for ResultCache {
    fn default() -> Self {
        ResultCache::new(record::DEFAULT_CACHE_DIR)
    }
}

pub(crate) async fn blocking<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    if inline {
        return f();
    }
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        let lost = io::Error::other(e);
        Err(io_err(Path::new(""), "run blocking cache task", lost))
    })
}

/// An attachment's names, owned (for a closure sent to the blocking pool).
pub(crate) fn owned((network, cid, ifname): Names<'_>) -> AttachmentKey {
    (network.into(), cid.into(), ifname.into())
}

/// The names of an owned key.
fn borrowed(key: &AttachmentKey) -> Names<'_> {
    (&key.0, &key.1, &key.2)
}

impl ResultCache {
    /// A cache rooted at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ResultCache {
            store: Store::new(dir.into()),
            inline: false,
        }
    }

    setters! {
        /// Whether the per-attachment disk work (lock, read, write, removal)
        /// runs on the calling thread instead of tokio's blocking pool (default
        /// false; listings always run on the pool). For a one-shot process
        /// (cnitool: about 0.1 ms per run saved), or a server whose flushes are
        /// deferred (cnid), so that a call is a few short system calls.
        pub fn with_inline_io(inline: bool);
    }

    /// The cache dir.
    pub fn dir(&self) -> &Path {
        &self.store.dir
    }

    /// `<dir>/results`.
    pub fn results_dir(&self) -> PathBuf {
        self.store.results_dir()
    }

    /// The record file of an attachment (names validated).
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> Result<PathBuf, Error> {
        self.store.path((network, container_id, ifname))
    }

    /// Takes the attachment's lock, waiting up to `timeout` for another
    /// holder (another process or task) to release it.
    pub async fn lock(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
    ) -> Result<AttachmentLock, Error> {
        let names = (network, container_id, ifname);
        let (lock, ()) = self.lock_then(names, timeout, |_, _, _| Ok(())).await?;
        Ok(lock)
    }

    /// [`ResultCache::lock`], then, under the lock and in the same trip to
    /// the blocking pool, a check that the attachment's file does not hold
    /// the record of *another* attachment (`a-b`+`c` and `a`+`b-c` share a
    /// file name: [`Error::AttachmentCollision`]); with `fresh` (an
    /// exclusive ADD), this attachment's own record or a corrupt file is
    /// refused too ([`Error::AlreadyAttached`]). Answers the lock and what
    /// of the attachment was there ([`Prior`]), which the ADD's rollback
    /// must leave alone; a corrupt file is left in place.
    pub(crate) async fn lock_for_add(
        &self,
        names: Names<'_>,
        timeout: Duration,
        fresh: bool,
    ) -> Result<(AttachmentLock, Prior), Error> {
        self.lock_then(names, timeout, move |store, path, names| {
            store.check_not_taken(path, names, fresh, true)
        })
        .await
    }

    /// [`ResultCache::lock`], then [`ResultCache::read`] once the lock is
    /// held, in one trip to the blocking pool: what a DEL or a CHECK does
    /// before running its plugins. A failed read keeps the lock, and the
    /// caller decides (a DEL goes on without prevResult, a CHECK fails).
    pub async fn lock_and_read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
    ) -> Result<(AttachmentLock, Result<Option<CacheEntry>, Error>), Error> {
        self.lock_and_read_with((network, container_id, ifname), timeout, true)
            .await
    }

    /// [`ResultCache::lock_and_read`]; without `move_corrupt`, a corrupt
    /// file stays in place (read as none): what a CHECK does, which changes
    /// nothing. Moved aside, it would be gone as evidence that something
    /// was attached ([`Prior::Corrupt`]).
    pub(crate) async fn lock_and_read_with(
        &self,
        names: Names<'_>,
        timeout: Duration,
        move_corrupt: bool,
    ) -> Result<(AttachmentLock, Result<Option<CacheEntry>, Error>), Error> {
        self.lock_then(names, timeout, move |store, path, names| {
            Ok(store.read_entry(path, names, move_corrupt))
        })
        .await
    }

    /// The lock loop: each try takes the lock and, when it got it, runs
    /// `then(store, record path, names)` in the same blocking call; between tries
    /// a doubling backoff (1 ms up to 50 ms); past `timeout`,
    /// [`Error::CacheLocked`]. When `then` fails, the lock is released.
    async fn lock_then<T: Send + 'static>(
        &self,
        names: Names<'_>,
        timeout: Duration,
        then: impl Fn(&Store, &Path, Names<'_>) -> Result<T, Error> + Clone + Send + 'static,
    ) -> Result<(AttachmentLock, T), Error> {
        let (at, key) = (self.store.lock_paths(names)?, owned(names));
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        loop {
            let (try_at, store, then, key) =
                (at.clone(), self.store.clone(), then.clone(), key.clone());
            let held = blocking(self.inline, move || {
                let Some(lock) = store.try_lock(&try_at)? else {
                    return Ok(None);
                };
                // On an error, `lock` is dropped (and so released) here.
                let value = then(&store, &lock.record, borrowed(&key))?;
                Ok(Some((lock, value)))
            })
            .await?;
            if let Some(held) = held {
                return Ok(held);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::CacheLocked {
                    path: at.path,
                    waited,
                });
            }
            tokio::time::sleep(backoff.min(timeout - waited)).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Reads the entry of an attachment.
    ///
    /// `Ok(None)` when there is none, when the file holds a record of another
    /// attachment (name collision), or when it was corrupt (then it has been
    /// moved to `<dir>/corrupt/` with a warning).
    pub async fn read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, Error> {
        self.read_with((network, container_id, ifname), true).await
    }

    /// Writes an attachment's record atomically (temp file, `fdatasync`,
    /// rename, `fsync` of the dir, as `cni_durable::write_atomic`), and,
    /// the first time, the cache's dirs durable in their parents.
    pub async fn write(&self, rec: &CacheRecord) -> Result<(), Error> {
        let (store, rec) = (self.store.clone(), rec.clone());
        blocking(self.inline, move || store.write_record(&rec, store.durable)).await
    }

    /// Like [`ResultCache::write`], but the attachment's lock travels with
    /// the disk work: if the caller's future is dropped mid-write, the lock is
    /// released only when the write has finished. Returns the lock (unless
    /// the blocking task itself was lost) and the outcome. A corrupt file
    /// the ADD found ([`Prior::Corrupt`]) is replaced, with a warning.
    pub(crate) async fn write_holding(
        &self,
        rec: &CacheRecord,
        lock: AttachmentLock,
        prior: Prior,
    ) -> (Option<AttachmentLock>, Result<(), Error>) {
        let path = match self.path(&rec.network_name, &rec.container_id, &rec.if_name) {
            Ok(p) => p,
            Err(e) => return (Some(lock), Err(e)),
        };
        let (bytes, store) = (rec.encode(), self.store.clone());
        let written = blocking(self.inline, move || {
            // Replaced by the rename, never moved aside first: if the
            // write fails, it stays as the sign that something is attached.
            let written = store.write_file(&path, &bytes, store.durable);
            if written.is_ok() && prior == Prior::Corrupt {
                tracing::warn!(file = %path.display(), "corrupt cache entry replaced by this ADD's record");
            }
            Ok((lock, written))
        });
        match written.await {
            Ok((lock, r)) => (Some(lock), r),
            // The blocking task itself was lost, and the lock with it.
            Err(e) => (None, Err(e)),
        }
    }

    /// Removes an attachment's record, if the file holds that attachment's
    /// record (or a legacy bare result). A missing file is fine. Not
    /// flushed (see the module's caveats).
    pub async fn remove(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<(), Error> {
        let (store, key) = (self.store.clone(), owned((network, container_id, ifname)));
        store.path(borrowed(&key))?;
        blocking(self.inline, move || store.remove(borrowed(&key))).await
    }

    /// Every cached attachment (only `cniCacheV1` records), optionally only
    /// those of one container, sorted by file name. Unreadable or corrupt
    /// files are skipped with a warning (not moved: listing changes nothing).
    pub async fn list(&self, container_id: Option<&str>) -> Result<Vec<CacheRecord>, Error> {
        let page = self.list_page(container_id, ListPage::ALL).await;
        page.map(|(recs, _)| recs)
    }

    /// One page of [`ResultCache::list`] (see [`ListPage`]): memory is
    /// bounded by the page, not by the cache. The second value is the file
    /// name to continue after, when names are left.
    pub async fn list_page(
        &self,
        container_id: Option<&str>,
        page: ListPage,
    ) -> Result<(Vec<CacheRecord>, Option<String>), Error> {
        let store = self.store.clone();
        let filter = container_id.map(str::to_owned);
        blocking(false, move || store.list_page(filter.as_deref(), &page)).await
    }
    /// [`ResultCache::read`]; without `move_aside`, a corrupt file stays in
    /// place (read as none), for the readers that change nothing (the
    /// cached getters), as [`ResultCache::lock_and_read_with`] says.
    pub(crate) async fn read_with(
        &self,
        names: Names<'_>,
        move_aside: bool,
    ) -> Result<Option<CacheEntry>, Error> {
        let (store, key) = (self.store.clone(), owned(names));
        blocking(self.inline, move || store.read(borrowed(&key), move_aside)).await
    }

    /// The cached attachments of containers other than `container_id` on
    /// `netns` with interface `ifname` (any network), whoever wrote them,
    /// from the cache's owner index brought up to date first (the store's
    /// `owners.rs`: up to [`ResultCache::INLINE_REFRESH`] changed record
    /// files read here when the I/O is inline, anything more, or a
    /// listing, on the blocking pool). An error when it cannot be: no
    /// proof that the interface is free.
    pub(crate) async fn others_on(
        &self,
        netns: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<Vec<crate::store::Holder>, Error> {
        let inline = if self.inline { Self::INLINE_REFRESH } else { 0 };
        self.refresh_owners(inline).await?;
        let index = self.store.owners();
        Ok(crate::store::others(&index, netns, ifname, container_id))
    }

    /// Brings the owner index up to date with `results/` (the store's
    /// `owners.rs`): up to `inline` changed record files, none big, are
    /// read on the calling thread when the index's watch names them and no
    /// other refresh runs; anything more (a listing, many files, a refresh
    /// to wait for) on the blocking pool. Either way it sees every record
    /// written or removed before it was called.
    pub(crate) async fn refresh_owners(&self, inline: usize) -> Result<(), Error> {
        if inline > 0 && self.store.refresh_owners_few(inline) {
            return Ok(());
        }
        let store = self.store.clone();
        blocking(false, move || store.refresh_owners().map(drop)).await
    }

    /// How many changed record files [`ResultCache::others_on`] reads on
    /// the calling thread when the cache's I/O is inline.
    pub(crate) const INLINE_REFRESH: usize = 8;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECOND: Duration = Duration::from_secs(1);

    fn record(network: &str, container_id: &str, ifname: &str) -> CacheRecord {
        let rt = cni_core::RuntimeConf::new(container_id, "/run/netns/x", ifname);
        let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]});
        CacheRecord::new(network, &rt, b"{}".to_vec(), Some(result))
    }

    /// Runs `test` on a current-thread runtime with the pool's only thread,
    /// once with the cache I/O on the pool and once inline.
    fn both_modes(test: impl AsyncFn(ResultCache, &Path)) {
        for inline in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let cache = ResultCache::new(dir.path()).with_inline_io(inline);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .max_blocking_threads(1)
                .build()
                .unwrap()
                .block_on(test(cache, dir.path()));
        }
    }

    /// `a-b` + `c` and `a` + `b-c` share a file name: an ADD's lock step for the
    /// second refuses, naming the occupant, and releases the lock; the lock
    /// file stays (a record is at its path), as after `lock` then
    /// its collision check.
    #[test]
    fn the_add_lock_step_refuses_a_colliding_record_and_releases_the_lock() {
        both_modes(async |cache, dir| {
            cache.write(&record("a-b", "c", "eth0")).await.unwrap();
            let before = std::fs::read(dir.join("results/a-b-c-eth0")).unwrap();

            let err = cache
                .lock_for_add(("a", "b-c", "eth0"), SECOND, false)
                .await
                .unwrap_err();
            assert!(matches!(err, Error::AttachmentCollision { .. }), "{err}");
            assert!(
                err.to_string().contains("\"a-b\""),
                "names the occupant: {err}"
            );

            assert!(dir.join("locks/a-b-c-eth0.lock").exists(), "lock file kept");
            assert_eq!(
                std::fs::read(dir.join("results/a-b-c-eth0")).unwrap(),
                before
            );
            // Released: taken again at once, even while a fork in another
            // test's thread holds a copy of the lock's open file (see
            // `a_released_lock_is_free_while_a_forked_child_holds_its_file`).
            let again = cache.lock("a-b", "c", "eth0", Duration::ZERO).await;
            assert!(again.is_ok(), "{:?}", again.err());
        });
    }

    /// A free slot, or this attachment's own record: the lock is held until
    /// dropped; dropping it without a record removes the lock file.
    #[test]
    fn the_add_lock_step_holds_the_lock_on_a_free_or_own_slot() {
        both_modes(async |cache, dir| {
            let (lock, _) = cache
                .lock_for_add(("n", "c1", "eth0"), SECOND, false)
                .await
                .unwrap();
            let busy = cache
                .lock("n", "c1", "eth0", Duration::ZERO)
                .await
                .unwrap_err();
            assert!(matches!(busy, Error::CacheLocked { .. }), "{busy}");
            drop(lock);
            assert!(
                !dir.join("locks/n-c1-eth0.lock").exists(),
                "unused lock file removed"
            );

            cache.write(&record("n", "c1", "eth0")).await.unwrap();
            let (lock, _) = cache
                .lock_for_add(("n", "c1", "eth0"), SECOND, false)
                .await
                .unwrap();
            drop(lock);
            assert!(
                dir.join("locks/n-c1-eth0.lock").exists(),
                "lock file of a record kept"
            );
        });
    }

    /// While someone else holds the lock, neither call looks at the slot (a
    /// corrupt record stays where it is) and both give up with `CacheLocked`
    /// after the timeout, having retried meanwhile.
    #[test]
    fn combined_calls_wait_for_the_lock_and_never_touch_the_slot_without_it() {
        both_modes(async |cache, dir| {
            let record_path = dir.join("results/n-c1-eth0");
            std::fs::create_dir_all(record_path.parent().unwrap()).unwrap();
            std::fs::write(&record_path, b"not json").unwrap();
            let held = cache.lock("n", "c1", "eth0", SECOND).await.unwrap();
            let timeout = Duration::from_millis(200);

            let started = Instant::now();
            let err = cache
                .lock_for_add(("n", "c1", "eth0"), timeout, false)
                .await
                .unwrap_err();
            let Error::CacheLocked { waited, .. } = err else {
                panic!("lock_for_add: {err}")
            };
            assert!(
                waited >= timeout && started.elapsed() >= timeout,
                "{waited:?}"
            );

            let err = cache
                .lock_and_read("n", "c1", "eth0", timeout)
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::CacheLocked { .. }),
                "lock_and_read: {err}"
            );

            assert_eq!(std::fs::read(&record_path).unwrap(), b"not json");
            assert!(!dir.join("corrupt").exists());
            drop(held);
        });
    }
}
