//! The journal's I/O through the storage seam: every write, flush,
//! truncation, rename and removal of the journal and of the intent files
//! goes through the [`Storage`] of `cni_async::daemon` (the result cache's
//! seam too; [`Disk`] but in tests), so that a test can see each I/O
//! point, fail it, or crash at it on the simulated disk (`sim_disk.rs`).
//! Here: each I/O point of an ADD and of recovery failed in turn (as a
//! full disk fails it); `crash_points.rs` crashes them.

use super::sim_disk::SimDisk;
use super::*;

fn recorded(dir: &Path, fail_at: Option<usize>) -> (ResultCache, Arc<SimDisk>, Intents) {
    let (cache, _, intents) = deferred(dir, "boot-a");
    let mut sim = SimDisk::new(dir);
    if let Some(n) = fail_at {
        sim = sim.fail_at(n);
    }
    let sim = Arc::new(sim);
    (cache, sim.clone(), intents.with_storage(sim))
}

/// The calls made on `sim` from the `from`-th on: kind and file name (an
/// intent file's `<intent>`).
fn ops(sim: &SimDisk, from: usize) -> Vec<String> {
    sim.calls()[from..]
        .iter()
        .map(|c| {
            let name = if c.name.ends_with(".json") {
                "<intent>"
            } else {
                &c.name
            };
            format!("{} {name}", c.kind)
        })
        .collect()
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
        ops(&rec, 0),
        [
            "open-append journal",
            "fsync journal",
            "fsync-dir intents",
            "write journal",
            "fdatasync journal",
            "write journal",
            "fdatasync journal",
        ]
    );
    let from = rec.calls().len();
    let rt = RuntimeConf::new("c-2", "/run/netns/x", "eth0");
    let p = open_add(&intents, &rt, b"{}".to_vec()).await;
    intents.finish(p).await.unwrap();
    cache.remove("n", "c-1", "eth0").await.unwrap();
    intents.remove("n", "c-1", "eth0").await.unwrap();
    assert_eq!(
        ops(&rec, from),
        [
            "write journal",
            "fdatasync journal",
            "write journal",
            "write journal",
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
            Ok(BeginAnswer::Recorded(p)) => {
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
        let injected = rec.calls().len() > fail_at;
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
                if let IntentFile::Intent(p, _) = f {
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
        let rec = Arc::new(SimDisk::new(dir.path()).fail_at(fail_at));
        let crashed = Intents::new(dir.path())
            .with_cache(cache.clone(), true)
            .with_boot_id("boot-b")
            .with_storage(rec.clone())
            .prepare();
        let injected = rec.calls().len() > fail_at;
        assert_eq!(
            crashed.is_err(),
            injected,
            "point {fail_at}: {:?}",
            ops(&rec, 0)
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
    // The state dir and its parent flushed (every start: a killed one
    // may have made them), the intent file (created, written, flushed,
    // renamed, its dir flushed), then the journal opened, emptied and
    // flushed.
    assert_eq!(visited, 10, "the I/O points of recovery");
}

/// A regression: a non-root cnid whose state dir and cache dir sit in a dir it
/// may not open (search permission only: `EACCES` for the `open` an
/// `fsync` needs) failed its first start (the flush of the state dir it
/// made, into that dir) and every later one (the flush of the state dir's
/// entry there), and would have kept every commit line of its journal
/// (the flush of the cache dir's entry there, at each flush task and
/// stop). Now such a dir is warned about once and its flush skipped:
/// nothing better can be done for it. Runs as `nobody` when run as root,
/// in a process of its own (it cannot take its privileges back).
#[test]
fn a_parent_dir_a_non_root_cnid_cannot_open_fails_nothing_and_is_warned_about_once() {
    use std::os::unix::fs::PermissionsExt;
    if !cni_test_support::process::alone(
        "daemon::intents::tests::io_failures::a_parent_dir_a_non_root_cnid_cannot_open_fails_nothing_and_is_warned_about_once",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("parent");
    std::fs::create_dir(&parent).unwrap();
    if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::Uid::from_raw(65534);
        let nogroup = nix::unistd::Gid::from_raw(65534);
        for d in [tmp.path(), &parent] {
            nix::unistd::chown(d, Some(nobody), Some(nogroup)).unwrap();
        }
        nix::unistd::setgroups(&[]).unwrap();
        nix::unistd::setresgid(nogroup, nogroup, nogroup).unwrap();
        nix::unistd::setresuid(nobody, nobody, nobody).unwrap();
    }
    // Written and searched, not read: its owner cannot open it.
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o300)).unwrap();
    assert_eq!(
        File::open(&parent).unwrap_err().raw_os_error(),
        Some(nix::libc::EACCES)
    );
    let log = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Log(writer.clone()))
            .finish(),
    )
    .unwrap();
    let state = parent.join("state");
    let daemon = || {
        let cache = ResultCache::new(parent.join("cache"))
            .with_durable(false)
            .with_inline_io(true);
        let intents = Intents::new(&state)
            .with_cache(cache.clone(), true)
            .with_boot_id("boot-a");
        (cache, intents)
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for start in ["the first start (makes the state dir)", "a restart"] {
        let (cache, intents) = daemon();
        intents.prepare().unwrap_or_else(|e| panic!("{start}: {e}"));
        rt.block_on(committed_add(&intents, &cache, "c-1"));
        // The stop flushes the record and its dirs, then drops the line.
        intents.close();
        assert!(
            !state.join(INTENTS_DIR).join(JOURNAL).exists(),
            "{start}: the journal kept for a flush that cannot be made"
        );
        rt.block_on(cache.remove("n", "c-1", "eth0")).unwrap();
    }
    let log = String::from_utf8(log.lock().unwrap().clone()).unwrap();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot open this directory to flush it"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains(&parent.display().to_string()), "{log}");
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700)).unwrap();
}

