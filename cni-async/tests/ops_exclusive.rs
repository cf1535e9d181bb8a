//! `.exclusive()`: an ADD that refuses an attachment the cache holds
//! already, checked under the attachment's lock (what cnitool runs).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::support::fake::{Fake, RIG_KILL_GRACE, Response, Rig, conflist};
use crate::support::gate::{Gate, poll_once};
use cni_async::cache::ResultCache;
use cni_async::{Cni, Error, ErrorKind, RawExec, Timeouts};
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.1.2/24"}]}"#;

fn list() -> cni_core::NetworkConfigList {
    conflist(
        json!({"cniVersion":"1.0.0","name":"excl","plugins":[{"type":"first"},{"type":"second"}]}),
    )
}

/// A rig whose plugins `first` and `second` answer [`RESULT`].
fn two_plugins() -> Rig {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    rig
}

/// [`two_plugins`] with `first`'s ADD held at the gate.
fn gated_plugins() -> (Rig, Gate) {
    let rig = two_plugins();
    let gate = Gate::new(rig.dir.root());
    rig.fake(
        "first",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT).with_shell(&gate.shell_wait())),
    );
    (rig, gate)
}

/// Fails unless `r` is [`Error::AlreadyAttached`].
#[track_caller]
fn assert_already_attached<T: std::fmt::Debug>(r: &Result<T, Error>) {
    assert!(
        matches!(
            r.as_ref().map_err(Error::innermost),
            Err(Error::AlreadyAttached { .. })
        ),
        "{r:?}"
    );
}

/// A `Cni` over the rig whose cache runs its I/O on the calling thread: a
/// first poll of an ADD then makes its first lock attempt before it
/// returns.
fn inline_cni(rig: &Rig) -> Cni {
    Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        // Fake plugins, stand-in netns paths: no namespace check.
        .check_netns(false)
        .cache(ResultCache::new(&rig.cache_dir).with_inline_io(true))
        .exec(Arc::new(RawExec::new().with_kill_grace(RIG_KILL_GRACE)))
        .timeouts(Timeouts::uniform(Duration::from_secs(30)))
        .build()
}

#[tokio::test]
async fn an_exclusive_add_of_a_cached_attachment_runs_no_plugin() {
    let rig = two_plugins();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&list, &rt)
        .exclusive()
        .await
        .expect("the first exclusive ADD");
    let record = std::fs::read(rig.cache_file("excl", "c1", "eth0")).expect("its record");

    let refused = cni.add_network_list(&list, &rt).exclusive().await;
    let Err(e) = refused else {
        panic!("a second exclusive ADD ran: {refused:?}");
    };
    assert!(
        matches!(e.innermost(), Error::AlreadyAttached { .. }),
        "{e:?}"
    );
    assert_eq!(
        e.innermost().to_string(),
        "container \"c1\" interface \"eth0\" is already attached to network \"excl\": DEL it first"
    );
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(
        e.code(),
        cni_core::error::code::INVALID_ENVIRONMENT_VARIABLES
    );
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert_eq!(
        std::fs::read(rig.cache_file("excl", "c1", "eth0")).unwrap(),
        record,
        "the record changed"
    );
    // So does .with_record(), and a detached ADD.
    let refused = cni
        .add_network_list(&list, &rt)
        .exclusive()
        .with_record()
        .await;
    assert_already_attached(&refused);
    let refused = cni
        .add_network_list(&list, &rt)
        .exclusive()
        .rollback_on_cancel()
        .await;
    assert_already_attached(&refused);
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert_eq!(
        rig.dir.invocations_of("DEL").len(),
        0,
        "something was rolled back"
    );

    // Another interface is another attachment; without exclusive, the ADD
    // runs the plugins over the existing attachment, as libcni does.
    let eth1 = RuntimeConf::new("c1", "/run/netns/c1", "eth1");
    cni.add_network_list(&list, &eth1)
        .exclusive()
        .await
        .expect("eth1");
    cni.add_network_list(&list, &rt)
        .await
        .expect("a plain ADD over it");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 6);
    // After the DEL, an exclusive ADD runs again.
    cni.del_network_list(&list, &rt).await.expect("DEL");
    cni.add_network_list(&list, &rt)
        .exclusive()
        .await
        .expect("after the DEL");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 8);
}

