//! The journal's I/O through the storage seam: every write, flush,
//! truncation, rename and removal of the journal and of the intent files
//! goes through the [`Storage`] of `cni_async::storage` (the result cache's
//! seam too; [`Disk`] but in tests), so that a test can see each I/O
//! point, fail it, or crash at it on the simulated disk (`simdisk.rs`).
//! Here: each I/O point of an ADD and of recovery failed in turn (as a
//! full disk fails it); `crashes.rs` crashes them.

use super::simdisk::SimDisk;
use super::testing::*;
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
