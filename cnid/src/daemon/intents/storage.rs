//! The storage seam: every write, flush, truncation, rename and removal of
//! the journal and of the intent files goes through one [`Storage`], so
//! that a test can see each I/O point, fail it, or stand the
//! simulated disk (`simdisk.rs`) behind it. [`Disk`] is the real one.
//!
//! Invariants kept here: the real calls never follow a link at the last
//! component and create files 0600; [`Storage::write_atomic`] is
//! [`durable::write_atomic`] (temp file, `fsync`, `rename`, `fsync` of the
//! dir), durable once it returns. Not behind the seam yet: reads, the
//! start-only removal of temp files and moving corrupt files aside
//! (`files.rs`), and the result cache's own I/O (`cni_async`).

use super::*;

/// The I/O calls of the journal and the intent files. Each is
/// `#[track_caller]` (a hidden argument, no I/O) so that the simulated disk
/// (`simdisk.rs`) can name the call site it crashed at.
pub(crate) trait Storage: std::fmt::Debug + Send + Sync {
    /// Opens `path` for appending (`O_APPEND`), created 0600 when missing.
    #[track_caller]
    fn open_append(&self, path: &Path) -> io::Result<File>;
    /// Opens an existing `path` for writing (to empty it).
    #[track_caller]
    fn open_write(&self, path: &Path) -> io::Result<File>;
    /// Appends `bytes` with one `write`.
    #[track_caller]
    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()>;
    /// Cuts the file to `len` bytes.
    #[track_caller]
    fn truncate(&self, file: &File, len: u64) -> io::Result<()>;
    /// `fdatasync`.
    #[track_caller]
    fn sync_data(&self, file: &File) -> io::Result<()>;
    /// `fsync`.
    #[track_caller]
    fn sync_all(&self, file: &File) -> io::Result<()>;
    /// `fsync` of a dir: its creations and renames become durable.
    #[track_caller]
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Replaces `path` with `bytes` atomically and durably (mode 0600).
    #[track_caller]
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Removes a file (not flushed).
    #[track_caller]
    fn remove(&self, path: &Path) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Disk;

pub(super) fn no_follow() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC);
    o
}

impl Storage for Disk {
    fn open_append(&self, path: &Path) -> io::Result<File> {
        no_follow().append(true).create(true).mode(0o600).open(path)
    }

    fn open_write(&self, path: &Path) -> io::Result<File> {
        no_follow().write(true).open(path)
    }

    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        (&*file).write_all(bytes)
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn sync_all(&self, file: &File) -> io::Result<()> {
        file.sync_all()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        Ok(durable::sync_dir(dir)?)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        Ok(durable::write_atomic(path, bytes, 0o600, true)?)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
}

/// A [`Storage`] for tests: the real disk, each call recorded (`op name`,
/// the file's name), and the call numbered `fail_at` (from 0) failing
/// with `ENOSPC` without doing anything.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Recording {
    pub(crate) calls: Mutex<Vec<String>>,
    pub(crate) fail_at: Option<usize>,
}

#[cfg(test)]
impl Recording {
    fn call(&self, op: &str, what: &str) -> io::Result<()> {
        let mut calls = self.calls.lock().unwrap();
        let n = calls.len();
        calls.push(format!("{op} {what}"));
        if self.fail_at == Some(n) {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
        }
        Ok(())
    }

    fn name(path: &Path) -> String {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.ends_with(".json") {
            "<intent>".to_owned()
        } else {
            name.into_owned()
        }
    }

    pub(crate) fn ops(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[cfg(test)]
impl Storage for Recording {
    fn open_append(&self, path: &Path) -> io::Result<File> {
        self.call("open-append", &Self::name(path))?;
        Disk.open_append(path)
    }

    fn open_write(&self, path: &Path) -> io::Result<File> {
        self.call("open-write", &Self::name(path))?;
        Disk.open_write(path)
    }

    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        self.call("append", "journal")?;
        Disk.append(file, bytes)
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        self.call("truncate", "journal")?;
        Disk.truncate(file, len)
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.call("fdatasync", "journal")?;
        Disk.sync_data(file)
    }

    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.call("fsync", "journal")?;
        Disk.sync_all(file)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.call("fsync-dir", &Self::name(dir))?;
        Disk.sync_dir(dir)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.call("write-atomic", &Self::name(path))?;
        Disk.write_atomic(path, bytes)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.call("remove", &Self::name(path))?;
        Disk.remove(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::intents::testing::*;

    fn recorded(dir: &Path, fail_at: Option<usize>) -> (ResultCache, Arc<Recording>, Intents) {
        let (cache, _, intents) = deferred(dir, "boot-a");
        let rec = Arc::new(Recording {
            fail_at,
            ..Default::default()
        });
        (cache, rec.clone(), intents.with_storage(rec))
    }

    /// The I/O points of an ADD through the journal, in order: the
    /// journal opened and made durable at the first record, the `begin`
    /// appended and flushed, the commit line appended and flushed; a
    /// rolled-back ADD's `end` appended only; a DEL's `gone` line appended
    /// only.
    #[tokio::test]
    async fn an_add_goes_through_the_seam_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, rec, intents) = recorded(dir.path(), None);
        committed_add(&intents, &cache, "c-1").await;
        assert_eq!(
            rec.ops(),
            [
                "open-append journal",
                "fsync journal",
                "fsync-dir intents",
                "append journal",
                "fdatasync journal",
                "append journal",
                "fdatasync journal",
            ]
        );
        rec.calls.lock().unwrap().clear();
        let rt = RuntimeConf::new("c-2", "/run/netns/x", "eth0");
        let p = open_add(&intents, &rt, b"{}".to_vec()).await;
        intents.finish(p).await.unwrap();
        cache.remove("n", "c-1", "eth0").await.unwrap();
        intents.remove("n", "c-1", "eth0").await.unwrap();
        assert_eq!(
            rec.ops(),
            [
                "append journal",
                "fdatasync journal",
                "append journal",
                "append journal",
                "remove <intent>",
            ]
        );
    }