/// Two exclusive ADDs of one attachment at once: the second has tried the
/// lock (so any check it made outside it is made) while the first runs
/// its plugin; once the first is done, the second finds its record and
/// runs nothing.
#[tokio::test]
async fn concurrent_exclusive_adds_of_one_attachment_run_the_plugins_once() {
    let (rig, gate) = gated_plugins();
    let cni = inline_cni(&rig);
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let (first, second) = tokio::join!(cni.add_network_list(&list, &rt).exclusive(), async {
        gate.wait_started(1).await;
        let second = cni.add_network_list(&list, &rt).exclusive().into_future();
        tokio::pin!(second);
        // Inline cache I/O: this poll made a lock attempt, found the lock
        // taken, and now waits to try again.
        let early = poll_once(&mut second).await;
        assert!(early.is_pending(), "the second ADD did not wait: {early:?}");
        gate.release();
        second.await
    });
    first.expect("the first exclusive ADD");
    assert_already_attached(&second);
    let adds = rig.dir.invocations_of("ADD");
    assert_eq!(adds.len(), 2, "{adds:?}");
    assert_eq!(gate.started(), 1, "the gated plugin ran twice");
}

/// A legacy bare result (what libcni wrote before `cniCacheV1`) is this
/// attachment's record: an exclusive ADD refuses it, runs nothing and
/// leaves the file as it was (a DEL still finds its prevResult).
#[tokio::test]
async fn an_exclusive_add_over_a_legacy_bare_result_is_refused_and_keeps_it() {
    let rig = two_plugins();
    let cni = rig.cni();
    let file = rig.cache_file("excl", "c1", "eth0");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let legacy = br#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.9.9/24"}]}"#;
    std::fs::write(&file, legacy).unwrap();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");

    let refused = cni.add_network_list(&list(), &rt).exclusive().await;
    assert_already_attached(&refused);
    assert!(rig.dir.invocations().is_empty(), "a plugin ran");
    assert_eq!(std::fs::read(&file).unwrap(), legacy, "the result changed");
    assert!(rig.corrupt_files().is_empty(), "{:?}", rig.corrupt_files());
}

/// A corrupt file at the attachment's record is, in doubt, an attachment:
/// an exclusive ADD refuses it as already attached, runs nothing and
/// leaves the file where it is (evidence for the next ADD too). A plain
/// ADD runs over it and replaces it with its own record (a DEL would move
/// it aside). Then the fresh record is refused.
#[tokio::test]
async fn an_exclusive_add_over_a_corrupt_record_is_refused_and_keeps_it() {
    let rig = two_plugins();
    let cni = rig.cni();
    let file = rig.cache_file("excl", "c1", "eth0");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let garbage = b"{\"kind\":\"cniCacheV1\",";
    std::fs::write(&file, garbage).unwrap();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");

    let refused = cni.add_network_list(&list(), &rt).exclusive().await;
    assert_already_attached(&refused);
    assert!(rig.dir.invocations().is_empty(), "a plugin ran");
    assert_eq!(std::fs::read(&file).unwrap(), garbage, "the file changed");
    assert!(rig.corrupt_files().is_empty(), "{:?}", rig.corrupt_files());

    cni.add_network_list(&list(), &rt)
        .await
        .expect("a plain ADD over a corrupt record");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2);
    let rec = rig
        .cache_json("excl", "c1", "eth0")
        .expect("a fresh record");
    assert_eq!(rec["containerId"], "c1", "{rec}");
    let refused = cni.add_network_list(&list(), &rt).exclusive().await;
    assert_already_attached(&refused);
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
}

