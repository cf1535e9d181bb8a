//! The on-disk result cache, shared with libcni.
//!
//! Layout and format are libcni's (`<dir>/results/<network>-<containerID>-<ifname>`,
//! a `cniCacheV1` JSON record, dir mode 0700, file mode 0600; see
//! [`cni_core::cache`]), so an attachment made by a Go runtime on the same
//! host can be deleted by us and the other way round. On top of that:
//!
//! - **Atomic writes** ([`crate::durable::write_atomic_on`]): a temp file in the
//!   same dir, `fdatasync`, `rename` over the target, `fsync` of the dir (the
//!   flushes unless [`ResultCache::with_durable`] turned them off for a
//!   caller that makes records durable itself). The first durable write of a
//!   cache (and of its clones) into a `results/` also makes `results/` and
//!   the cache dir durable in their parents, whether it made them or found
//!   them (a writer killed before it flushed them, or libcni, which never
//!   does, may have left them): [`durable::ensure_private_dir_durable_once`].
//!   A crash leaves the old record or the new one,
//!   never half of one. Removals are not fsynced: a record that a power loss
//!   brings back only earns its attachment a repeat DEL, which must succeed.
//! - **Per-attachment locks**: `<dir>/locks/<network>-<containerID>-<ifname>.lock`
//!   with `flock`, so two processes (cnitool and cnid, say) never run an
//!   operation on the same attachment at once. A lock file lives only as
//!   long as the attachment's record: the holder releasing a lock when
//!   there is no record (after a DEL, a failed ADD, a CHECK of an unknown
//!   attachment) unlinks the file *while still holding it*. A locker checks
//!   after `flock` that the file it locked is still the one at the path
//!   (device and inode of its descriptor against a `stat` of the path) and
//!   starts over when it is not, so two lockers never hold "the" lock at
//!   once. Only a holder unlinks, and only the file it verified, so the
//!   path never loses a file someone else holds.
//! - **Private dirs**: `results/`, `locks/` and `corrupt/` are made 0700 and
//!   tightened to 0700 when found open to others ([`ensure_private_dir`],
//!   [`ResultCache::tighten_dirs`]); libcni leaves an existing dir as it is
//!   (`docs/decisions.md` D22).
//!   The cache dir itself is created 0700 but an existing one keeps its
//!   mode: other tools keep their data in it.
//! - **One storage seam**: every write, flush, rename and removal (records,
//!   their temp files, lock files, moves aside, the flushes of created
//!   dirs) goes through the cache's [`Storage`],
//!   the real [`Disk`] unless
//!   [`ResultCache::with_storage`] put a simulated one there (cnid's
//!   crash-point enumeration does).
//! - **Corrupt entries** (unparsable, a symlink, wrong kind) are moved aside to
//!   `<dir>/corrupt/` with a warning and treated as absent; they are never
//!   silently trusted. An ADD's lock step leaves one in place (it may be
//!   all that is left of an attachment, which the ADD's rollback must then
//!   keep, and the next ADD's too; an exclusive ADD refuses it), and a
//!   plain ADD that succeeds replaces it with its own record, with a
//!   warning.
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

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_core::cache::{self as record, CacheEntry, CacheRecord};
use cni_core::error::Chain;

use crate::durable::{self, is_symlink_refusal, read_nofollow};
pub use crate::durable::{PrivateDir, ensure_private_dir};
use crate::error::Error;
use crate::storage::{Disk, Storage};
use std::sync::Arc;

#[cfg(feature = "watch")]
mod watch;

/// Subdirectory of the cache dir holding lock files.
pub const LOCKS_DIR: &str = "locks";
/// Subdirectory of the cache dir where corrupt entries are moved.
pub const CORRUPT_DIR: &str = "corrupt";

/// The result cache rooted at one directory (default `/var/lib/cni`).
#[derive(Debug, Clone)]
pub struct ResultCache {
    dir: PathBuf,
    durable: bool,
    inline: bool,
    /// Every write, flush, rename and removal ([`Disk`] but in tests).
    storage: Arc<dyn Storage>,
    /// Whether `results/` and the cache dir are known durable in their
    /// parents (shared by the clones: flushed once, not per write).
    dirs: Arc<durable::DurableDirs>,
}

impl Default for ResultCache {
    fn default() -> Self {
        ResultCache::new(record::DEFAULT_CACHE_DIR)
    }
}

fn io_err(path: &Path, op: &'static str, source: std::io::Error) -> Error {
    Error::Cache {
        path: path.to_owned(),
        op,
        source,
    }
}

async fn blocking<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    if inline {
        return f();
    }
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(Error::Cache {
            path: PathBuf::new(),
            op: "run blocking cache task",
            source: std::io::Error::other(e.to_string()),
        }),
    }
}

