//! Following `results/` from one scan to the next, whoever writes the
//! records (this process, cnitool, a libcni runtime): each scan reads only
//! what changed since the last one ([`RecordScan`]), with the one reader
//! of listed records (`listed.rs`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::listed::{AttachmentKey, ScannedRecord, names_container, read_named};
#[cfg(feature = "watch")]
use super::watch;
use super::{Store, io_err};
use crate::error::Error;

/// Follows the records in `results/` from one call of [`Store::scan`] to
/// the next, whoever writes them (this process, cnitool, a libcni
/// runtime): each call reads only the files
/// that are new or were replaced since the last one, and reports the
/// attachments whose files went away. It also keeps the file names in
/// byte order, for paging ([`RecordScan::names_after`], [`Store::page_from`]).
/// The owner index (`owners.rs`) and the stale scanner each follow the
/// cache with one.
///
/// How it finds what changed:
/// - [`RecordScan::default`]: a listing of `results/` at every scan (by
///   file name, inode and change time: a `stat` per file), so a scan costs
///   a listing and a `stat` of every record.
/// - [`RecordScan::watched`] (feature `watch`): an inotify watch on
///   `results/` names the entries changed since the last scan, and a scan
///   looks at those only (a `stat` and a read each), so it costs the
///   number of changes, whatever the number of records
///   ([`Store::scan_few`] reads a few on the calling thread). The dir is listed whole at the
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
pub(crate) struct RecordScan {
    seen: std::collections::BTreeMap<std::ffi::OsString, (Stamp, Option<AttachmentKey>)>,
    /// Full listings of `results/` so far.
    listings: u64,
    #[cfg(feature = "watch")]
    watch: Option<watch::ResultsWatch>,
}

impl RecordScan {
    /// A scan that follows `results/` with inotify (see the type's docs).
    #[cfg(feature = "watch")]
    pub(crate) fn watched() -> Self {
        RecordScan {
            watch: Some(watch::ResultsWatch::new()),
            ..RecordScan::default()
        }
    }

    /// How many times a scan listed `results/` whole.
    pub(crate) fn listings(&self) -> u64 {
        self.listings
    }

