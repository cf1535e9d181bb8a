//! Trips to tokio's blocking pool per operation: ADD takes the
//! attachment's lock and checks its slot in one trip (the crate's
//! `lock_for_add`, tested with its unit tests), DEL and CHECK take it and read the record
//! in one trip ([`ResultCache::lock_and_read`]); with inline I/O there is
//! no trip at all. And the combined calls keep the semantics of the calls
//! they replace: the collision error, the lock released (and its file kept
//! or removed) as before, no look at the slot before the lock is held,
//! `CacheLocked` after the timeout, a corrupt record moved aside.
//!
//! A trip is counted as a `Pending` of the operation's future, on a
//! current-thread runtime whose blocking pool has one thread, with an
//! in-process executor whose plugins answer at once: the only thing an ADD,
//! CHECK or DEL waits for is then the blocking pool (no other task, no timer
//! while the lock is free). Left alone, a fast blocking task can finish
//! before its handle is first polled (the woken pool thread preempts the
//! caller), and its trip would not show; so the pool's thread is kept
//! plugged ([`Plug`]) except while the runtime's thread is idle: each trip
//! is then exactly one `Pending`.

use std::future::{Future, IntoFuture};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use cni_async::cache::ResultCache;
use cni_async::{Cni, Error, ExecOutput, ExecRequest, PluginExec};
use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::{Command, NetworkConfigList, RuntimeConf};
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// Plugins run in the test process: each answers at once (ADD with a fixed
/// result) and its verb and stdin are recorded.
#[derive(Debug, Default)]
struct InProcess {
    calls: Mutex<Vec<(Command, Value)>>,
}

fn add_result() -> Value {
    json!({"cniVersion": "1.0.0", "ips": [{"address": "10.231.0.2/24"}]})
}

impl PluginExec for InProcess {
    fn exec<'a>(&'a self, req: ExecRequest<'a>) -> BoxFuture<'a, Result<ExecOutput, Error>> {
        let stdin: Value = serde_json::from_slice(req.stdin).expect("stdin is JSON");
        self.calls.lock().unwrap().push((req.command, stdin));
        let stdout = match req.command {
            Command::Add => add_result().to_string().into_bytes(),
            _ => Vec::new(),
        };
        Box::pin(std::future::ready(Ok(ExecOutput {
            stdout,
            stderr: Vec::new(),
            elapsed: Duration::ZERO,
        })))
    }

    fn find_plugin(&self, plugin_type: &str, _dirs: &[PathBuf]) -> Result<PathBuf, Error> {
        Ok(PathBuf::from("/in-process").join(plugin_type))
    }
}

/// Runs `fut` to completion, counting the times it was left `Pending`.
async fn counting_pendings<F: Future>(fut: F) -> (F::Output, usize) {
    let mut fut = std::pin::pin!(fut);
    let mut pendings = 0;
    let out = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Pending => {
            pendings += 1;
            Poll::Pending
        }
        Poll::Ready(v) => Poll::Ready(v),
    })
    .await;
    (out, pendings)
}

/// Keeps the blocking pool's only thread busy with a plug (a blocking task
/// waiting on a channel) except while the runtime's thread is parked. At
/// each park ([`Plug::cycle`] as the `on_thread_park` hook) the current plug
/// is pulled and a fresh one queued behind what is queued: a blocking task
/// spawned by the future being run can only start once that future has
/// returned `Pending` and the runtime has nothing else to do.
#[derive(Debug, Clone, Default)]
struct Plug(Arc<Mutex<Option<std::sync::mpsc::Sender<()>>>>);

impl Plug {
    /// Queues a fresh plug, then pulls the one in place.
    fn cycle(&self) {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        // The timeout only stops a failed test from hanging.
        drop(tokio::task::spawn_blocking(move || {
            let _ = rx.recv_timeout(Duration::from_secs(60));
        }));
        // Dropping the old sender lets the old plug return.
        *self.0.lock().unwrap() = Some(tx);
    }

    /// Pulls the plug in place, if any.
    fn pull(&self) {
        self.0.lock().unwrap().take();
    }
}

/// A current-thread runtime with one blocking thread, kept plugged by
/// `plug` while the runtime works.
fn plugged_runtime(plug: &Plug) -> tokio::runtime::Runtime {
    let hook = plug.clone();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .on_thread_park(move || hook.cycle())
        .build()
        .unwrap()
}

