//! Crash-point enumeration (issue 21, item 3) at the level of the storage
//! seam: each operation of the journal and of the result cache runs on the
//! simulated disk ([`SimDisk`], behind both), is crashed at each of its
//! I/O points in turn, and the daemon's start is run from what that
//! leaves, twice: as after a `kill -9` (the same boot, every write kept)
//! and as after a power loss (another boot, only what was flushed:
//! unflushed appends lost, cut short or kept, unflushed names and dirs
//! lost, the cache's records included). Then the runtime's DELs follow,
//! and a new ADD of each attachment.
//!
//! The operations: an ADD answered (the first start on a fresh state dir
//! and the first ADD), one rolled back (not answered), one whose rollback
//! failed (its intent kept), a DEL, a CHECK, a GC's deletion, the flush task, a
//! compaction, a graceful stop, start-up itself (recovery restoring the
//! records a power loss took and flushing them in one `syncfs`, as a
//! start with many records does; removing earlier crashes' temp files,
//! moving a corrupt intent aside, and keeping a record it cannot
//! restore, flushing file by file), and an ADD and a graceful stop of a daemon whose start kept
//! such a record (issue 21's defects 1 and 2), each also with an `ENOSPC`
//! at each point followed by a crash at each of the next three (at each
//! later one in `make soak`). The daemon's part is modelled as the engine
//! makes it, the library's as `cni_async` makes it: an ADD takes the
//! attachment's lock (a lock file), runs the plugins, writes the record
//! (not flushed) and releases the lock (removing its file when no record
//! was written); a DEL takes the lock and reads the record, runs the
//! plugins, removes the record and the lock file. The plugins are the
//! chain `[alloc, gate]`: `alloc`'s allocations outlive every crash (the
//! worst case for leaks).
//!
//! Checked after each start:
//! - an answered ADD keeps its cached result, byte for byte, and the
//!   runtime's DEL gets it (`prevResult`);
//! - every allocation has a cache record or an intent (which the start
//!   DELs): after the DELs, none is left;
//! - a record removed by an answered DEL or GC is not back after a
//!   same-boot start; after a power loss it may be (the window of
//!   `docs/reliability.md`), but after the runtime's DEL a new ADD of the
//!   attachment is accepted (as is every other);
//! - nothing grows: after the DELs, a graceful stop and the sweep of dead
//!   writers' temp files, the intents dir and the cache's `results/` and
//!   `locks/` hold no file (no journal, intent, record, temp or lock
//!   file), a corrupt file is moved aside once, and a start crashed at the
//!   same point again and again leaves no more files than the first
//!   starts did.
//!
//! And every call site of [`Storage`] in the journal's code and in the
//! cache's (`cni-async/src/cache.rs`), of its methods and of
//! `cni_async::durable`'s functions over it, is crashed at by some
//! operation: a new one cannot slip in untested.
//!
//! A killed daemon's temp files carry its pid, which the test shares:
//! [`abandon_cache_temps`] gives them a dead writer's pid and an old date
//! where the model lets time pass (the sweep 5 minutes after a start;
//! starts that far apart).
//! `CNID_CRASH_EXHAUSTIVE=1` (`make soak`) runs the operations with more
//! attachments and open ADDs, every crash after an `ENOSPC` with the four
//! kinds of restart, and kills the first start after each crash at each of
//! its own points in turn before the start that is checked (crash points
//! times start points: minutes, not seconds).

use super::simdisk::{Cut, SimDisk};
use super::testing::*;
use super::*;
use std::collections::{BTreeMap, BTreeSet};

const BOOT: &str = "boot-a";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    AddAnswered,
    AddRolledBack,
    AddNotUndone,
    Del,
    Check,
    Gc,
    Flush,
    Compaction,
    Close,
    Recovery,
    RecoveryKeeps,
    AddAfterKept,
    StopAfterKept,
}

impl Op {
    const ALL: [Op; 13] = [
        Op::AddAnswered,
        Op::AddRolledBack,
        Op::AddNotUndone,
        Op::Del,
        Op::Check,
        Op::Gc,
        Op::Flush,
        Op::Compaction,
        Op::Close,
        Op::Recovery,
        Op::RecoveryKeeps,
        Op::AddAfterKept,
        Op::StopAfterKept,
    ];
}