/// The cached getters (libcni's `GetNetworkListCachedResult` and
/// `GetNetworkListCachedConfig`) only read: a corrupt record stays where
/// it is, as it does for a CHECK. Moved aside by them, it was gone as
/// evidence: the next exclusive ADD found no record, ran the plugins over
/// the attachment and counted it as its own (its rollback or a sandbox's
/// undo would then delete it), and the scans forgot the netns's owner.
#[tokio::test]
async fn the_cached_getters_leave_a_corrupt_record_in_place() {
    let rig = two_plugins();
    let cni = rig.cni();
    let file = rig.cache_file("excl", "c1", "eth0");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let garbage = b"{\"kind\":\"cniCacheV1\",";
    std::fs::write(&file, garbage).unwrap();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");

    let result = cni.cached_result(&list(), &rt).await;
    assert!(matches!(result, Ok(None)), "{result:?}");
    let config = cni.cached_config("excl", &rt).await;
    assert!(matches!(config, Ok(None)), "{config:?}");
    assert_eq!(std::fs::read(&file).unwrap(), garbage, "the file changed");
    assert!(rig.corrupt_files().is_empty(), "{:?}", rig.corrupt_files());

    let refused = cni.add_network_list(&list(), &rt).exclusive().await;
    assert_already_attached(&refused);
    assert!(rig.dir.invocations().is_empty(), "a plugin ran");
}

/// An ADD with rollback over a corrupt record whose own record cannot be
/// written (the cache is full) fails without a rollback (the corrupt
/// record may be all that is left of an attachment) and leaves the corrupt
/// file where it was: moved aside before the write, it was gone, and the
/// next ADD saw no record and rolled back, deleting what was attached.
/// Needs root (mounts a tmpfs).
#[tokio::test]
async fn an_add_over_a_corrupt_record_that_cannot_write_keeps_the_record() {
    crate::support::require_root!();
    let rig = two_plugins();
    let cache = cni_test_support::tmpfs::Tmpfs::mount(&rig.cache_dir);
    let cni = rig.cni();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    // Everything of the attachment's in place (dirs, lock file), then its
    // record turns corrupt and the cache fills up.
    cni.add_network_list(&list(), &rt).await.unwrap();
    std::fs::create_dir_all(rig.cache_dir.join("corrupt")).unwrap();
    let file = rig.cache_file("excl", "c1", "eth0");
    let garbage = b"{\"kind\":\"cniCacheV1\",";
    std::fs::write(&file, garbage).unwrap();
    rig.dir.clear_records();
    cache.fill();

    let err = cni
        .add_network_list(&list(), &rt)
        .rollback(true)
        .await
        .expect_err("no room for the record");
    assert!(
        matches!(err.innermost(), Error::Cache { source, .. } if source.raw_os_error() == Some(28)),
        "{err:?}"
    );
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2);
    assert!(
        rig.dir.invocations_of("DEL").is_empty(),
        "rolled back over a corrupt record"
    );
    assert_eq!(
        std::fs::read(&file).expect("the corrupt record is gone"),
        garbage
    );
    assert!(rig.corrupt_files().is_empty(), "{:?}", rig.corrupt_files());
}

/// A symbolic link at the record's path is never followed, even to a
/// valid record of this very attachment: it is moved aside (the target is
/// left alone) and the exclusive ADD runs.
#[tokio::test]
async fn an_exclusive_add_over_a_symlinked_record_moves_the_link_aside_unfollowed() {
    let rig = two_plugins();
    let cni = rig.cni();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    // A genuine record of this attachment, kept elsewhere.
    cni.add_network_list(&list(), &rt)
        .exclusive()
        .await
        .unwrap();
    let file = rig.cache_file("excl", "c1", "eth0");
    let elsewhere = rig.dir.scratch("elsewhere");
    std::fs::rename(&file, &elsewhere).unwrap();
    let genuine = std::fs::read(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
    rig.dir.clear_records();

    cni.add_network_list(&list(), &rt)
        .exclusive()
        .await
        .expect("an exclusive ADD over a symbolic link");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2);
    assert_eq!(rig.corrupt_files().len(), 1, "{:?}", rig.corrupt_files());
    assert!(
        !std::fs::symlink_metadata(&file)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is still the record"
    );
    assert_eq!(
        std::fs::read(&elsewhere).unwrap(),
        genuine,
        "the link was followed"
    );
}