fn one_plugin_list() -> NetworkConfigList {
    NetworkConfigList::from_value(
        &json!({"cniVersion": "1.0.0", "name": "hand", "plugins": [{"type": "p"}]}),
    )
    .unwrap()
}

/// ADD, CHECK and DEL of a one-plugin network; returns the trips each took
/// and checks what the plugins got.
fn trips(inline: bool) -> [usize; 3] {
    let dir = tempfile::tempdir().unwrap();
    let exec = Arc::new(InProcess::default());
    let cni = Cni::builder()
        .cache(ResultCache::new(dir.path()).with_inline_io(inline))
        .exec(exec.clone())
        .check_netns(false)
        .build();
    let list = one_plugin_list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let plug = Plug::default();
    let trips = plugged_runtime(&plug).block_on(async {
        plug.cycle();
        let (added, add) = counting_pendings(cni.add_network_list(&list, &rt).into_future()).await;
        let added = added.expect("ADD");
        assert_eq!(added.to_value(), add_result());
        let (checked, check) =
            counting_pendings(cni.check_network_list(&list, &rt).into_future()).await;
        checked.expect("CHECK");
        let (deleted, del) =
            counting_pendings(cni.del_network_list(&list, &rt).into_future()).await;
        deleted.expect("DEL");
        plug.pull();
        [add, check, del]
    });
    let calls = exec.calls.lock().unwrap();
    let verbs: Vec<Command> = calls.iter().map(|(c, _)| *c).collect();
    assert_eq!(verbs, [Command::Add, Command::Check, Command::Del]);
    for (verb, stdin) in &calls[1..] {
        assert_eq!(
            stdin.get("prevResult"),
            Some(&add_result()),
            "{verb:?} gets the cached result as prevResult: {stdin}"
        );
    }
    let results = dir.path().join("results");
    assert_eq!(
        std::fs::read_dir(&results).unwrap().count(),
        0,
        "DEL removed the record"
    );
    let locks = dir.path().join("locks");
    assert_eq!(
        std::fs::read_dir(&locks).unwrap().count(),
        0,
        "DEL removed the lock file"
    );
    trips
}

// A fork in another test's thread holds a copy of the lock CHECK
// released until its child execs; the release unlocks every copy at once
// (`a_released_lock_is_free_while_a_forked_child_holds_its_file`), so DEL
// never waits for it (a `Pending` that is no trip to the pool).

#[test]
fn add_check_and_del_take_one_trip_to_the_pool_per_cache_step() {
    // ADD: lock + slot check, then the write (with the lock). CHECK: lock
    // + read. DEL: lock + read, then the removal.
    assert_eq!(trips(false), [2, 1, 2], "trips of ADD, CHECK, DEL");
}

#[test]
fn with_inline_io_add_check_and_del_never_wait() {
    assert_eq!(trips(true), [0, 0, 0]);
}

/// When the lock cannot be taken for a cache error (here `locks/` cannot
/// be made: a file is in the way), DEL runs unlocked and still reads the
/// record on its own for prevResult, then removes it; a corrupt record is
/// moved aside and the DEL runs without prevResult.
#[test]
fn an_unlocked_del_still_reads_the_record_for_prev_result() {
    for inline in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let exec = Arc::new(InProcess::default());
        let cache = ResultCache::new(dir.path()).with_inline_io(inline);
        let cni = Cni::builder()
            .cache(cache.clone())
            .exec(exec.clone())
            .check_netns(false)
            .build();
        let list = one_plugin_list();
        std::fs::write(dir.path().join("locks"), b"in the way").unwrap();
        current_thread().block_on(async {
            cache.write(&record("hand", "c1", "eth0")).await.unwrap();
            let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
            cni.del_network_list(&list, &rt).await.expect("DEL");

            std::fs::write(dir.path().join("results/hand-c2-eth0"), b"not json").unwrap();
            let rt = RuntimeConf::new("c2", "/run/netns/c2", "eth0");
            cni.del_network_list(&list, &rt).await.expect("DEL");
        });
        let calls = exec.calls.lock().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0].1.get("prevResult"),
            Some(&add_result()),
            "inline {inline}"
        );
        assert_eq!(calls[1].1.get("prevResult"), None, "inline {inline}");
        let results = dir.path().join("results");
        assert_eq!(std::fs::read_dir(&results).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_dir(dir.path().join("corrupt"))
                .unwrap()
                .count(),
            1
        );
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn record(network: &str, container_id: &str, ifname: &str) -> CacheRecord {
    let rt = RuntimeConf::new(container_id, "/run/netns/x", ifname);
    CacheRecord::new(network, &rt, b"{}".to_vec(), Some(add_result()))
}

