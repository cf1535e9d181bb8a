//! The journal as a log: appends, flushes, compaction and the flush task.
//!
//! Invariants kept here, under the [`Journal`]'s lock: an append is one
//! `write` with `O_APPEND` and a failed one is cut off again ([`Intents`]'s
//! `append`), so records never interleave and no torn line swallows later
//! ones; a rewrite ([`Intents`]'s `compact`) is atomic and durable and
//! holds, in this order, the lines carried from the start
//! ([`Journal::carried`]), the open `begin`s and the commit lines whose
//! records are not known flushed; a commit line leaves the journal only
//! after an `fsync` of its record (`compact_when`); the journal is emptied
//! unflushed only when it holds none of those three kinds.
//!
//! Flushes are shared ([`Intents::flush_through`], group commit): a record
//! that must be durable (a `begin`, a `commit`) takes a [`Ticket`] for the
//! batch of records appended since the running flush began, in the same
//! hold of the lock as its append; one `fdatasync` at a time runs, and
//! each takes the whole open batch. A waiter is released only with the
//! outcome of the flush that took its batch, which began after its
//! append returned: `Ok` only when that `fdatasync` succeeded, an error
//! for every record of the batch when it failed (a later flush that
//! succeeds does not answer for them: a failed write-back may have left
//! their pages clean and nowhere on disk). A rewrite meanwhile copies the
//! open `begin`s and the commit lines durably, so a flush of the file it
//! replaced still answers for them truly.

use super::*;

/// Past this size the journal is rewritten with only its open records.
pub(super) const COMPACT_AT: u64 = 1 << 20;

/// Commit lines older than this are dropped after a flush of the cache:
/// about the kernel's own write-back delay (`dirty_expire_centisecs`,
/// 30 s by default).
pub(super) const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The journal's file and the ADDs it holds open.
#[derive(Debug)]
pub(super) struct Journal {
    /// Opened for appending (at the first record after start).
    pub(super) file: Option<Arc<File>>,
    /// Bytes appended since it was last emptied or rewritten.
    pub(super) len: u64,
    pub(super) next_seq: u64,
    /// The ADDs begun and not ended: their attachment key and their
    /// `begin` line, which a compaction copies.
    pub(super) open: HashMap<u64, (String, Vec<u8>)>,
    /// Rewrite the journal past this many bytes (and past twice what the
    /// last rewrite kept: many long ADDs open do not make every `end` a
    /// rewrite).
    pub(super) compact_at: u64,
    pub(super) kept: u64,
    /// The commit records in the journal whose cache records may not be
    /// flushed yet, by commit number (in append order): a compaction keeps
    /// them until an `fsync` of each of those records. Only a journal with
    /// a deferred cache ([`Intents::with_cache`]) has any.
    pub(super) committed: std::collections::BTreeMap<u64, Committed>,
    pub(super) next_commit: u64,
    /// A compaction is flushing the cache (outside the lock).
    pub(super) compacting: bool,
    /// Commit lines a start could not settle (a record that could not be
    /// restored or flushed: [`Intents::prepare`]), rewritten with `end` 0,
    /// which ends no `begin`. Until the next start settles them, every
    /// rewrite of the journal copies them first, [`Intents::close`] keeps
    /// the journal, and only a commit or a removal of their attachment
    /// drops them (a newer line, or a `gone` line, then stands for it).
    pub(super) carried: Vec<Carried>,
    /// The shared flush: the batch of records appended since the running
    /// `fdatasync` began, and whether one runs ([`Intents::flush_through`]).
    pub(super) flush: GroupFlush,
}

/// The state of the shared flush, under the [`Journal`]'s lock.
#[derive(Debug, Default)]
pub(super) struct GroupFlush {
    /// The records appended since the running flush took its batch: the
    /// next flush's.
    open: Ticket,
    /// A flush runs (outside the lock); it owns every batch taken and not
    /// yet answered.
    running: bool,
}

/// A record's place in a batch of the shared flush: answered once, by the
/// flush that took the batch.
#[derive(Debug, Default, Clone)]
pub(super) struct Ticket(Arc<std::sync::OnceLock<Result<(), (io::ErrorKind, String)>>>);

