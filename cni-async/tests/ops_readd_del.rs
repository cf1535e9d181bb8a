//! A plain ADD with rollback run again over an attachment, racing a DEL of
//! that attachment: what "recorded before the ADD" means is decided under
//! the attachment's lock, so it is never a record a concurrent DEL removes.
//!
//! - The ADD first (held in its first plugin): the DEL waits for the lock;
//!   the ADD fails in its second plugin and, the record being there, is not
//!   rolled back; then the DEL runs every plugin with that record's
//!   prevResult and removes it. Nothing is left, nothing ran twice.
//! - The DEL first (held in its first plugin): the ADD waits; once the
//!   DEL removed the record, the ADD finds none, and its failure is rolled
//!   back (what it made is its own). Nothing is left either.
//!
//! Fake plugins; the order comes from gates and a lock attempt seen to
//! wait, never from sleeps.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::support::fake::{Fake, RIG_KILL_GRACE, Response, Rig, conflist};
use crate::support::gate::{Gate, poll_once};
use cni_async::cache::ResultCache;
use cni_async::{Cni, RawExec, Timeouts};
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.3.2/24"}]}"#;

fn list() -> cni_core::NetworkConfigList {
    conflist(
        json!({"cniVersion":"1.0.0","name":"readd","plugins":[{"type":"first"},{"type":"second"}]}),
    )
}

/// A `Cni` whose cache runs its I/O on the calling thread: a first poll
/// of a call makes its first lock attempt before it returns.
fn inline_cni(rig: &Rig) -> Cni {
    Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        .cache(ResultCache::new(&rig.cache_dir).with_inline_io(true))
        .exec(Arc::new(RawExec::new().with_kill_grace(RIG_KILL_GRACE)))
        .timeouts(Timeouts::uniform(Duration::from_secs(30)))
        .check_netns(false)
        .build()
}

/// `(plugin, command)` of every recorded run, in order.
fn runs(rig: &Rig) -> Vec<(String, String)> {
    rig.dir
        .invocations()
        .into_iter()
        .map(|i| {
            (
                i.plugin.clone(),
                i.var("CNI_COMMAND").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn run(plugin: &str, command: &str) -> (String, String) {
    (plugin.to_owned(), command.to_owned())
}

/// The attachment ADDed, then `first` (gated on `gated`) and `second`
/// (ADD refused) as the race needs them; the records cleared.
async fn attached(gated: &str) -> (Rig, Gate, Cni, RuntimeConf) {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    let cni = inline_cni(&rig);
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&list(), &rt)
        .await
        .expect("the first ADD");
    let gate = Gate::new(rig.dir.root());
    let held = Response::ok(RESULT).with_shell(&gate.shell_wait());
    let first = match gated {
        "ADD" => Fake::new(Response::ok("")).on("ADD", held),
        _ => Fake::new(Response::ok(RESULT)),
    };
    rig.fake("first", &first);
    let second = Fake::new(Response::ok("")).on("ADD", Response::cni_error(11, "refused", ""));
    let second = match gated {
        "DEL" => second.on("DEL", Response::ok("").with_shell(&gate.shell_wait())),
        _ => second,
    };
    rig.fake("second", &second);
    rig.dir.clear_records();
    (rig, gate, cni, rt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_behind_a_failing_readd_deletes_the_attachment_after_it() {
    let (rig, gate, cni, rt) = attached("ADD").await;
    let list = list();
    let (add, del) = tokio::join!(
        cni.add_network_list(&list, &rt)
            .rollback(true)
            .into_future(),
        async {
            gate.wait_started(1).await;
            let del = cni.del_network_list(&list, &rt).into_future();
            tokio::pin!(del);
            let early = poll_once(&mut del).await;
            assert!(early.is_pending(), "the DEL did not wait: {early:?}");
            gate.release();
            del.await
        }
    );
    let err = add.expect_err("the second plugin refuses the ADD");
    let chain = cni_async::Chain(&err).to_string();
    assert!(chain.contains("refused"), "{chain}");
    del.expect("the DEL");
    assert_eq!(
        runs(&rig),
        [
            run("first", "ADD"),
            run("second", "ADD"),
            run("second", "DEL"),
            run("first", "DEL"),
        ],
        "the ADD was rolled back, or the DEL ran inside it"
    );
    // The DEL had the record written before the ADD as prevResult.
    for del in rig.dir.invocations_of("DEL") {
        assert_eq!(
            del.stdin_json()["prevResult"]["ips"][0]["address"],
            "10.219.3.2/24"
        );
    }
    assert!(rig.result_files().is_empty(), "{:?}", rig.result_files());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readd_behind_a_del_finds_no_record_and_rolls_back_its_own() {
    let (rig, gate, cni, rt) = attached("DEL").await;
    let list = list();
    let (del, add) = tokio::join!(cni.del_network_list(&list, &rt).into_future(), async {
        gate.wait_started(1).await;
        let add = cni
            .add_network_list(&list, &rt)
            .rollback(true)
            .into_future();
        tokio::pin!(add);
        let early = poll_once(&mut add).await;
        assert!(early.is_pending(), "the ADD did not wait: {early:?}");
        gate.release();
        add.await
    });
    del.expect("the DEL");
    add.expect_err("the second plugin refuses the ADD");
    assert_eq!(
        runs(&rig),
        [
            run("second", "DEL"),
            run("first", "DEL"),
            run("first", "ADD"),
            run("second", "ADD"),
            run("second", "DEL"),
            run("first", "DEL"),
        ],
        "the ADD ran inside the DEL, or its failure was not rolled back"
    );
    assert!(rig.result_files().is_empty(), "{:?}", rig.result_files());
}