/// A log writer into a shared buffer.
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `commit` whose flush failed is answered with an error, and the engine
/// deletes the attachment again (its DEL removes the cache record) without
/// a `gone` line: its commit line must not stand for the attachment any
/// more. It stayed among the lines the journal keeps, so the next flush
/// (another ADD's) or a rewrite made it durable, and after a reboot the
/// start restored the record of the ADD answered as failed and undone: the
/// attachment's next ADD was refused as already attached.
#[tokio::test]
async fn a_commit_whose_flush_failed_is_not_restored_after_a_reboot() {
    use super::sim_disk::Cut;
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimDisk::new(dir.path()));
    let intents = on_sim(dir.path(), "boot-a", &sim);
    intents.prepare().unwrap();
    let cache = cache_in(dir.path()).with_storage(sim.clone());
    let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
    let p = open_add(&intents, &rt, br#"{"name":"n"}"#.to_vec()).await;
    let rec = CacheRecord::new("n", &rt, br#"{"name":"n"}"#.to_vec(), None);
    cache.write(&rec).await.unwrap();
    // The commit line's write (call 0), then its `fdatasync`, which fails.
    sim.arm_fail(1);
    let err = intents.commit(p, &rec).await.unwrap_err();
    assert!(err.to_string().contains("fdatasync"), "{err}");
    // The engine's undo: a DEL of the attachment, which removes its record.
    cache.remove("n", "c-1", "eth0").await.unwrap();
    // Another ADD, answered: its flush covers every line before it.
    committed_add(&intents, &cache, "c-2").await;
    drop(intents);
    sim.power_loss(Cut::None);
    let after = on_sim(dir.path(), "boot-b", &sim);
    after.prepare().unwrap();
    assert!(
        !cache.path("n", "c-1", "eth0").unwrap().exists(),
        "the record of an ADD answered as failed came back after a reboot"
    );
    assert!(cache.path("n", "c-2", "eth0").unwrap().exists());
}

/// A `begin` whose flush failed is answered with an I/O error before any
/// plugin runs, and is off the open set; its line stayed in the journal
/// without an `end`, so a later flush (another ADD's) made it durable, and
/// the next start, after a `kill -9` as after a power loss, took it for an
/// ADD interrupted mid-chain and ran a DEL of an attachment no plugin ever
/// made (the container's namespace passed to it, whatever holds that path
/// by then). It is ended now, in the file, before the error is answered.
#[tokio::test]
async fn a_begin_whose_flush_failed_is_not_rolled_back_at_the_next_start() {
    use super::sim_disk::Cut;
    for power_loss in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimDisk::new(dir.path()));
        let intents = on_sim(dir.path(), "boot-a", &sim);
        intents.prepare().unwrap();
        let cache = cache_in(dir.path()).with_storage(sim.clone());
        // The journal exists: the `begin`'s write (call 0), then its
        // `fdatasync`, which fails.
        committed_add(&intents, &cache, "c-0").await;
        sim.arm_fail(1);
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let failed = intents
            .begin(&Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec()))
            .await;
        assert!(
            matches!(&failed, Err(BeginError::Journal(e)) if e.to_string().contains("fdatasync")),
            "{failed:?}"
        );
        // Another ADD, answered: its flush covers every line before it.
        committed_add(&intents, &cache, "c-2").await;
        drop(intents);
        if power_loss {
            sim.power_loss(Cut::None);
        }
        let after = on_sim(dir.path(), "boot-a", &sim);
        after.prepare().unwrap();
        assert!(
            after.scan().unwrap().is_empty(),
            "power loss {power_loss}: the next start rolls back an ADD answered as failed before any plugin ran"
        );
    }
}