/// A commit line carried over from an earlier start ([`Journal::carried`]).
#[derive(Debug)]
pub(super) struct Carried {
    pub(super) attachment: [String; 3],
    pub(super) line: Vec<u8>,
}

impl Carried {
    pub(super) fn key(&self) -> String {
        let [n, c, i] = &self.attachment;
        key(n, c, i)
    }
}

/// A commit line kept in the journal: its attachment (network, container
/// ID, interface), its bytes, and when it was appended.
#[derive(Debug)]
pub(super) struct Committed {
    pub(super) attachment: [String; 3],
    pub(super) line: Vec<u8>,
    pub(super) at: tokio::time::Instant,
}

impl Committed {
    pub(super) fn names(&self) -> (&str, &str, &str) {
        let [n, c, i] = &self.attachment;
        (n, c, i)
    }
}

/// Whether the journal is to be rewritten: past its size limit, and past
/// twice what the last rewrite kept (many long ADDs open do not make every
/// `end` a rewrite).
pub(super) fn due(j: &Journal) -> bool {
    j.len >= j.compact_at.max(2 * j.kept)
}

impl Intents {
    /// Appends one record with one `write` (`O_APPEND`: records of
    /// concurrent ADDs never interleave). A failed append is cut off again,
    /// so that no torn line swallows the records after it.
    pub(super) fn append(&self, j: &mut Journal, file: &File, line: &[u8]) -> io::Result<()> {
        if let Err(e) = self.storage.write(file, line) {
            let _ = self.storage.truncate(file, j.len);
            return Err(ctx(&self.dir.join(JOURNAL), "append to", e));
        }
        j.len += line.len() as u64;
        Ok(())
    }

    /// The batch the record just appended belongs to (under the same hold
    /// of the lock as its append): [`Intents::flush_through`] waits for it.
    pub(super) fn ticket(j: &Journal) -> Ticket {
        j.flush.open.clone()
    }

    /// Makes the records of `ticket`'s batch durable: returns once a
    /// flush that began after their append completed, with its outcome.
    /// When no flush runs, this caller runs one (an `fdatasync` of the
    /// journal, outside the lock) for every record appended until then,
    /// its own included; otherwise it waits for the running one to end
    /// and looks again (its batch is then the next one). So a burst of
    /// records costs one or two `fdatasync`s, not one each. Blocking.
    pub(super) fn flush_through(&self, ticket: &Ticket) -> io::Result<()> {
        let path = self.dir.join(JOURNAL);
        let mut j = lock(&self.journal);
        loop {
            if let Some(outcome) = ticket.0.get() {
                return outcome
                    .clone()
                    .map_err(|(kind, msg)| io::Error::new(kind, msg));
            }
            if !j.flush.running {
                // Not answered and no flush runs: the batch is still the
                // open one (a flush answers what it took before it ends).
                let batch = std::mem::take(&mut j.flush.open);
                j.flush.running = true;
                // `None` only after a rewrite (durable, holding every
                // open `begin` and needed commit line) whose reopening
                // failed: nothing of the batch is left to flush.
                let file = j.file.clone();
                drop(j);
                // A panic in it must not leave the waiters stranded.
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &file {
                    Some(f) => self.storage.sync_data(f),
                    None => Ok(()),
                }))
                .unwrap_or_else(|_| Err(io::Error::other("the flush panicked")));
                j = lock(&self.journal);
                j.flush.running = false;
                let res = res.map_err(|e| {
                    let e = ctx(&path, "fdatasync", e);
                    (e.kind(), e.to_string())
                });
                let _ = batch.0.set(res);
                self.flushed.notify_all();
                continue;
            }
            j = self.flushed.wait(j).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The journal, opened (created, and its dir entry made durable) when
    /// it is not yet.
    pub(super) fn journal_file(&self, j: &mut Journal) -> io::Result<Arc<File>> {
        if let Some(f) = &j.file {
            return Ok(f.clone());
        }
        self.open_journal(j, true)
    }

