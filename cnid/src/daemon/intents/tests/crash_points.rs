//! Crash-point enumeration at the level of the storage
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
//! restore, flushing file by file), an ADD and a graceful stop of a daemon whose start kept
//! such a record (a kept journal's numbering and its removal by a stop, both
//! once defects), and an ADD by cnitool on
//! the daemon's cache dir (the library alone, its own flushes, no
//! journal), each also with an `ENOSPC`
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
//! Combined ([`enumerate_combined`]): the state each operation's
//! `kill -9` at each of its points (and right after its end) leaves is
//! restarted in the same boot on the same disk, so what the dead process
//! never flushed is still unflushed; the restart is killed at each of its
//! own points in turn (in `make test` a sample: [`Restarts::Sample`]), or
//! runs to its end and serves an ADD through the daemon, alone or
//! followed by one by cnitool; then the power goes, and the start after
//! it is checked. What a restart trusts that a killed process left
//! unflushed shows only so: an attack on the journal found three such
//! defects by hand, which this finds put back, and it found the
//! library's durable write trusting a `results/` it did not make.
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
//! cache's (`cni-async/src/store/`: `entry.rs`, `lock.rs`, `flush.rs`), of its methods and of
//! `cni_async::daemon::durable`'s functions over it, is crashed at by some
//! operation: a new one cannot slip in untested.
//!
//! A killed daemon's temp files carry its pid, which the test shares:
//! [`abandon_cache_temps`] gives them a dead writer's pid and an old date
//! where the model lets time pass (the sweep 5 minutes after a start;
//! starts that far apart).
//! `CNID_CRASH_EXHAUSTIVE=1` (`make soak`) runs the operations with more
//! attachments and open ADDs, every crash after an `ENOSPC` with the four
//! kinds of restart, kills the first start after each crash at each of
//! its own points in turn before the start that is checked (crash points
//! times start points: minutes, not seconds), and the combined restarts
//! at each of their points, before a power loss that loses or cuts short
//! what was not flushed.
//!
//! Cost: each state a crash leaves is made once and copied for each
//! restart from it ([`SimDisk::fork`]); the checked start runs on the real
//! disk (nothing crashes it); the operations are shared by one thread per
//! CPU (`CNID_CRASH_THREADS`), each crash point independent of the others.

use super::sim_disk::{Cut, SimDisk};
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
    LibAdd,
}