/// `a-b` + `c` and `a` + `b-c` share a file name: an exclusive ADD of
/// one while the other is recorded is a collision (not "already
/// attached", which would send the user to DEL the wrong attachment), runs
/// nothing and leaves the other's record; the recorded one is refused as
/// already attached.
#[tokio::test]
async fn an_exclusive_add_of_a_colliding_name_is_a_collision_not_already_attached() {
    let rig = two_plugins();
    let cni = rig.cni();
    let recorded = RuntimeConf::new("a-b", "/run/netns/ab", "c");
    let colliding = RuntimeConf::new("a", "/run/netns/a", "b-c");
    cni.add_network_list(&list(), &recorded)
        .exclusive()
        .await
        .unwrap();
    let file = rig.cache_file("excl", "a-b", "c");
    assert_eq!(file, rig.cache_file("excl", "a", "b-c"));
    let record = std::fs::read(&file).unwrap();

    let collided = cni.add_network_list(&list(), &colliding).exclusive().await;
    assert!(
        matches!(
            collided.as_ref().map_err(Error::innermost),
            Err(Error::AttachmentCollision { .. })
        ),
        "{collided:?}"
    );
    let refused = cni.add_network_list(&list(), &recorded).exclusive().await;
    assert_already_attached(&refused);
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert_eq!(std::fs::read(&file).unwrap(), record, "the record changed");
}

/// The lock comes first: an exclusive ADD that cannot take the lock in
/// time is `CacheLocked` (it cannot know what the holder leaves), even
/// with a record there; once the lock is free it is `AlreadyAttached`,
/// and it released the lock on the way out (taken again at once, with no
/// wait) and kept the lock file (the record is there).
#[tokio::test]
async fn a_held_lock_is_cache_locked_before_already_attached_which_releases_it() {
    let rig = two_plugins();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&list, &rt).exclusive().await.unwrap();
    let cache = ResultCache::new(&rig.cache_dir);

    let held = cache
        .lock("excl", "c1", "eth0", Duration::ZERO)
        .await
        .expect("the lock is free");
    let short = cni_async::CallOptions {
        timeout: Some(Duration::from_millis(50)),
        rollback: false,
    };
    let locked = cni
        .add_network_list(&list, &rt)
        .options(&short)
        .exclusive()
        .await;
    assert!(
        matches!(
            locked.as_ref().map_err(Error::innermost),
            Err(Error::CacheLocked { .. })
        ),
        "{locked:?}"
    );
    drop(held);

    let refused = cni.add_network_list(&list, &rt).exclusive().await;
    assert_already_attached(&refused);
    let again = cache.lock("excl", "c1", "eth0", Duration::ZERO).await;
    assert!(again.is_ok(), "the refused ADD kept the lock: {again:?}");
    drop(again);
    assert!(rig.lock_file("excl", "c1", "eth0").exists());
    // A DEL right after runs at once.
    let del = cni_async::CallOptions {
        timeout: Some(Duration::from_secs(10)),
        rollback: false,
    };
    cni.del_network_list(&list, &rt)
        .options(&del)
        .await
        .expect("DEL");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2);
    assert_eq!(rig.dir.invocations_of("DEL").len(), 2);
    assert!(rig.result_files().is_empty(), "{:?}", rig.result_files());
}

/// A detached exclusive ADD whose caller gave up while it waited for the
/// lock (held by an exclusive ADD that then attaches) finds the record,
/// runs nothing and, above all, deletes nothing: its task must not undo
/// the other ADD's attachment.
#[tokio::test]
async fn a_detached_exclusive_add_given_up_while_waiting_deletes_nothing() {
    let (rig, gate) = gated_plugins();
    let cni = inline_cni(&rig);
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let (first, ()) = tokio::join!(cni.add_network_list(&list, &rt).exclusive(), async {
        gate.wait_started(1).await;
        let mut given_up = cni
            .add_network_list(&list, &rt)
            .exclusive()
            .rollback_on_cancel()
            .into_future();
        // Spawns its task, which waits for the lock.
        assert!(poll_once(&mut given_up).await.is_pending());
        drop(given_up);
        gate.release();
    });
    first.expect("the first exclusive ADD");
    tokio::time::timeout(crate::support::gate::GATE_WAIT_LIMIT, cni.wait_detached())
        .await
        .expect("the given-up ADD ends on its task");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert!(
        rig.dir.invocations_of("DEL").is_empty(),
        "the other ADD's attachment was undone"
    );
    assert!(
        rig.cache_json("excl", "c1", "eth0").is_some(),
        "record gone"
    );
    assert_eq!(gate.started(), 1);
}