    /// Opens the journal for appending; `sync`: make its content and dir
    /// entry durable first (not needed right after a durable rewrite).
    pub(super) fn open_journal(&self, j: &mut Journal, sync: bool) -> io::Result<Arc<File>> {
        let path = self.dir.join(JOURNAL);
        let f = self
            .storage
            .open_append(&path)
            .map_err(|e| ctx(&path, "open", e))?;
        j.len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if sync {
            self.storage
                .sync_all(&f)
                .map_err(|e| ctx(&path, "fsync", e))?;
            self.storage.sync_dir(&self.dir)?;
        }
        let f = Arc::new(f);
        j.file = Some(f.clone());
        Ok(f)
    }

    /// When the journal is due ([`due`]): flushes the records of its commit
    /// lines (an `fsync` each, outside the journal's lock: ADDs go on
    /// meanwhile), then rewrites the journal without the lines that flush
    /// made unnecessary. Blocking. One compaction at a time; an ADD that
    /// finds one running leaves the work to it or to a later one.
    pub(super) fn compact_if_due(&self) -> io::Result<()> {
        self.compact_when(due)
    }

    /// Every [`FLUSH_EVERY`] while the daemon runs ([`Intents::flush_loop`]):
    /// commit lines older than that are dropped after an `fsync` of their
    /// records, so that a power loss brings back only the records of the
    /// last minute at most (those DELed since included), and not every
    /// attachment committed since the last compaction.
    pub(super) fn flush_old_commits(&self) -> io::Result<()> {
        // `committed` is in append order: its first line is the oldest.
        self.compact_when(|j| {
            j.committed
                .values()
                .next()
                .is_some_and(|c| c.at.elapsed() >= FLUSH_EVERY)
        })
    }

