//! Start-up recovery ([`Intents::prepare`]), before any request runs.
//!
//! Invariants kept here: the open `begin`s become intent files, durably,
//! before the journal changes; commit lines of another boot put their
//! records back (unless newer ones are there), those of this boot have
//! their records flushed; what could not be settled is carried
//! ([`Journal::carried`]) and is all the journal keeps; the next run numbers
//! past every number the journal held. Restartable: a crash at any point
//! leaves the journal as it was or as rewritten, and doing it again
//! converges (`a_crash_during_recovery_repeated_converges`).

use super::*;

/// A temp file in the cache's `results/` whose writer's pid is gone is
/// removed once it is this old ([`Intents::remove_abandoned_cache_temps`]).
pub(super) use cni_async::daemon::durable::ABANDONED_AFTER;

impl Intents {
    /// At start, before any request: creates the dir, or makes an existing
    /// one private (0700, see `private_state_dir`), removes the temp files
    /// of killed writes (an earlier start's too), then turns the ADDs the
    /// journal holds open (begun before a crash, never ended) into intent
    /// files ([`Intents::scan`] finds them) and empties the journal. The
    /// files are durable before the journal is emptied, so a crash in
    /// between only does it again.
    pub(crate) fn prepare(&self) -> io::Result<()> {
        // A dir made here is flushed into its parent, and so is the state
        // dir when this is its first start (a power loss must not take the
        // journal away with its dir; found by the crash-point enumeration).
        // A dir found here is flushed too: a start killed between making
        // it and flushing it left it so, and the kernel keeps it until a
        // power loss (found by an attack on the journal). Two `fsync`s of
        // dirs per start.
        let new = std::fs::symlink_metadata(&self.dir).is_err();
        durable::ensure_private_dir_durable(&*self.storage, &self.dir, true)
            .map_err(|e| ctx(&self.dir, "create", e))?;
        if !new && let Some(state) = self.dir.parent() {
            durable::sync_dir(&*self.storage, state)?;
        }
        if let Some(above) = self.dir.parent().and_then(Path::parent) {
            // Not ours: a non-root cnid may not open it (warned once).
            durable::sync_dir_above(&*self.storage, above)?;
        }
        super::super::private_state_dir(&self.dir)
            .map_err(|e| io::Error::other(format!("{}: {e}", self.dir.display())))?;
        // Before it writes any: the temp files of a start killed while it
        // wrote intent files or restored cache records would otherwise
        // pile up, one per crash, for as long as the starts keep being
        // killed (the cache's once its writer is dead and they are
        // [`ABANDONED_AFTER`] old).
        if let Err(e) = self.remove_leftovers() {
            tracing::warn!(error = %e, "cannot remove leftover ADD intent temp files");
        }
        self.remove_abandoned_cache_temps();
        let path = self.dir.join(JOURNAL);
        let bytes = match durable::read_nofollow(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ctx(&path, "read", e)),
        };
        let mtime = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok();
        let unsettled = self.settle_commits(&bytes, mtime);
        for (seq, intent) in open_records(&bytes) {
            match intent {
                Ok(i) => {
                    let file = self.path(&i.network, &i.rt.container_id, &i.rt.ifname);
                    durable::write_atomic_on(&*self.storage, &file, &i.encode(), 0o600, true)?;
                }
                Err(reason) => tracing::error!(file = %path.display(), seq, %reason,
                    "unreadable ADD journal record; its attachment (if any) is not cleaned up"),
            }
        }
        // The open records are intent files now: the journal keeps only
        // the commit lines not settled, and no `begin` or `end` of an
        // earlier run (a `begin` left there would be rolled back again at
        // every start, and an `end` would end a new `begin` of the same
        // number).
        let mut j = lock(&self.journal);
        j.next_seq = max_seq(&bytes) + 1;
        if unsettled.is_empty() {
            if !bytes.is_empty() {
                let f = self
                    .storage
                    .open_write(&path)
                    .map_err(|e| ctx(&path, "open", e))?;
                self.storage
                    .truncate(&f, 0)
                    .and_then(|()| self.storage.sync_all(&f))
                    .map_err(|e| ctx(&path, "empty", e))?;
            }
        } else {
            let kept: Vec<u8> = unsettled.iter().flat_map(|c| c.line.clone()).collect();
            durable::write_atomic_on(&*self.storage, &path, &kept, 0o600, true)?;
            j.kept = kept.len() as u64;
        }
        j.carried = unsettled;
        Ok(())
    }

    /// At start, before the journal is emptied: the cache records its
    /// commit lines carry. Committed in another boot (the machine went
    /// down, maybe before writing them back), each attachment's file is
    /// made to hold its last committed record again, unless it already
    /// does or was written after the journal's last change (by another
    /// tool since the reboot: left alone). A DEL answered before the
    /// crash may come back with it if its `gone` line was not written
    /// back: a repeat DEL of a record is harmless, as for any removal a
    /// power loss undoes. Committed in this boot (only the process died),
    /// the page cache still holds what was written, including later
    /// removals: nothing is restored, the records are flushed. Returns
    /// the commit lines whose record could not be restored or flushed,
    /// rewritten with `end` 0 (see [`Journal::carried`]): the journal keeps
    /// them for the next start, which settles them again. Restartable: a
    /// crash anywhere in here leaves the journal as it was, and doing it
    /// again restores the same bytes or finds them there.
    pub(super) fn settle_commits(
        &self,
        bytes: &[u8],
        journal_mtime: Option<SystemTime>,
    ) -> Vec<Carried> {
        let Some(cache) = &self.cache else {
            return Vec::new();
        };
        let records = committed_records_with_end(bytes);
        let mut unsettled = Vec::new();
        let carry = |boot: &str, rec: &CacheRecord, bytes: &[u8]| Carried {
            attachment: [
                rec.network_name.clone(),
                rec.container_id.clone(),
                rec.if_name.clone(),
            ],
            line: commit_line(0, boot, bytes),
        };
        // The records to flush (by index): this boot's, and the restored
        // ones, whose write flushed them but trusted a dir it found there,
        // which a start killed before its flush may have left unflushed
        // (found by an attack on the journal): the flush makes the dirs
        // durable too.
        let mut flush = Vec::new();
        for (i, (boot, rec, bytes, end)) in records.iter().enumerate() {
            let (net, cid, ifname) = (&rec.network_name, &rec.container_id, &rec.if_name);
            // A line an earlier start carried (`end` 0: its flush or
            // restore failed) whose record the cache holds: written again,
            // not flushed again. The failed write-back left the record's
            // pages clean, its data maybe nowhere on disk, and the error
            // taken: a flush now returns `Ok` (found by the attack on issue
            // 25 item 4: the next start's `syncfs` dropped every line kept
            // for it). The write's own flush reports whether it is durable.
            let held = || {
                let p = cache.path(net, cid, ifname).ok()?;
                let m = std::fs::symlink_metadata(&p).and_then(|m| m.modified());
                durable::read_nofollow(&p)
                    .is_ok_and(|b| b == *bytes)
                    .then_some((p, m.ok()))
            };
            if *end == 0
                && let Some((path, mtime)) = held()
            {
                match cache.write_durable_blocking(rec) {
                    Ok(()) => {
                        flush.push(i);
                        if let Some(t) = mtime {
                            date_restored(&path, t);
                        }
                    }
                    Err(e) => {
                        unsettled.push(carry(boot, rec, bytes));
                        tracing::error!(network = %net, container = %cid, ifname = %ifname, error = %cni_core::error::Chain(&e),
                            "cannot write again the cached result of an ADD whose flush failed; the ADD journal is kept for the next start");
                    }
                }
                continue;
            }
            if self.boot.is_empty() || **boot == *self.boot {
                flush.push(i);
                continue;
            }
            let path = match cache.path(net, cid, ifname) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(network = %net, container = %cid, ifname = %ifname, error = %cni_core::error::Chain(&e), "ADD journal: unusable committed record; skipped");
                    continue;
                }
            };
            if durable::read_nofollow(&path).is_ok_and(|b| b == *bytes) {
                // Restored by a start that may not have flushed it.
                flush.push(i);
                continue;
            }
            let newer = std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .zip(journal_mtime)
                .is_some_and(|(file, journal)| file > journal);
            if newer {
                tracing::info!(network = %net, container = %cid, ifname = %ifname,
                    "cached result written after the machine went down; the journal's older one is not restored");
                continue;
            }
            match cache.write_durable_blocking(rec) {
                Ok(()) => {
                    flush.push(i);
                    if let Some(t) = journal_mtime {
                        date_restored(&path, t);
                    }
                    tracing::warn!(network = %net, container = %cid, ifname = %ifname,
                        "restored the cached result of an ADD answered before the machine went down")
                }
                Err(e) => {
                    unsettled.push(carry(boot, rec, bytes));
                    tracing::error!(network = %net, container = %cid, ifname = %ifname, error = %cni_core::error::Chain(&e),
                        "cannot restore the cached result of an ADD answered before the machine went down; the ADD journal is kept for the next start");
                }
            }
        }
        let names = flush.iter().map(|&i| {
            let rec = &records[i].1;
            (
                rec.network_name.as_str(),
                rec.container_id.as_str(),
                rec.if_name.as_str(),
            )
        });
        // One `syncfs` for many records (at node scale 10,000 `fsync`s
        // took 9 to 40 s): the same guarantee, every record named durable
        // before the journal drops its line (see `Intents::sync_records`).
        if let Err(e) = self.sync_records(cache, names) {
            unsettled.extend(flush.iter().map(|&i| {
                let (boot, rec, bytes, _) = &records[i];
                carry(boot, rec, bytes)
            }));
            tracing::error!(error = %cni_core::error::Chain(&e), "cannot flush the cached ADD results; the ADD journal is kept for the next start");
        }
        unsettled
    }

    /// The cache records of the commit lines this start could not settle
    /// and carries ([`Journal::carried`]): ADDs answered before the machine
    /// went down whose records the cache does not hold until a later
    /// start restores them. The owner check counts them as attachments.
    pub(crate) fn carried_records(&self) -> Vec<CacheRecord> {
        let j = lock(&self.journal);
        let lines: Vec<u8> = j.carried.iter().flat_map(|c| c.line.clone()).collect();
        committed_records(&lines)
            .into_iter()
            .map(|(_, rec, _)| rec)
            .collect()
    }

    /// Removes the temp files of cache writers killed mid-write (a
    /// `kill -9` between a record's temp file and its rename) from the
    /// shared cache's `results/`: ours only, of dead writers, at least
    /// [`ABANDONED_AFTER`] old ([`ResultCache::remove_abandoned`]).
    /// At start ([`Intents::prepare`]), and once more that long after it
    /// ([`Intents::flush_loop`]) for those the killed predecessor left just
    /// before. Blocking.
    pub(crate) fn remove_abandoned_cache_temps(&self) {
        let Some(cache) = &self.cache else { return };
        match cache.remove_abandoned(ABANDONED_AFTER) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                count = n,
                "removed temp and lock files of cache writers killed mid-write"
            ),
            Err(e) => {
                tracing::warn!(error = %cni_core::error::Chain(&e), "cannot remove the temp files of killed cache writers")
            }
        }
    }
}