/// What the plugin `gate` does in an ADD.
#[derive(Debug, Clone, Copy)]
enum Gate {
    /// Succeeds: the ADD is committed.
    Ok,
    /// Fails; the rollback (`alloc`'s DEL) succeeds.
    Fails,
    /// Fails, and so does the rollback: `alloc`'s allocation stays.
    FailsNotUndone,
}

/// What outlives the daemon: the allocations of the plugin `alloc`, and
/// what the runtime was told.
#[derive(Debug, Default)]
struct World {
    alloc: BTreeSet<String>,
    /// Answered ADDs not DELed since: their records' bytes.
    answered: BTreeMap<String, Vec<u8>>,
    /// Answered DELs and GC deletions.
    deleted: BTreeSet<String>,
    /// Every attachment the runtime ADDed, answered or not: it DELs them
    /// after a failure or a reboot.
    tried: BTreeSet<String>,
}

fn rt(cid: &str) -> RuntimeConf {
    RuntimeConf::new(cid, "/run/netns/x", "eth0")
}

/// The daemon's start: recovery ([`Intents::prepare`]), then what the
/// engine's `recover` does before its DELs (the temp files of killed
/// intent writes removed, the intent files read, corrupt ones moved
/// aside).
fn start(i: &Intents) -> io::Result<Vec<IntentFile>> {
    i.prepare()?;
    i.remove_leftovers()?;
    i.scan()
}

/// How long the model's lock calls may wait (no one else holds a lock).
const WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// An ADD as the engine makes it ([`super::super::engine`]'s
/// `add_result`), with the chain `[alloc, gate]`, and the library's part
/// of it as `cni_async` makes it: the attachment's lock (a lock file), the
/// plugins, the record written (not flushed), the lock released (its
/// file removed when no record was written).
async fn add(i: &Intents, sim: &SimDisk, w: &mut World, cid: &str, gate: Gate) {
    let cache = i.cache.clone().unwrap();
    let rt = rt(cid);
    let intent = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
    w.tried.insert(cid.to_owned());
    let p = match i.begin(&intent).await {
        Ok(BeginAnswer::Recorded(p)) => p,
        Ok(other) => panic!("{cid}: {other:?}"),
        Err(_) => return, // answered with an error; no plugin ran
    };
    let lock = match cache.lock_unused("n", cid, "eth0", WAIT).await {
        Ok(lock) => lock,
        Err(_) if sim.dead() => return,
        Err(_) => {
            // No plugin ran: the ADD is ended, answered with the error.
            let _ = i.finish(p).await;
            return;
        }
    };
    w.alloc.insert(cid.to_owned());
    match gate {
        Gate::Ok => {
            let rec = CacheRecord::new(
                "n",
                &rt,
                intent.config.clone(),
                Some(json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]})),
            );
            let written = cache.write(&rec).await;
            if written.is_err() && !sim.dead() {
                // The library rolls the chain back (the plugins' DEL).
                w.alloc.remove(cid);
            }
            drop(lock);
            if sim.dead() {
                return;
            }
            if written.is_err() {
                let _ = i.finish(p).await;
                return;
            }
            match i.commit(p, &rec).await {
                Ok(()) => {
                    w.answered.insert(cid.to_owned(), rec.encode());
                }
                Err(_) if sim.dead() => {}
                Err(_) => {
                    // Undone: the library's DEL of the chain.
                    lib_del(&cache, sim, w, cid).await;
                }
            }
        }
        Gate::Fails => {
            w.alloc.remove(cid);
            drop(lock);
            if !sim.dead() {
                let _ = i.finish(p).await;
            }
        }
        Gate::FailsNotUndone => {
            drop(lock);
            if !sim.dead() {
                let _ = i.keep(p, &intent).await;
            }
        }
    }
}

/// How a DEL of the library ended.
#[derive(Debug, PartialEq, Eq)]
enum Deleted {
    /// The process died in it.
    Died,
    /// It ran to its end; `removed`: the record with it (else it stays
    /// for a later DEL: answered all the same).
    Done { removed: bool },
}

