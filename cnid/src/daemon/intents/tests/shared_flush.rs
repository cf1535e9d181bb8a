//! Tests of the journal's shared flush ([`Intents::flush_through`]): a
//! record's waiter is released only by a flush that began after its
//! append, a burst of records shares its `fdatasync`s, and a failed flush
//! fails every record it took. The flushes are held at a gate the test
//! opens, over the simulated disk, so that what a power loss would keep is
//! checked at the moment each waiter is released.

use super::sim_disk::{Cut, SimDisk};
use super::*;
use std::collections::BTreeSet;
use std::sync::Condvar;

/// The simulated disk, whose `fdatasync`s, once armed, stop at a gate: the
/// `n`-th (from 1) makes what it flushes durable when it is called, then
/// returns only when the test opened the gate `n` times (or fails with
/// `EIO`, a failed write-back, flushing nothing, when planned to fail).
#[derive(Debug)]
struct Gated {
    sim: Arc<SimDisk>,
    state: Mutex<GateState>,
    moved: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    armed: bool,
    /// `fdatasync`s called (each numbered on entry).
    called: usize,
    /// `fdatasync`s that reached the gate.
    started: usize,
    /// How many of them may return.
    opened: usize,
    /// Which of them fail.
    fail: BTreeSet<usize>,
    /// Which of them return without waiting (another file's, such as a
    /// rewrite's temp file, while the journal's flush is held).
    through: BTreeSet<usize>,
}

impl Gated {
    fn new(sim: Arc<SimDisk>) -> Arc<Self> {
        Arc::new(Gated {
            sim,
            state: Mutex::default(),
            moved: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on, `fdatasync`s stop at the gate; those numbered in
    /// `fail` fail.
    fn arm(self: &Arc<Self>, fail: &[usize]) -> OpenOnDrop {
        let mut s = self.lock();
        s.armed = true;
        s.fail = fail.iter().copied().collect();
        OpenOnDrop(self.clone())
    }

    fn started(&self) -> usize {
        self.lock().started
    }

    /// Lets the `n`-th `fdatasync` return without waiting for the gate.
    fn let_through(&self, n: usize) {
        self.lock().through.insert(n);
        self.moved.notify_all();
    }

    /// Lets the `fdatasync`s up to the `n`-th return.
    fn open_to(&self, n: usize) {
        self.lock().opened = n;
        self.moved.notify_all();
    }
}

/// Opens the gate for good when dropped: a failed assertion must not
/// leave a flush held (the runtime would wait for its thread forever).
#[derive(Debug)]
struct OpenOnDrop(Arc<Gated>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open_to(usize::MAX);
    }
}

impl Storage for Gated {
    #[track_caller]
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.sim.create_new(path, mode)
    }
    #[track_caller]
    fn open_append(&self, path: &Path) -> io::Result<File> {
        self.sim.open_append(path)
    }
    #[track_caller]
    fn open_write(&self, path: &Path) -> io::Result<File> {
        self.sim.open_write(path)
    }
    #[track_caller]
    fn open_lock(&self, path: &Path) -> io::Result<File> {
        self.sim.open_lock(path)
    }
    #[track_caller]
    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        self.sim.write(file, bytes)
    }
    #[track_caller]
    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        self.sim.truncate(file, len)
    }
    #[track_caller]
    fn sync_data(&self, file: &File) -> io::Result<()> {
        let (n, fails) = {
            let mut s = self.lock();
            if !s.armed {
                drop(s);
                return self.sim.sync_data(file);
            }
            s.called += 1;
            let n = s.called;
            (n, s.fail.contains(&n))
        };
        // What is written when the flush begins is what it makes durable.
        if !fails {
            self.sim.sync_data(file)?;
        }
        let mut s = self.lock();
        s.started += 1;
        self.moved.notify_all();
        while s.opened < n && !s.through.contains(&n) {
            s = self.moved.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if fails {
            return Err(io::Error::from_raw_os_error(nix::libc::EIO));
        }
        Ok(())
    }
    #[track_caller]
    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.sim.sync_all(file)
    }
    #[track_caller]
    fn sync_file(&self, path: &Path) -> io::Result<bool> {
        self.sim.sync_file(path)
    }
    #[track_caller]
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.sim.sync_dir(dir)
    }
    #[track_caller]
    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.sim.sync_fs(dir)
    }
    #[track_caller]
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.sim.rename(from, to)
    }
    #[track_caller]
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.sim.remove(path)
    }
    #[track_caller]
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.sim.remove_dir(path)
    }
}