impl Op {
    const ALL: [Op; 14] = [
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
        Op::LibAdd,
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
#[derive(Debug, Default, Clone)]
struct World {
    alloc: BTreeSet<String>,
    /// Answered ADDs not DELed since: their records' bytes.
    answered: BTreeMap<String, Vec<u8>>,
    /// Answered DELs and GC deletions.
    deleted: BTreeSet<String>,
    /// Every attachment the runtime ADDed, answered or not: it DELs them
    /// after a failure or a reboot.
    tried: BTreeSet<String>,
    /// The attachments ADDed by the library alone (cnitool on the
    /// daemon's cache dir), which keeps no journal: one killed before its
    /// record was written leaves its allocation to the runtime's DEL.
    unjournaled: BTreeSet<String>,
}

fn rt(cid: &str) -> RuntimeConf {
    RuntimeConf::new(cid, "/run/netns/x", "eth0")
}

/// The daemon's journal and cache over `dir` on `sim`, as `daemon::run`
/// makes them (the cache's disk work on the calling thread).
fn daemon_on(dir: &Path, boot: &str, sim: &Arc<SimDisk>) -> Intents {
    Intents::new(dir)
        .with_cache(
            cache_in(dir).with_inline_io(true).with_storage(sim.clone()),
            true,
        )
        .with_boot_id(boot)
        .with_storage(sim.clone())
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
    // The lock and a look at the slot under it, a corrupt record moved
    // aside (names never collide here).
    let lock = match cache
        .lock_and_read("n", cid, "eth0", WAIT)
        .await
        .map(|(l, _)| l)
    {
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

/// An ADD by the library alone, as cnitool makes it on the daemon's
/// cache dir (a cache of its own, with its flushes: no journal stands for
/// its record): the attachment's lock, the plugins, the record written
/// durably, the lock released. Answered when the process got that far.
async fn lib_add(dir: &Path, sim: &Arc<SimDisk>, w: &mut World, cid: &str) {
    let cache = ResultCache::new(cache_in(dir).dir())
        .with_storage(sim.clone())
        .with_inline_io(true);
    w.tried.insert(cid.to_owned());
    w.unjournaled.insert(cid.to_owned());
    let Ok((lock, _)) = cache.lock_and_read("n", cid, "eth0", WAIT).await else {
        return;
    };
    w.alloc.insert(cid.to_owned());
    let rec = CacheRecord::new(
        "n",
        &rt(cid),
        br#"{"name":"n"}"#.to_vec(),
        Some(json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.3/24"}]})),
    );
    let written = cache.write(&rec).await;
    if written.is_err() && !sim.dead() {
        // The library rolls the chain back.
        w.alloc.remove(cid);
    }
    drop(lock);
    if written.is_ok() && !sim.dead() {
        w.answered.insert(cid.to_owned(), rec.encode());
    }
}

/// What the model's operations run on: the simulated disk, which can
/// stop the process, or the real one (the start that is checked).
trait Dies {
    /// Whether the process died (at a crash point of the simulated disk).
    fn dead(&self) -> bool;
}

impl Dies for SimDisk {
    fn dead(&self) -> bool {
        SimDisk::dead(self)
    }
}

impl Dies for Disk {
    fn dead(&self) -> bool {
        false
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
async fn lib_del(cache: &ResultCache, sim: &impl Dies, w: &mut World, cid: &str) -> Deleted {
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
    let i = daemon_on(dir, BOOT, &sim);
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
            let b = daemon_on(dir, "boot-b", &sim);
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
                // (once numbered from 1 again, so a kept `end` closed a new
                // `begin`), or a graceful stop (once removed the kept journal).
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
        Op::LibAdd => {
            // cnitool's ADD on the cache dir of a daemon that has not
            // written into it yet: it makes the cache dir (for its lock
            // file) and `results/`.
            arm(&sim);
            lib_add(dir, &sim, &mut w, "lib").await;
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
    // On the real disk: nothing crashes it, and no power loss follows.
    let i = Intents::new(dir)
        .with_cache(cache_in(dir).with_inline_io(true), true)
        .with_boot_id(boot);
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
    for cid in w.alloc.difference(&w.unjournaled) {
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
            lib_del(&cache, &Disk, &mut w, cid).await,
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
            lib_del(&cache, &Disk, &mut w, cid).await,
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
        .chain(footprint(&cache.dir().join(cni_async::daemon::LOCKS_DIR)))
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
    /// Per operation: the combined points ([`enumerate_combined`]): a
    /// state the operation's `kill -9` left, restarted, the restart killed
    /// at one of its points (or run to its end and followed by ADDs), then
    /// a power loss.
    combined: BTreeMap<Op, usize>,
    sites: BTreeSet<String>,
}

/// Crashes `op` at each of its I/O points in turn (after an `ENOSPC` at
/// the `fail`-th, if any), and checks both kinds of restart from each.
/// The state a crash leaves is made once; each restart runs on a copy of
/// it ([`SimDisk::fork`]).
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
        let made = scratch();
        let (w, sim, boot) = run(op, made.path(), Some(n), fail, size).await;
        let crashed = sim.crashed_at();
        if let (Some(f), None) = (fail, &crashed)
            && sim.calls_since_arm() <= f
        {
            return; // the failure point is past the operation's end
        }
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
            let after = scratch();
            let disk = sim.fork(after.path());
            let at = format!("{op:?}, fail {fail:?}, crash {n} ({crashed:?}), {mode}");
            if cut.is_none() && fail.is_none() && (op == Op::Recovery || op == Op::RecoveryKeeps) {
                no_growth(after.path(), boot, n, &at);
            }
            let boot = match cut {
                None => boot,
                Some(cut) => {
                    disk.power_loss(cut);
                    "boot-z"
                }
            };
            // Every removal on disk (no power loss, or all written
            // back): a deleted record must stay deleted.
            let kept_all = matches!(cut, None | Some(Cut::All));
            if !nested {
                restart_and_check(after.path(), w.clone(), boot, kept_all, &at).await;
                v.starts += 1;
                continue;
            }
            // With `nested`, the first start is killed too, at each of its
            // points in turn (`m`), before the start that is checked.
            for m in 0.. {
                let dir = scratch();
                let start = Arc::new(disk.fork(dir.path()));
                start.arm_crash(m);
                let _ = super::crash_points::start(&daemon_on(dir.path(), boot, &start));
                let last = start.crashed_at().is_none();
                if !last {
                    v.nested += 1;
                }
                let at = format!("{at}, then its start killed at {m}");
                restart_and_check(dir.path(), w.clone(), boot, kept_all, &at).await;
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

/// A start crashed at its `n`-th point again and again on `dir`: no
/// growth. Each start gets further (what an earlier one did is not done
/// again, and a removal of its leftovers is an I/O point too: the same
/// point is not the same call), so the files change (a record or intent
/// file more each time); but no more temp files are left by the last
/// starts than by the first (one left by each crash would be).
fn no_growth(dir: &Path, boot: &str, n: usize, at: &str) {
    let mut files = Vec::new();
    for _ in 0..6 {
        // The starts [`ABANDONED_AFTER`] apart (else each leaves at most
        // one temp file in the cache until one is that old).
        abandon_cache_temps(dir);
        let again = Arc::new(SimDisk::new(dir));
        again.arm_crash(n);
        let _ = start(&daemon_on(dir, boot, &again));
        files.push(footprint(dir));
    }
    // Temp files (hidden names) are what a crash leaves; records and
    // intent files are the starts' progress.
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

/// Which of a restart's points [`enumerate_combined`] kills it at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restarts {
    /// Each of them.
    Every,
    /// The first three (the start's dir flushes), every fourth after
    /// them and the last: `make test`'s sample.
    Sample,
}

impl Restarts {
    fn kills_at(self, m: usize) -> bool {
        self == Restarts::Every || m < 3 || m % 4 == 3
    }
}

/// A `kill -9`, a restart and a power loss, combined.
/// The state `op` leaves when killed at its `n`-th I/O point, or right
/// after its end (each `n` in turn), is restarted in the same boot on the
/// same disk (what the dead process never flushed is still unflushed: the
/// kernel kept it), the restart killed at its `m`-th point (each `m` in
/// turn, or `restarts`' sample) or run to its end and followed by an ADD
/// through the daemon and an ADD by the library alone (cnitool), both
/// answered; then the power goes (`cuts`), and the start after it is
/// checked as [`restart_and_check`] checks a start after a power loss.
async fn enumerate_combined(
    op: Op,
    size: usize,
    restarts: Restarts,
    cuts: &[Cut],
    v: &mut Visited,
) {
    for n in 0.. {
        // The state the `kill -9` leaves, made once; each restart on a
        // copy of it (of the disk's durable state too).
        let made = scratch();
        let (w, sim, boot) = run(op, made.path(), Some(n), None, size).await;
        let past_end = sim.crashed_at().is_none();
        for m in 0.. {
            let mut restart_ended = false;
            // After a restart run to its end: an ADD through the daemon
            // alone, or followed by one by cnitool (whose flushes of the
            // cache's dirs would hide what the daemon's own left out).
            for cnitool in [false, true] {
                for &cut in cuts {
                    let dir = scratch();
                    // The same boot: every write of the dead process kept,
                    // flushed or not.
                    let sim = Arc::new(sim.fork(dir.path()));
                    sim.arm_crash(m);
                    let restart = daemon_on(dir.path(), boot, &sim);
                    let _ = start(&restart);
                    let killed = sim.crashed_at();
                    sim.revive();
                    restart_ended = killed.is_none();
                    if !restart_ended && (cnitool || !restarts.kills_at(m)) {
                        break;
                    }
                    let mut w = w.clone();
                    let mut at = format!("{op:?}, killed at {n}, restarted, ");
                    if let Some(c) = &killed {
                        at += &format!("the restart killed at {m} ({c:?})");
                    } else {
                        add(&restart, &sim, &mut w, "after", Gate::Ok).await;
                        at += "then an ADD through the daemon";
                        if cnitool {
                            lib_add(dir.path(), &sim, &mut w, "lib-after").await;
                            at += " and one by cnitool";
                        }
                    }
                    drop(restart);
                    sim.power_loss(cut);
                    at += &format!(", then a power loss ({cut:?})");
                    restart_and_check(dir.path(), w, "boot-z", false, &at).await;
                    v.starts += 1;
                    *v.combined.entry(op).or_default() += 1;
                }
                if !restart_ended {
                    break;
                }
            }
            if restart_ended {
                break;
            }
        }
        if past_end {
            break;
        }
    }
}

/// The call sites of [`Storage`] in the journal's code (not its tests):
/// `file:line` of each method call on a `storage`, and of each call of
/// `cni_async::daemon::durable`'s functions that go through one (they are
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
    const DURABLE: [&str; 10] = [
        "write_atomic_on",
        "sync_dir",
        "sync_dir_above",
        "sync_file",
        "sync_entries_once",
        "move_aside",
        "remove_leftovers",
        "remove_abandoned",
        "ensure_private_dir_durable",
        "ensure_private_dir_durable_once",
    ];
    let mut sites = BTreeSet::new();
    for (file, src) in [
        ("mod.rs", include_str!("../mod.rs")),
        ("log.rs", include_str!("../log.rs")),
        ("files.rs", include_str!("../files.rs")),
        ("recover.rs", include_str!("../recover.rs")),
        (
            "entry.rs",
            include_str!("../../../../../cni-async/src/store/entry.rs"),
        ),
        (
            "lock.rs",
            include_str!("../../../../../cni-async/src/store/lock.rs"),
        ),
        (
            "flush.rs",
            include_str!("../../../../../cni-async/src/store/flush.rs"),
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

/// One share of the enumeration, run by one worker thread.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// [`enumerate_combined`] of an operation.
    Combined(Op),
    /// [`enumerate`] of an operation, without a failure.
    Crashes(Op),
    /// [`enumerate`] of an operation after an `ENOSPC` at that point.
    AfterFailure(Op, usize),
}

/// How the enumeration runs: `make test`'s bounded one, or `make soak`'s
/// exhaustive one (`CNID_CRASH_EXHAUSTIVE=1`).
#[derive(Debug, Clone, Copy)]
struct Setting {
    exhaustive: bool,
    /// The attachments of the operations' setups.
    size: usize,
}

impl Setting {
    fn from_env() -> Self {
        let exhaustive = std::env::var("CNID_CRASH_EXHAUSTIVE").is_ok_and(|v| v == "1");
        Setting {
            exhaustive,
            size: if exhaustive { 4 } else { 2 },
        }
    }

    async fn run(self, job: Job, v: &mut Visited) {
        let (restarts, cuts) = if self.exhaustive {
            (Restarts::Every, &[Cut::None, Cut::Half][..])
        } else {
            (Restarts::Sample, &[Cut::None][..])
        };
        match job {
            Job::Combined(op) => enumerate_combined(op, self.size, restarts, cuts, v).await,
            Job::Crashes(op) => enumerate(op, None, self.size, self.exhaustive, v).await,
            Job::AfterFailure(op, f) => {
                enumerate(op, Some(f), self.size, self.exhaustive, v).await;
            }
        }
    }

    /// The number of I/O points of `op` run to its end (where an `ENOSPC`
    /// can be injected).
    async fn points(self, op: Op) -> usize {
        let dir = scratch();
        // Armed (to count from the operation's start), never reached.
        let (_, sim, _) = run(op, dir.path(), Some(1 << 40), None, self.size).await;
        assert!(sim.crashed_at().is_none());
        sim.calls_since_arm()
    }
}

/// What the worker threads run their jobs on: a runtime of their own,
/// its clock paused, as `#[tokio::test(start_paused = true)]` makes one.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

impl Visited {
    fn merge(&mut self, other: Visited) {
        for (op, (plain, after)) in other.points {
            let e = self.points.entry(op).or_default();
            e.0 += plain;
            e.1 += after;
        }
        for (op, n) in other.combined {
            *self.combined.entry(op).or_default() += n;
        }
        self.starts += other.starts;
        self.nested += other.nested;
        self.sites.extend(other.sites);
    }
}

/// The enumeration (module docs), its jobs shared by one worker thread
/// per CPU (`CNID_CRASH_THREADS` to choose): each crash point is
/// independent of the others. Prints the crash points visited per
/// operation; fails on a broken invariant or a call site never crashed at.
#[test]
fn every_crash_point_of_every_journal_operation() {
    let setting = Setting::from_env();
    let lengths: Vec<(Op, usize)> = paused_runtime().block_on(async {
        let mut l = Vec::new();
        for op in Op::ALL {
            l.push((op, setting.points(op).await));
        }
        l
    });
    // The longest first (the combined ones of the start-up operations
    // take the most), so that no thread is left with one at the end.
    let mut jobs: Vec<(usize, Job)> = Vec::new();
    for &(op, len) in &lengths {
        jobs.push((len * 8, Job::Combined(op)));
        jobs.push((len * 4, Job::Crashes(op)));
        jobs.extend((0..len).map(|f| (len - f, Job::AfterFailure(op, f))));
    }
    jobs.sort_by_key(|(weight, _)| std::cmp::Reverse(*weight));
    let failures: usize = lengths.iter().map(|(_, len)| len).sum();
    let queue = Mutex::new(jobs.into_iter().map(|(_, j)| j).collect::<Vec<_>>());
    queue.lock().unwrap().reverse();
    let threads = std::env::var("CNID_CRASH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    let failed = std::sync::atomic::AtomicBool::new(false);
    // The exhaustive run takes minutes: a line per tenth of the jobs.
    let total = queue.lock().unwrap().len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let began = std::time::Instant::now();
    let mut v = Visited::default();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                std::thread::Builder::new()
                    .name(format!("crashes-{k}"))
                    .stack_size(16 << 20)
                    .spawn_scoped(scope, || {
                        let rt = paused_runtime();
                        let mut v = Visited::default();
                        loop {
                            if failed.load(std::sync::atomic::Ordering::Relaxed) {
                                break;
                            }
                            let Some(job) = queue.lock().unwrap().pop() else {
                                break;
                            };
                            let ran =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    rt.block_on(setting.run(job, &mut v))
                                }));
                            if let Err(panic) = ran {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                std::panic::resume_unwind(panic);
                            }
                            let k = 1 + done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if setting.exhaustive && (k * 10 / total) > ((k - 1) * 10 / total) {
                                eprintln!(
                                    "crash enumeration: {k} of {total} jobs done in {:.0?}",
                                    began.elapsed()
                                );
                            }
                        }
                        v
                    })
                    .unwrap()
            })
            .collect();
        let mut panicked = None;
        for w in workers {
            match w.join() {
                Ok(part) => v.merge(part),
                Err(p) => panicked = panicked.or(Some(p)),
            }
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    });
    let plain: usize = v.points.values().map(|p| p.0).sum();
    let after: usize = v.points.values().map(|p| p.1).sum();
    eprintln!(
        "crash points visited: {plain}, and {after} after an ENOSPC at one of {failures} points; \
         {} starts checked ({} of them after a start killed at one of its points), \
         on {threads} threads",
        v.starts, v.nested
    );
    let combined: usize = v.combined.values().sum();
    eprintln!(
        "combined (kill -9, the restart killed at one of its points or run to its end and \
         followed by ADDs, a power loss): {combined} points"
    );
    for (op, (plain, after)) in &v.points {
        let c = v.combined.get(op).copied().unwrap_or_default();
        eprintln!("  {op:?}: {plain} (+{after} after an ENOSPC; {c} combined)");
    }
    let sites = storage_call_sites();
    assert!(sites.len() >= 17, "the source scan found {sites:?}");
    let missed: Vec<_> = sites.difference(&v.sites).collect();
    assert!(
        missed.is_empty(),
        "I/O call sites never crashed at: {missed:?}"
    );
}

/// A cache as cnitool has it on `dir`'s cache dir, over `sim`: its own
/// flushes, its disk work on the calling thread.
fn cnitool_cache(dir: &Path, sim: &Arc<SimDisk>) -> ResultCache {
    ResultCache::new(cache_in(dir).dir())
        .with_storage(sim.clone())
        .with_inline_io(true)
}

/// A record of attachment `cid` on network `n`.
fn record_of(cid: &str) -> CacheRecord {
    CacheRecord::new("n", &rt(cid), br#"{"name":"n"}"#.to_vec(), None)
}

/// The library's durable write: a cnitool killed after it made
/// the cache dir and `results/` and before it flushed them left them to
/// the kernel; the next cnitool found `results/` there and trusted it,
/// flushing its record and `results/` but neither entry above: a power
/// loss took `results/` away, and the answered ADD's record with it (the
/// same with a `results/` cnid's cache made, which never flushes it, or
/// libcni's). Found by the combined enumeration (a `kill -9`, a restart,
/// a power loss); fixed by `durable::ensure_private_dir_durable_once`.
#[tokio::test]
async fn a_record_written_into_a_results_dir_a_killed_writer_left_survives_a_power_loss() {
    let dir = scratch();
    let sim = Arc::new(SimDisk::new(dir.path()));
    let first = cnitool_cache(dir.path(), &sim);
    sim.arm_crash(0);
    assert!(first.write_durable_blocking(&record_of("c-1")).is_err());
    assert_eq!(sim.crashed_at().unwrap().kind, "fsync-dir");
    assert!(first.results_dir().is_dir(), "made, not flushed");
    sim.revive();
    let second = cnitool_cache(dir.path(), &sim);
    second.write_durable_blocking(&record_of("c-2")).unwrap();
    sim.power_loss(Cut::None);
    assert_eq!(
        std::fs::read(second.path("n", "c-2", "eth0").unwrap()).ok(),
        Some(record_of("c-2").encode()),
        "the answered ADD's record, lost with its results/"
    );
}

/// The library's durable write: cnitool's first ADD on a fresh
/// cache dir takes its lock first, which makes the cache dir (for
/// `locks/`) without a flush; the write then made `results/` and flushed
/// it into the cache dir, but took the cache dir as found: a power loss
/// took it away with the record. Found by the enumeration's cnitool ADD
/// (`Op::LibAdd`) run to its end, then a restart and a power loss.
#[tokio::test]
async fn the_first_record_in_a_cache_dir_its_lock_made_survives_a_power_loss() {
    let dir = scratch();
    let sim = Arc::new(SimDisk::new(dir.path()));
    let mut w = World::default();
    lib_add(dir.path(), &sim, &mut w, "c-1").await;
    assert!(w.answered.contains_key("c-1"));
    sim.power_loss(Cut::None);
    assert_eq!(
        std::fs::read(cache_in(dir.path()).path("n", "c-1", "eth0").unwrap()).ok(),
        w.answered.get("c-1").cloned(),
        "the answered ADD's record, lost with the cache dir"
    );
}
