//! Durable ADD intents: crash safety for attachments half made, and the
//! durability of the ADD results the daemon caches.
//!
//! Before the first plugin of an ADD runs, the daemon appends a `begin`
//! record to `<state dir>/intents/journal` and `fdatasync`s it: one line of
//! JSON holding everything a DEL needs (the configuration list's bytes,
//! self-contained, plugin files inlined, and the runtime parameters) and a
//! sequence number. When the ADD completed, its result is in the cache,
//! written there *without* `fsync` (the daemon's [`ResultCache`] is
//! [`with_durable(false)`](ResultCache::with_durable)), and before the
//! caller is answered a `commit` line follows and is `fdatasync`ed: it ends
//! the `begin` and carries the cache record's exact bytes and this boot's
//! id ([`Intents::commit`]). One flush where the cache's own write takes
//! two (the temp file, then the dir after the rename). Concurrent ADDs
//! share these flushes (`log.rs`, [`Intents::flush_through`]): each
//! record waits for an `fdatasync` that began after its append, one runs
//! at a time and covers every record appended before it began. When the ADD failed
//! and its rollback succeeded, a plain `end` line follows, not flushed.
//! When the rollback failed too, the intent goes to its own file,
//! `<state dir>/intents/<network>:<containerID>:<ifname>.json` (temp file,
//! `fsync`, `rename`, `fsync` of the dir: [`durable::write_atomic`]), before
//! the `end`; that file stays until a DEL of the attachment succeeds.
//!
//! At start ([`Intents::prepare`]) every `begin` without its `end` belongs
//! to an ADD whose caller never got a success: it becomes an intent file
//! (durably, before the journal is emptied), and the daemon DELs each
//! intent file with the configuration it recorded (`prevResult` from the
//! cache when the chain had finished). So a `kill -9` at any point of an
//! ADD leaks no IP and no interface. Commit lines written in another boot
//! put their records back into the cache where a power loss lost them
//! (unless a newer record is there, written since the reboot); those of
//! this boot have their records `fsync`ed (from [`SYNC_FS_AT`] records on,
//! all at once: one `syncfs` of the cache's file system,
//! [`Intents::sync_records`]); then the journal is emptied.
//! While the daemon runs, its flush task ([`Intents::flush_loop`], off the
//! request path) `fsync`s the records of the commit lines and then drops
//! those lines: every 30 s for the lines older than 30 s, and when the
//! journal passed 1 MiB (it is then rewritten with its open records and
//! the newer commit lines). A DEL that succeeded forgets the attachment's
//! commit line (an unflushed `gone` line), and so does a GC's deletion
//! ([`Intents::forget_removed`]). At a graceful exit the records are
//! flushed and the journal removed.
//!
//! A start that cannot restore or flush a record keeps its commit line,
//! and only such lines: the journal is rewritten with them (`end` 0, which
//! ends no `begin`) once the open ADDs are intent files, and until a later
//! start settles them every rewrite copies them and a graceful exit keeps
//! the journal ([`Journal::carried`]). A new run numbers its ADDs past every
//! number the journal held, so no old `end` ends a new `begin`.
//!
//! The daemon writes its cache this way only when the journal outlives it:
//! with the state dir on tmpfs or ramfs and the cache dir not, or without a
//! readable boot id, the cache flushes its own records and an ADD ends with
//! a plain `end` line.
//!
//! What each flush is for: the `begin`'s `fdatasync` makes the record
//! outlive a power loss or kernel crash, after which the plugins' own state
//! (host-local's files in `/var/lib/cni/networks`, written without fsync)
//! may or may not hold the address; a DEL of an attachment that was never
//! made must succeed, so recovery is right either way. The `commit`'s
//! makes the answered ADD's cached result outlive one, as the cache's
//! own flushes do for a library caller. A process crash (`kill -9`, OOM)
//! needs no flush at all: the page cache keeps every write, which is why
//! commit lines of this boot restore nothing (a record missing then was
//! removed by a DEL). The `end`s and the removals are not flushed: a power
//! loss can only bring back a record of an ADD that was answered (a commit
//! line of the last 30 to 60 s whose `gone` line was not written back
//! restores the record of an attachment DELed since), whose containers
//! are gone with the reboot,
//! and the DEL that recovery or the runtime then makes is what the host
//! needs.
//!
//! `:` cannot occur in network names, container IDs or interface names, so
//! unlike the result cache's `<network>-<containerID>-<ifname>`, these names
//! never collide, and `<network>:` picks exactly one network's intents.
//!
//! # Caveats
//! A crash during an append tears at most the last line (its ADD ran no
//! plugin yet), which is skipped: `log` and `record` keep this. Intent
//! files, their temp files and what a GC may touch of them: `files`.
//!
//! # Rooms
//! Behind the [`Intents`] front (`begin`, `commit`, `finish`, `keep`,
//! `remove`, `close`), four modules, each stating the invariants it keeps:
//! `record` (the line format), `log` (appends, compaction, the flush
//! task), `files` (the intent files) and `recover` (start-up recovery).
//! Their writes, flushes, truncations, renames and removals go through
//! one seam, [`Storage`] (`cni_async::daemon::Storage`, the result cache's too);
//! the tests in `tests/` fail each I/O point of an ADD and of recovery
//! in turn (`io_failures.rs`) and crash every operation at each of them,
//! the cache's included (`crash_points.rs`), on the simulated disk
//! (`sim_disk.rs`).