/// Dates a record restored from another boot's commit line as written
/// when the journal last changed (in that boot), not now: the
/// stale-attachment reaper takes a record older than the boot for an
/// earlier boot's (`cni_async::stale`), and deletes it at start when its
/// namespace is gone. Not a durability matter: a crash before it leaves
/// the record dated now, reaped after `--stale-after` instead; and the
/// next start's "written after the journal" check still finds it not
/// newer.
fn date_restored(path: &Path, when: SystemTime) {
    use std::os::unix::fs::OpenOptionsExt;
    let res = std::fs::File::options()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .and_then(|f| f.set_modified(when));
    if let Err(e) = res {
        tracing::debug!(file = %path.display(), error = %e, "cannot date a restored cache record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::intents::testing::*;
    use crate::daemon::intents::tests::sim_disk::{Cut, SimDisk};

    /// An ADD begun and not finished survives the daemon (a new `Intents`
    /// on the same dir, as after `kill -9`): the start turns it into an
    /// intent file and empties the journal; a finished one leaves nothing.
    #[tokio::test]
    async fn open_journal_records_become_intent_files_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt1 = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let rt2 = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        let i1 = Intent::new("n", &rt1, b"{\"a\":1}".to_vec());
        let p1 = intents.begin(&i1).await.unwrap().pending().unwrap();
        let p2 = open_add(&intents, &rt2, b"{}".to_vec()).await;
        assert!(intents.exists("n", "c-1", "eth0").await);
        assert!(!intents.exists("n", "c-3", "eth0").await);
        intents.finish(p2).await.unwrap();
        assert!(!intents.exists("n", "c-2", "eth0").await);
        assert_eq!(open_names(dir.path()), ["n:c-1:eth0"]);
        assert!(intents.scan().unwrap().is_empty(), "no file while running");
        let _ = p1;

        // The crash: a new daemon on the same state dir.
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        match after.scan().unwrap().as_slice() {
            [IntentFile::Intent(p, i)] => {
                assert!(p.ends_with("n:c-1:eth0.json"));
                assert_eq!(i.rt, rt1);
                assert_eq!(i.config, i1.config);
            }
            other => panic!("{other:?}"),
        }
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        // Once recovered (the DEL removes the file), the next start finds nothing.
        assert!(after.remove("n", "c-1", "eth0").await.unwrap());
        let again = Intents::new(dir.path());
        again.prepare().unwrap();
        assert!(again.scan().unwrap().is_empty());
    }

    /// A power loss can take the cache file the daemon wrote without
    /// fsync; the commit line it flushed puts the same bytes back at the
    /// next start, when the boot id changed. In the same boot (only the
    /// process died) a missing file was removed on purpose (a DEL) and
    /// stays missing.
    #[tokio::test]
    async fn commit_lines_restore_cache_records_after_a_reboot_only() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let path = cache.path("n", "c-1", "eth0").unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(written, rec.encode(), "the engine's record is the cache's");
        let bytes = std::fs::read(&journal).unwrap();
        let found = committed_records(&bytes);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "boot-a");
        assert_eq!(found[0].2, written);

        // Same boot, the file gone (a DEL after the ADD): nothing restored.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&journal, &bytes).unwrap();
        deferred(dir.path(), "boot-a");
        assert!(!path.exists(), "a record removed in this boot came back");
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);

        // Another boot, the file lost or torn: restored, byte for byte.
        std::fs::write(&journal, &bytes).unwrap();
        let (_, _, rebooted) = deferred(dir.path(), "boot-b");
        assert_eq!(std::fs::read(&path).unwrap(), written);
        std::fs::write(&path, b"").unwrap();
        std::fs::write(&journal, &bytes).unwrap();
        deferred(dir.path(), "boot-c");
        assert_eq!(std::fs::read(&path).unwrap(), written);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        assert!(
            rebooted.scan().unwrap().is_empty(),
            "a committed ADD is no intent"
        );
    }

    /// After a reboot, a record written since (by cnitool or another
    /// runtime, before cnid started) is newer than the journal: left alone.
    #[tokio::test]
    async fn a_record_written_after_the_reboot_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let path = cache.path("n", "c-1", "eth0").unwrap();
        let mut newer = rec.clone();
        newer.netns = "/run/netns/after-the-reboot".into();
        std::fs::write(&path, newer.encode()).unwrap();
        // Make the journal older than the record, whatever the clock's
        // resolution.
        let f = std::fs::File::options().write(true).open(&journal).unwrap();
        f.set_modified(SystemTime::now() - std::time::Duration::from_secs(60))
            .unwrap();
        drop(f);
        deferred(dir.path(), "boot-b");
        assert_eq!(std::fs::read(&path).unwrap(), newer.encode());
    }

    /// A regression: a start that kept the journal (a record it could
    /// not restore) numbered its ADDs from 1 again after the kept lines,
    /// and the next start took the kept commit line's `end` 1 for the end
    /// of the new `begin` 1: that ADD, half done when the daemon was
    /// killed, was never rolled back.
    #[tokio::test]
    async fn sequence_numbers_are_not_reused_after_a_kept_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        // The machine went down; c-1's record cannot be restored.
        let _unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1
        );
        // An ADD of c-2 whose second plugin hangs, and the daemon is killed.
        let rt = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        open_add(&kept, &rt, b"{}".to_vec()).await;
        drop(kept);

        let (_, _, after) = deferred(dir.path(), "boot-b");
        let found: Vec<String> = after
            .scan()
            .unwrap()
            .into_iter()
            .map(|f| match f {
                IntentFile::Intent(p, _) => p.file_name().unwrap().to_string_lossy().into_owned(),
                IntentFile::Corrupt(p, r) => panic!("{}: {r}", p.display()),
            })
            .collect();
        assert_eq!(found, ["n:c-2:eth0.json"], "c-2's ADD is not rolled back");
    }

    /// While a kept line waits, the attachment's own DEL (a `gone` line)
    /// or a new ADD's commit line stands for it: the next start neither
    /// brings back the deleted record nor puts the old one over the new.
    #[tokio::test]
    async fn a_del_or_a_new_add_supersedes_a_kept_commit_line() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        drop(intents);
        let unblock1 = block_restore(&cache, "c-1");
        let unblock2 = block_restore(&cache, "c-2");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        unblock1();
        unblock2();
        // c-1 DELed, c-2 ADDed again (with another result).
        assert!(!kept.remove("n", "c-1", "eth0").await.unwrap());
        let rt = RuntimeConf::new("c-2", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
        let p = kept.begin(&i).await.unwrap().pending().unwrap();
        let newer = CacheRecord::new(
            "n",
            &rt,
            i.config.clone(),
            Some(json!({"cniVersion": "1.1.0"})),
        );
        cache.write(&newer).await.unwrap();
        kept.commit(p, &newer).await.unwrap();
        kept.close();
        assert!(!journal.exists(), "nothing left to restore: removed");
        // Even a crash instead of that stop (the journal as it was).
        let (_, _, _) = deferred(dir.path(), "boot-c");
        assert!(!cache.path("n", "c-1", "eth0").unwrap().exists());
        assert_eq!(
            std::fs::read(cache.path("n", "c-2", "eth0").unwrap()).unwrap(),
            newer.encode()
        );
    }

    /// Recovery is restartable: a start that keeps the journal, repeated
    /// (killed before or after it settled, again and again), turns the
    /// same open ADD into the same one intent file, lets no file grow, and
    /// converges once the record can be restored.
    #[tokio::test]
    async fn a_crash_during_recovery_repeated_converges() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let rt = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        open_add(&intents, &rt, b"{}".to_vec()).await;
        drop(intents);
        let unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let mut sizes = Vec::new();
        for boot in ["boot-b", "boot-b", "boot-c", "boot-c", "boot-d"] {
            let (_, _, again) = deferred(dir.path(), boot);
            assert_eq!(
                again.scan().unwrap().len(),
                1,
                "the open ADD's one intent file"
            );
            sizes.push(std::fs::metadata(&journal).unwrap().len());
        }
        assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1
        );
        unblock();
        deferred(dir.path(), "boot-d");
        assert_eq!(
            std::fs::read(cache.path("n", "c-1", "eth0").unwrap()).unwrap(),
            rec.encode()
        );
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        // The recovery DEL done: nothing left for another start.
        assert!(intents_after_del(dir.path()).await);
    }

    /// Found by the crash-point enumeration (`tests/crash_points.rs`): a start
    /// killed while it wrote an open ADD's intent file (its temp file
    /// written, not renamed yet) left the temp file, and each start killed
    /// there again left one more: they were removed only after recovery
    /// (`Engine::recover`), which those starts never reached.
    #[tokio::test]
    async fn temp_files_of_starts_killed_mid_write_do_not_pile_up() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        open_add(
            &intents,
            &RuntimeConf::new("c-1", "/run/netns/x", "eth0"),
            b"{}".to_vec(),
        )
        .await;
        drop(intents);
        let temps = || {
            std::fs::read_dir(dir.path().join(INTENTS_DIR))
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with('.')
                })
                .count()
        };
        for _ in 0..3 {
            // Killed at the temp file's fdatasync: written, not renamed
            // (after the removal of the last start's temp file, if any:
            // an I/O point too; after the start's flushes of the state
            // dir and of its parent, two more).
            let at = if temps() == 0 { 4 } else { 5 };
            let sim = Arc::new(SimDisk::new(dir.path()).crash_at(at));
            let killed = Intents::new(dir.path()).with_storage(sim.clone());
            assert!(killed.prepare().is_err());
            assert_eq!(sim.crashed_at().unwrap().kind, "fdatasync");
            assert_eq!(temps(), 1, "temp files of killed starts pile up");
        }
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        assert_eq!(temps(), 0);
        assert_eq!(after.scan().unwrap().len(), 1);
    }

    /// Two ADDs answered in boot `boot-a`, then the machine went down
    /// and took the cache dir with it (written without a flush; with
    /// `results`, its empty `results/` came back): what a start in
    /// another boot restores. The simulated disk over `dir` from then on,
    /// all of it durable.
    async fn rebooted_with_two_records(
        dir: &Path,
        results: bool,
    ) -> (Vec<CacheRecord>, Arc<SimDisk>) {
        let (cache, _, intents) = deferred(dir, "boot-a");
        let recs = vec![
            committed_add(&intents, &cache, "c-1").await,
            committed_add(&intents, &cache, "c-2").await,
        ];
        drop(intents);
        std::fs::remove_dir_all(cache.dir()).unwrap();
        if results {
            std::fs::create_dir_all(cache.results_dir()).unwrap();
        }
        (recs, Arc::new(SimDisk::new(dir)))
    }

    /// The index of the first call of a start on `rebooted_with_two_records`
    /// of `kind` made by the cache (its store's `entry.rs`), found by a start on a
    /// copy of that state.
    async fn first_cache_call(kind: &str, results: bool) -> usize {
        let dry = tempfile::tempdir().unwrap();
        let (_, sim) = rebooted_with_two_records(dry.path(), results).await;
        on_sim(dry.path(), "boot-b", &sim).prepare().unwrap();
        sim.calls()
            .iter()
            .position(|c| c.kind == kind && c.site.starts_with("entry.rs"))
            .unwrap_or_else(|| panic!("no {kind}: {:?}", sim.calls()))
    }

    /// Found by the crash-point enumeration (`tests/crash_points.rs`): a start that
    /// restores records into a cache dir a power loss took away makes the
    /// dir again and flushes it into its parent; when that flush failed
    /// (a full disk), its record was kept for the next start, but the next
    /// record restored found the dir there, did not flush it, and was
    /// taken as durable: its commit line dropped, a second power loss lost
    /// it for good. Now a dir whose flush failed is removed again
    /// (`durable::ensure_private_dir_durable`), and the next write makes
    /// and flushes it.
    #[tokio::test]
    async fn a_restore_after_a_failed_dir_flush_does_not_trust_the_dir() {
        let at = first_cache_call("fsync-dir", false).await;
        let dir = tempfile::tempdir().unwrap();
        let (recs, _) = rebooted_with_two_records(dir.path(), false).await;
        let sim = Arc::new(SimDisk::new(dir.path()).fail_at(at));
        on_sim(dir.path(), "boot-b", &sim).prepare().unwrap();
        sim.power_loss(Cut::None);
        let (cache, _, _) = deferred(dir.path(), "boot-c");
        assert_all_restored(&cache, &recs);
    }

    /// Every record of `recs` is in `cache`, byte for byte.
    fn assert_all_restored(cache: &ResultCache, recs: &[CacheRecord]) {
        for r in recs {
            let path = cache.path("n", &r.container_id, "eth0").unwrap();
            assert_eq!(
                std::fs::read(&path).ok(),
                Some(r.encode()),
                "{}: lost",
                r.container_id
            );
        }
    }

    /// Found by the crash-point enumeration: the first start on a fresh
    /// state dir made `intents/` and never flushed it into the state dir;
    /// a power loss then took it away with the journal, and with it the
    /// commit line of an ADD answered since: its cached result was lost.
    #[tokio::test]
    async fn the_first_start_flushes_the_intents_dir() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimDisk::new(dir.path()));
        let intents = on_sim(dir.path(), "boot-a", &sim);
        intents.prepare().unwrap();
        let cache = intents.cache.clone().unwrap();
        let r = committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        sim.power_loss(Cut::None);
        deferred(dir.path(), "boot-b");
        assert_eq!(
            std::fs::read(cache.path("n", "c-1", "eth0").unwrap()).ok(),
            Some(r.encode()),
            "the answered ADD's result, restored from its commit line"
        );
    }

    /// Found by an attack on the journal: the kill -9 case of
    /// `a_restore_after_a_failed_dir_flush_does_not_trust_the_dir`. A
    /// start after a reboot, killed after it made the cache dir (to restore
    /// a record into) and before it flushed it, left the dir; the next
    /// start, same boot, found it there, restored the records into it
    /// without flushing it, and dropped their commit lines: a power loss
    /// then lost the records for good.
    #[tokio::test]
    async fn a_restore_after_a_killed_dir_flush_does_not_trust_the_dir() {
        let at = first_cache_call("fsync-dir", false).await;
        let dir = tempfile::tempdir().unwrap();
        let (recs, _) = rebooted_with_two_records(dir.path(), false).await;
        let sim = Arc::new(SimDisk::new(dir.path()).crash_at(at));
        assert!(on_sim(dir.path(), "boot-b", &sim).prepare().is_err());
        assert_eq!(sim.crashed_at().unwrap().kind, "fsync-dir");
        assert!(cache_in(dir.path()).results_dir().is_dir(), "made");
        sim.revive();
        on_sim(dir.path(), "boot-b", &sim).prepare().unwrap();
        sim.power_loss(Cut::None);
        let (cache, _, _) = deferred(dir.path(), "boot-c");
        assert_all_restored(&cache, &recs);
    }

    /// Found by an attack on the journal: cnid writes records without a
    /// flush (the journal's commit lines stand for them) and, before the
    /// lines go (a graceful stop, the periodic flush), flushes the record
    /// files and `results/`, but never `results/` into the cache dir nor
    /// the cache dir into its parent. The first stop's removal of the
    /// journal is unflushed, so a power loss right then brings the lines
    /// back; but a restart in the same boot flushes the new journal's dir,
    /// and with it that removal: a power loss then took `results/` away
    /// with the first run's answered ADD, whose line was gone for good.
    #[tokio::test]
    async fn records_flushed_at_a_stop_survive_a_later_power_loss() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimDisk::new(dir.path()));
        let first = on_sim(dir.path(), "boot-a", &sim);
        first.prepare().unwrap();
        let cache = first.cache.clone().unwrap();
        let r1 = committed_add(&first, &cache, "c-1").await;
        first.close();
        drop(first);
        let second = on_sim(dir.path(), "boot-a", &sim);
        second.prepare().unwrap();
        let r2 = committed_add(&second, &cache, "c-2").await;
        drop(second);
        sim.power_loss(Cut::None);
        deferred(dir.path(), "boot-b");
        for r in [r1, r2] {
            let path = cache.path("n", &r.container_id, "eth0").unwrap();
            assert_eq!(
                std::fs::read(&path).ok(),
                Some(r.encode()),
                "{}: the answered ADD's result lost",
                r.container_id
            );
        }
    }

    /// Found by an attack on the journal (a `kill -9` in a start, then a
    /// restart in the same boot, then a power loss, which the enumeration
    /// does not combine: its restarts after a kill take everything on disk
    /// as durable): the first start, killed after it made `intents/` and
    /// before it flushed it into the state dir, left the dir; the next
    /// start found it there and did not flush it, so a power loss took it
    /// away with the journal, and with it the commit line of an ADD that
    /// start had answered: its cached result was lost.
    #[tokio::test]
    async fn a_start_flushes_the_intents_dir_a_killed_start_made() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimDisk::new(dir.path()).crash_at(0));
        assert!(on_sim(dir.path(), "boot-a", &sim).prepare().is_err());
        assert_eq!(sim.crashed_at().unwrap().kind, "fsync-dir");
        assert!(dir.path().join(INTENTS_DIR).is_dir(), "made, not flushed");
        sim.revive();
        let intents = on_sim(dir.path(), "boot-a", &sim);
        intents.prepare().unwrap();
        let cache = intents.cache.clone().unwrap();
        let r = committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        sim.power_loss(Cut::None);
        deferred(dir.path(), "boot-b");
        assert_eq!(
            std::fs::read(cache.path("n", "c-1", "eth0").unwrap()).ok(),
            Some(r.encode()),
            "the answered ADD's result, restored from its commit line"
        );
    }

    /// Found by the crash-point enumeration: starts killed while they
    /// restored a record each left a temp file in the cache's `results/`,
    /// and the temp files of dead writers were removed only after the
    /// start's recovery, which those starts never reached. Now the start
    /// removes them first (those of dead writers, old enough).
    #[tokio::test]
    async fn cache_temps_of_starts_killed_mid_restore_do_not_pile_up() {
        let at = first_cache_call("fdatasync", true).await;
        let dir = tempfile::tempdir().unwrap();
        rebooted_with_two_records(dir.path(), true).await;
        let temps = || {
            std::fs::read_dir(cache_in(dir.path()).results_dir())
                .map(|d| d.count())
                .unwrap_or(0)
        };
        for _ in 0..3 {
            // Killed at the restored record's fdatasync (after the
            // removal of the last start's temp file, if any).
            let at = at + temps();
            let sim = Arc::new(SimDisk::new(dir.path()).crash_at(at));
            assert!(on_sim(dir.path(), "boot-b", &sim).prepare().is_err());
            assert_eq!(sim.crashed_at().unwrap().kind, "fdatasync");
            assert_eq!(temps(), 1, "temp files of killed starts pile up");
            // The killed start's pid gone, and the next start that late.
            abandon_cache_temps(dir.path());
        }
    }

    /// `n` ADDs answered in boot `boot-a` on the simulated disk (their
    /// records written without a flush, their commit lines flushed), then
    /// the daemon killed (`kill -9`: no graceful stop).
    async fn killed_with_records(dir: &Path, n: usize) -> (Vec<CacheRecord>, Arc<SimDisk>) {
        let sim = Arc::new(SimDisk::new(dir));
        let intents = on_sim(dir, "boot-a", &sim);
        intents.prepare().unwrap();
        let cache = intents.cache.clone().unwrap();
        let mut recs = Vec::new();
        for k in 1..=n {
            recs.push(committed_add(&intents, &cache, &format!("c-{k}")).await);
        }
        drop(intents);
        (recs, sim)
    }

    /// The kinds of `sim`'s calls from the `from`-th on, with the file or
    /// dir each acted on (records as `<record>`).
    fn kinds(sim: &SimDisk, from: usize) -> Vec<String> {
        sim.calls()[from..]
            .iter()
            .map(|c| {
                let name = if c.name.starts_with("n-c-") {
                    "<record>"
                } else {
                    &c.name
                };
                format!("{} {name}", c.kind)
            })
            .collect()
    }

    /// At node scale: a restart in the same boot (after a `kill -9`)
    /// with many commit lines flushes their records in one `syncfs` of
    /// the cache's file system, then the dirs, instead of an `fsync` per
    /// record; and the guarantee is the same: the journal drops the lines
    /// only after it, and a power loss right after the start keeps every
    /// record a dropped line named.
    #[tokio::test]
    async fn a_batched_flush_at_start_keeps_every_record_of_a_dropped_line() {
        let dir = tempfile::tempdir().unwrap();
        let (recs, sim) = killed_with_records(dir.path(), 5).await;
        let from = sim.calls().len();
        let start = on_sim(dir.path(), "boot-a", &sim).with_sync_fs_at(5);
        start.prepare().unwrap();
        let calls = kinds(&sim, from);
        assert!(
            !calls.iter().any(|c| c.ends_with("<record>")),
            "no call per record: {calls:?}"
        );
        let flush = calls.iter().position(|c| c == "syncfs results").unwrap();
        assert_eq!(
            calls[flush..],
            [
                "syncfs results",
                "fsync-dir results",
                "fsync-dir cache",
                &format!(
                    "fsync-dir {}",
                    dir.path().file_name().unwrap().to_string_lossy()
                ),
                // Only then is the journal emptied.
                "open-write journal",
                "truncate journal",
                "fsync journal",
            ]
        );
        drop(start);
        sim.power_loss(Cut::None);
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0, "dropped");
        let (cache, _, _) = deferred(dir.path(), "boot-b");
        assert_all_restored(&cache, &recs);
    }

    /// A graceful stop with many commit lines flushes their records in one
    /// `syncfs` too, before it removes the journal; a restart in the same
    /// boot whose first ADD makes a new journal (flushing the journal's
    /// dir, and with it that removal), then a power loss, keep every
    /// record.
    #[tokio::test]
    async fn a_batched_flush_at_a_graceful_stop_keeps_every_record() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimDisk::new(dir.path()));
        let first = on_sim(dir.path(), "boot-a", &sim).with_sync_fs_at(3);
        first.prepare().unwrap();
        let cache = first.cache.clone().unwrap();
        let mut recs = Vec::new();
        for k in 1..=3 {
            recs.push(committed_add(&first, &cache, &format!("c-{k}")).await);
        }
        let from = sim.calls().len();
        first.close();
        let calls = kinds(&sim, from);
        assert!(
            !calls.iter().any(|c| c.ends_with("<record>")),
            "no call per record: {calls:?}"
        );
        let flush = calls.iter().position(|c| c == "syncfs results");
        let removed = calls.iter().position(|c| c == "remove journal");
        assert!(flush.is_some() && flush < removed, "{calls:?}");
        drop(first);
        let second = on_sim(dir.path(), "boot-a", &sim);
        second.prepare().unwrap();
        recs.push(committed_add(&second, &cache, "c-4").await);
        drop(second);
        sim.power_loss(Cut::None);
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1,
            "the stop's removal of the journal is durable: only c-4's line"
        );
        let (cache, _, _) = deferred(dir.path(), "boot-b");
        assert_all_restored(&cache, &recs);
    }

    /// Below [`SYNC_FS_AT`] records, a start flushes file by file (a
    /// `syncfs` would write back and wait for everything else dirty on the
    /// file system); from it on, in one `syncfs`.
    #[tokio::test]
    async fn a_start_flushes_in_one_syncfs_from_the_threshold_on() {
        for (n, at, batched) in [(2, 3, false), (3, 3, true), (2, SYNC_FS_AT, false)] {
            let dir = tempfile::tempdir().unwrap();
            let (_, sim) = killed_with_records(dir.path(), n).await;
            let from = sim.calls().len();
            on_sim(dir.path(), "boot-a", &sim)
                .with_sync_fs_at(at)
                .prepare()
                .unwrap();
            let calls = kinds(&sim, from);
            let per_record = calls.iter().filter(|c| *c == "fsync <record>").count();
            let syncfs = calls.iter().filter(|c| c.starts_with("syncfs")).count();
            assert_eq!(
                (per_record, syncfs),
                if batched { (0, 1) } else { (n, 0) },
                "{n} records, threshold {at}: {calls:?}"
            );
        }
    }

    /// A start killed at the batched flush (or at any of the dirs' flushes
    /// after it), or whose `syncfs` failed (a write-back error: `EIO`,
    /// `ENOSPC`), has not dropped a line: the journal keeps every commit
    /// line (a failure rewrites it with them, `end` 0), and after a power
    /// loss that took the unflushed records, the next start (another boot)
    /// restores every one.
    #[tokio::test]
    async fn a_start_crashed_or_failed_at_the_batched_flush_keeps_the_lines() {
        // Where the start's flush calls are, found by a start on a copy.
        let dry = tempfile::tempdir().unwrap();
        let (_, sim) = killed_with_records(dry.path(), 3).await;
        let from = sim.calls().len();
        on_sim(dry.path(), "boot-a", &sim)
            .with_sync_fs_at(1)
            .prepare()
            .unwrap();
        let calls = kinds(&sim, from);
        let at = calls.iter().position(|c| c == "syncfs results").unwrap();
        for (point, crash) in (at..at + 4).flat_map(|p| [(p, true), (p, false)]) {
            let dir = tempfile::tempdir().unwrap();
            let (recs, sim) = killed_with_records(dir.path(), 3).await;
            let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
            let lines = committed_records(&std::fs::read(&journal).unwrap()).len();
            assert_eq!(lines, 3);
            if crash {
                sim.arm_crash(point);
            } else {
                sim.arm_fail(point);
            }
            let start = on_sim(dir.path(), "boot-a", &sim).with_sync_fs_at(1);
            let started = start.prepare();
            assert_eq!(
                started.is_err(),
                crash,
                "point {point}, crash {crash}: {started:?}"
            );
            drop(start);
            let what = format!("{} (crash: {crash})", calls[point]);
            assert_eq!(
                committed_records(&std::fs::read(&journal).unwrap()).len(),
                lines,
                "{what}: a commit line dropped"
            );
            sim.power_loss(Cut::None);
            assert_eq!(
                committed_records(&std::fs::read(&journal).unwrap()).len(),
                lines,
                "{what}: a commit line lost to the power loss"
            );
            let (cache, _, _) = deferred(dir.path(), "boot-b");
            assert_all_restored(&cache, &recs);
            assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0, "{what}");
        }
    }

    /// On a kernel whose `syncfs` does not report write-back errors
    /// (before 5.8: the storage answers `Unsupported`), the batched flush
    /// flushes file by file, with the same guarantee.
    #[tokio::test]
    async fn without_a_reporting_syncfs_the_batched_flush_goes_file_by_file() {
        let dir = tempfile::tempdir().unwrap();
        let (recs, sim) = killed_with_records(dir.path(), 3).await;
        sim.disable_sync_fs();
        let from = sim.calls().len();
        let start = on_sim(dir.path(), "boot-a", &sim).with_sync_fs_at(1);
        start.prepare().unwrap();
        let calls = kinds(&sim, from);
        assert_eq!(
            calls.iter().filter(|c| *c == "fsync <record>").count(),
            3,
            "{calls:?}"
        );
        assert_eq!(calls.iter().filter(|c| *c == "syncfs results").count(), 1);
        drop(start);
        sim.power_loss(Cut::None);
        let (cache, _, _) = deferred(dir.path(), "boot-b");
        assert_all_restored(&cache, &recs);
    }

    async fn intents_after_del(dir: &Path) -> bool {
        let (_, _, i) = deferred(dir, "boot-d");
        i.remove("n", "c-2", "eth0").await.unwrap();
        let (_, _, again) = deferred(dir, "boot-e");
        again.scan().unwrap().is_empty()
    }

    /// Found by an attack on the journal (a full state file system): an
    /// ADD whose commit line could not be appended was undone and answered
    /// with an error, but its `begin` stayed open in the journal; the same
    /// attachment ADDed again and answered, the next start rolled that
    /// `begin` back and deleted the answered attachment.
    #[tokio::test]
    async fn a_begin_left_open_by_a_failed_append_does_not_undo_a_later_add() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let p = open_add(&intents, &rt, br#"{"name":"n"}"#.to_vec()).await;
        // The end cannot be appended (as with ENOSPC): a descriptor that
        // refuses writes.
        intents.journal.lock().unwrap().file = Some(Arc::new(File::open(&journal).unwrap()));
        assert!(intents.finish(p).await.is_err());
        intents.journal.lock().unwrap().file = None;
        assert_eq!(
            open_names(dir.path()),
            ["n:c-1:eth0"],
            "the begin stays open"
        );
        // The same attachment ADDed again, and answered; then a crash.
        committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        let (_, _, after) = deferred(dir.path(), "boot-a");
        assert!(
            after.scan().unwrap().is_empty(),
            "the answered ADD is rolled back at start"
        );
    }
}