/// A journal over `dir` on the gated disk, prepared (the gate not armed).
fn gated_journal(dir: &Path) -> (Arc<SimDisk>, Arc<Gated>, Intents) {
    let sim = Arc::new(SimDisk::new(dir));
    let gated = Gated::new(sim.clone());
    let intents = Intents::new(dir).with_storage(gated.clone());
    intents.prepare().unwrap();
    (sim, gated, intents)
}

/// The open ADDs a power loss right now would leave in the journal.
fn durable_open(sim: &SimDisk) -> Vec<String> {
    let to = tempfile::tempdir().unwrap();
    let fork = sim.fork(to.path());
    fork.power_loss(Cut::None);
    let mut names = open_names(to.path());
    names.sort();
    names
}

fn intent(cid: &str) -> Intent {
    Intent::new(
        "n",
        &RuntimeConf::new(cid, "/run/netns/x", "eth0"),
        b"{}".to_vec(),
    )
}

/// A `begin` of `cid`, run as the engine runs it (its own task).
fn spawn_begin(
    intents: &Intents,
    cid: &str,
) -> tokio::task::JoinHandle<Result<BeginAnswer, BeginError>> {
    let (intents, intent) = (intents.clone(), intent(cid));
    tokio::spawn(async move { intents.begin(&intent).await })
}

/// Waits until the journal file holds a line of `cid` (its append
/// returned: the file is read past the seam, from the page cache).
async fn appended(dir: &Path, cid: &str) {
    let journal = dir.join(INTENTS_DIR).join(JOURNAL);
    let needle = format!("\"{cid}\"");
    wait_for(&format!("{cid} was not appended"), || {
        String::from_utf8_lossy(&std::fs::read(&journal).unwrap_or_default()).contains(&needle)
    })
    .await;
}

/// The journal's `fdatasync`s since the gate was armed.
fn journal_flushes(sim: &SimDisk, before: usize) -> usize {
    sim.calls()[before..]
        .iter()
        .filter(|c| c.kind == "fdatasync" && c.name == JOURNAL)
        .count()
}

/// A `begin` appended while a flush runs is not covered by it: its waiter
/// stays until a flush that began after its append completed, and when
/// any waiter is released its record is what a power loss keeps.
#[tokio::test]
async fn a_waiter_is_released_only_by_a_flush_that_began_after_its_append() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, gate, intents) = gated_journal(dir.path());
    let _open = gate.arm(&[]);
    let a = spawn_begin(&intents, "c-a");
    wait_for("the first flush did not start", || gate.started() == 1).await;
    let b = spawn_begin(&intents, "c-b");
    appended(dir.path(), "c-b").await;

    gate.open_to(1);
    let a = a.await.unwrap().unwrap();
    assert!(matches!(a, BeginAnswer::Recorded(_)));
    // What a power loss keeps once a is answered (b's flush may have
    // begun meanwhile: b may be there too).
    assert!(durable_open(&sim).contains(&"n:c-a:eth0".to_owned()));
    wait_for("b was neither released nor flushed again", || {
        gate.started() == 2 || b.is_finished()
    })
    .await;
    assert!(
        !b.is_finished(),
        "b was released by a flush that began before its append"
    );

    gate.open_to(2);
    assert!(matches!(
        b.await.unwrap().unwrap(),
        BeginAnswer::Recorded(_)
    ));
    assert_eq!(durable_open(&sim), ["n:c-a:eth0", "n:c-b:eth0"]);
}

/// Sixteen `begin`s at once (a burst of pods) cost two `fdatasync`s, not
/// sixteen: the first, and one for every record appended while it ran.
/// Each is durable once answered.
#[tokio::test]
async fn a_burst_of_begins_shares_two_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, gate, intents) = gated_journal(dir.path());
    // The journal exists (its creation flushed): only appends follow.
    let first = intents.begin(&intent("c-0")).await.unwrap();
    assert!(matches!(first, BeginAnswer::Recorded(_)));
    let before = sim.calls().len();
    let _open = gate.arm(&[]);
    let lead = spawn_begin(&intents, "c-1");
    wait_for("the first flush did not start", || gate.started() == 1).await;
    let rest: Vec<_> = (2..=16)
        .map(|i| spawn_begin(&intents, &format!("c-{i}")))
        .collect();
    for i in 2..=16 {
        appended(dir.path(), &format!("c-{i}")).await;
    }
    gate.open_to(usize::MAX);
    assert!(matches!(
        lead.await.unwrap().unwrap(),
        BeginAnswer::Recorded(_)
    ));
    for t in rest {
        assert!(matches!(
            t.await.unwrap().unwrap(),
            BeginAnswer::Recorded(_)
        ));
    }
    assert_eq!(
        journal_flushes(&sim, before),
        2,
        "one flush per record instead of one per batch"
    );
    let mut want: Vec<String> = (0..=16).map(|i| format!("n:c-{i}:eth0")).collect();
    want.sort();
    assert_eq!(durable_open(&sim), want);
}