mod files;
mod log;
mod record;
mod recover;

pub(crate) use files::IntentFile;
use log::*;
pub(crate) use record::Intent;
use record::*;
use recover::*;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::daemon::lock;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cni_async::cache::ResultCache;
use cni_async::daemon::durable;
use cni_async::daemon::{Disk, Storage};
use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::{CapabilityArgs, CniArgs, RuntimeConf, validate};
use serde_json::{Map, Value, json};

/// Subdirectory of the state dir.
pub(crate) const INTENTS_DIR: &str = "intents";
/// The journal of ADDs in progress, in the intents dir.
pub(crate) const JOURNAL: &str = "journal";
/// From how many records to flush the start and a graceful exit use one
/// `syncfs` of the cache's file system instead of an `fsync` per record
/// ([`Intents::sync_records`]). An `fsync` is a flush of the device
/// (1–4 ms each on this project's virtual disk: 10,000 records took 9 to
/// 40 s); a `syncfs` flushes everything dirty on the file system, other
/// programs' data too, and waits for it: worth it from a few dozen
/// records on, not for the handful a restart usually finds
/// (`BENCHMARKS.md`, "Node scale: 10,000 attachments").
pub(crate) const SYNC_FS_AT: usize = 64;

/// The intents dir.
#[derive(Debug, Clone)]
pub(crate) struct Intents {
    dir: PathBuf,
    journal: Arc<Mutex<Journal>>,
    /// The result cache whose records [`Intents::commit`] makes durable
    /// (the daemon's, written without `fsync`); `None` in tests of the
    /// journal alone.
    cache: Option<ResultCache>,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`), written into
    /// each commit record: a record from another boot means the machine
    /// went down, and the page cache with it.
    boot: Arc<str>,
    /// Whether the cache is written without `fsync` and commit lines carry
    /// its records ([`Intents::with_cache`]); otherwise an ADD ends with a
    /// plain `end` line, the cache flushing its own records.
    deferred: bool,
    /// Every write, flush, truncation, rename and removal of the journal
    /// and the intent files ([`Storage`]; [`Disk`] but in tests).
    storage: Arc<dyn Storage>,
    /// Signalled, with the journal's lock, when a shared flush ends
    /// ([`Intents::flush_through`]).
    flushed: Arc<std::sync::Condvar>,
    /// Wakes [`Intents::flush_loop`] when the journal is due for a
    /// compaction that has commit lines to flush (off the request path).
    wake: Arc<tokio::sync::Notify>,
    /// From how many records on the start and a graceful exit flush them
    /// in one `syncfs` ([`Intents::sync_records`]; [`SYNC_FS_AT`]).
    sync_fs_at: usize,
    /// The attachments whose records compactions flushed, in order, and
    /// how many record files those flushes `fsync`ed.
    #[cfg(test)]
    synced: Arc<Mutex<(Vec<String>, usize)>>,
}

/// What [`Intents::begin`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BeginAnswer {
    /// Recorded: run the plugins, then [`Intents::commit`] or
    /// [`Intents::finish`].
    Recorded(Pending),
    /// The attachment has a cached result: it exists.
    Cached,
    /// The attachment has an intent: an ADD in progress, or one that
    /// failed and was not undone.
    Open,
}

#[cfg(test)]
impl BeginAnswer {
    /// The record, when one was made.
    fn pending(self) -> Option<Pending> {
        match self {
            BeginAnswer::Recorded(p) => Some(p),
            BeginAnswer::Cached | BeginAnswer::Open => None,
        }
    }
}

/// Why [`Intents::begin`] could not record.
#[derive(Debug)]
pub(crate) enum BeginError {
    /// Reading the attachment's cached result failed.
    Cache(cni_async::Error),
    /// Appending to or flushing the journal failed.
    Journal(io::Error),
}

/// An ADD recorded in the journal ([`Intents::begin`]), to be ended with
/// [`Intents::finish`] or [`Intents::keep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending(u64);

/// This boot's id; empty when it cannot be read.
fn boot_id() -> String {
    cni_async::daemon::boot_id().unwrap_or_default().to_owned()
}

fn key(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{network}:{container_id}:{ifname}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn ctx(path: &Path, op: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(format!("blocking task failed: {e}"))))
}