    /// Every I/O point of an answered ADD failed in turn (as a full disk
    /// fails it): the ADD is answered only when every point succeeded,
    /// and a restart after it (in the same boot, and after a reboot that
    /// lost the cache file) never rolls back an answered ADD and keeps its
    /// result; one that was not answered leaves at most its intent, which
    /// the start DELs.
    #[tokio::test]
    async fn every_io_point_of_an_answered_add_failed_in_turn() {
        let mut visited = 0;
        for fail_at in 0.. {
            let dir = tempfile::tempdir().unwrap();
            let (cache, rec, intents) = recorded(dir.path(), Some(fail_at));
            let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
            let i = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
            let answered = match intents.begin(&i).await {
                Ok(Begun::Recorded(p)) => {
                    let r = CacheRecord::new(
                        "n",
                        &rt,
                        i.config.clone(),
                        Some(json!({"cniVersion": "1.1.0"})),
                    );
                    cache.write(&r).await.unwrap();
                    match intents.commit(p, &r).await {
                        Ok(()) => Some(r),
                        Err(_) => {
                            // The engine undoes it: the DEL removes the record.
                            cache.remove("n", "c-1", "eth0").await.unwrap();
                            None
                        }
                    }
                }
                Ok(other) => panic!("{other:?}"),
                Err(_) => None,
            };
            let injected = rec.ops().len() > fail_at;
            drop(intents);
            let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
            let bytes = std::fs::read(&journal).unwrap_or_default();
            for boot in ["boot-a", "boot-b"] {
                std::fs::write(&journal, &bytes).unwrap();
                let path = cache.path("n", "c-1", "eth0").unwrap();
                if boot == "boot-b" {
                    let _ = std::fs::remove_file(&path);
                }
                let (_, _, after) = deferred(dir.path(), boot);
                let intents = after.scan().unwrap();
                match &answered {
                    Some(r) => {
                        assert!(
                            intents.is_empty(),
                            "point {fail_at}, {boot}: an answered ADD is rolled back"
                        );
                        assert_eq!(
                            std::fs::read(&path).unwrap(),
                            r.encode(),
                            "point {fail_at}, {boot}"
                        );
                    }
                    None => assert!(intents.len() <= 1, "point {fail_at}, {boot}"),
                }
                for f in intents {
                    if let Found::Intent(p, _) = f {
                        std::fs::remove_file(p).unwrap();
                    }
                }
            }
            if !injected {
                assert!(answered.is_some(), "no failure injected, yet not answered");
                break;
            }
            assert!(
                answered.is_none(),
                "point {fail_at} failed, yet the ADD was answered"
            );
            visited += 1;
        }
        assert_eq!(visited, 7, "the I/O points of an answered ADD");
    }

    /// Recovery is restartable at every I/O point: a start that finds an
    /// open `begin` and a commit line of another boot, crashed at each of
    /// its points in turn (the point and everything after it not done),
    /// then started again, converges: one intent file for the open ADD,
    /// the record restored, the journal empty.
    #[tokio::test]
    async fn every_io_point_of_recovery_failed_in_turn_converges() {
        let mut visited = 0;
        for fail_at in 0.. {
            let dir = tempfile::tempdir().unwrap();
            let (cache, journal, intents) = deferred(dir.path(), "boot-a");
            let r = committed_add(&intents, &cache, "c-1").await;
            let rt = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
            open_add(&intents, &rt, b"{}".to_vec()).await;
            drop(intents);
            let path = cache.path("n", "c-1", "eth0").unwrap();
            std::fs::remove_file(&path).unwrap();
            let rec = Arc::new(Recording {
                fail_at: Some(fail_at),
                ..Default::default()
            });
            let crashed = Intents::new(dir.path())
                .with_cache(cache.clone(), true)
                .with_boot_id("boot-b")
                .with_storage(rec.clone())
                .prepare();
            let injected = rec.ops().len() > fail_at;
            assert_eq!(
                crashed.is_err(),
                injected,
                "point {fail_at}: {:?}",
                rec.ops()
            );
            let (_, _, after) = deferred(dir.path(), "boot-b");
            let found = after.scan().unwrap();
            assert_eq!(found.len(), 1, "point {fail_at}: {found:?}");
            assert_eq!(std::fs::read(&path).unwrap(), r.encode(), "point {fail_at}");
            assert_eq!(
                std::fs::metadata(&journal).unwrap().len(),
                0,
                "point {fail_at}"
            );
            if !injected {
                break;
            }
            visited += 1;
        }
        // The intent file, then the journal opened, emptied and flushed.
        assert_eq!(visited, 4, "the I/O points of recovery");
    }
}