/// Runs `test` on a current-thread runtime with the pool's only thread,
/// once with the cache I/O on the pool and once inline.
fn both_modes(test: impl AsyncFn(ResultCache, &std::path::Path)) {
    for inline in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(dir.path()).with_inline_io(inline);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .unwrap()
            .block_on(test(cache, dir.path()));
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// `lock_and_read` gives this attachment's record with the lock held; a
/// corrupt record is moved aside and reads as none; a failed read is
/// returned beside the lock, which stays held.
#[test]
fn lock_and_read_reads_under_the_lock() {
    both_modes(async |cache, dir| {
        cache.write(&record("n", "c1", "eth0")).await.unwrap();
        let (lock, read) = cache
            .lock_and_read("n", "c1", "eth0", SECOND)
            .await
            .unwrap();
        let entry = read.unwrap().expect("the record");
        assert!(matches!(&entry, CacheEntry::Record(r) if r.container_id == "c1"));
        assert_eq!(entry.result(), Some(&add_result()));
        let busy = cache
            .lock("n", "c1", "eth0", Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(busy, Error::CacheLocked { .. }), "{busy}");
        drop(lock);

        std::fs::write(dir.join("results/n-c2-eth0"), b"not json").unwrap();
        let (lock, read) = cache
            .lock_and_read("n", "c2", "eth0", SECOND)
            .await
            .unwrap();
        assert!(read.unwrap().is_none());
        assert!(!dir.join("results/n-c2-eth0").exists());
        assert_eq!(std::fs::read_dir(dir.join("corrupt")).unwrap().count(), 1);
        drop(lock);
        assert!(
            !dir.join("locks/n-c2-eth0.lock").exists(),
            "unused lock file removed"
        );

        // A directory where the record should be: a read error, not a
        // missing record; the lock stays held.
        std::fs::create_dir(dir.join("results/n-c3-eth0")).unwrap();
        let (lock, read) = cache
            .lock_and_read("n", "c3", "eth0", SECOND)
            .await
            .unwrap();
        let err = read.unwrap_err();
        assert!(matches!(err, Error::Cache { op: "read", .. }), "{err}");
        let busy = cache
            .lock("n", "c3", "eth0", Duration::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(busy, Error::CacheLocked { .. }), "{busy}");
        drop(lock);
    });
}

/// A child forked while the lock was held (any thread's plugin spawn)
/// holds a copy of the lock's open file until it execs. Releasing the
/// lock frees it for everyone at once, not when that child gets to exec:
/// the child here is held between fork and exec until the lock has been
/// taken again with no wait.
#[test]
fn a_released_lock_is_free_while_a_forked_child_holds_its_file() {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;

    both_modes(async |cache, _dir| {
        // A record keeps the lock file (and its inode) across the release.
        cache.write(&record("n", "c1", "eth0")).await.unwrap();
        let lock = cache.lock("n", "c1", "eth0", SECOND).await.unwrap();
        // forked: the child says it is between fork and exec;
        // go: the test lets it exec.
        let (forked_r, forked_w): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
        let (go_r, go_w): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
        let (child_forked_w, child_go_r) = (forked_w.as_raw_fd(), go_r.as_raw_fd());
        let spawner = std::thread::spawn(move || {
            let mut command = std::process::Command::new("true");
            // SAFETY: only async-signal-safe calls (write, read) between
            // fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let mut byte = [0u8; 1];
                    libc::write(child_forked_w, byte.as_ptr().cast(), 1);
                    libc::read(child_go_r, byte.as_mut_ptr().cast(), 1);
                    Ok(())
                });
            }
            command.status().unwrap()
        });
        // Both ends stay open here until the child has used them.
        let mut byte = [0u8; 1];
        std::fs::File::from(forked_r).read_exact(&mut byte).unwrap();
        drop(forked_w);

        drop(lock);
        let again = cache.lock("n", "c1", "eth0", Duration::ZERO).await;

        std::fs::File::from(go_w).write_all(b"x").unwrap();
        assert!(spawner.join().unwrap().success());
        drop(go_r);
        assert!(again.is_ok(), "{:?}", again.err());
    });
}