impl Intents {
    /// The intents dir under `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> Self {
        Intents {
            dir: state_dir.join(INTENTS_DIR),
            journal: Arc::new(Mutex::new(Journal {
                file: None,
                len: 0,
                next_seq: 1,
                open: HashMap::new(),
                compact_at: COMPACT_AT,
                kept: 0,
                committed: Default::default(),
                next_commit: 0,
                compacting: false,
                carried: Vec::new(),
                flush: GroupFlush::default(),
            })),
            flushed: Arc::new(std::sync::Condvar::new()),
            cache: None,
            deferred: false,
            boot: boot_id().into(),
            storage: Arc::new(Disk),
            wake: Arc::new(tokio::sync::Notify::new()),
            sync_fs_at: SYNC_FS_AT,
            #[cfg(test)]
            synced: Arc::default(),
        }
    }

    #[cfg(test)]
    fn with_storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The daemon's result cache: [`Intents::begin`] checks it. With
    /// `deferred`, the cache is written without `fsync`, commit lines
    /// carry its records, [`Intents::prepare`] restores them after a reboot
    /// and compactions flush them.
    pub(crate) fn with_cache(mut self, cache: ResultCache, deferred: bool) -> Self {
        self.cache = Some(cache);
        self.deferred = deferred;
        self
    }

    /// Whether this boot's id could be read: without it, a restart cannot
    /// tell a reboot from a process crash, and the cache must flush its own
    /// records.
    pub(crate) fn knows_boot(&self) -> bool {
        !self.boot.is_empty()
    }

    #[cfg(test)]
    fn with_boot_id(mut self, boot: &str) -> Self {
        self.boot = boot.into();
        self
    }

    /// Flushes `n` records or more in one `syncfs` (tests: the batched
    /// flush on a handful of records).
    #[cfg(test)]
    fn with_sync_fs_at(mut self, n: usize) -> Self {
        self.sync_fs_at = n;
        self
    }

    /// Makes the records of these attachments durable before their
    /// commit lines are forgotten, at the start and at a graceful exit:
    /// file by file (`fsync` each, then the dirs), or, from
    /// [`SYNC_FS_AT`] records on, all in one `syncfs` of the cache's file
    /// system, then the same dirs
    /// ([`ResultCache::sync_records_at_once_blocking`]). Either way every
    /// record named is durable when it returns `Ok`. Blocking.
    pub(super) fn sync_records<'a>(
        &self,
        cache: &ResultCache,
        attachments: impl ExactSizeIterator<Item = (&'a str, &'a str, &'a str)> + Clone,
    ) -> Result<(), cni_async::Error> {
        if attachments.len() >= self.sync_fs_at {
            cache.sync_records_at_once_blocking(attachments).map(drop)
        } else {
            cache.sync_records_blocking(attachments).map(drop)
        }
    }

    #[cfg(test)]
    fn with_compact_at(self, bytes: u64) -> Self {
        lock(&self.journal).compact_at = bytes;
        self
    }

    /// Records an ADD before its first plugin runs: one line appended to
    /// the journal and `fdatasync`ed (the journal's dir entry was made
    /// durable when it was created). Cheaper than an intent file per ADD
    /// (temp file, fsync, rename, fsync of the dir) by one flush and three
    /// metadata operations. `Ok(None)`, recording nothing, when the
    /// attachment has an intent already (an ADD not undone, in its file,
    /// or one in progress): checked in the same hop to the blocking pool.
    ///
    /// With a cache ([`Intents::with_cache`]), an attachment whose result is
    /// cached is refused first ([`BeginAnswer::Cached`]), in the same hop.
    pub(crate) async fn begin(&self, intent: &Intent) -> Result<BeginAnswer, BeginError> {
        let k = key(&intent.network, &intent.rt.container_id, &intent.rt.ifname);
        let this = self.clone();
        let intent = intent.clone();
        let task = tokio::task::spawn_blocking(move || {
            let (net, cid, ifname) = (
                intent.network.as_str(),
                intent.rt.container_id.as_str(),
                intent.rt.ifname.as_str(),
            );
            if let Some(cache) = &this.cache {
                // A corrupt record stays in place for the ADD's lock step,
                // which counts it as an attachment its rollback must keep.
                match cache.read_in_place_blocking(net, cid, ifname) {
                    Ok(Some(_)) => return Ok(BeginAnswer::Cached),
                    Ok(None) => {}
                    Err(e) => return Err(BeginError::Cache(e)),
                }
            }
            if std::fs::symlink_metadata(this.path(net, cid, ifname)).is_ok() {
                return Ok(BeginAnswer::Open);
            }
            let (seq, ticket) = {
                let mut j = lock(&this.journal);
                if j.open.values().any(|(open, _)| *open == k) {
                    return Ok(BeginAnswer::Open);
                }
                let file = this.journal_file(&mut j).map_err(BeginError::Journal)?;
                let seq = j.next_seq;
                j.next_seq += 1;
                let line = begin_line(seq, &intent);
                this.append(&mut j, &file, &line)
                    .map_err(BeginError::Journal)?;
                j.open.insert(seq, (k, line));
                (seq, Intents::ticket(&j))
            };
            // Outside the lock, shared with the records of concurrent
            // ADDs (`flush_through`). A compaction meanwhile copies this
            // record into its durable rewrite, so it is durable either way.
            if let Err(e) = this.flush_through(&ticket) {
                // No plugin runs: the record is ended, in the file too (not
                // flushed, as any `end`), so that a later flush that makes
                // the `begin` durable makes its end durable with it (else
                // the next start would DEL an attachment never made).
                let mut j = lock(&this.journal);
                let _ = this.end_open(&mut j, seq);
                return Err(BeginError::Journal(e));
            }
            Ok(BeginAnswer::Recorded(Pending(seq)))
        });
        task.await.unwrap_or_else(|e| {
            Err(BeginError::Journal(io::Error::other(format!(
                "blocking task failed: {e}"
            ))))
        })
    }

    /// Ends a completed ADD whose result the cache holds, written without
    /// `fsync`: a commit line carrying that record (`rec`, the bytes the
    /// cache file holds) is appended and `fdatasync`ed, on the blocking
    /// pool. One flush instead of the cache's two (temp file, dir), and
    /// what makes the record outlive a power loss: after a reboot,
    /// [`Intents::prepare`] puts it back. A compaction forgets commit lines
    /// only after an `fsync` of their records, in [`Intents::flush_loop`],
    /// never on the request path. On an error the ADD is off the open set
    /// (as with [`Intents::finish`]), and the caller must undo it.
    pub(crate) async fn commit(&self, pending: Pending, rec: &CacheRecord) -> io::Result<()> {
        if !self.deferred {
            return self.finish(pending).await;
        }
        let line = commit_line(pending.0, &self.boot, &rec.encode());
        let attachment = [
            rec.network_name.clone(),
            rec.container_id.clone(),
            rec.if_name.clone(),
        ];
        let this = self.clone();
        blocking(move || {
            let k = key(&attachment[0], &attachment[1], &attachment[2]);
            let (ticket, due_now, n) = {
                let mut j = lock(&this.journal);
                j.open.remove(&pending.0);
                let file = this.journal_file(&mut j)?;
                this.append(&mut j, &file, &line)?;
                // This line stands for the attachment from now on.
                j.carried.retain(|c| c.key() != k);
                let n = j.next_commit;
                j.next_commit += 1;
                j.committed.insert(
                    n,
                    Committed {
                        attachment,
                        line,
                        at: tokio::time::Instant::now(),
                    },
                );
                (Intents::ticket(&j), due(&j), n)
            };
            // Outside the lock and shared, as in `begin`: a rewrite
            // meanwhile copies the line durably.
            if let Err(e) = this.flush_through(&ticket) {
                // The caller undoes the ADD: the line stands for nothing.
                // Off the kept lines (a rewrite would copy it durably),
                // and a `gone` line after it in the file, so that a later
                // flush that makes it durable makes its end durable too
                // (else a reboot would restore the record of an ADD
                // answered as failed, refusing the attachment's next ADD).
                let mut j = lock(&this.journal);
                j.committed.remove(&n);
                if let Ok(file) = this.journal_file(&mut j) {
                    let _ = this.append(&mut j, &file, &gone_line(&k));
                }
                return Err(e);
            }
            if due_now {
                this.wake.notify_one();
            }
            Ok(())
        })
        .await
    }

    /// Ends a recorded ADD (completed and cached, or rolled back): an `end`
    /// line, not flushed (see the module docs), written on the calling
    /// thread (a short append to the page cache; only a compaction, which
    /// flushes, goes to the blocking pool). The ADD is off the open set even
    /// when the append fails: its `begin` then only costs a repeat DEL at
    /// the next start.
    pub(crate) async fn finish(&self, pending: Pending) -> io::Result<()> {
        {
            let mut j = lock(&self.journal);
            self.end_open(&mut j, pending.0)?;
            if !due(&j) {
                return Ok(());
            }
            if !j.committed.is_empty() {
                // Commit lines to flush first: the flush loop's work.
                self.wake.notify_one();
                return Ok(());
            }
        }
        let this = self.clone();
        blocking(move || this.compact_if_due()).await
    }

    /// Takes ADD `seq` off the open set and appends its `end` line (not
    /// flushed), under the caller's hold of the lock. Off the open set
    /// even when the append fails.
    fn end_open(&self, j: &mut Journal, seq: u64) -> io::Result<()> {
        j.open.remove(&seq);
        let file = self.journal_file(j)?;
        self.append(j, &file, &end_line(seq))
    }

    /// At a graceful exit, once every operation finished: removes the
    /// journal when it holds no open ADD, so that a stopped cnid leaves only
    /// what the next start needs. With open records (not expected after a
    /// drain), or commit lines carried from the start ([`Journal::carried`]:
    /// records still to restore), it stays for the next start.
    pub(crate) fn close(&self) {
        let mut j = lock(&self.journal);
        if !j.open.is_empty() {
            return;
        }
        if !j.committed.is_empty()
            && let Some(cache) = &self.cache
        {
            // The records the commit lines stand for must be on disk before
            // the lines go (at most those of the last minute or so).
            let synced = self.sync_records(cache, j.committed.values().map(Committed::names));
            if let Err(e) = synced {
                tracing::warn!(error = %cni_core::error::Chain(&e), "cannot flush the cached ADD results at exit; the ADD journal stays for the next start");
                return;
            }
            j.committed.clear();
        }
        if !j.carried.is_empty() {
            tracing::warn!(
                count = j.carried.len(),
                "cached ADD results not restored yet; the ADD journal stays for the next start"
            );
            return;
        }
        j.file = None;
        j.len = 0;
        let path = self.dir.join(JOURNAL);
        match self.storage.remove(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove the ADD journal at exit")
            }
        }
    }

    /// An ADD that failed and could not be rolled back: its intent file is
    /// written (durably) before the journal's record is ended, so the
    /// attachment stays recorded until a DEL succeeds. When the file cannot
    /// be written, the journal record stays open: the next start turns it
    /// into the file.
    pub(crate) async fn keep(&self, pending: Pending, intent: &Intent) -> io::Result<()> {
        self.write(intent).await?;
        self.finish(pending).await
    }

    /// Removes an attachment's intent (not `fsync`ed, see the module docs);
    /// `Ok(false)` when there was none.
    ///
    /// Called after every DEL that succeeded (a GC's deletions:
    /// [`Intents::forget_removed`]): the attachment's commit
    /// lines are forgotten too, with a `gone` line (not flushed), so that a
    /// restart after a power loss restores its record only if that line
    /// did not reach the disk (as with the cache's own removal). A line
    /// that cannot be written (a full disk) leaves the commit line known,
    /// for the flush task to drop within a minute.
    pub(crate) async fn remove(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> io::Result<bool> {
        let path = self.path(network, container_id, ifname);
        let k = key(network, container_id, ifname);
        let this = self.clone();
        blocking(move || {
            {
                let mut j = lock(&this.journal);
                let has = j.committed.values().any(|c| {
                    let (n, c, i) = c.names();
                    key(n, c, i) == k
                }) || j.carried.iter().any(|c| c.key() == k);
                if has {
                    // Forgotten only once the `gone` line is written: else
                    // the flush task drops the commit line within a minute,
                    // as any other (it would stay until the next compaction).
                    let file = this.journal_file(&mut j)?;
                    this.append(&mut j, &file, &gone_line(&k))?;
                    j.committed.retain(|_, c| {
                        let (n, c, i) = c.names();
                        key(n, c, i) != k
                    });
                    j.carried.retain(|c| c.key() != k);
                }
            }
            match this.storage.remove(&path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(ctx(&path, "remove", e)),
            }
        })
        .await
    }

    /// After a GC of `network`, under its exclusive gate (no ADD or DEL of
    /// it runs): forgets, as [`Intents::remove`] does after a DEL, the
    /// commit lines of its attachments whose cache record is gone (the
    /// GC deleted them, even when it then failed), with a `gone` line
    /// each. Without it a restart after a power loss would bring such a
    /// record back, and the record would refuse the attachment's next ADD.
    /// Returns how many were forgotten.
    pub(crate) async fn forget_removed(&self, network: &str) -> io::Result<usize> {
        let Some(cache) = self.cache.clone() else {
            return Ok(0);
        };
        let this = self.clone();
        let network = network.to_owned();
        blocking(move || {
            let removed = |[n, c, i]: &[String; 3]| {
                *n == network
                    && cache.path(n, c, i).is_ok_and(|p| {
                        std::fs::symlink_metadata(p)
                            .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
                    })
            };
            let mut j = lock(&this.journal);
            let mut gone: Vec<String> = j
                .committed
                .values()
                .map(|c| &c.attachment)
                .chain(j.carried.iter().map(|c| &c.attachment))
                .filter(|a| removed(a))
                .map(|[n, c, i]| key(n, c, i))
                .collect();
            gone.sort();
            gone.dedup();
            if gone.is_empty() {
                return Ok(0);
            }
            let file = this.journal_file(&mut j)?;
            for k in &gone {
                // Forgotten once its `gone` line is written (as in `remove`).
                this.append(&mut j, &file, &gone_line(k))?;
                j.committed.retain(|_, c| {
                    let (n, c, i) = c.names();
                    key(n, c, i) != *k
                });
                j.carried.retain(|c| c.key() != *k);
            }
            Ok(gone.len())
        })
        .await
    }
}

