//! Two setups of one sandbox at once (a runtime's retry racing its first
//! try): the second waits for the attachment's lock, finds the first's
//! record and is refused as already attached; neither undoes anything of
//! the other. The first's result stands; one removal cleans up all. Fake
//! plugins, ordered by a gate and a lock attempt seen to wait.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::support::fake::{Fake, RIG_KILL_GRACE, Response, Rig, conflist};
use crate::support::gate::{Gate, poll_once};
use cni_async::cache::ResultCache;
use cni_async::multi::{MultiNetwork, Sandbox, SetupMode};
use cni_async::{Cni, RawExec, Timeouts};
use cni_core::error::Chain;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.5.2/24"}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_setup_of_one_sandbox_at_once_is_refused_and_undoes_nothing() {
    for mode in [SetupMode::Serial, SetupMode::Parallel] {
        let rig = Rig::new();
        let gate = Gate::new(rig.dir.root());
        rig.fake(
            "held",
            &Fake::new(Response::ok(""))
                .on("ADD", Response::ok(RESULT).with_shell(&gate.shell_wait())),
        );
        rig.fake(
            "quick",
            &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
        );
        let cni = Cni::builder()
            .plugin_dirs(rig.dir.dirs())
            .cache(ResultCache::new(&rig.cache_dir).with_inline_io(true))
            .exec(Arc::new(RawExec::new().with_kill_grace(RIG_KILL_GRACE)))
            .timeouts(Timeouts::uniform(Duration::from_secs(30)))
            .check_netns(false)
            .build();
        let multi = MultiNetwork::builder(cni.clone())
            .network(conflist(
                json!({"cniVersion":"1.0.0","name":"one","plugins":[{"type":"held"}]}),
            ))
            .network(conflist(
                json!({"cniVersion":"1.0.0","name":"two","plugins":[{"type":"quick"}]}),
            ))
            .mode(mode)
            .build()
            .unwrap();
        let sb = Sandbox::new("c1", "/run/netns/c1");

        let (first, second) = tokio::join!(multi.setup(&sb), async {
            // The first holds network one's lock, in its plugin (and, in
            // parallel mode, has set up network two or is doing so).
            gate.wait_started(1).await;
            let second = multi.setup(&sb).into_future();
            tokio::pin!(second);
            let early = poll_once(&mut second).await;
            // Serial: the second waits on one's lock. Parallel: it may
            // have been refused at two already, and waits on one too.
            assert!(
                early.is_pending(),
                "{mode:?}: the second setup did not wait: {early:?}"
            );
            gate.release();
            second.await
        });
        let results = first.unwrap_or_else(|e| panic!("{mode:?}: the first setup: {e:#}"));
        assert_eq!(results.interfaces.len(), 2, "{mode:?}: {results:?}");
        let err = second.expect_err("the second setup");
        let chain = Chain(&err).to_string();
        assert!(
            chain.contains("already attached"),
            "{mode:?}: not refused as attached: {chain}"
        );
        assert!(
            rig.dir.invocations_of("DEL").is_empty(),
            "{mode:?}: something was undone: {:?}",
            rig.dir.invocations_of("DEL")
        );
        assert_eq!(
            rig.dir.invocations_of("ADD").len(),
            2,
            "{mode:?}: plugins ran again"
        );
        assert_eq!(
            rig.result_files().len(),
            2,
            "{mode:?}: {:?}",
            rig.result_files()
        );

        multi.remove(&sb).await.expect("remove");
        assert!(rig.result_files().is_empty(), "{mode:?}");
    }
}
