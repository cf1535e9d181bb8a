//! `.rollback_on_cancel()`: an ADD whose caller gives up (drops the
//! future) is finished or rolled back on its own task. Dropped at every
//! point of a three-plugin chain (each plugin held at a gate of its own),
//! it leaves nothing: no plugin state, no cache record, no lock file, no
//! process.

use std::future::IntoFuture;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::fake::{
    Fake, Invocation, Response, Rig, alive, conflist, dir_names, read_pids, sh_quote,
};
use crate::support::gate::{GATE_WAIT_LIMIT, Gate, poll_once};
use cni_core::RuntimeConf;
use serde_json::json;

const PLUGINS: [&str; 3] = ["p1", "p2", "p3"];

fn result(n: usize) -> String {
    json!({"cniVersion":"1.0.0","ips":[{"address": format!("10.215.0.{n}/24")}]}).to_string()
}

/// Three fakes: each ADD records its pid, leaves a state file (what a
/// plugin makes: a veth, a lease), waits at its own gate and answers; each
/// DEL removes its state file. `fail_last`: p3's ADD fails after its gate.
struct Chain {
    rig: Rig,
    gates: Vec<Gate>,
    state: PathBuf,
    pids: PathBuf,
}

impl Chain {
    fn new(fail_last: bool) -> Chain {
        let rig = Rig::new();
        let state = rig.dir.scratch("state");
        std::fs::create_dir_all(&state).unwrap();
        let pids = rig.dir.scratch("pids");
        let mut gates = Vec::new();
        for (i, name) in PLUGINS.iter().enumerate() {
            let gate = Gate::new(rig.dir.root());
            let file = sh_quote(&state.join(name).to_string_lossy());
            let shell = format!(
                "echo $$ >> {pids}\ntouch {file}\n{wait}",
                pids = sh_quote(&pids.to_string_lossy()),
                wait = gate.shell_wait()
            );
            let add = if fail_last && i == 2 {
                Response::cni_error(110, "p3 broke", "")
            } else {
                Response::ok(&result(i + 1))
            };
            let del = Response::ok("").with_shell(&format!("rm -f {file}"));
            rig.fake(name, &Fake::new(del).on("ADD", add.with_shell(&shell)));
            gates.push(gate);
        }
        Chain {
            rig,
            gates,
            state,
            pids,
        }
    }

    fn release_all(&self) {
        for gate in &self.gates {
            gate.release();
        }
    }