/// The tests' shared set-ups: journals, caches and ADDs as the engine makes them.
#[cfg(test)]
pub(super) mod testing {
    use super::tests::sim_disk::SimDisk;
    use super::*;

    pub(crate) fn open_names(dir: &Path) -> Vec<String> {
        let bytes = std::fs::read(dir.join(INTENTS_DIR).join(JOURNAL)).unwrap_or_default();
        open_records(&bytes)
            .into_iter()
            .map(|(_, i)| {
                let i = i.unwrap();
                key(&i.network, &i.rt.container_id, &i.rt.ifname)
            })
            .collect()
    }

    /// Begins an ADD of `rt` on network `n`; it must be recorded.
    pub(crate) async fn open_add(intents: &Intents, rt: &RuntimeConf, config: Vec<u8>) -> Pending {
        intents
            .begin(&Intent::new("n", rt, config))
            .await
            .unwrap()
            .pending()
            .expect("recorded")
    }

    /// The daemon's cache: no fsync of its own (the commit lines stand for it).
    pub(crate) fn cache_in(dir: &Path) -> ResultCache {
        ResultCache::new(dir.join("cache")).with_durable(false)
    }

    /// A journal over the daemon's kind of cache in `dir`, in boot `boot`,
    /// prepared (as at a start: a second call on the same dir is a restart).
    pub(crate) fn deferred(dir: &Path, boot: &str) -> (ResultCache, PathBuf, Intents) {
        let cache = cache_in(dir);
        let intents = Intents::new(dir)
            .with_cache(cache.clone(), true)
            .with_boot_id(boot);
        intents.prepare().unwrap();
        (cache, dir.join(INTENTS_DIR).join(JOURNAL), intents)
    }

