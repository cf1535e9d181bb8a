//! When records become durable. A store with flushes makes each record
//! durable as it writes it ([`Store::write_file`]); one without (cnid's)
//! owes the flushes later, before its caller forgets which records are not
//! durable yet: file by file ([`Store::sync_records`]) or in one `syncfs`
//! of `results/` ([`Store::sync_records_at_once`]). Either also flushes
//! the dirs' own entries: a record flushed into a dir that is not durable
//! itself is lost with the dir at a power loss.
//!
//! # Caveats
//! - `syncfs` writes back *everything* dirty on that file system, other
//!   programs' data too, and waits for it; where the kernel would not
//!   report a failed write-back (before Linux 5.8) it is not used.

use super::{Store, durable, durable_err, io_err};
use crate::error::Error;

impl Store {
    /// See [`crate::cache::ResultCache::sync_records_blocking`].
    pub(crate) fn sync_records<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> Result<usize, Error> {
        let mut n = 0;
        for names in attachments {
            let path = self.path(names)?;
            if durable::sync_file(&*self.storage, &path).map_err(durable_err)? {
                n += 1;
            }
        }
        if n > 0 {
            let results = self.results_dir();
            durable::sync_dir(&*self.storage, &results).map_err(durable_err)?;
            durable::sync_entries_once(&*self.storage, &results, &self.dirs)
                .map_err(durable_err)?;
        }
        Ok(n)
    }

    /// See [`crate::cache::ResultCache::sync_records_at_once_blocking`].
    /// Names are checked as the file-by-file flush checks them.
    pub(crate) fn sync_records_at_once<'a>(
        &self,
        attachments: impl IntoIterator<Item = (&'a str, &'a str, &'a str)> + Clone,
    ) -> Result<bool, Error> {
        for names in attachments.clone() {
            self.path(names)?;
        }
        let results = self.results_dir();
        // A `results/` that is a link to a dir is flushed where it points:
        // the storage opens no link.
        let target = match std::fs::symlink_metadata(&results) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(&results) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(io_err(&results, "resolve the link", e)),
            },
            _ => results.clone(),
        };
        match self.storage.sync_fs(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                return self.sync_records(attachments).map(|n| n > 0);
            }
            Err(e) => return Err(io_err(&results, "syncfs", e)),
        }
        // The dirs' own entries in their parents (on another file system
        // when `results/` or the cache dir is a mount point).
        let above = self.dir.parent().filter(|p| !p.as_os_str().is_empty());
        for d in [results.as_path(), self.dir.as_path()]
            .into_iter()
            .chain(above)
        {
            durable::sync_dir(&*self.storage, d).map_err(durable_err)?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::traced::Traced;
    use cni_core::cache::CacheRecord;
    use std::path::Path;
    use std::sync::Arc;

    /// The flushes of a durable record write, each needed and none twice.
    /// The first one, which creates `results/`, also flushes the cache dir
    /// (else a power loss can take `results/` and the record with it) and
    /// the cache dir's parent (the cache dir may have been found, left
    /// unflushed by a killed writer); the next ones flush the record's data
    /// and `results/` after the rename, nothing more.
    #[test]
    fn record_writes_flush_what_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let disk = Arc::new(Traced::default());
        let cache = Store::new(tmp.path().to_owned()).with_storage(disk.clone());
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let results = cache.results_dir();
        let above = tmp.path().parent().unwrap().display().to_string();
        disk.take();
        cache.write_record(&rec, true).unwrap();
        assert_eq!(
            flushes(tmp.path(), disk.take()),
            [
                "fsync-dir CACHE".to_owned(),
                format!("fsync-dir {above}"),
                "fdatasync CACHE/results/.n-c1-eth0.tmp".to_owned(),
                "fsync-dir CACHE/results".to_owned(),
            ]
        );
        assert!(results.join("n-c1-eth0").is_file());
        cache.write_record(&rec, true).unwrap();
        assert_eq!(
            flushes(tmp.path(), disk.take()),
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

    /// Defect: a durable write into a `results/` it found (made by a
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
        let disk = Arc::new(Traced::default());
        let dir = tmp.path().join("cache");
        let rt = |cid: &str| cni_core::RuntimeConf::new(cid, "/proc/self/ns/net", "eth0");
        let rec = |cid: &str| CacheRecord::new("n", &rt(cid), b"{}".to_vec(), None);
        let cache = Store::new(dir.clone()).with_storage(disk.clone());
        // Made by a writer without flushes.
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        let clone = cache.clone();
        let top = tmp.path().display().to_string();
        disk.take();
        cache.write_record(&rec("c1"), true).unwrap();
        assert_eq!(
            flushes(&dir, disk.take()),
            [
                format!("fsync-dir {}", std::env::temp_dir().display()),
                format!("fsync-dir {top}"),
                "fsync-dir CACHE".to_owned(),
                "fdatasync CACHE/results/.n-c1-eth0.tmp".to_owned(),
                "fsync-dir CACHE/results".to_owned(),
            ],
            "the first write into a results/ found there"
        );
        clone.write_record(&rec("c2"), true).unwrap();
        let next = [
            "fdatasync CACHE/results/.n-c2-eth0.tmp",
            "fsync-dir CACHE/results",
        ];
        assert_eq!(flushes(&dir, disk.take()), next, "a clone's");
        // Another cache (another process): once more.
        Store::new(dir.clone())
            .with_storage(disk.clone())
            .write_record(&rec("c2"), true)
            .unwrap();
        assert_eq!(flushes(&dir, disk.take()).len(), 5);
        // `results/` made again (by a writer without flushes): once more.
        std::fs::remove_dir_all(cache.results_dir()).unwrap();
        std::fs::create_dir(cache.results_dir()).unwrap();
        cache.write_record(&rec("c2"), true).unwrap();
        assert_eq!(flushes(&dir, disk.take()).len(), 5);
        cache.write_record(&rec("c2"), true).unwrap();
        assert_eq!(flushes(&dir, disk.take()), next);
        // A cache that flushes later does the same once per `results/`.
        let mut later = Store::new(dir.clone()).with_storage(disk.clone());
        later.durable = false;
        for k in 0..2 {
            let path = later.path(("n", "c3", "eth0")).unwrap();
            std::fs::write(path, rec("c3").encode()).unwrap();
            later.sync_records([("n", "c3", "eth0")]).unwrap();
            let want = if k == 0 { 5 } else { 2 };
            assert_eq!(flushes(&dir, disk.take()).len(), want, "{k}");
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
        let disk = Arc::new(Traced::default());
        let dir = fs.dir.path().join("cache");
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let cache = Store::new(dir.clone()).with_storage(disk.clone());
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        disk.take();
        cache.write_record(&rec, true).unwrap();
        // Not the temp dir the file system is mounted on.
        assert_eq!(flushes(&dir, disk.take()).len(), 4, "found");
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
        cache.write_record(&rec, true).unwrap();
        assert_eq!(
            flushes(&dir, disk.take()),
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
        let disk = Arc::new(Traced::default());
        let rt = cni_core::RuntimeConf::new("c1", "/proc/self/ns/net", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let cache = Store::new(dir.to_owned()).with_storage(disk.clone());
        std::fs::create_dir_all(cache.results_dir()).unwrap();
        disk.take();
        cache.write_record(&rec, true).unwrap();
        disk.take()
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
}