/// The library's DEL as `cni_async` makes it: the lock taken and the
/// record read (an unusable cache dir: it runs unlocked), the plugins,
/// the record removed (not flushed), the lock file removed.
async fn lib_del(cache: &ResultCache, sim: &SimDisk, w: &mut World, cid: &str) -> Deleted {
    let locked = cache.lock_and_read("n", cid, "eth0", WAIT).await;
    if sim.dead() {
        return Deleted::Died;
    }
    w.answered.remove(cid);
    w.alloc.remove(cid);
    if cache.remove("n", cid, "eth0").await.is_err() {
        // Logged; the lock is released as it is dropped (its file stays
        // with the record).
        return if sim.dead() {
            Deleted::Died
        } else {
            Deleted::Done { removed: false }
        };
    }
    if let Ok((lock, _)) = locked {
        lock.release_and_remove();
    }
    if sim.dead() {
        Deleted::Died
    } else {
        Deleted::Done { removed: true }
    }
}

/// A DEL as the engine makes it: the library's, then the intent and the
/// commit line forgotten (an error there is logged; the DEL is answered).
async fn del(i: &Intents, sim: &SimDisk, w: &mut World, cid: &str) {
    let cache = i.cache.clone().unwrap();
    let Deleted::Done { removed } = lib_del(&cache, sim, w, cid).await else {
        return;
    };
    // Not written (a full disk: answered all the same), the `gone` line
    // leaves the record to come back after a power loss in the flush
    // task's window: not counted as deleted for good.
    let forgotten = i.remove("n", cid, "eth0").await.is_ok();
    if removed && forgotten && !sim.dead() {
        w.deleted.insert(cid.to_owned());
    }
}

/// A GC of network `n` that deletes `cid` (stale: the library's DEL),
/// then forgets it.
async fn gc(i: &Intents, sim: &SimDisk, w: &mut World, cid: &str) {
    let cache = i.cache.clone().unwrap();
    let Deleted::Done { removed } = lib_del(&cache, sim, w, cid).await else {
        return;
    };
    let forgotten = i.forget_removed("n").await.is_ok();
    if removed && forgotten && !sim.dead() {
        w.deleted.insert(cid.to_owned());
    }
}

/// The name of the intent file the Recovery operations find corrupt.
const CORRUPT: &str = "n:bad:eth0.json";

/// What earlier crashes left for a start to clean: a temp file of an
/// intent write killed before its rename, one of a killed cache writer
/// (dead, and old), and an intent file that cannot be read.
fn plant_leftovers(dir: &Path) {
    let intents = dir.join(INTENTS_DIR);
    std::fs::write(intents.join(".n:x:eth0.json.tmp-1-1"), b"{half").unwrap();
    std::fs::write(intents.join(CORRUPT), b"{corrupt").unwrap();
    let results = cache_in(dir).results_dir();
    std::fs::create_dir_all(&results).unwrap();
    let temp = results.join(format!(".n-x-eth0.tmp-{DEAD_PID}-1"));
    std::fs::write(&temp, b"{half").unwrap();
    File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(SystemTime::UNIX_EPOCH)
        .unwrap();
}

/// The setup's attachments: committed ADDs (and an open one for some
/// operations).
fn names(n: usize) -> Vec<String> {
    (1..=n).map(|k| format!("c-{k}")).collect()
}