    /// One ADD through the journal as the engine makes it: begin, the
    /// cache write (not flushed), commit with the same record.
    pub(crate) async fn committed_add(
        intents: &Intents,
        cache: &ResultCache,
        cid: &str,
    ) -> CacheRecord {
        let rt = RuntimeConf::new(cid, "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
        let p = intents.begin(&i).await.unwrap().pending().unwrap();
        let rec = CacheRecord::new(
            "n",
            &rt,
            i.config.clone(),
            Some(json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]})),
        );
        cache.write(&rec).await.unwrap();
        intents.commit(p, &rec).await.unwrap();
        rec
    }

    /// Makes the restore of `n:<cid>:eth0`'s record fail: a non-empty dir
    /// where the file goes (no rename replaces it), as a full cache file
    /// system or a planted file makes it fail; returns a guard that
    /// removes it (the space freed).
    pub(crate) fn block_restore(cache: &ResultCache, cid: &str) -> impl FnOnce() + use<> {
        let path = cache.path("n", cid, "eth0").unwrap();
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(path.join("blocker")).unwrap();
        move || std::fs::remove_dir_all(&path).unwrap()
    }

    /// Marks every commit line of the journal with boot `boot`: the
    /// journal as a restart after a reboot finds it.
    pub(crate) fn as_if_committed_in(journal: &Path, from: &str, boot: &str) {
        let text = std::fs::read_to_string(journal).unwrap();
        std::fs::write(journal, text.replace(from, boot)).unwrap();
    }

    /// The daemon's journal and cache over `dir`, both on the simulated disk.
    pub(crate) fn on_sim(dir: &Path, boot: &str, sim: &Arc<SimDisk>) -> Intents {
        Intents::new(dir)
            .with_cache(cache_in(dir).with_storage(sim.clone()), true)
            .with_boot_id(boot)
            .with_storage(sim.clone())
    }

    /// The pid of a dead writer: past any `pid_max`.
    pub(crate) const DEAD_PID: u32 = i32::MAX as u32 - 1;

    /// The process that crashed is gone, and [`ABANDONED_AFTER`] passes: its
    /// temp files in the cache's `results/` become those of a dead writer,
    /// dated long ago (all the next sweep looks at: the writer's pid in the
    /// name, the file's age). The test's own pid stands for the dead
    /// daemon's.
    pub(crate) fn abandon_cache_temps(dir: &Path) {
        let results = cache_in(dir).results_dir();
        let ours = format!(".tmp-{}-", std::process::id());
        for e in std::fs::read_dir(&results).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((head, n)) = name.split_once(&ours) else {
                continue;
            };
            let to = results.join(format!("{head}.tmp-{DEAD_PID}-{n}"));
            std::fs::rename(e.path(), &to).unwrap();
            File::options()
                .write(true)
                .open(&to)
                .unwrap()
                .set_modified(SystemTime::UNIX_EPOCH)
                .unwrap();
        }
    }

    /// Waits (real time, up to 30 s) until `cond` holds, letting the
    /// runtime's other tasks run: the flush loop's work runs on a pool
    /// thread, and the loop itself on this (paused-clock) runtime.
    pub(crate) async fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "{what}"
            );
            tokio::task::yield_now().await;
        }
    }
}