/// A flush that fails fails every record it took, `begin`s and a `commit`
/// alike: none of their ADDs is answered as recorded or committed, and a
/// later flush that succeeds (of a record appended meanwhile) does not
/// answer for them. The failed `begin`s are off the open set: their
/// attachments can be ADDed again.
#[tokio::test]
async fn a_failed_flush_fails_every_waiter_it_took() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path());
    let sim = Arc::new(SimDisk::new(dir.path()));
    let gate = Gated::new(sim.clone());
    let intents = Intents::new(dir.path())
        .with_cache(cache.clone().with_storage(sim.clone()), true)
        .with_storage(gate.clone());
    intents.prepare().unwrap();
    // An ADD whose plugins ran: its commit joins the failing batch.
    let d = intent("c-d");
    let pd = intents.begin(&d).await.unwrap().pending().unwrap();
    let rec = CacheRecord::new(
        "n",
        &d.rt,
        d.config.clone(),
        Some(json!({"cniVersion": "1.1.0"})),
    );
    cache.write(&rec).await.unwrap();

    let _open = gate.arm(&[2]);
    let a = spawn_begin(&intents, "c-a");
    wait_for("the first flush did not start", || gate.started() == 1).await;
    let b = spawn_begin(&intents, "c-b");
    let c = spawn_begin(&intents, "c-c");
    let commit = {
        let (intents, rec) = (intents.clone(), rec.clone());
        tokio::spawn(async move { intents.commit(pd, &rec).await })
    };
    for cid in ["c-b", "c-c"] {
        appended(dir.path(), cid).await;
    }
    wait_for("the commit was not appended", || {
        !committed_records(&std::fs::read(dir.path().join(INTENTS_DIR).join(JOURNAL)).unwrap())
            .is_empty()
    })
    .await;
    gate.open_to(1);
    assert!(matches!(
        a.await.unwrap().unwrap(),
        BeginAnswer::Recorded(_)
    ));
    // The second flush takes b, c and the commit, and is held; e is
    // appended after it began.
    wait_for("the second flush did not start", || gate.started() == 2).await;
    let e = spawn_begin(&intents, "c-e");
    appended(dir.path(), "c-e").await;
    gate.open_to(usize::MAX);

    for (cid, t) in [("c-b", b), ("c-c", c)] {
        match t.await.unwrap() {
            Err(BeginError::Journal(err)) => {
                assert!(err.to_string().contains("fdatasync"), "{cid}: {err}");
            }
            other => panic!("{cid}: recorded though its flush failed: {other:?}"),
        }
    }
    assert!(
        commit.await.unwrap().is_err(),
        "the commit was answered though its flush failed"
    );
    assert!(matches!(
        e.await.unwrap().unwrap(),
        BeginAnswer::Recorded(_)
    ));
    assert_eq!(gate.started(), 3, "e had a flush of its own");
    let open: Vec<String> = {
        let j = intents.journal.lock().unwrap();
        let mut v: Vec<String> = j.open.values().map(|(k, _)| k.clone()).collect();
        v.sort();
        v
    };
    assert_eq!(open, ["n:c-a:eth0", "n:c-e:eth0"]);
    // b can be ADDed again (not refused as in progress).
    assert!(
        intents
            .begin(&intent("c-b"))
            .await
            .unwrap()
            .pending()
            .is_some()
    );
}

/// Liveness on the real disk: 200 ADDs at once, each a `begin` and a
/// `commit` sharing flushes with the others, on a runtime with several
/// workers; every one is answered and its commit line is in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_adds_are_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, journal, intents) = deferred(dir.path(), "boot-a");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (intents, cache) = (intents.clone(), cache.clone());
        tasks.spawn(async move { committed_add(&intents, &cache, &format!("c-{i}")).await });
    }
    let all = async {
        let mut n = 0;
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
            n += 1;
        }
        n
    };
    let n = tokio::time::timeout(std::time::Duration::from_secs(120), all)
        .await
        .expect("an ADD was never answered");
    assert_eq!(n, 200);
    assert_eq!(
        committed_records(&std::fs::read(&journal).unwrap()).len(),
        200
    );
}