    /// Waits (within [`GATE_WAIT_LIMIT`]) until the ADD cached its result:
    /// finished, its result not yet taken.
    async fn record_written(&self) {
        let record = self.rig.cache_file("roc", "c1", "eth0");
        let end = std::time::Instant::now() + GATE_WAIT_LIMIT;
        while !record.exists() {
            assert!(
                std::time::Instant::now() < end,
                "no cache record within {GATE_WAIT_LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// What is left of the attachment: state files, cache record, lock
    /// file, live plugin processes.
    fn leftovers(&self) -> Vec<String> {
        let mut left: Vec<String> = dir_names(&self.state)
            .into_iter()
            .map(|n| format!("state of {n}"))
            .collect();
        left.extend(
            self.rig
                .result_files()
                .into_iter()
                .map(|n| format!("cache record {n}")),
        );
        let lock = self.rig.lock_file("roc", "c1", "eth0");
        if lock.exists() {
            left.push(format!("lock file {}", lock.display()));
        }
        left.extend(
            read_pids(&self.pids)
                .into_iter()
                .filter(|p| alive(*p))
                .map(|p| format!("live plugin process {p}")),
        );
        left
    }
}

fn list() -> cni_core::NetworkConfigList {
    conflist(
        json!({"cniVersion":"1.0.0","name":"roc","plugins":[{"type":"p1"},{"type":"p2"},{"type":"p3"}]}),
    )
}

fn rt() -> RuntimeConf {
    RuntimeConf::new("c1", "/run/netns/c1", "eth0")
}

/// Where the caller gives up.
#[derive(Debug, Clone, Copy)]
enum DropAt {
    /// Before the first poll: nothing was started.
    Unpolled,
    /// Right after the first poll, with the gates open: anywhere.
    FirstPoll,
    /// While plugin `n` (0-based) runs, held at its gate.
    Running(usize),
    /// After the ADD finished and cached its result, before the caller
    /// polled again to take it.
    Finished,
}

/// Starts the ADD, drops it at `at`, lets everything run, waits for the
/// detached work and returns what is left.
async fn dropped_at(at: DropAt, fail_last: bool) -> (Vec<String>, Chain) {
    let chain = Chain::new(fail_last);
    drop_add(&chain, at).await;
    (chain.leftovers(), chain)
}

/// Starts the ADD on `chain`, drops it at `at`, lets everything run and
/// waits for the detached work.
async fn drop_add(chain: &Chain, at: DropAt) {
    let cni = chain.rig.cni();
    let (list, rt) = (list(), rt());
    let mut add = cni
        .add_network_list(&list, &rt)
        .rollback_on_cancel()
        .into_future();
    match at {
        DropAt::Unpolled => {}
        DropAt::FirstPoll => {
            chain.release_all();
            assert!(poll_once(&mut add).await.is_pending());
        }
        DropAt::Running(n) => {
            for gate in &chain.gates[..n] {
                gate.release();
            }
            assert!(poll_once(&mut add).await.is_pending());
            chain.gates[n].wait_started(1).await;
        }
        DropAt::Finished => {
            chain.release_all();
            assert!(poll_once(&mut add).await.is_pending());
            chain.record_written().await;
        }
    }
    drop(add);
    chain.release_all();
    tokio::time::timeout(GATE_WAIT_LIMIT, cni.wait_detached())
        .await
        .expect("the given-up ADD ends on its task");
}

fn steps(calls: &[Invocation]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{} {}", c.command(), c.plugin))
        .collect()
}

#[tokio::test]
async fn dropped_before_its_first_poll_runs_nothing() {
    let (left, chain) = dropped_at(DropAt::Unpolled, false).await;
    assert!(left.is_empty(), "left: {left:?}");
    assert!(chain.rig.dir.invocations().is_empty());
}

#[tokio::test]
async fn dropped_right_after_its_first_poll_leaves_nothing() {
    let (left, _chain) = dropped_at(DropAt::FirstPoll, false).await;
    assert!(left.is_empty(), "left: {left:?}");
}

#[tokio::test]
async fn dropped_while_each_plugin_runs_the_ones_that_ran_are_rolled_back() {
    for n in 0..PLUGINS.len() {
        let (left, chain) = dropped_at(DropAt::Running(n), false).await;
        assert!(
            left.is_empty(),
            "dropped while p{} ran, left: {left:?}",
            n + 1
        );
        // The running plugin finished; none after it started; DEL last to
        // first.
        let mut expected: Vec<String> = PLUGINS[..=n].iter().map(|p| format!("ADD {p}")).collect();
        expected.extend(PLUGINS[..=n].iter().rev().map(|p| format!("DEL {p}")));
        assert_eq!(
            steps(&chain.rig.dir.invocations()),
            expected,
            "dropped while p{} ran",
            n + 1
        );
    }
}

#[tokio::test]
async fn dropped_while_the_failing_plugin_runs_is_rolled_back() {
    let (left, chain) = dropped_at(DropAt::Running(2), true).await;
    assert!(left.is_empty(), "left: {left:?}");
    assert_eq!(
        steps(&chain.rig.dir.invocations()),
        ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
    );
}

#[tokio::test]
async fn dropped_after_it_finished_but_before_its_result_was_taken_is_deleted() {
    let (left, chain) = dropped_at(DropAt::Finished, false).await;
    assert!(left.is_empty(), "left: {left:?}");
    assert_eq!(
        steps(&chain.rig.dir.invocations()),
        ["ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1"]
    );
}

/// A caller that waits gets the result, and the attachment stays.
#[tokio::test]
async fn awaited_it_is_an_ordinary_add() {
    let chain = Chain::new(false);
    chain.release_all();
    let cni = chain.rig.cni();
    let got = cni
        .add_network_list(&list(), &rt())
        .rollback_on_cancel()
        .await
        .unwrap();
    assert_eq!(
        got.to_value(),
        serde_json::from_str::<serde_json::Value>(&result(3)).unwrap()
    );
    cni.wait_detached().await;
    assert_eq!(dir_names(&chain.state), PLUGINS);
    assert_eq!(chain.rig.result_files().len(), 1);
    cni.del_network_list(&list(), &rt()).await.unwrap();
    assert!(chain.leftovers().is_empty(), "{:?}", chain.leftovers());
}

/// A failed ADD is rolled back (rollback is on) and its error comes back.
#[tokio::test]
async fn awaited_a_failure_comes_back_rolled_back() {
    let chain = Chain::new(true);
    chain.release_all();
    let cni = chain.rig.cni();
    let err = cni
        .add_network_list(&list(), &rt())
        .rollback_on_cancel()
        .await
        .unwrap_err();
    assert!(err.is_plugin_code(110), "{err}");
    cni.wait_detached().await;
    assert!(chain.leftovers().is_empty(), "{:?}", chain.leftovers());
}

/// A caller that gave up after the ADD finished and retries at once gets
/// an attachment that stays: the given-up ADD's task holds the attachment's
/// lock from its ADD to its DEL, so the retry runs after that DEL, never
/// before it (which would leave the retry's caller with an answer whose
/// plugins' state that DEL then removed). Repeated: the retry is started
/// the moment the first future is dropped, racing its task's DEL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_right_after_giving_up_a_finished_add_is_not_deleted_by_its_cleanup() {
    for round in 0..10 {
        let chain = Chain::new(false);
        chain.release_all();
        let cni = chain.rig.cni();
        let mut first = {
            let cni = cni.clone();
            Box::pin(async move {
                cni.add_network_list(&list(), &rt())
                    .rollback_on_cancel()
                    .await
            })
        };
        assert!(poll_once(&mut first).await.is_pending());
        // Finished and cached, its result not taken.
        chain.record_written().await;
        drop(first);
        let retry = {
            let cni = cni.clone();
            tokio::spawn(async move { cni.add_network_list(&list(), &rt()).await })
        };
        retry
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: retry: {e}"));
        tokio::time::timeout(GATE_WAIT_LIMIT, cni.wait_detached())
            .await
            .expect("the given-up ADD ends on its task");
        assert_eq!(
            dir_names(&chain.state),
            PLUGINS,
            "round {round}: the retry's attachment lost its state; runs: {:?}",
            steps(&chain.rig.dir.invocations())
        );
        assert_eq!(chain.rig.result_files().len(), 1, "round {round}");
        assert_eq!(
            steps(&chain.rig.dir.invocations()),
            [
                "ADD p1", "ADD p2", "ADD p3", "DEL p3", "DEL p2", "DEL p1", "ADD p1", "ADD p2",
                "ADD p3"
            ],
            "round {round}"
        );
    }
}

/// Given up over an attachment recorded before it (a runtime's retry of an
/// ADD that worked), the detached ADD deletes nothing: neither the plugins
/// it ran nor, once finished, the attachment. A DEL could not tell what it
/// made from what was there, and would take the working attachment down.
#[tokio::test]
async fn given_up_over_an_existing_attachment_deletes_nothing() {
    for at in [DropAt::Running(0), DropAt::Running(2), DropAt::Finished] {
        let chain = Chain::new(false);
        // The attachment made earlier: its plugins' state and its record.
        for p in PLUGINS {
            std::fs::write(chain.state.join(p), "").unwrap();
        }
        let before = cni_core::cache::CacheRecord::new(
            "roc",
            &rt(),
            list().cache_bytes(),
            Some(serde_json::from_str(&result(3)).unwrap()),
        );
        chain.rig.cni().cache().write(&before).await.unwrap();

        drop_add(&chain, at).await;

        let calls = steps(&chain.rig.dir.invocations());
        assert!(
            calls.iter().all(|c| c.starts_with("ADD ")),
            "{at:?}: no DEL: {calls:?}"
        );
        assert_eq!(dir_names(&chain.state), PLUGINS, "{at:?}: state kept");
        assert_eq!(chain.rig.result_files().len(), 1, "{at:?}: the record kept");
    }
}