/// The front's tests; in `tests/`, the simulated disk and the tests
/// that fail or crash the journal's and the cache's I/O on it.
#[cfg(test)]
mod tests {
    mod crash_points;
    mod io_failures;
    mod shared_flush;
    pub(super) mod sim_disk;

    use super::*;
    use testing::*;

    /// A graceful exit removes the journal when nothing is open, and keeps
    /// it (for the next start) while an ADD is.
    #[tokio::test]
    async fn close_removes_the_journal_only_when_nothing_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let p = open_add(&intents, &rt, b"{}".to_vec()).await;
        intents.close();
        assert!(journal.exists(), "an open ADD keeps the journal");
        intents.finish(p).await.unwrap();
        intents.close();
        assert!(!journal.exists(), "nothing open: removed");
        // And the daemon may go on: the next ADD opens a new journal.
        let p = open_add(&intents, &rt, b"{}".to_vec()).await;
        assert!(journal.exists());
        assert_eq!(open_names(dir.path()), ["n:c-1:eth0"]);
        intents.finish(p).await.unwrap();
    }

    /// An attachment with an ADD in progress, or one not undone (its
    /// file), gets no second record: the caller answers 409.
    #[tokio::test]
    async fn begin_refuses_an_attachment_with_an_intent() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, b"{}".to_vec());
        let p = intents
            .begin(&i)
            .await
            .unwrap()
            .pending()
            .expect("recorded");
        assert_eq!(
            intents.begin(&i).await.unwrap().pending(),
            None,
            "in progress"
        );
        intents.keep(p, &i).await.unwrap();
        assert_eq!(
            intents.begin(&i).await.unwrap().pending(),
            None,
            "kept in its file"
        );
        assert!(intents.remove("n", "c-1", "eth0").await.unwrap());
        assert!(intents.begin(&i).await.unwrap().pending().is_some());
    }

    /// A failed rollback keeps the intent in its own file (GC and DEL find
    /// it there), and the journal record is ended.
    #[tokio::test]
    async fn keep_moves_the_intent_to_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, b"{}".to_vec());
        let p = intents.begin(&i).await.unwrap().pending().unwrap();
        intents.keep(p, &i).await.unwrap();
        assert!(open_names(dir.path()).is_empty());
        assert_eq!(intents.of_network("n").await.len(), 1);
        assert!(intents.exists("n", "c-1", "eth0").await);
    }

    /// An attachment whose result is cached is refused before anything is
    /// recorded.
    #[tokio::test]
    async fn begin_refuses_a_cached_attachment() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(dir.path());
        let intents = Intents::new(dir.path()).with_cache(cache.clone(), true);
        intents.prepare().unwrap();
        committed_add(&intents, &cache, "c-1").await;
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        assert_eq!(
            intents
                .begin(&Intent::new("n", &rt, b"{}".to_vec()))
                .await
                .unwrap(),
            BeginAnswer::Cached
        );
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert!(matches!(
            intents
                .begin(&Intent::new("n", &rt, b"{}".to_vec()))
                .await
                .unwrap(),
            BeginAnswer::Recorded(_)
        ));
    }

    /// A DEL after the ADD forgets its commit line (a `gone` line): a
    /// restart after a reboot does not bring the record back, unless that
    /// line was lost too.
    #[tokio::test]
    async fn a_del_forgets_the_commit_line() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        let with_both = std::fs::read(&journal).unwrap();
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert!(
            !intents.remove("n", "c-1", "eth0").await.unwrap(),
            "no intent file"
        );
        let bytes = std::fs::read(&journal).unwrap();
        let left: Vec<String> = committed_records(&bytes)
            .into_iter()
            .map(|(_, r, _)| r.container_id)
            .collect();
        assert_eq!(left, ["c-2"]);
        assert_eq!(intents.journal.lock().unwrap().committed.len(), 1);

        // After a reboot that kept the gone line: c-1 stays deleted.
        std::fs::remove_file(cache.path("n", "c-2", "eth0").unwrap()).unwrap();
        deferred(dir.path(), "boot-b");
        assert!(!cache.path("n", "c-1", "eth0").unwrap().exists());
        assert!(cache.path("n", "c-2", "eth0").unwrap().exists(), "restored");

        // One that lost it: c-1 comes back (a repeat DEL's worth).
        cache.remove("n", "c-1", "eth0").await.unwrap();
        std::fs::write(&journal, &with_both).unwrap();
        deferred(dir.path(), "boot-c");
        assert!(cache.path("n", "c-1", "eth0").unwrap().exists());
    }

    /// Found by the crash-point enumeration (`tests/crash_points.rs`): a DEL whose
    /// `gone` line could not be appended (a full state file system)
    /// forgot the commit line in memory only; the journal kept it until
    /// its next compaction, which an idle daemon never makes, and any power
    /// loss until then brought the deleted record back. Now the commit line
    /// stays known, and the flush task drops it within a minute, as any
    /// other.
    #[tokio::test(start_paused = true)]
    async fn a_gone_line_not_written_leaves_the_commit_line_to_the_flush_task() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        cache.remove("n", "c-1", "eth0").await.unwrap();
        let sim = Arc::new(sim_disk::SimDisk::new(dir.path()).fail_at(0));
        let full = intents.clone().with_storage(sim.clone());
        assert!(full.remove("n", "c-1", "eth0").await.is_err(), "ENOSPC");
        assert_eq!(sim.calls()[0].kind, "write");
        tokio::time::advance(log::FLUSH_EVERY).await;
        full.flush_old_commits().unwrap();
        assert!(
            committed_records(&std::fs::read(&journal).unwrap()).is_empty(),
            "the deleted record's commit line stays in the journal"
        );
        // And a reboot does not bring the record back.
        drop((intents, full));
        deferred(dir.path(), "boot-b");
        assert!(!cache.path("n", "c-1", "eth0").unwrap().exists());
    }

    /// Without `deferred` (the cache flushes its own records), an ADD ends
    /// with a plain `end` line and the journal carries no record.
    #[tokio::test]
    async fn without_deferral_the_journal_carries_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(dir.path().join("cache"));
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path()).with_cache(cache.clone(), false);
        intents.prepare().unwrap();
        committed_add(&intents, &cache, "c-1").await;
        let bytes = std::fs::read(&journal).unwrap();
        assert!(committed_records(&bytes).is_empty());
        assert!(open_names(dir.path()).is_empty());
        assert!(intents.journal.lock().unwrap().committed.is_empty());
    }

    /// A GC's deletions are forgotten as a DEL's are (a GC once wrote
    /// no `gone` lines; here at the journal's level; `daemon_commit.rs` pins it through GC):
    /// only the network's attachments whose record is gone.
    #[tokio::test]
    async fn forget_removed_writes_gone_lines_for_deleted_records_only() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert_eq!(intents.forget_removed("other").await.unwrap(), 0);
        assert_eq!(intents.forget_removed("n").await.unwrap(), 1);
        assert_eq!(intents.forget_removed("n").await.unwrap(), 0);
        let left: Vec<String> = committed_records(&std::fs::read(&journal).unwrap())
            .into_iter()
            .map(|(_, r, _)| r.container_id)
            .collect();
        assert_eq!(left, ["c-2"]);
    }
}