/// Liveness: 300 `begin`s arrive while a flush is held (a disk that
/// stalls): each appends and waits, none runs a flush of its own while
/// the held one runs, and once it ends one more flush answers them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_begins_during_a_held_flush_share_the_next_one() {
    const N: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let (sim, gate, intents) = gated_journal(dir.path());
    let first = intents.begin(&intent("c-first")).await.unwrap();
    assert!(matches!(first, BeginAnswer::Recorded(_)));
    let before = sim.calls().len();
    let _open = gate.arm(&[]);
    let lead = spawn_begin(&intents, "c-lead");
    wait_for("the first flush did not start", || gate.started() == 1).await;
    let rest: Vec<_> = (0..N)
        .map(|i| spawn_begin(&intents, &format!("c-{i}")))
        .collect();
    wait_for("not every begin was appended", || {
        intents.journal.lock().unwrap().open.len() == N + 2
    })
    .await;
    assert_eq!(gate.started(), 1, "a flush ran beside the held one");
    gate.open_to(usize::MAX);
    assert!(matches!(
        lead.await.unwrap().unwrap(),
        BeginAnswer::Recorded(_)
    ));
    for t in rest {
        assert!(matches!(
            t.await.unwrap().unwrap(),
            BeginAnswer::Recorded(_)
        ));
    }
    assert_eq!(journal_flushes(&sim, before), 2);
    assert_eq!(durable_open(&sim).len(), N + 2);
}

/// A graceful stop while a `commit`'s shared flush is held (its record
/// the only thing to keep): the stop flushes the record and removes the
/// journal; the held flush of the removed file then answers the commit,
/// and after a power loss and a reboot the answered ADD's record is
/// there.
#[tokio::test]
async fn a_graceful_stop_during_a_held_commit_flush_keeps_the_answered_record() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(dir.path());
    let sim = Arc::new(SimDisk::new(dir.path()));
    let gate = Gated::new(sim.clone());
    let intents = Intents::new(dir.path())
        .with_cache(cache.clone().with_storage(sim.clone()), true)
        .with_boot_id("boot-a")
        .with_storage(gate.clone());
    intents.prepare().unwrap();
    let d = intent("c-d");
    let pd = intents.begin(&d).await.unwrap().pending().unwrap();
    let rec = CacheRecord::new(
        "n",
        &d.rt,
        d.config.clone(),
        Some(json!({"cniVersion": "1.1.0"})),
    );
    cache
        .clone()
        .with_storage(sim.clone())
        .write(&rec)
        .await
        .unwrap();
    let _open = gate.arm(&[]);
    let commit = {
        let (intents, rec) = (intents.clone(), rec.clone());
        tokio::spawn(async move { intents.commit(pd, &rec).await })
    };
    wait_for("the commit's flush did not start", || gate.started() == 1).await;
    let stopping = intents.clone();
    tokio::task::spawn_blocking(move || stopping.close())
        .await
        .unwrap();
    assert!(
        !dir.path().join(INTENTS_DIR).join(JOURNAL).exists(),
        "the stop kept the journal"
    );
    gate.open_to(usize::MAX);
    commit.await.unwrap().unwrap();
    drop(intents);
    sim.power_loss(Cut::None);
    let after = on_sim(dir.path(), "boot-b", &sim);
    after.prepare().unwrap();
    assert_eq!(
        std::fs::read(cache.path("n", "c-d", "eth0").unwrap()).ok(),
        Some(rec.encode()),
        "the answered ADD's record was lost"
    );
}

/// A rewrite (compaction) while a flush of the file it replaces is held:
/// `a`'s flush is of the old file, `b` was appended to the old file after
/// that flush began, `c` to the new one. Each is answered only by a flush
/// that covers it (the rewrite copied `b` durably, the next flush is of
/// the new file), and a power loss keeps all three.
#[tokio::test]
async fn a_rewrite_during_a_held_flush_loses_no_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, gate, intents) = gated_journal(dir.path());
    let _open = gate.arm(&[]);
    let a = spawn_begin(&intents, "c-a");
    wait_for("the first flush did not start", || gate.started() == 1).await;
    let b = spawn_begin(&intents, "c-b");
    appended(dir.path(), "c-b").await;
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
    let old = inode(&journal);
    intents.journal.lock().unwrap().compact_at = 1;
    // The rewrite's temp file is flushed too: not held.
    gate.let_through(2);
    let compacting = intents.clone();
    tokio::task::spawn_blocking(move || compacting.compact_if_due())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(inode(&journal), old, "not rewritten");
    let c = spawn_begin(&intents, "c-c");
    appended(dir.path(), "c-c").await;
    gate.open_to(usize::MAX);
    for (cid, t) in [("c-a", a), ("c-b", b), ("c-c", c)] {
        assert!(
            matches!(t.await.unwrap(), Ok(BeginAnswer::Recorded(_))),
            "{cid}"
        );
        assert!(
            durable_open(&sim).contains(&format!("n:{cid}:eth0")),
            "{cid} answered, not durable"
        );
    }
    assert_eq!(
        durable_open(&sim),
        ["n:c-a:eth0", "n:c-b:eth0", "n:c-c:eth0"]
    );
}