    /// Up to `n` file names (in byte order) of the last scan sorting after
    /// `after`, optionally only those that may be `container_id`'s (a
    /// pre-filter on the name; the record's field decides): for
    /// [`Store::page_from`].
    pub(crate) fn names_after(
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

    /// A listing failed: `e`, and the next scan lists again (the watch set
    /// up for this one reports only what changes after it).
    fn failed(&mut self, e: Error) -> Error {
        #[cfg(feature = "watch")]
        if let Some(w) = self.watch.as_mut() {
            w.lose();
        }
        e
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
            let before = self.seen.remove(&name).and_then(|(_, k)| k);
            let stamp = match std::fs::symlink_metadata(results.join(&name)) {
                Ok(m) => stamp(&m),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    changes.removed.extend(before);
                    continue;
                }
                // There, but not for us to read: as a listing would have it.
                Err(_) => (0, 0, 0),
            };
            let key = changes.read_again(results, &name, before);
            self.seen.insert(name, (stamp, key));
        }
        self.retry_later(&mut changes);
        changes
    }

    /// The files of `changes` that could not be read this time are read
    /// again at the next scan: given back to the watch, and remembered
    /// with a stamp no file has, which a listing finds changed.
    fn retry_later(&mut self, changes: &mut ScanChanges) {
        for name in std::mem::take(&mut changes.retry) {
            if let Some((stamp, _)) = self.seen.get_mut(&name) {
                *stamp = (0, i64::MIN, 0);
            }
            #[cfg(feature = "watch")]
            if let Some(w) = self.watch.as_mut() {
                w.retry(name);
            }
        }
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

/// What changed in the cache since the previous scan.
#[derive(Debug, Default)]
pub(crate) struct ScanChanges {
    /// Records of files new or replaced since the previous scan.
    pub(crate) added: Vec<ScannedRecord>,
    /// Attachments whose record file is gone (or was replaced: its new
    /// record, if usable, is in `added`).
    pub(crate) removed: Vec<AttachmentKey>,
    /// Those of `removed` whose file is still there but now reads as no
    /// record (emptied by a writer killed mid-rewrite, half written,
    /// damaged past its names): no proof that the attachment left, so the
    /// owner index keeps its slot. The scan keeps the key for the name,
    /// and reports it removed again once the file goes.
    pub(crate) unreadable: Vec<AttachmentKey>,
    /// The first error of a file that could not be read this time (no
    /// descriptor left, an I/O error): the scan is no proof about it, and
    /// the next scan reads it again (its key, if any, is in `unreadable`).
    pub(crate) unread: Option<Error>,
    /// The names of those files.
    retry: Vec<std::ffi::OsString>,
}

impl ScanChanges {
    /// Reads the changed file `name` of `results`, which held `before`'s
    /// record at the last scan; the key the scan keeps for the name.
    fn read_again(
        &mut self,
        results: &Path,
        name: &std::ffi::OsStr,
        before: Option<AttachmentKey>,
    ) -> Option<AttachmentKey> {
        let rec = match name.to_str().map(|n| read_named(results, n)) {
            Some(Ok(rec)) => rec,
            Some(Err(e)) => {
                self.unread.get_or_insert(e);
                self.retry.push(name.to_owned());
                None
            }
            None => None,
        };
        let Some(rec) = rec else {
            self.unreadable.extend(before.clone());
            self.removed.extend(before.clone());
            return before;
        };
        self.removed.extend(before);
        let key = rec.key();
        self.added.push(rec);
        Some(key)
    }
}

impl Store {
    /// See [`RecordScan`]. Blocking (a directory listing, or with a live
    /// watch only the entries it reported, plus a read of each new
    /// record).
    pub(crate) fn scan(&self, scan: &mut RecordScan) -> Result<ScanChanges, Error> {
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
                    removed,
                    ..ScanChanges::default()
                });
            }
            Err(e) => return Err(scan.failed(io_err(&results, "read directory", e))),
        };
        // The whole listing before anything changes: an entry the listing
        // cannot give (an I/O error midway) is not taken for a removal.
        let entries = match entries.collect::<Result<Vec<_>, _>>() {
            Ok(entries) => entries,
            Err(e) => return Err(scan.failed(io_err(&results, "read directory", e))),
        };
        let mut changes = ScanChanges::default();
        let mut now = std::collections::BTreeMap::new();
        for entry in entries {
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
            let key = match scan.seen.remove(&name) {
                Some((old, key)) if old == stamp && !reread_all => key,
                before => changes.read_again(&results, &name, before.and_then(|(_, k)| k)),
            };
            now.insert(name, (stamp, key));
        }
        changes.removed.extend(
            std::mem::take(&mut scan.seen)
                .into_values()
                .filter_map(|(_, k)| k),
        );
        scan.seen = now;
        scan.retry_later(&mut changes);
        Ok(changes)
    }

    /// Largest record file [`Store::scan_few`] reads; a bigger one
    /// leaves the scan to [`Store::scan`]. cnid's own
    /// records are a few KiB.
    pub(crate) const SCAN_FEW_MAX_BYTES: u64 = 64 * 1024;

    /// [`Store::scan`] when the watch makes it a few system
    /// calls, for a caller that would otherwise hand it to the blocking
    /// pool: the watch is live and reports at most `max` names changed
    /// since the last scan (each one a `stat` and a read of one record
    /// file, as cnid's own record writes on its workers are). `None`
    /// (nothing scanned) otherwise: no live watch, or more changes; the
    /// changes then stay for the next [`Store::scan`]. Also
    /// `None` when one of the changed files is bigger than
    /// [`Store::SCAN_FEW_MAX_BYTES`] (its read would hold the thread).
    ///
    /// A file that grows past the limit between the `stat` and the read is
    /// read whole anyway (a writer racing the scan, rare).
    /// cnid's admissions: a request's own ADD or DEL changes a name or
    /// two, which the next admission's refresh reads here instead of
    /// waiting for a pool thread.
    pub(crate) fn scan_few(&self, scan: &mut RecordScan, max: usize) -> Option<ScanChanges> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_core::cache as record;

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

    /// a FIFO (no writer) and a symbolic link to an endless
    /// device, named as records, among the few changes `scan_few` reads on
    /// an async worker: neither is opened for long nor read (the open
    /// does not wait for a writer, the link is not followed), nothing is
    /// added, and the real record beside them is.
    #[cfg(feature = "watch")]
    #[test]
    fn a_fifo_or_a_link_among_few_changes_is_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Store::new(tmp.path().to_owned());
        put_record(tmp.path(), "c0", "/run/netns/n0", 0);
        let mut scan = RecordScan::watched();
        cache.scan(&mut scan).unwrap();
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

    /// `scan_few` (which cnid calls on an async worker) read a
    /// changed record whole whatever its size: another tool's record of
    /// megabytes held the worker for the read and parse. A file bigger
    /// than [`Store::SCAN_FEW_MAX_BYTES`] among the changes leaves
    /// them all to `scan_blocking`, which then reads them.
    #[cfg(feature = "watch")]
    #[test]
    fn a_huge_changed_record_is_left_to_the_blocking_scan() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Store::new(tmp.path().to_owned());
        put_record(tmp.path(), "c0", "/run/netns/n0", 0);
        let mut scan = RecordScan::watched();
        cache.scan(&mut scan).unwrap();
        put_record(tmp.path(), "small", "/run/netns/s", 0);
        put_record(
            tmp.path(),
            "huge",
            "/run/netns/h",
            Store::SCAN_FEW_MAX_BYTES as usize + 1,
        );
        assert!(
            cache.scan_few(&mut scan, 8).is_none(),
            "a record over the inline limit read on the caller's thread"
        );
        let changes = cache.scan(&mut scan).unwrap();
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
}