impl ResultCache {
    /// A cache rooted at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ResultCache {
            dir: dir.into(),
            durable: true,
            inline: false,
            storage: Arc::new(Disk),
            dirs: Arc::default(),
        }
    }

    /// Makes every write, flush, rename and removal of the cache (records,
    /// temp files, lock files, moves aside) through `storage` instead of
    /// the real [`Disk`]: for tests that fail or crash each I/O point in
    /// turn (cnid's crash-point enumeration).
    pub fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// Whether writes are `fsync`ed (default true). Turning it off keeps
    /// writes atomic (rename) but not durable across power loss: for
    /// throwaway test harnesses on slow disks, or for a caller that makes
    /// its records durable itself (cnid journals each ADD's record with one
    /// `fdatasync`, and [`ResultCache::sync_records_blocking`] flushes them
    /// before it forgets them).
    pub fn with_durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Whether the per-attachment disk work (lock, read, write, removal)
    /// runs on the calling thread instead of tokio's blocking pool (default
    /// false; listings always run on the pool). For a process that does one operation
    /// and has nothing else to run meanwhile (cnitool): it saves starting
    /// the pool's thread and a hand-off per call, about 0.1 ms per run. In
    /// a server, only together with `with_durable(false)` (as cnid): with
    /// the fsyncs, it would stall the other tasks of that worker for as
    /// long as a write and its flushes take; without them, a call is a few
    /// short system calls, which a file system under heavy write-back can
    /// still slow down.
    pub fn with_inline_io(mut self, inline: bool) -> Self {
        self.inline = inline;
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
        let path = self.path(network, container_id, ifname)?;
        read_entry(self, &path, network, container_id, ifname, true)
    }

    /// [`ResultCache::read_blocking`], but a corrupt file is left where it
    /// is (and reads as none): for a check made before an ADD, whose own
    /// lock step must still find it. Moved aside there, it would be gone
    /// as evidence that something was attached, and the ADD's rollback
    /// would delete the attachment.
    pub fn read_in_place_blocking(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<Option<CacheEntry>, Error> {
        let path = self.path(network, container_id, ifname)?;
        read_entry(self, &path, network, container_id, ifname, false)
    }

    /// Writes `rec` atomically and durably (temp file, `fsync`, `rename`,
    /// `fsync` of the dir) on the calling thread, whatever
    /// [`ResultCache::with_durable`] says: for restoring a record.
    pub fn write_durable_blocking(&self, rec: &CacheRecord) -> Result<(), Error> {
        let path = self.path(&rec.network_name, &rec.container_id, &rec.if_name)?;
        write_atomic(self, &path, &rec.encode(), true)
    }

    /// Makes the records of these attachments durable: an `fsync` of each
    /// record file there is (a missing one is skipped: a DEL removed it),
    /// then one of `results/` for the renames, and of the cache dir and its
    /// parent for the dirs' own entries (a write without a flush makes
    /// `results/` without flushing it either; those two once per
    /// `results/`, [`durable::sync_entries_once`]). What a cache
    /// [`with_durable(false)`](ResultCache::with_durable) owes before its
    /// caller forgets which records are not flushed yet. Blocking. Returns
    /// how many files were flushed.
    pub fn sync_records_blocking<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> Result<usize, Error> {
        let mut n = 0;
        for (network, container_id, ifname) in attachments {
            let path = self.path(network, container_id, ifname)?;
            if durable::sync_file(&*self.storage, &path).map_err(durable_err)? {
                n += 1;
            }
        }
        if n > 0 {
            let results = self.results_dir();
            durable::sync_dir(&*self.storage, &results).map_err(durable_err)?;
            // Not only `results/`: the records' dir itself must be durable
            // before the caller forgets them (found by the attack on issue
            // 21: cnid dropped the commit lines of records whose
            // `results/` was never flushed into the cache dir, and a power
            // loss took the dir away with them). Once per `results/`: a
            // cache dir's parent that cannot be opened (a non-root cnid)
            // is warned about once and fails nothing.
            durable::sync_entries_once(&*self.storage, &results, &self.dirs)
                .map_err(durable_err)?;
        }
        Ok(n)
    }

    /// What [`ResultCache::sync_records_blocking`] does, in one flush for
    /// any number of records: one [`Storage::sync_fs`] of `results/` (every
    /// record file there durable, data and name), then the same `fsync`s
    /// of `results/`, the cache dir and its parent. For many records at
    /// once (cnid's start: an `fsync` per file is a flush of the device
    /// each, 1–4 ms on a virtual disk); its cost is the write-back of
    /// whatever else is dirty on that file system, other programs' data
    /// included, which it waits for. Names are checked as the
    /// file-by-file flush checks them (an invalid one fails it). Where the
    /// storage cannot report write-back errors (`Unsupported`: Linux before
    /// 5.8), it flushes file by file instead. Blocking. Returns whether
    /// `results/` was there (nothing to flush otherwise: every record named
    /// was removed).
    pub fn sync_records_at_once_blocking<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)> + Clone,
    ) -> Result<bool, Error> {
        for (network, container_id, ifname) in attachments.clone() {
            self.path(network, container_id, ifname)?;
        }
        let results = self.results_dir();
        // A `results/` that is a link to a dir (the cache makes and uses
        // its dirs through links) is flushed where it points: the storage
        // opens no link (found by the attack on issue 25: from 64 records
        // on, every start failed and carried every line).
        let target = match std::fs::symlink_metadata(&results) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(&results) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                Err(source) => {
                    return Err(Error::Cache {
                        path: results,
                        op: "resolve the link",
                        source,
                    });
                }
            },
            _ => results.clone(),
        };
        match self.storage.sync_fs(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                return self.sync_records_blocking(attachments).map(|n| n > 0);
            }
            Err(source) => {
                return Err(Error::Cache {
                    path: results,
                    op: "syncfs",
                    source,
                });
            }
        }
        // As in the file-by-file flush: the dirs' own entries in their
        // parents (on another file system than the one flushed when
        // `results/` or the cache dir is a mount point).
        let above = self.dir.parent().filter(|p| !p.as_os_str().is_empty());
        for d in [results.as_path(), self.dir.as_path()]
            .into_iter()
            .chain(above)
        {
            durable::sync_dir(&*self.storage, d).map_err(durable_err)?;
        }
        Ok(true)
    }

    /// Removes what processes killed mid-operation left: the temp files
    /// of record writes in `results/` (between a record's temp file and
    /// its rename), only those named as this crate names them whose
    /// writer's pid is gone and that are at least `min_age` old
    /// ([`durable::remove_abandoned`]), for the dir is shared with other
    /// tools; and the lock files of attachments that have no record (a
    /// CHECK or a failed ADD killed before it removed its lock file),
    /// each taken first and removed while held, as a holder removes it
    /// ([`AttachmentLock`]): one held by anyone is left. Blocking. Returns
    /// how many files went.
    pub fn remove_abandoned(&self, min_age: Duration) -> Result<usize, Error> {
        let temps = durable::remove_abandoned(&*self.storage, &self.results_dir(), min_age)
            .map_err(durable_err)?;
        Ok(temps + self.remove_unused_locks()?)
    }

    /// The lock files of [`ResultCache::remove_abandoned`].
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
            let path = locks.join(&name);
            if let Some(file) = try_lock_once(&*self.storage, &locks, &path)? {
                // Dropped: removed while held, as the record is missing.
                drop(AttachmentLock {
                    path: path.clone(),
                    record,
                    file: Some(file),
                    storage: self.storage.clone(),
                });
                if std::fs::symlink_metadata(&path).is_err() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The cache dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/results`.
    pub fn results_dir(&self) -> PathBuf {
        record::results_dir(&self.dir)
    }

    /// Makes the dirs of ours that exist (`results/`, `locks/`, `corrupt/`)
    /// private, 0700 ([`ensure_private_dir`]: each is tightened with a
    /// warning when found open to others), and warns when the cache dir
    /// itself can be written by others (who can then replace those dirs).
    /// The cache dir's own mode is left alone: it is shared with libcni,
    /// and other tools keep their data in it (host-local's `networks/` in
    /// `/var/lib/cni`). Dirs created later are made 0700 anyway; a daemon
    /// calls this at start. Blocking (a few `stat` calls).
    pub fn tighten_dirs(&self) {
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

    /// The record file of an attachment (names validated).
    pub fn path(&self, network: &str, container_id: &str, ifname: &str) -> Result<PathBuf, Error> {
        Ok(record::file_path(&self.dir, network, container_id, ifname)?)
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
        let (lock, ()) = self
            .lock_then(network, container_id, ifname, timeout, |_, _| Ok(()))
            .await?;
        Ok(lock)
    }

    /// [`ResultCache::lock`], then, once the lock is held and in the same
    /// trip to the blocking pool, a check that the attachment's file does
    /// not hold the record of *another* attachment (`a-b`+`c` and
    /// `a`+`b-c` share a file name; a missing file, a record of this
    /// attachment, a legacy bare result or a corrupt file, moved aside,
    /// are all fine). The library's own ADD no longer uses it: its lock
    /// step leaves a corrupt file in place (it may be a working
    /// attachment's record). On
    /// [`Error::AttachmentCollision`] (or a failed read) the lock is
    /// released as dropping an [`AttachmentLock`] releases it (the lock
    /// file stays, since the record's path holds a file).
    pub async fn lock_unused(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
    ) -> Result<AttachmentLock, Error> {
        let (net, cid, ifn) = (
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        );
        self.lock_then(
            network,
            container_id,
            ifname,
            timeout,
            move |cache, path| check_not_taken(cache, path, (&net, &cid, &ifn), false, false),
        )
        .await
        .map(|(lock, _)| lock)
    }

    /// [`ResultCache::lock_unused`]; with `fresh`, this attachment's own
    /// record (or a legacy bare result) is refused too
    /// ([`Error::AlreadyAttached`]): what an exclusive ADD does
    /// ([`AddRequest::exclusive`](crate::ops::AddRequest)). The check is
    /// made under the lock, so of concurrent callers on one attachment,
    /// each sees what the one before it left. Answers the lock and what of
    /// the attachment was there ([`Prior`]): an attachment made before
    /// this ADD, which its rollback must leave alone. Unlike
    /// [`ResultCache::lock_unused`], a corrupt file is left in place, and
    /// refused as an attachment when `fresh` (in doubt, it is one; a DEL
    /// moves it aside): otherwise [`ResultCache::write_holding`] replaces
    /// it once the ADD succeeded.
    pub(crate) async fn lock_for_add(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
        fresh: bool,
    ) -> Result<(AttachmentLock, Prior), Error> {
        let (net, cid, ifn) = (
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        );
        self.lock_then(
            network,
            container_id,
            ifname,
            timeout,
            move |cache, path| check_not_taken(cache, path, (&net, &cid, &ifn), fresh, true),
        )
        .await
    }

    /// [`ResultCache::lock`], then [`ResultCache::read`] once the lock is
    /// held, in one trip to the blocking pool instead of two: what a DEL or
    /// a CHECK does before running its plugins. The read's outcome comes
    /// beside the lock: a failed read keeps the lock, and the caller
    /// decides (a DEL goes on without prevResult, a CHECK fails).
    pub async fn lock_and_read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
    ) -> Result<(AttachmentLock, Result<Option<CacheEntry>, Error>), Error> {
        self.lock_and_read_moving(network, container_id, ifname, timeout, true)
            .await
    }

    /// [`ResultCache::lock_and_read`], leaving a corrupt file in place
    /// (read as none): what a CHECK does, which changes nothing. Moved
    /// aside, it would be gone as evidence that something was attached,
    /// and a later ADD's rollback would delete the attachment
    /// ([`Prior::Corrupt`]).
    pub(crate) async fn lock_and_read_in_place(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
    ) -> Result<(AttachmentLock, Result<Option<CacheEntry>, Error>), Error> {
        self.lock_and_read_moving(network, container_id, ifname, timeout, false)
            .await
    }

    async fn lock_and_read_moving(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
        move_corrupt: bool,
    ) -> Result<(AttachmentLock, Result<Option<CacheEntry>, Error>), Error> {
        let (net, cid, ifn) = (
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        );
        self.lock_then(
            network,
            container_id,
            ifname,
            timeout,
            move |cache, path| Ok(read_entry(cache, path, &net, &cid, &ifn, move_corrupt)),
        )
        .await
    }

    /// The lock loop: each try takes the lock and, when it got it, runs
    /// `then(cache, record path)` in the same blocking call (on the
    /// pool, or on the calling thread with
    /// [`with_inline_io`](ResultCache::with_inline_io)). Between tries it
    /// sleeps with a doubling backoff (1 ms up to 50 ms); past `timeout`
    /// it fails with [`Error::CacheLocked`]. When `then` fails, the lock
    /// is dropped (released as [`AttachmentLock`]'s `Drop` says) before the
    /// error is returned.
    async fn lock_then<T: Send + 'static>(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        timeout: Duration,
        then: impl Fn(&ResultCache, &Path) -> Result<T, Error> + Clone + Send + 'static,
    ) -> Result<(AttachmentLock, T), Error> {
        let name = record::file_name(network, container_id, ifname)?;
        let locks = self.dir.join(LOCKS_DIR);
        let path = locks.join(format!("{name}.lock"));
        let record = self.path(network, container_id, ifname)?;
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        loop {
            let (p, l, r, this, then) = (
                path.clone(),
                locks.clone(),
                record.clone(),
                self.clone(),
                then.clone(),
            );
            let held = blocking(self.inline, move || {
                let Some(file) = try_lock_once(&*this.storage, &l, &p)? else {
                    return Ok(None);
                };
                let lock = AttachmentLock {
                    path: p,
                    record: r,
                    file: Some(file),
                    storage: this.storage.clone(),
                };
                // On an error, `lock` is dropped (and so released) here.
                let value = then(&this, &lock.record)?;
                Ok(Some((lock, value)))
            })
            .await?;
            if let Some(held) = held {
                return Ok(held);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::CacheLocked { path, waited });
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
        let this = self.clone();
        let (net, cid, ifn) = (
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        );
        blocking(self.inline, move || this.read_blocking(&net, &cid, &ifn)).await
    }

    /// Writes an attachment's record atomically (temp file, fsync, rename,
    /// fsync of the dir; without the fsyncs when not
    /// [`durable`](ResultCache::with_durable)).
    pub async fn write(&self, rec: &CacheRecord) -> Result<(), Error> {
        let path = self.path(&rec.network_name, &rec.container_id, &rec.if_name)?;
        let bytes = rec.encode();
        let this = self.clone();
        blocking(self.inline, move || {
            write_atomic(&this, &path, &bytes, this.durable)
        })
        .await
    }

    /// Like [`ResultCache::write`], but the attachment's lock travels with
    /// the disk work: if the caller's future is dropped mid-write, the lock is
    /// released only when the write has finished, so no other operation on
    /// the attachment can start before the record is in place. Returns the
    /// lock (unless the blocking task itself was lost) and the outcome.
    /// With `prior` [`Prior::Corrupt`], the corrupt file the ADD found is
    /// replaced (with a warning); it stays if the write fails.
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
        let bytes = rec.encode();
        let write = move |cache: &ResultCache| {
            // A corrupt file found by the lock step is replaced by the
            // rename, never moved aside first: if the write fails, it stays
            // as the sign that something is attached (and moving it back
            // would be one more step a crash can cut).
            let written = write_atomic(cache, &path, &bytes, cache.durable);
            if written.is_ok() && prior == Prior::Corrupt {
                tracing::warn!(file = %path.display(), "corrupt cache entry replaced by this ADD's record");
            }
            written
        };
        if self.inline {
            let r = write(self);
            return (Some(lock), r);
        }
        let this = self.clone();
        let task = tokio::task::spawn_blocking(move || {
            let r = write(&this);
            (lock, r)
        });
        match task.await {
            Ok((lock, r)) => (Some(lock), r),
            Err(e) => (
                None,
                Err(Error::Cache {
                    path: PathBuf::new(),
                    op: "run blocking cache task",
                    source: std::io::Error::other(e.to_string()),
                }),
            ),
        }
    }

    /// Removes an attachment's record, if the file holds that attachment's
    /// record (or a legacy bare result). A missing file is fine.
    pub async fn remove(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<(), Error> {
        let path = self.path(network, container_id, ifname)?;
        let (net, cid, ifn) = (
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        );
        let this = self.clone();
        blocking(self.inline, move || {
            // Check ownership first: never delete another attachment's record.
            if read_entry(&this, &path, &net, &cid, &ifn, true)?.is_none() {
                return Ok(());
            }
            match this.storage.remove(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_err(&path, "remove", e)),
            }
            // No fsync of the dir: if a power loss brings the record back,
            // the attachment gets one more DEL (from GC or the runtime),
            // which the spec requires to succeed anyway. That saves an
            // fsync on every DEL.
            Ok(())
        })
        .await
    }

    /// Every cached attachment (only `cniCacheV1` records), optionally only
    /// those of one container, sorted by file name. Unreadable or corrupt
    /// files are skipped with a warning (not moved: listing changes nothing).
    pub async fn list(&self, container_id: Option<&str>) -> Result<Vec<CacheRecord>, Error> {
        let results = self.results_dir();
        let filter = container_id.map(str::to_owned);
        blocking(false, move || {
            list_records(&results, filter.as_deref(), &ListPage::ALL).map(|(recs, _)| recs)
        })
        .await
    }

    /// One page of [`ResultCache::list`]: the records whose file names sort
    /// after `page.after`, at most `page.limit` of them, and no more once
    /// their files add up to `page.max_bytes` (the first one always comes,
    /// whatever its size). Only the records of a page are read, so memory
    /// is bounded by the page, not by the cache. The second value is the
    /// file name to continue after, when names are left.
    pub async fn list_page(
        &self,
        container_id: Option<&str>,
        page: ListPage,
    ) -> Result<(Vec<CacheRecord>, Option<String>), Error> {
        let results = self.results_dir();
        let filter = container_id.map(str::to_owned);
        blocking(false, move || {
            list_records(&results, filter.as_deref(), &page)
        })
        .await
    }
}

/// Which part of the cache [`ResultCache::list_page`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Only file names sorting after this one (byte-wise).
    pub after: Option<String>,
    /// Records at most.
    pub limit: usize,
    /// Bytes of record files at most (the first record comes regardless).
    pub max_bytes: u64,
}

impl ListPage {
    /// Everything.
    pub const ALL: ListPage = ListPage {
        after: None,
        limit: usize::MAX,
        max_bytes: u64::MAX,
    };
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

fn create_private_dir(dir: &Path) -> Result<(), Error> {
    report_private_dir(
        dir,
        ensure_private_dir(dir).map_err(|e| io_err(dir, "create directory", e))?,
    );
    Ok(())
}

/// Warns about what [`ensure_private_dir`] found wrong with `dir`.
fn report_private_dir(dir: &Path, found: PrivateDir) {
    match found {
        PrivateDir::Private => {}
        PrivateDir::Tightened { was } => tracing::warn!(
            dir = %dir.display(),
            was = %format_args!("{was:04o}"),
            "cache directory was open to other users; made it 0700"
        ),
        PrivateDir::Foreign { owner, mode } => tracing::warn!(
            dir = %dir.display(),
            owner,
            mode = %format_args!("{mode:04o}"),
            "cache directory belongs to another user, who can plant records; left as it is"
        ),
    }
}

fn durable_err(f: durable::Failure) -> Error {
    Error::Cache {
        path: f.path,
        op: f.op,
        source: f.source,
    }
}

fn write_atomic(cache: &ResultCache, path: &Path, bytes: &[u8], fsync: bool) -> Result<(), Error> {
    let (storage, results) = (&*cache.storage, cache.results_dir());
    // A durable write makes `results/` and the cache dir durable in their
    // parents: those made here at once, those found there the first time
    // this cache writes into them (a process killed before it flushed
    // them, or a writer that never does, may have left them: found by
    // cnid's crash-point enumeration), then never again for the same
    // `results/`.
    report_private_dir(
        &results,
        durable::ensure_private_dir_durable_once(storage, &results, fsync, &cache.dirs)
            .map_err(|e| io_err(&results, "create directory", e))?,
    );
    durable::write_atomic_on(storage, path, bytes, 0o600, fsync).map_err(durable_err)
}

/// Moves a corrupt entry to `corrupt/` with a warning; answers where to,
/// `None` (with a warning) when it could not.
fn move_aside(cache: &ResultCache, path: &Path, reason: &str) -> Option<PathBuf> {
    match durable::move_aside(&*cache.storage, path, &cache.dir.join(CORRUPT_DIR)) {
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

/// What an attachment's cache file holds, as seen by that attachment.
enum Slot {
    /// No file.
    Empty,
    /// A corrupt file: nothing usable, but maybe what is left
    /// of an attachment made earlier. Moved aside, unless the reader asked
    /// to keep it in place.
    Corrupt,
    /// A symbolic link, always moved aside.
    Link,
    /// This attachment's record, or a legacy bare result.
    Ours(CacheEntry),
    /// The record of another attachment whose names collide with ours.
    Theirs(CacheRecord),
}

/// Reads the file at `path` as seen by one attachment; a corrupt or
/// symlinked file is moved aside when `move_corrupt`, else left where it
/// is (an ADD's lock step: see [`Prior::Corrupt`]).
fn read_slot(
    cache: &ResultCache,
    path: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
    move_corrupt: bool,
) -> Result<Slot, Error> {
    let corrupt = |reason: &str| {
        if move_corrupt {
            move_aside(cache, path, reason);
        } else {
            tracing::warn!(file = %path.display(), %reason, "corrupt cache entry kept in place until an ADD replaces it or a DEL moves it aside");
        }
        Ok(Slot::Corrupt)
    };
    let bytes = match read_nofollow(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Slot::Empty),
        Err(e) if is_symlink_refusal(&e) => {
            move_aside(cache, path, "is a symbolic link");
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

/// What an ADD's lock step found of its own attachment
/// ([`ResultCache::lock_for_add`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prior {
    /// No file: nothing of this attachment was recorded.
    Nothing,
    /// Its record, or a legacy bare result.
    Record,
    /// A symbolic link, moved aside at once (never followed; neither this
    /// library nor libcni writes one, so it is no sign of an attachment to
    /// keep in place), counted as there before all the same.
    Link,
    /// A corrupt file, left in place: no proof that nothing
    /// is attached, so it must stay as evidence until the ADD succeeds
    /// (then [`ResultCache::write_holding`] replaces it) or a DEL moves it
    /// aside. Moved aside earlier, a failed ADD would leave nothing, and
    /// the next ADD's rollback would delete what was attached.
    Corrupt,
}

impl Prior {
    /// Something of this attachment was there before the ADD.
    pub(crate) fn existed(self) -> bool {
        self != Prior::Nothing
    }
}

/// The check of [`ResultCache::lock_unused`], on the calling thread.
/// `Ok` unless `path` holds another attachment's record (or, when
/// `fresh`, this attachment's own); answers what of this attachment was
/// there before. A corrupt file is moved aside unless `keep_corrupt`.
fn check_not_taken(
    cache: &ResultCache,
    path: &Path,
    (network, container_id, ifname): (&str, &str, &str),
    fresh: bool,
    keep_corrupt: bool,
) -> Result<Prior, Error> {
    let already = || Error::AlreadyAttached {
        network: network.to_owned(),
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
    };
    match read_slot(cache, path, network, container_id, ifname, !keep_corrupt)? {
        Slot::Theirs(rec) => Err(Error::AttachmentCollision {
            path: path.to_owned(),
            occupant: format!(
                "network {:?} container {:?} interface {:?}",
                rec.network_name, rec.container_id, rec.if_name
            ),
        }),
        // In doubt, a corrupt record (kept in place) is an attachment too:
        // an exclusive ADD that ran over it and succeeded (loopback does,
        // again and again) would count as made by this call, and a
        // sandbox's undo would take the working attachment down. A DEL
        // moves it aside.
        Slot::Ours(_) if fresh => Err(already()),
        Slot::Corrupt if fresh && keep_corrupt => Err(already()),
        Slot::Empty => Ok(Prior::Nothing),
        Slot::Ours(_) => Ok(Prior::Record),
        // A corrupt record is no proof that nothing was attached: in doubt,
        // the rollback keeps it.
        Slot::Corrupt => Ok(Prior::Corrupt),
        Slot::Link => Ok(Prior::Link),
    }
}

/// This attachment's entry at `path`, if any; a corrupt file reads as
/// none and is moved aside when `move_corrupt`.
fn read_entry(
    cache: &ResultCache,
    path: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
    move_corrupt: bool,
) -> Result<Option<CacheEntry>, Error> {
    Ok(
        match read_slot(cache, path, network, container_id, ifname, move_corrupt)? {
            Slot::Ours(entry) => Some(entry),
            Slot::Empty | Slot::Corrupt | Slot::Link | Slot::Theirs(_) => None,
        },
    )
}

fn list_records(
    results: &Path,
    container_id: Option<&str>,
    page: &ListPage,
) -> Result<(Vec<CacheRecord>, Option<String>), Error> {
    let entries = match std::fs::read_dir(results) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), None)),
        Err(e) => return Err(io_err(results, "read directory", e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .filter(|n| page.after.as_deref().is_none_or(|a| n.as_str() > a))
        .filter(|n| container_id.is_none_or(|cid| names_container(n, cid)))
        .collect();
    names.sort();
    let mut names = names.into_iter();
    Ok(page_of(results, container_id, page, |_, n| {
        names.by_ref().take(n).collect()
    }))
}

/// Cheap pre-filter of file names by container, as libcni does; the
/// record's field decides.
fn names_container(name: &str, container_id: &str) -> bool {
    name.contains(&format!("-{container_id}-"))
}

/// A page (see [`ResultCache::list_page`]) of the records named by
/// `names(after, n)`: up to `n` file names sorting after `after` (or from
/// the first), in byte order, already pre-filtered by container; called
/// again after the last name it gave while the page has room, so only
/// about a page's names are ever taken.
fn page_of(
    results: &Path,
    container_id: Option<&str>,
    page: &ListPage,
    mut names: impl FnMut(Option<&str>, usize) -> Vec<String>,
) -> (Vec<CacheRecord>, Option<String>) {
    let chunk = page.limit.clamp(1, 1024).saturating_add(1);
    let mut out = Vec::new();
    let mut page_bytes = 0u64;
    let mut last: Option<String> = None;
    loop {
        let taken = names(last.as_deref().or(page.after.as_deref()), chunk);
        if taken.is_empty() {
            return (out, None);
        }
        for name in taken {
            if out.len() >= page.limit {
                return (out, last);
            }
            let path = results.join(&name);
            if page.max_bytes < u64::MAX {
                let size = std::fs::symlink_metadata(&path).map_or(0, |m| m.len());
                if !out.is_empty() && page_bytes.saturating_add(size) > page.max_bytes {
                    return (out, last);
                }
                page_bytes = page_bytes.saturating_add(size);
            }
            if let Some(rec) = read_listed(results, &name)
                && container_id.is_none_or(|c| c == rec.container_id)
            {
                out.push(rec);
            }
            last = Some(name);
        }
    }
}

/// The record in `results/<name>` when it is a usable `cniCacheV1` record
/// whose fields name that file; unreadable, corrupt and mismatched files
/// are skipped with a warning (not moved: listing changes nothing).
fn read_listed(results: &Path, name: &str) -> Option<CacheRecord> {
    let path = results.join(name);
    let bytes = match read_nofollow(&path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %path.display(), error = %e, "skipping unreadable cache entry");
            }
            return None;
        }
    };
    match CacheEntry::decode(&bytes, &path.display().to_string()) {
        Ok(CacheEntry::Record(rec)) => {
            if rec.if_name.is_empty() || rec.network_name.is_empty() {
                return None;
            }
            // Only records whose file name is the one they would be written to.
            if record::file_name(&rec.network_name, &rec.container_id, &rec.if_name)
                .ok()
                .as_deref()
                != Some(name)
            {
                tracing::warn!(file = %path.display(), "skipping cache entry whose fields do not match its file name");
                return None;
            }
            Some(rec)
        }
        Ok(CacheEntry::LegacyResult(_)) => None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %Chain(&e), "skipping corrupt cache entry");
            None
        }
    }
}

/// An attachment's identity in the cache: (network, container ID, ifname).
pub type AttachmentKey = (String, String, String);

/// Follows the records in `results/` from one call of
/// [`ResultCache::scan_blocking`] to the next, whoever writes them (this
/// process, cnitool, a libcni runtime): each call reads only the files
/// that are new or were replaced since the last one, and reports the
/// attachments whose files went away. It also keeps the file names in
/// byte order, for paging ([`RecordScan::names_after`],
/// [`ResultCache::list_page_from_blocking`]).
///
/// How it finds what changed:
/// - [`RecordScan::default`]: a listing of `results/` at every scan (by
///   file name, inode and change time: a `stat` per file), so a scan costs
///   a listing and a `stat` of every record.
/// - [`RecordScan::watched`] (feature `watch`): an inotify watch on
///   `results/` names the entries changed since the last scan, and a scan
///   looks at those only (a `stat` and a read each), so it costs the
///   number of changes, whatever the number of records; and
///   [`ResultCache::scan_is_current`] tells without leaving the calling
///   thread that there is nothing to read. The dir is listed whole at the
///   first scan and again whenever events may have been lost (queue
///   overflow, `results/` deleted, moved or replaced; every record is
///   then read again) or no watch can be
///   set up (`results/` missing, inotify limits): never fewer records seen
///   than with a listing. Not for a cache on a network file system, where
///   inotify misses other hosts' changes.
///
/// # Caveats
/// A record rewritten in place (libcni writes with `O_TRUNC`, keeping the
/// inode; it does so when the same attachment is added again) is read
/// again: a listing sees its change time move, a watch sees the writer
/// close it. A record read while half written is read again at the next
/// scan after the write ends.
#[derive(Debug, Default)]
pub struct RecordScan {
    seen: std::collections::BTreeMap<std::ffi::OsString, (Stamp, Option<AttachmentKey>)>,
    /// Full listings of `results/` so far.
    listings: u64,
    #[cfg(feature = "watch")]
    watch: Option<watch::ResultsWatch>,
}

impl RecordScan {
    /// A scan that follows `results/` with inotify (see the type's docs).
    #[cfg(feature = "watch")]
    pub fn watched() -> Self {
        RecordScan {
            watch: Some(watch::ResultsWatch::new()),
            ..RecordScan::default()
        }
    }

    /// How many times a scan listed `results/` whole.
    pub fn listings(&self) -> u64 {
        self.listings
    }

    /// Up to `n` file names (in byte order) of the last scan sorting after
    /// `after`, optionally only those that may be `container_id`'s (a
    /// pre-filter on the name; the record's field decides): for
    /// [`ResultCache::list_page_from_blocking`].
    pub fn names_after(
        &self,
        after: Option<&str>,
        container_id: Option<&str>,
        n: usize,
    ) -> Vec<String> {
        use std::ffi::OsStr;
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, |a| Bound::Excluded(OsStr::new(a)));
        self.seen
            .range::<OsStr, _>((from, Bound::Unbounded))
            .filter_map(|(name, _)| name.to_str())
            .filter(|name| container_id.is_none_or(|cid| names_container(name, cid)))
            .take(n)
            .map(str::to_owned)
            .collect()
    }

    /// Looks at `names` in `results` again (a watch reported them).
    #[cfg(feature = "watch")]
    fn reread(
        &mut self,
        results: &Path,
        names: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> ScanChanges {
        let mut changes = ScanChanges::default();
        for name in names {
            if let Some((_, Some(key))) = self.seen.remove(&name) {
                changes.removed.push(key);
            }
            let stamp = match std::fs::symlink_metadata(results.join(&name)) {
                Ok(m) => stamp(&m),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // There, but not for us to read: as a listing would have it.
                Err(_) => (0, 0, 0),
            };
            let rec = name.to_str().and_then(|n| scan_listed(results, n));
            let key = rec.as_ref().map(ScannedRecord::key);
            changes.added.extend(rec);
            self.seen.insert(name, (stamp, key));
        }
        changes
    }
}

/// What tells a record file's contents apart from one scan to the next:
/// its inode and its change time (`ctime`, seconds and nanoseconds). The
/// inode alone misses a record rewritten in place (libcni writes with
/// `O_TRUNC`) and a new record given the inode of one just deleted; the
/// change time moves with every write and cannot be set back.
type Stamp = (u64, i64, i64);

fn stamp(m: &std::fs::Metadata) -> Stamp {
    (m.ino(), m.ctime(), m.ctime_nsec())
}

/// The identity and netns of a record, read without keeping its result
/// (a cached result can be megabytes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ScannedRecord {
    /// `networkName`.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// `containerId`.
    #[serde(rename = "containerId")]
    pub container_id: String,
    /// `ifName`.
    #[serde(rename = "ifName")]
    pub if_name: String,
    /// `netns` (empty when absent).
    #[serde(default)]
    pub netns: String,
    /// `netnsIdentity` ([`record::NetnsIdentity`]; `None` when absent;
    /// one with an empty boot id when there but unreadable: damaged or
    /// forged, which proves nothing either way).
    #[serde(
        default,
        rename = "netnsIdentity",
        deserialize_with = "lenient_identity"
    )]
    pub identity: Option<record::NetnsIdentity>,
}

fn lenient_identity<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<record::NetnsIdentity>, D::Error> {
    use serde::Deserialize as _;
    let v = Option::<serde_json::Value>::deserialize(d)?;
    Ok(match v {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(record::NetnsIdentity::from_value(&v).unwrap_or_default()),
    })
}

impl ScannedRecord {
    fn key(&self) -> AttachmentKey {
        (
            self.network_name.clone(),
            self.container_id.clone(),
            self.if_name.clone(),
        )
    }
}

/// A `cniCacheV1` record in `results/<name>` whose fields name that file,
/// read as a [`ScannedRecord`]; anything else is `None` (the listing and
/// the operations warn about such files).
fn scan_listed(results: &Path, name: &str) -> Option<ScannedRecord> {
    #[derive(serde::Deserialize)]
    struct Kind {
        kind: Option<String>,
    }
    let bytes = read_nofollow(&results.join(name)).ok()?;
    let kind: Kind = serde_json::from_slice(&bytes).ok()?;
    if kind.kind.as_deref() != Some(record::KIND_V1) {
        return None;
    }
    let rec: ScannedRecord = serde_json::from_slice(&bytes).ok()?;
    (record::file_name(&rec.network_name, &rec.container_id, &rec.if_name)
        .ok()
        .as_deref()
        == Some(name))
    .then_some(rec)
}

/// What changed in the cache since the previous scan.
#[derive(Debug, Default)]
pub struct ScanChanges {
    /// Records of files new or replaced since the previous scan.
    pub added: Vec<ScannedRecord>,
    /// Attachments whose record file is gone (or was replaced: its new
    /// record, if usable, is in `added`).
    pub removed: Vec<AttachmentKey>,
}

impl ResultCache {
    /// See [`RecordScan`]. Blocking (a directory listing, or with a live
    /// watch only the entries it reported, plus a read of each new
    /// record).
    pub fn scan_blocking(&self, scan: &mut RecordScan) -> Result<ScanChanges, Error> {
        use std::os::unix::fs::DirEntryExt;
        let results = self.results_dir();
        // After a lost watch every entry is read again: one rewritten in
        // place (or read half written) keeps its inode.
        #[cfg(feature = "watch")]
        let reread_all = match scan.watch.as_mut().map(|w| w.take(&results)) {
            Some(watch::Since::Changed(names)) => return Ok(scan.reread(&results, names)),
            Some(watch::Since::List { reread }) => reread,
            None => false,
        };
        #[cfg(not(feature = "watch"))]
        let reread_all = false;
        scan.listings += 1;
        let entries = match std::fs::read_dir(&results) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let removed = std::mem::take(&mut scan.seen)
                    .into_values()
                    .filter_map(|(_, k)| k)
                    .collect();
                return Ok(ScanChanges {
                    added: Vec::new(),
                    removed,
                });
            }
            Err(e) => return Err(io_err(&results, "read directory", e)),
        };
        let mut changes = ScanChanges::default();
        let mut now = std::collections::BTreeMap::new();
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name.as_encoded_bytes().first() == Some(&b'.') {
                continue;
            }
            // Stat before the read: a write after it moves the change
            // time, and the next scan reads the record again.
            let stamp = match entry.metadata() {
                Ok(m) => stamp(&m),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // There, but not for us to look at: its inode from the
                // listing (a record we cannot read is left out anyway).
                Err(_) => (entry.ino(), 0, 0),
            };
            match scan.seen.remove(&name) {
                Some((old, key)) if old == stamp && !reread_all => {
                    now.insert(name, (stamp, key));
                }
                before => {
                    if let Some((_, Some(key))) = before {
                        changes.removed.push(key);
                    }
                    let rec = name.to_str().and_then(|n| scan_listed(&results, n));
                    let key = rec.as_ref().map(ScannedRecord::key);
                    changes.added.extend(rec);
                    now.insert(name, (stamp, key));
                }
            }
        }
        changes.removed.extend(
            std::mem::take(&mut scan.seen)
                .into_values()
                .filter_map(|(_, k)| k),
        );
        scan.seen = now;
        Ok(changes)
    }

    /// Whether [`ResultCache::scan_blocking`] would find nothing to read:
    /// `scan` has a live watch ([`RecordScan::watched`]) that reported no
    /// change since the last scan. Cheap enough for an async thread (a
    /// `stat` of `results/` and a non-blocking `read`); `false` without a
    /// watch.
    pub fn scan_is_current(&self, scan: &mut RecordScan) -> bool {
        #[cfg(feature = "watch")]
        if let Some(w) = scan.watch.as_mut() {
            return w.is_current(&self.results_dir());
        }
        let _ = scan;
        false
    }

    /// Largest record file [`ResultCache::scan_few`] reads; a bigger one
    /// leaves the scan to [`ResultCache::scan_blocking`]. cnid's own
    /// records are a few KiB.
    pub const SCAN_FEW_MAX_BYTES: u64 = 64 * 1024;

    /// [`ResultCache::scan_blocking`] when the watch makes it a few system
    /// calls, for a caller that would otherwise hand it to the blocking
    /// pool: the watch is live and reports at most `max` names changed
    /// since the last scan (each one a `stat` and a read of one record
    /// file, as cnid's own record writes on its workers are). `None`
    /// (nothing scanned) otherwise: no live watch, or more changes; the
    /// changes then stay for the next [`ResultCache::scan_blocking`]. Also
    /// `None` when one of the changed files is bigger than
    /// [`ResultCache::SCAN_FEW_MAX_BYTES`] (its read would hold the thread).
    ///
    /// A file that grows past the limit between the `stat` and the read is
    /// read whole anyway (a writer racing the scan, rare).
    /// cnid's admissions: a request's own ADD or DEL changes a name or
    /// two, which the next admission's refresh reads here instead of
    /// waiting for a pool thread (issue 25 item 4).
    pub fn scan_few(&self, scan: &mut RecordScan, max: usize) -> Option<ScanChanges> {
        #[cfg(feature = "watch")]
        if let Some(w) = scan.watch.as_mut() {
            let results = self.results_dir();
            let names = w.take_few(&results, max)?;
            // A big file among them (another tool's record with a large
            // result, or anything else dropped into `results/`) is read
            // whole: not on the caller's thread, which may be an async
            // worker. One `stat` each, before any is read.
            let big = |n: &std::ffi::OsString| {
                std::fs::symlink_metadata(results.join(n))
                    .is_ok_and(|m| m.len() > Self::SCAN_FEW_MAX_BYTES)
            };
            if names.iter().any(big) {
                w.give_back(names);
                return None;
            }
            return Some(scan.reread(&results, names));
        }
        let _ = (scan, max);
        None
    }

    /// One page, as [`ResultCache::list_page`] gives it, of the records
    /// named by `names(after, n)`: up to `n` file names sorting after
    /// `after` (from the first when `None`), in byte order, pre-filtered
    /// by container (for example [`RecordScan::names_after`] of a current
    /// scan). `names` is called again after the last name it gave while
    /// the page has room, so a page takes about a page's names, not the
    /// whole cache's: a full paging is linear in the cache's size.
    /// Blocking (the page's records are read).
    pub fn list_page_from_blocking(
        &self,
        container_id: Option<&str>,
        page: &ListPage,
        names: impl FnMut(Option<&str>, usize) -> Vec<String>,
    ) -> (Vec<CacheRecord>, Option<String>) {
        page_of(&self.results_dir(), container_id, page, names)
    }

    /// The cached attachments of containers other than `container_id` on
    /// `netns` with interface `ifname` (any network): reads every record
    /// whose file name ends in `-<ifname>`.
    pub(crate) async fn others_on(
        &self,
        netns: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<Vec<CacheRecord>, Error> {
        let this = self.clone();
        let (netns, ifname, cid) = (netns.to_owned(), ifname.to_owned(), container_id.to_owned());
        blocking(self.inline, move || {
            this.others_on_blocking(&netns, &ifname, &cid)
        })
        .await
    }

    /// [`ResultCache::others_on`], on the calling thread.
    fn others_on_blocking(
        &self,
        netns: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<Vec<CacheRecord>, Error> {
        let results = self.results_dir();
        let entries = match std::fs::read_dir(&results) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&results, "read directory", e)),
        };
        let suffix = format!("-{ifname}");
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.') && n.ends_with(&suffix))
            .filter_map(|n| read_listed(&results, &n))
            .filter(|r| r.netns == netns && r.if_name == ifname && r.container_id != container_id)
            .collect())
    }
}

/// An attachment's lock; released when dropped.
///
/// Dropping it removes the lock file first when the attachment has no
/// record (nothing was added, or it was deleted), while the lock is still
/// held: lockers that opened the old file notice and start over on a fresh
/// one. So the locks dir holds one file per cached attachment at most, not
/// one per attachment ever named by a CHECK or a failed ADD.
#[derive(Debug)]
pub struct AttachmentLock {
    path: PathBuf,
    /// The attachment's record file: the lock file stays while it exists.
    record: PathBuf,
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
    /// exists (after a successful DEL: the attachment is gone, so should its
    /// lock file be). Waiters holding the old file notice and retry on a
    /// fresh one.
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

/// Releases a held lock file's `flock` now, then closes it.
///
/// Closing alone is not enough: `flock` belongs to the open file, and a
/// child forked by any thread of this process (a plugin being spawned)
/// holds a copy of it until the child execs, keeping the lock taken for
/// that moment. `LOCK_UN` releases it for every copy at once.
fn unlock(file: File) {
    if let Err(e) = file.unlock() {
        tracing::debug!(error = %e, "cannot unlock an attachment lock file; closing it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `cniCacheV1` record of `n/<cid>/eth0` in `netns`, with `pad`
    /// bytes of result, written by rename as another tool would.
    #[cfg(feature = "watch")]
    fn put_record(dir: &Path, cid: &str, netns: &str, pad: usize) {
        let results = dir.join(record::RESULTS_DIR);
        std::fs::create_dir_all(&results).unwrap();
        let name = record::file_name("n", cid, "eth0").unwrap();
        let rec = serde_json::json!({
            "kind": record::KIND_V1, "networkName": "n", "containerId": cid,
            "ifName": "eth0", "netns": netns, "result": {"pad": "x".repeat(pad)},
        });
        let tmp = results.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap()).unwrap();
        std::fs::rename(&tmp, results.join(&name)).unwrap();
    }

    /// attack25b: a FIFO (no writer) and a symbolic link to an endless
    /// device, named as records, among the few changes `scan_few` reads on
    /// an async worker: neither is opened for long nor read (the open
    /// does not wait for a writer, the link is not followed), nothing is
    /// added, and the real record beside them is.
    #[cfg(feature = "watch")]
    #[test]
    fn a_fifo_or_a_link_among_few_changes_is_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path());
        put_record(tmp.path(), "c0", "/run/netns/n0", 0);
        let mut scan = RecordScan::watched();
        cache.scan_blocking(&mut scan).unwrap();
        let results = tmp.path().join(record::RESULTS_DIR);
        let fifo = results.join(record::file_name("n", "fifo", "eth0").unwrap());
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let link = results.join(record::file_name("n", "link", "eth0").unwrap());
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        put_record(tmp.path(), "real", "/run/netns/r", 0);
        let few = cache.scan_few(&mut scan, 8).expect("three small changes");
        let got: Vec<_> = few.added.iter().map(|r| r.container_id.as_str()).collect();
        assert_eq!(got, ["real"]);
        assert!(few.removed.is_empty());
    }

    /// attack25b: `scan_few` (which cnid calls on an async worker) read a
    /// changed record whole whatever its size: another tool's record of
    /// megabytes held the worker for the read and parse. A file bigger
    /// than [`ResultCache::SCAN_FEW_MAX_BYTES`] among the changes leaves
    /// them all to `scan_blocking`, which then reads them.
    #[cfg(feature = "watch")]
    #[test]
    fn a_huge_changed_record_is_left_to_the_blocking_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path());
        put_record(tmp.path(), "c0", "/run/netns/n0", 0);
        let mut scan = RecordScan::watched();
        cache.scan_blocking(&mut scan).unwrap();
        put_record(tmp.path(), "small", "/run/netns/s", 0);
        put_record(
            tmp.path(),
            "huge",
            "/run/netns/h",
            ResultCache::SCAN_FEW_MAX_BYTES as usize + 1,
        );
        assert!(
            cache.scan_few(&mut scan, 8).is_none(),
            "a record over the inline limit read on the caller's thread"
        );
        let changes = cache.scan_blocking(&mut scan).unwrap();
        let mut got: Vec<_> = changes
            .added
            .iter()
            .map(|r| r.container_id.as_str())
            .collect();
        got.sort_unstable();
        assert_eq!(got, ["huge", "small"], "the names given back are scanned");
        assert_eq!(scan.listings(), 1, "from the watch, not a listing");
        // Small changes only: read inline again.
        put_record(tmp.path(), "small", "/run/netns/s2", 0);
        let few = cache.scan_few(&mut scan, 8).expect("one small change");
        assert_eq!(few.added.len(), 1);
        assert_eq!(few.added[0].netns, "/run/netns/s2");
    }

    fn lock_at(cache: &ResultCache, path: &Path) -> Option<AttachmentLock> {
        try_lock_once(&Disk, &cache.dir.join(LOCKS_DIR), path)
            .unwrap()
            .map(|file| AttachmentLock {
                path: path.to_owned(),
                record: cache.path("n", "c1", "eth0").unwrap(),
                file: Some(file),
                storage: cache.storage.clone(),
            })
    }

    /// The race, one step at a time: B opens the lock file while A holds
    /// it; A releases it and, the attachment having no record, unlinks it;
    /// C creates a fresh file and locks it. B's `flock` on the old inode now
    /// succeeds, but B must see that it is not the file at the path, and
    /// then finds C holding the real one.
    #[test]
    fn a_locker_on_an_unlinked_file_starts_over() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path()).with_inline_io(true);
        let path = tmp.path().join(LOCKS_DIR).join("n-c1-eth0.lock");

        let a = lock_at(&cache, &path).expect("A locks");
        let b_file = Disk.open_lock(&path).expect("B opens the same file");
        let old = b_file.metadata().unwrap().ino();
        drop(a);
        assert!(!path.exists(), "A left its unused lock file");
        let c = lock_at(&cache, &path).expect("C locks a fresh file");
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), old);

        match lock_opened(b_file, &path).unwrap() {
            Attempt::Stale => {}
            other => panic!("B locked an unlinked file and took it for the lock: {other:?}"),
        }
        assert!(lock_at(&cache, &path).is_none(), "B shares C's lock");
        drop(c);
        let b = lock_at(&cache, &path).expect("B after C");
        assert!(b.path().exists());
    }

    /// Issue 25: the flushes of a durable record write. The first one, which
    /// creates `results/`, also flushes the cache dir (else a power loss can
    /// take `results/` and the record with it) and the cache dir's parent
    /// (issue 21: the cache dir was found, maybe left unflushed by a killed
    /// writer); the next ones flush the record's data and `results/` after
    /// the rename, nothing more.
    #[test]
    fn record_writes_flush_what_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path()).with_inline_io(true);
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let results = cache.results_dir();
        let above = tmp.path().parent().unwrap().display().to_string();
        durable::take_trace();
        cache.write_durable_blocking(&rec).unwrap();
        assert_eq!(
            flushes(tmp.path(), durable::take_trace()),
            [
                "fsync-dir CACHE".to_owned(),
                format!("fsync-dir {above}"),
                "fdatasync CACHE/results/.n-c1-eth0.tmp".to_owned(),
                "fsync-dir CACHE/results".to_owned(),
            ]
        );
        assert!(results.join("n-c1-eth0").is_file());
        cache.write_durable_blocking(&rec).unwrap();
        assert_eq!(
            flushes(tmp.path(), durable::take_trace()),
            [
                "fdatasync CACHE/results/.n-c1-eth0.tmp",
                "fsync-dir CACHE/results",
            ]
        );
    }

    /// The flushes of `trace`, the cache dir `dir` written `CACHE`, temp
    /// files without their unique suffix.
    /// Flushes of the dirs above the temp dir (whether they changed since
    /// the boot depends on the machine) are left out.
    fn flushes(dir: &Path, trace: Vec<String>) -> Vec<String> {
        let tmp = std::env::temp_dir();
        let above_tmp: Vec<String> = tmp
            .ancestors()
            .skip(1)
            .map(|a| format!("fsync-dir {}", a.display()))
            .collect();
        trace
            .into_iter()
            .filter(|s| s.starts_with("fsync") || s.starts_with("fdatasync"))
            .filter(|s| !above_tmp.contains(s))
            .map(|s| s.replace(&dir.display().to_string(), "CACHE"))
            .map(|s| match s.split_once(".tmp-") {
                Some((head, _)) => format!("{head}.tmp"),
                None => s,
            })
            .collect()
    }

    /// Issue 21: a durable write into a `results/` it found (made by a
    /// writer that did not flush it: killed before it did, libcni, a cache
    /// without flushes) trusted it, flushing only `results/` after the
    /// rename: a power loss could take `results/` away with the record.
    /// Now the first write of a cache and its clones makes `results/` and
    /// the cache dir durable in their parents; later ones do not again,
    /// until `results/` is another dir. (The crash-point enumeration's
    /// `a_record_written_into_a_results_dir_a_killed_writer_left_survives_a_power_loss`
    /// shows the loss on the simulated disk.)
    #[test]
    fn a_found_results_dir_is_flushed_into_its_parents_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cache");
        let rt = |cid: &str| cni_core::RuntimeConf::new(cid, "/proc/self/ns/net", "eth0");
        let rec = |cid: &str| CacheRecord::new("n", &rt(cid), b"{}".to_vec(), None);
        let cache = ResultCache::new(&dir).with_inline_io(true);
        // Made by a writer without flushes.
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        let clone = cache.clone();
        let top = tmp.path().display().to_string();
        durable::take_trace();
        cache.write_durable_blocking(&rec("c1")).unwrap();
        assert_eq!(
            flushes(&dir, durable::take_trace()),
            [
                format!("fsync-dir {}", std::env::temp_dir().display()),
                format!("fsync-dir {top}"),
                "fsync-dir CACHE".to_owned(),
                "fdatasync CACHE/results/.n-c1-eth0.tmp".to_owned(),
                "fsync-dir CACHE/results".to_owned(),
            ],
            "the first write into a results/ found there"
        );
        clone.write_durable_blocking(&rec("c2")).unwrap();
        let next = [
            "fdatasync CACHE/results/.n-c2-eth0.tmp",
            "fsync-dir CACHE/results",
        ];
        assert_eq!(flushes(&dir, durable::take_trace()), next, "a clone's");
        // Another cache (another process): once more.
        ResultCache::new(&dir)
            .with_inline_io(true)
            .write_durable_blocking(&rec("c2"))
            .unwrap();
        assert_eq!(flushes(&dir, durable::take_trace()).len(), 5);
        // `results/` made again (by a writer without flushes): once more.
        std::fs::remove_dir_all(cache.results_dir()).unwrap();
        std::fs::create_dir(cache.results_dir()).unwrap();
        cache.write_durable_blocking(&rec("c2")).unwrap();
        assert_eq!(flushes(&dir, durable::take_trace()).len(), 5);
        cache.write_durable_blocking(&rec("c2")).unwrap();
        assert_eq!(flushes(&dir, durable::take_trace()), next);
        // A cache that flushes later does the same once per `results/`.
        let later = ResultCache::new(&dir)
            .with_inline_io(true)
            .with_durable(false);
        for k in 0..2 {
            let path = later.path("n", "c3", "eth0").unwrap();
            std::fs::write(path, rec("c3").encode()).unwrap();
            later.sync_records_blocking([("n", "c3", "eth0")]).unwrap();
            let want = if k == 0 { 5 } else { 2 };
            assert_eq!(flushes(&dir, durable::take_trace()).len(), want, "{k}");
        }
    }

    /// Attack on 88e8009: a file system that keeps no birth time (ext4
    /// with 128-byte inodes, ext2/ext3, NFS) gives a `results/` removed
    /// and made again by another tool the same inode number, so its
    /// identity (device, inode, no birth time) equalled the flushed one's
    /// and the first write into the new, unflushed `results/` flushed only
    /// `results/` itself: a power loss took the dir with the record. On
    /// such a file system a dir is never taken for one flushed before.
    /// (Root: a loop-mounted ext4 of its own, unmounted at the end.)
    #[test]
    fn a_results_dir_made_again_on_a_file_system_without_birth_times_is_flushed_again() {
        let fs = NoBirthTimeFs::mount();
        let dir = fs.dir.path().join("cache");
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let cache = ResultCache::new(&dir).with_inline_io(true);
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        durable::take_trace();
        cache.write_durable_blocking(&rec).unwrap();
        // Not the temp dir the file system is mounted on.
        assert_eq!(flushes(&dir, durable::take_trace()).len(), 4, "found");
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = ino(&cache.results_dir());
        std::fs::remove_dir_all(cache.results_dir()).unwrap();
        std::fs::create_dir(cache.results_dir()).unwrap();
        assert_eq!(
            ino(&cache.results_dir()),
            before,
            "the experiment's premise"
        );
        assert!(
            std::fs::metadata(cache.results_dir())
                .unwrap()
                .created()
                .is_err()
        );
        cache.write_durable_blocking(&rec).unwrap();
        assert_eq!(
            flushes(&dir, durable::take_trace()),
            [
                format!("fsync-dir {}", fs.dir.path().display()),
                "fsync-dir CACHE".to_owned(),
                "fdatasync CACHE/results/.n-c1-eth0.tmp".to_owned(),
                "fsync-dir CACHE/results".to_owned(),
            ],
            "the first write into a results/ made again"
        );
    }

    /// Attack on 88e8009: a killed writer (a `ResultCache` killed between
    /// its `mkdir -p` and the flushes, or a tool that never flushes) made
    /// the cache dir *and its parents*; the next writer flushed `results/`
    /// into the cache dir and the cache dir into its parent, but not the
    /// parent into the grandparent: a power loss took the parent, the
    /// cache dir and the record with them. Every dir above `results/`
    /// changed since the boot must have its entry flushed.
    #[test]
    fn a_cache_dir_whose_parents_a_killed_writer_made_is_flushed_up_to_them() {
        let tmp = tempfile::tempdir().unwrap();
        let trace = first_write_into_found(&tmp.path().join("a/b/cache"));
        for d in [tmp.path().to_owned(), tmp.path().join("a")] {
            let want = format!("fsync-dir {}", d.display());
            assert!(trace.contains(&want), "{want} not in {trace:#?}");
        }
    }

    /// Attack on the walk up of found dirs: a cache dir named through `..`
    /// is walked up by more `..` (`T/a/../cache` → `T/a/..` → `T/a/../..`
    /// …), which never reaches the root by name; where the root changed
    /// since the boot the walk went on for ever (the root's `..` is the
    /// root). It stops at the root, having flushed each dir once.
    #[test]
    fn a_cache_dir_named_through_dot_dot_is_walked_up_to_the_root_once() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("a")).unwrap();
        let trace = first_write_into_found(&tmp.path().join("a/../cache"));
        let dirs = trace.iter().filter(|s| s.starts_with("fsync-dir")).count();
        let depth = tmp.path().join("cache/results").components().count();
        assert!(dirs <= depth, "{trace:#?}");
        assert!(trace.contains(&format!("fsync-dir {}", tmp.path().join("a/..").display())));
    }

    /// The trace of a durable record write into the cache at `dir`, whose
    /// `results/` (and missing parents) a writer without flushes made.
    fn first_write_into_found(dir: &Path) -> Vec<String> {
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let cache = ResultCache::new(dir).with_inline_io(true);
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        durable::take_trace();
        cache.write_durable_blocking(&rec).unwrap();
        durable::take_trace()
    }

    /// A 16 MiB ext4 with 128-byte inodes (no birth times), loop-mounted
    /// on a temp dir; unmounted (lazily) and its image removed on drop.
    struct NoBirthTimeFs {
        dir: tempfile::TempDir,
        _image: tempfile::NamedTempFile,
    }

    impl NoBirthTimeFs {
        fn mount() -> Self {
            let image = tempfile::NamedTempFile::new().unwrap();
            image.as_file().set_len(16 << 20).unwrap();
            let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
                let out = std::process::Command::new(cmd).args(args).output().unwrap();
                assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
            };
            run(
                "mkfs.ext4",
                &[
                    "-q".as_ref(),
                    "-I".as_ref(),
                    "128".as_ref(),
                    image.path().as_os_str(),
                ],
            );
            let dir = tempfile::tempdir().unwrap();
            run(
                "mount",
                &[
                    "-o".as_ref(),
                    "loop".as_ref(),
                    image.path().as_os_str(),
                    dir.path().as_os_str(),
                ],
            );
            NoBirthTimeFs { dir, _image: image }
        }
    }

    impl Drop for NoBirthTimeFs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    /// Found by cnid's crash-point enumeration: a CHECK of an attachment
    /// with no record killed between creating its lock file and removing
    /// it left the file for good (nothing DELs an attachment never
    /// added). The sweep removes such a file; one held, or one whose
    /// attachment has a record, stays.
    #[test]
    fn unused_lock_files_are_swept_held_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path()).with_inline_io(true);
        let locks = tmp.path().join(LOCKS_DIR);
        create_private_dir(&locks).unwrap();
        let orphan = locks.join("n-gone-eth0.lock");
        drop(Disk.open_lock(&orphan).unwrap());
        let held_path = locks.join("n-c1-eth0.lock");
        let held = lock_at(&cache, &held_path).expect("locked");
        let rt = cni_core::RuntimeConf::new("c2", "/proc/self/ns/net", "eth0");
        cache
            .write_durable_blocking(&CacheRecord::new("n", &rt, b"{}".to_vec(), None))
            .unwrap();
        let recorded = locks.join("n-c2-eth0.lock");
        drop(Disk.open_lock(&recorded).unwrap());
        assert_eq!(cache.remove_abandoned(Duration::from_secs(300)).unwrap(), 1);
        assert!(!orphan.exists());
        assert!(held_path.exists() && recorded.exists());
        drop(held);
        assert_eq!(cache.remove_abandoned(Duration::from_secs(300)).unwrap(), 0);
    }

    /// While a record exists, releasing keeps the file: a waiter that
    /// opened it gets the lock on it without starting over.
    #[test]
    fn a_lock_file_with_a_record_is_kept_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(tmp.path()).with_inline_io(true);
        let path = tmp.path().join(LOCKS_DIR).join("n-c1-eth0.lock");
        let record = cache.path("n", "c1", "eth0").unwrap();
        create_private_dir(record.parent().unwrap()).unwrap();
        std::fs::write(&record, b"{}").unwrap();

        let a = lock_at(&cache, &path).expect("A locks");
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