    /// Until `stop`: every [`FLUSH_EVERY`], flushes the commits older than
    /// that; when an ADD found the journal due, compacts it. On the
    /// blocking pool, off every request's path. Once, [`ABANDONED_AFTER`]
    /// after the start, removes the temp files of killed cache writers.
    pub(crate) async fn flush_loop(self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let sweep = tokio::time::sleep(ABANDONED_AFTER);
        tokio::pin!(sweep);
        let mut swept = false;
        loop {
            let old = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => true,
                _ = self.wake.notified() => false,
                () = &mut sweep, if !swept => {
                    swept = true;
                    let this = self.clone();
                    let _ = blocking(move || {
                        this.remove_abandoned_cache_temps();
                        Ok(())
                    })
                    .await;
                    continue;
                }
            };
            if old && lock(&self.journal).committed.is_empty() {
                // An idle daemon wakes no pool thread.
                continue;
            }
            let this = self.clone();
            let res = blocking(move || {
                if old {
                    this.flush_old_commits()
                } else {
                    this.compact_if_due()
                }
            })
            .await;
            if let Err(e) = res {
                tracing::warn!(error = %e, "cannot flush the committed ADD results; retrying later");
            }
        }
    }

    pub(super) fn compact_when(&self, when: impl Fn(&Journal) -> bool) -> io::Result<()> {
        let (upto, attachments) = {
            let mut j = lock(&self.journal);
            if j.compacting || !when(&j) {
                return Ok(());
            }
            if j.committed.is_empty() {
                return self.compact(&mut j);
            }
            j.compacting = true;
            let attachments: Vec<[String; 3]> =
                j.committed.values().map(|c| c.attachment.clone()).collect();
            (j.next_commit, attachments)
        };
        // Every commit numbered below `upto` was appended after its cache
        // record was written: these fsyncs make those records durable.
        let synced = self.cache.as_ref().map_or(Ok(0), |c| {
            c.sync_records_blocking(
                attachments
                    .iter()
                    .map(|[n, c, i]| (n.as_str(), c.as_str(), i.as_str())),
            )
        });
        let mut j = lock(&self.journal);
        j.compacting = false;
        let _files = match synced {
            Ok(n) => n,
            Err(e) => {
                return Err(io::Error::other(format!(
                    "flush the cached ADD results: {}",
                    cni_core::error::Chain(&e)
                )));
            }
        };
        #[cfg(test)]
        {
            let mut t = self.synced.lock().unwrap();
            t.0.extend(attachments.iter().map(|[n, c, i]| key(n, c, i)));
            t.1 += _files;
        }
        j.committed.retain(|n, _| *n >= upto);
        self.compact(&mut j)
    }

    /// Rewrites the journal with only the lines carried from the start, the
    /// open ADDs' `begin` lines and the commit lines still needed (atomically and durably,
    /// [`durable::write_atomic`]), or empties it when there are none. Under
    /// the journal's lock.
    pub(super) fn compact(&self, j: &mut Journal) -> io::Result<()> {
        let path = self.dir.join(JOURNAL);
        if j.open.is_empty() && j.committed.is_empty() && j.carried.is_empty() {
            if let Some(f) = &j.file {
                // Not flushed: the records it drops are all ended, and a
                // power loss that brings them back brings back their ends.
                self.storage
                    .truncate(f, 0)
                    .map_err(|e| ctx(&path, "empty", e))?;
            }
            j.len = 0;
            j.kept = 0;
            return Ok(());
        }
        let mut seqs: Vec<u64> = j.open.keys().copied().collect();
        seqs.sort_unstable();
        // The carried lines are older than any of this run: first, so that
        // a newer line of their attachment still wins at the next start.
        let mut bytes: Vec<u8> = j.carried.iter().flat_map(|c| c.line.clone()).collect();
        for s in seqs {
            bytes.extend_from_slice(&j.open[&s].1);
        }
        for c in j.committed.values() {
            bytes.extend_from_slice(&c.line);
        }
        durable::write_atomic_on(&*self.storage, &path, &bytes, 0o600, true)?;
        j.file = None;
        j.len = bytes.len() as u64;
        j.kept = j.len;
        self.open_journal(j, false)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::intents::testing::*;

    /// Past its size limit the journal is rewritten with the open records
    /// only (or emptied), and what is open still survives a crash.
    #[tokio::test]
    async fn compaction_keeps_the_open_records_only() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path()).with_compact_at(4096);
        intents.prepare().unwrap();
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let rt = RuntimeConf::new("long-running", "/run/netns/x", "eth0");
        let _open = open_add(&intents, &rt, b"{}".to_vec()).await;
        for i in 0..40 {
            let rt = RuntimeConf::new(format!("c-{i}"), "/run/netns/x", "eth0");
            let p = open_add(&intents, &rt, vec![b' '; 100]).await;
            intents.finish(p).await.unwrap();
        }
        assert!(std::fs::metadata(&journal).unwrap().len() < 4096);
        assert_eq!(open_names(dir.path()), ["n:long-running:eth0"]);
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        assert_eq!(after.scan().unwrap().len(), 1);

        // None open: emptied.
        let d2 = tempfile::tempdir().unwrap();
        let intents = Intents::new(d2.path()).with_compact_at(1024);
        intents.prepare().unwrap();
        for i in 0..20 {
            let rt = RuntimeConf::new(format!("c-{i}"), "/run/netns/x", "eth0");
            let p = open_add(&intents, &rt, vec![b' '; 100]).await;
            intents.finish(p).await.unwrap();
        }
        assert!(
            std::fs::metadata(d2.path().join(INTENTS_DIR).join(JOURNAL))
                .unwrap()
                .len()
                < 1024
        );
    }

    /// Past its size limit the journal is due; an ADD does not compact it
    /// (that would put a flush of many records on its path) but wakes the
    /// flush loop, whose compaction drops the commit lines after an fsync
    /// of each of their records and keeps the open ADDs; a graceful exit
    /// with only commit lines flushes and removes it.
    #[tokio::test]
    async fn compaction_and_close_forget_commits_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(dir.path());
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path())
            .with_cache(cache.clone(), true)
            .with_compact_at(4096);
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("long-running", "/run/netns/x", "eth0");
        let open = open_add(&intents, &rt, b"{}".to_vec()).await;
        for i in 0..40 {
            committed_add(&intents, &cache, &format!("c-{i}")).await;
        }
        let before = std::fs::metadata(&journal).unwrap().len();
        assert!(before > 4096, "{before}");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            40,
            "an ADD compacted on its own path"
        );
        // What the flush loop does when woken.
        let woken =
            tokio::time::timeout(std::time::Duration::from_secs(10), intents.wake.notified());
        woken.await.expect("the ADDs woke the flush loop");
        intents.compact_if_due().unwrap();
        assert!(std::fs::metadata(&journal).unwrap().len() < 4096);
        assert!(committed_records(&std::fs::read(&journal).unwrap()).is_empty());
        let (synced, files) = intents.synced.lock().unwrap().clone();
        let want: Vec<String> = (0..40).map(|i| format!("n:c-{i}:eth0")).collect();
        assert_eq!(
            synced, want,
            "every dropped commit line's record was flushed first"
        );
        assert_eq!(files, 40, "each of the 40 record files was fsynced");
        assert_eq!(open_names(dir.path()), ["n:long-running:eth0"]);
        assert_eq!(cache.list(None).await.unwrap().len(), 40);
        intents.finish(open).await.unwrap();
        intents.close();
        assert!(
            !journal.exists(),
            "only commit lines left: flushed and removed"
        );
    }

    /// The daemon's flush loop, on tokio's paused clock: a commit line
    /// younger than the window stays; once it is older, the next tick
    /// flushes its record and drops it; a journal past its size limit is
    /// compacted as soon as an ADD finds it due, without a tick.
    #[tokio::test(start_paused = true)]
    async fn the_flush_loop_drops_old_commit_lines_and_compacts_when_woken() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(intents.clone().flush_loop(stop.clone()));
        committed_add(&intents, &cache, "c-1").await;
        let lines = || committed_records(&std::fs::read(&journal).unwrap_or_default()).len();

        tokio::time::advance(FLUSH_EVERY / 2).await;
        tokio::task::yield_now().await;
        assert_eq!(lines(), 1, "young: kept");
        assert_eq!(intents.synced.lock().unwrap().1, 0);

        tokio::time::advance(FLUSH_EVERY * 2).await;
        wait_for("the old commit line was not dropped", || {
            intents.journal.lock().unwrap().committed.is_empty()
        })
        .await;
        assert_eq!(lines(), 0);
        assert_eq!(
            intents.synced.lock().unwrap().clone(),
            (vec!["n:c-1:eth0".to_owned()], 1)
        );
        assert!(cache.path("n", "c-1", "eth0").unwrap().exists());

        // Due by size: woken, no tick needed.
        intents.journal.lock().unwrap().compact_at = 1;
        committed_add(&intents, &cache, "c-2").await;
        wait_for("the due journal was not compacted", || {
            intents.journal.lock().unwrap().committed.is_empty()
        })
        .await;
        assert_eq!(intents.synced.lock().unwrap().1, 2);
        stop.cancel();
        task.await.unwrap();
    }

    /// A regression: the journal a start kept (c-1's record not
    /// restored) was removed by the graceful stop that followed, and by any
    /// compaction, which only knew the commit lines of their own run: the
    /// record was never restored. Kept now until a start restores it.
    #[tokio::test]
    async fn a_kept_journal_survives_a_graceful_stop_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        let unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        unblock(); // the space freed

        // A compaction of this run (nothing of its own to keep).
        kept.journal.lock().unwrap().compact_at = 1;
        let rt = RuntimeConf::new("c-3", "/run/netns/z", "eth0");
        let p = open_add(&kept, &rt, b"{}".to_vec()).await;
        kept.finish(p).await.unwrap();
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1,
            "a compaction dropped the kept commit line"
        );
        // The graceful stop.
        kept.close();
        assert!(
            journal.exists(),
            "the graceful stop removed the kept journal"
        );

        // The next start restores the record, and the journal goes.
        let (_, _, next) = deferred(dir.path(), "boot-b");
        let path = cache.path("n", "c-1", "eth0").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), rec.encode());
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        next.close();
        assert!(!journal.exists());
    }
}