/// A detached exclusive ADD given up while its plugin runs is rolled back
/// under its lock; an exclusive ADD waiting for that lock meanwhile then
/// finds no record and attaches: a rolled-back attachment is not "already
/// attached".
#[tokio::test]
async fn an_exclusive_add_waiting_behind_a_rolled_back_one_attaches() {
    let (rig, gate) = gated_plugins();
    let cni = inline_cni(&rig);
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let mut given_up = cni
        .add_network_list(&list, &rt)
        .exclusive()
        .rollback_on_cancel()
        .into_future();
    assert!(poll_once(&mut given_up).await.is_pending());
    gate.wait_started(1).await;
    let waiting = cni.add_network_list(&list, &rt).exclusive().into_future();
    tokio::pin!(waiting);
    // Inline cache I/O: this poll tried the lock and found it taken.
    assert!(poll_once(&mut waiting).await.is_pending());
    drop(given_up);
    gate.release();
    waiting.await.expect("the exclusive ADD after the rollback");
    tokio::time::timeout(crate::support::gate::GATE_WAIT_LIMIT, cni.wait_detached())
        .await
        .expect("the given-up ADD ends on its task");
    let steps: Vec<String> = rig
        .dir
        .invocations()
        .iter()
        .map(|c| format!("{} {}", c.command(), c.plugin))
        .collect();
    assert_eq!(steps, ["ADD first", "DEL first", "ADD first", "ADD second"]);
    assert!(rig.cache_json("excl", "c1", "eth0").is_some(), "no record");
}

/// Many exclusive ADDs and DELs of one attachment on one `Cni` at once,
/// any interleaving: plugin runs are serialized by the lock, so their
/// order is the real one; no ADD ever runs right after another ADD (a DEL
/// always comes between), and the record is there exactly when the last
/// plugin run was an ADD.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_exclusive_adds_and_dels_never_add_twice_and_the_record_follows_the_last() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    let list = conflist(json!({"cniVersion":"1.0.0","name":"excl","plugins":[{"type":"first"}]}));
    let cni = rig.cni();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    for round in 0..5 {
        rig.dir.clear_records();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (cni, list, rt) = (cni.clone(), list.clone(), rt.clone());
            tasks.spawn(async move {
                if i % 3 == 2 {
                    cni.del_network_list(&list, &rt).await.map(|()| "DEL")
                } else {
                    match cni
                        .add_network_list(&list, &rt)
                        .exclusive()
                        .await
                        .map_err(Error::into_innermost)
                    {
                        Ok(_) => Ok("ADD"),
                        Err(Error::AlreadyAttached { .. }) => Ok("refused"),
                        Err(e) => Err(e),
                    }
                }
            });
        }
        let mut outcomes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            outcomes.push(joined.unwrap().expect("no error but AlreadyAttached"));
        }
        let runs: Vec<String> = rig
            .dir
            .invocations()
            .iter()
            .map(|c| c.command().to_owned())
            .collect();
        for pair in runs.windows(2) {
            assert_ne!(
                pair,
                ["ADD", "ADD"],
                "round {round}: two ADDs in a row: {runs:?}"
            );
        }
        let recorded = rig.cache_json("excl", "c1", "eth0").is_some();
        let last_add = runs.last().is_some_and(|c| c == "ADD");
        assert_eq!(recorded, last_add, "round {round}: {runs:?}, {outcomes:?}");
        let adds = outcomes.iter().filter(|o| **o == "ADD").count();
        assert_eq!(adds, runs.iter().filter(|c| *c == "ADD").count());
    }
}