/// Runs `op` after its setup, the process dying at the `crash`-th I/O
/// point of the operation (none: it runs to its end) with an `ENOSPC` at
/// its `fail`-th. Returns the world, the disk and the boot it ran in.
async fn run(
    op: Op,
    dir: &Path,
    crash: Option<usize>,
    fail: Option<usize>,
    size: usize,
) -> (World, Arc<SimDisk>, &'static str) {
    let mut w = World::default();
    let sim = Arc::new(SimDisk::new(dir));
    let i = on_sim(dir, BOOT, &sim);
    if op == Op::Compaction {
        i.journal.lock().unwrap().compact_at = 1;
    }
    let arm = |sim: &SimDisk| {
        if let Some(n) = crash {
            sim.arm_crash(n);
        }
        if let Some(n) = fail {
            sim.arm_fail(n);
        }
    };
    if op == Op::AddAnswered {
        // The first start on a fresh state dir (its dirs made and
        // flushed) and the first ADD: crashed or failed in either.
        arm(&sim);
        if start(&i).is_err() {
            return (w, sim, BOOT);
        }
    } else {
        start(&i).unwrap();
    }
    match op {
        Op::AddAnswered | Op::AddRolledBack | Op::AddNotUndone => {
            // The answered one on a fresh journal (its opening is part of
            // it), the others after committed ADDs.
            let before = if op == Op::AddAnswered { 0 } else { size - 1 };
            for c in names(before) {
                add(&i, &sim, &mut w, &c, Gate::Ok).await;
            }
            if op != Op::AddAnswered {
                arm(&sim);
            }
            let gate = match op {
                Op::AddAnswered => Gate::Ok,
                Op::AddRolledBack => Gate::Fails,
                _ => Gate::FailsNotUndone,
            };
            add(&i, &sim, &mut w, "new", gate).await;
        }
        Op::Del | Op::Gc | Op::Check => {
            for c in names(size) {
                add(&i, &sim, &mut w, &c, Gate::Ok).await;
            }
            arm(&sim);
            match op {
                Op::Del => del(&i, &sim, &mut w, "c-1").await,
                Op::Gc => gc(&i, &sim, &mut w, "c-1").await,
                _ => {
                    // The library's CHECK: the lock taken and the record
                    // read, the plugins, the lock released; of an
                    // attachment that has no record too (its lock file
                    // made, then removed).
                    let cache = i.cache.clone().unwrap();
                    for cid in ["c-1", "unknown"] {
                        drop(cache.lock_and_read("n", cid, "eth0", WAIT).await);
                    }
                }
            }
        }
        Op::Flush | Op::Close => {
            for c in names(size) {
                add(&i, &sim, &mut w, &c, Gate::Ok).await;
            }
            arm(&sim);
            if op == Op::Flush {
                tokio::time::advance(FLUSH_EVERY).await;
                let _ = i.flush_old_commits();
            } else {
                i.close();
            }
        }
        Op::Compaction => {
            // Every `end` compacts (no commit line to flush first): the
            // journal is rewritten with the open ADD's `begin`.
            add(&i, &sim, &mut w, "open", Gate::Fails).await;
            let intent = Intent::new("n", &rt("long"), br#"{"name":"n"}"#.to_vec());
            w.tried.insert("long".into());
            i.begin(&intent).await.unwrap().pending().unwrap();
            w.alloc.insert("long".into());
            arm(&sim);
            add(&i, &sim, &mut w, "new", Gate::Fails).await;
        }
        Op::Recovery | Op::RecoveryKeeps | Op::AddAfterKept | Op::StopAfterKept => {
            for c in names(size) {
                add(&i, &sim, &mut w, &c, Gate::Ok).await;
            }
            // Open ADDs (killed in their plugins): one, or `size - 1`.
            for k in 1..(size - 1).max(2) {
                let cid = format!("open-{k}");
                let intent = Intent::new("n", &rt(&cid), br#"{"name":"n"}"#.to_vec());
                w.tried.insert(cid.clone());
                i.begin(&intent).await.unwrap().pending().unwrap();
                w.alloc.insert(cid);
            }
            drop(i);
            // The machine goes down: the records were never flushed.
            sim.power_loss(Cut::None);
            let unblock = (op != Op::Recovery).then(|| {
                let unblock = block_restore(&cache_in(dir), "c-1");
                // Older than the journal: not a record written since the
                // reboot, which the start would leave alone.
                let path = cache_in(dir).path("n", "c-1", "eth0").unwrap();
                File::open(&path)
                    .unwrap()
                    .set_modified(SystemTime::UNIX_EPOCH)
                    .unwrap();
                unblock
            });
            if op == Op::RecoveryKeeps {
                plant_leftovers(dir);
            }
            if op == Op::AddAfterKept {
                // The new ADD's record file, corrupt: moved aside.
                let path = cache_in(dir).path("n", "new", "eth0").unwrap();
                std::fs::write(path, b"{corrupt").unwrap();
            }
            let sim = Arc::new(SimDisk::new(dir));
            let in_start = matches!(op, Op::Recovery | Op::RecoveryKeeps);
            if in_start {
                arm(&sim);
            }
            let b = on_sim(dir, "boot-b", &sim);
            // Recovery flushes its records in one `syncfs` (as a start
            // with many does), RecoveryKeeps file by file.
            let b = if op == Op::Recovery {
                b.with_sync_fs_at(1)
            } else {
                b
            };
            let _ = start(&b);
            if !in_start {
                // A daemon whose start kept c-1's commit line: an ADD
                // (issue 21, defect 1), or a graceful stop (defect 2).
                arm(&sim);
                if op == Op::AddAfterKept {
                    add(&b, &sim, &mut w, "new", Gate::Ok).await;
                } else {
                    b.close();
                }
            }
            if let Some(unblock) = unblock {
                unblock(); // the space freed
            }
            return (w, sim, "boot-b");
        }
    }
    (w, sim, BOOT)
}

/// A dir for one run: on tmpfs where there is one (the simulated disk
/// models durability itself; real `fsync`s there would only cost time).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// The files under `dir`, with their sizes.
fn footprint(dir: &Path) -> Vec<(PathBuf, u64)> {
    fn walk(d: &Path, out: &mut Vec<(PathBuf, u64)>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path(), out);
            } else {
                out.push((e.path(), m.len()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// The daemon's start on `dir` in boot `boot`, its recovery DELs, the
/// runtime's DELs and a new ADD of each attachment, checking the
/// invariants (module docs) on the way. `kept_all`: every write reached
/// the disk (a process crash, or a power loss after all was written back).
async fn restart_and_check(dir: &Path, mut w: World, boot: &str, kept_all: bool, at: &str) {
    let sim = Arc::new(SimDisk::new(dir));
    let i = on_sim(dir, boot, &sim);
    let cache = i.cache.clone().unwrap();
    let mut intents = BTreeSet::new();
    for f in start(&i).unwrap_or_else(|e| panic!("{at}: start: {e}")) {
        match f {
            IntentFile::Intent(_, i) => {
                intents.insert(i.rt.container_id.clone());
            }
            IntentFile::Corrupt(p, _) if p.ends_with(CORRUPT) => {}
            IntentFile::Corrupt(p, r) => panic!("{at}: corrupt {}: {r}", p.display()),
        }
    }
    let record = |cid: &str| std::fs::read(cache.path("n", cid, "eth0").unwrap()).ok();
    for (cid, bytes) in &w.answered {
        assert_eq!(
            record(cid).as_ref(),
            Some(bytes),
            "{at}: the answered ADD of {cid} lost its cached result"
        );
    }
    for cid in &w.alloc {
        assert!(
            record(cid).is_some() || intents.contains(cid),
            "{at}: {cid}'s allocation has neither a record nor an intent: leaked"
        );
    }
    if kept_all {
        for cid in &w.deleted {
            assert_eq!(record(cid), None, "{at}: the deleted {cid} came back");
        }
    }
    // The start's DELs of the intents.
    for cid in &intents {
        assert_eq!(
            lib_del(&cache, &sim, &mut w, cid).await,
            Deleted::Done { removed: true }
        );
        assert!(i.remove("n", cid, "eth0").await.unwrap(), "{at}: {cid}");
    }
    // The runtime's DELs: every attachment it ADDed or DELed (a repeat
    // DEL succeeds); the answered ones get their result.
    let all: Vec<String> = w.tried.union(&w.deleted).cloned().collect();
    for cid in &all {
        let prev = cache.read_blocking("n", cid, "eth0").unwrap();
        assert!(
            prev.is_some() || !w.answered.contains_key(cid),
            "{at}: {cid}'s DEL without prevResult"
        );
        assert_eq!(
            lib_del(&cache, &sim, &mut w, cid).await,
            Deleted::Done { removed: true }
        );
        i.remove("n", cid, "eth0").await.unwrap();
    }
    assert!(w.alloc.is_empty(), "{at}: leaked {:?}", w.alloc);
    // A new ADD of each is accepted (no record came back to refuse it).
    for cid in w.tried.union(&w.deleted) {
        let intent = Intent::new("n", &rt(cid), br#"{"name":"n"}"#.to_vec());
        match i.begin(&intent).await.unwrap() {
            BeginAnswer::Recorded(p) => i.finish(p).await.unwrap(),
            other => panic!("{at}: a new ADD of {cid} refused: {other:?}"),
        }
    }
    i.close();
    // The sweep [`ABANDONED_AFTER`] after the start: the temp files of
    // the crashed writers (their pids gone) go.
    abandon_cache_temps(dir);
    i.remove_abandoned_cache_temps();
    let corrupt = dir.join(INTENTS_DIR).join(files::CORRUPT_DIR);
    let moved = footprint(&corrupt);
    assert!(
        moved.len() <= 1,
        "{at}: moved aside more than once: {moved:?}"
    );
    let left: Vec<_> = footprint(&dir.join(INTENTS_DIR))
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&corrupt))
        .chain(footprint(&cache.results_dir()))
        .chain(footprint(&cache.dir().join(cni_async::cache::LOCKS_DIR)))
        .collect();
    assert!(left.is_empty(), "{at}: files left: {left:?}");
}

/// Per operation: the crash points visited, and the call sites crashed at.
#[derive(Debug, Default)]
struct Visited {
    /// Per operation: crash points, and those after an `ENOSPC`.
    points: BTreeMap<Op, (usize, usize)>,
    starts: usize,
    /// Starts killed in their turn before the start checked.
    nested: usize,
    sites: BTreeSet<String>,
}

/// Crashes `op` at each of its I/O points in turn (after an `ENOSPC` at
/// the `fail`-th, if any), and checks both kinds of restart from each.
async fn enumerate(op: Op, fail: Option<usize>, size: usize, nested: bool, v: &mut Visited) {
    let first = fail.map_or(0, |f| f + 1);
    v.points.entry(op).or_default();
    // After an `ENOSPC`, the crashes at the three points that follow it
    // (where the failure is handled), but in `make soak`: all of them.
    let last = match fail {
        Some(_) if !nested => first + 3,
        _ => usize::MAX,
    };
    for n in first..last {
        let mut crashed = None;
        let modes = [
            ("kill -9", None),
            ("power loss, unflushed lost", Some(Cut::None)),
            ("power loss, unflushed cut short", Some(Cut::Half)),
            ("power loss, all written back", Some(Cut::All)),
        ];
        // After an `ENOSPC` (hundreds of pairs of points), the two
        // extremes only, but in `make soak`.
        let modes = if fail.is_some() && !nested {
            &modes[..2]
        } else {
            &modes[..]
        };
        for &(mode, cut) in modes {
            // With `nested`, the first start is killed too, at each of its
            // points in turn (`m`), before the start that is checked.
            for m in 0.. {
                let dir = scratch();
                let (w, sim, boot) = run(op, dir.path(), Some(n), fail, size).await;
                crashed = sim.crashed_at();
                if let (Some(f), None) = (fail, &crashed)
                    && sim.calls_since_arm() <= f
                {
                    return; // the failure point is past the operation's end
                }
                let mut at = format!("{op:?}, fail {fail:?}, crash {n} ({crashed:?}), {mode}");
                if cut.is_none()
                    && fail.is_none()
                    && (op == Op::Recovery || op == Op::RecoveryKeeps)
                {
                    // Crashed at the same point again and again: no growth.
                    // Each start gets further (what an earlier one did is
                    // not done again, and a removal of its leftovers is an
                    // I/O point too: the same point is not the same call),
                    // so the files change (a record or intent file more
                    // each time); but no more temp files are left by the
                    // last starts than by the first (one left by each
                    // crash would be).
                    let mut files = Vec::new();
                    for _ in 0..6 {
                        // The starts [`ABANDONED_AFTER`] apart (else each
                        // leaves at most one temp file in the cache until
                        // one is that old).
                        abandon_cache_temps(dir.path());
                        let again = Arc::new(SimDisk::new(dir.path()));
                        again.arm_crash(n);
                        let _ = start(&on_sim(dir.path(), boot, &again));
                        files.push(footprint(dir.path()));
                    }
                    // Temp files (hidden names) are what a crash leaves;
                    // records and intent files are the starts' progress.
                    let temps = |f: &Vec<(PathBuf, u64)>| {
                        f.iter()
                            .filter(|(p, _)| {
                                p.file_name()
                                    .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
                            })
                            .count()
                    };
                    let most = |f: &[Vec<(PathBuf, u64)>]| f.iter().map(temps).max();
                    assert!(
                        most(&files[3..]) <= most(&files[..3]),
                        "{at}: each repeated crash of the start left more temp files: {files:?}"
                    );
                }
                let boot = match cut {
                    None => boot,
                    Some(cut) => {
                        sim.power_loss(cut);
                        "boot-z"
                    }
                };
                let mut last = true;
                if nested {
                    let start = Arc::new(SimDisk::new(dir.path()));
                    start.arm_crash(m);
                    let _ = super::crashes::start(&on_sim(dir.path(), boot, &start));
                    last = start.crashed_at().is_none();
                    at += &format!(", then its start killed at {m}");
                    if !last {
                        v.nested += 1;
                    }
                }
                // Every removal on disk (no power loss, or all written
                // back): a deleted record must stay deleted.
                let kept_all = matches!(cut, None | Some(Cut::All));
                restart_and_check(dir.path(), w, boot, kept_all, &at).await;
                v.starts += 1;
                if last {
                    break;
                }
            }
        }
        match crashed {
            Some(c) => {
                let e = v.points.entry(op).or_default();
                if fail.is_none() {
                    e.0 += 1;
                } else {
                    e.1 += 1;
                }
                v.sites.insert(c.site);
            }
            None => return, // ran to its end: crashed after it
        }
    }
}

/// The call sites of [`Storage`] in the journal's code (not its tests):
/// `file:line` of each method call on a `storage`, and of each call of
/// `cni_async::durable`'s functions that go through one (they are
/// `#[track_caller]`: the simulated disk names their caller's line).
fn storage_call_sites() -> BTreeSet<String> {
    const METHODS: [&str; 14] = [
        "create_new",
        "open_append",
        "open_write",
        "open_lock",
        "write",
        "truncate",
        "sync_data",
        "sync_all",
        "sync_file",
        "sync_dir",
        "sync_fs",
        "rename",
        "remove",
        "remove_dir",
    ];
    const DURABLE: [&str; 7] = [
        "write_atomic_on",
        "sync_dir",
        "sync_file",
        "move_aside",
        "remove_leftovers",
        "remove_abandoned",
        "ensure_private_dir_durable",
    ];
    let mut sites = BTreeSet::new();
    for (file, src) in [
        ("mod.rs", include_str!("mod.rs")),
        ("log.rs", include_str!("log.rs")),
        ("files.rs", include_str!("files.rs")),
        ("recover.rs", include_str!("recover.rs")),
        (
            "cache.rs",
            include_str!("../../../../cni-async/src/cache.rs"),
        ),
    ] {
        let code = src.split("\n#[cfg(test)]\nmod tests").next().unwrap();
        let lines: Vec<&str> = code.lines().collect();
        for (ix, line) in lines.iter().enumerate() {
            let method = METHODS.iter().any(|m| {
                let call = format!(".{m}(");
                let here = line.contains(&format!("storage{call}"));
                let split = line.trim_start().starts_with(&call)
                    && ix > 0
                    && lines[ix - 1].trim_end().ends_with("storage");
                here || split
            });
            let durable = DURABLE
                .iter()
                .any(|f| line.contains(&format!("durable::{f}(")));
            if method || durable {
                sites.insert(format!("{file}:{}", ix + 1));
            }
        }
    }
    sites
}

/// The enumeration (module docs). Prints the crash points visited per
/// operation; fails on a broken invariant or a call site never crashed at.
#[tokio::test(start_paused = true)]
async fn every_crash_point_of_every_journal_operation() {
    let exhaustive = std::env::var("CNID_CRASH_EXHAUSTIVE").is_ok_and(|v| v == "1");
    let size = if exhaustive { 4 } else { 2 };
    let mut v = Visited::default();
    let mut failures = 0;
    for op in Op::ALL {
        enumerate(op, None, size, exhaustive, &mut v).await;
        for f in 0.. {
            let before = v.starts;
            enumerate(op, Some(f), size, exhaustive, &mut v).await;
            if v.starts == before {
                break;
            }
            failures += 1;
        }
    }
    let plain: usize = v.points.values().map(|p| p.0).sum();
    let after: usize = v.points.values().map(|p| p.1).sum();
    eprintln!(
        "crash points visited: {plain}, and {after} after an ENOSPC at one of {failures} points; \
         {} starts checked ({} of them after a start killed at one of its points)",
        v.starts, v.nested
    );
    for (op, (plain, after)) in &v.points {
        eprintln!("  {op:?}: {plain} (+{after} after an ENOSPC)");
    }
    let sites = storage_call_sites();
    assert!(sites.len() >= 17, "the source scan found {sites:?}");
    let missed: Vec<_> = sites.difference(&v.sites).collect();
    assert!(
        missed.is_empty(),
        "I/O call sites never crashed at: {missed:?}"
    );
}
