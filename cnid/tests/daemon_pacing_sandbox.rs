//! Pacing (`--plugin-slots`) and sandbox operations: a sandbox's step
//! takes its pacing slot after the step's network gate, as a
//! `--max-parallel` slot, so a sandbox never holds a slot while its next
//! step waits for a GC that waits for that slot.

use std::time::{Duration, Instant};

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, eventually_async, gated_network, recording_plugin};
use crate::support::gate::{Gate, LOAD_MARGIN};
use cnid::api::{GcRequest, SandboxNetwork, SandboxRequest};
use cnid::client::Client;
use serde_json::json;

const FIRST: &str = "psfirst";
const SECOND: &str = "pssecond";
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_sandbox_step_waiting_for_a_gc_does_not_hold_the_slot_the_gc_waits_for() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = gated_network(
        &dirs,
        ("10-a.conflist", FIRST, "held"),
        r#"[ "$CNI_COMMAND" = ADD ]"#,
        &gate,
    );
    dirs.plugin("rec", &recording_plugin(&records, ""));
    dirs.conf(
        "20-b.conflist",
        &json!({"cniVersion": "1.1.0", "name": SECOND, "plugins": [{"type": "rec"}]}),
    );
    // The CPUs busy, whatever the machine does: the slots hold (nothing
    // is lent a run), as this test needs.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| cpus.install(c));
    let client = daemon.client().await;
    // The sandbox's first step runs (its plugin held at the gate).
    let sandbox = {
        let socket = daemon.socket.clone();
        let req = SandboxRequest {
            container_id: "sb".into(),
            netns: dirs.netns("sb"),
            networks: vec![SandboxNetwork::new(FIRST), SandboxNetwork::new(SECOND)],
            ..Default::default()
        };
        tokio::spawn(async move {
            let c = Client::connect(&socket).await.expect("connect");
            c.sandbox_add(&req).await.expect("sandbox ADD");
            Instant::now()
        })
    };
    gate.wait_started(1).await;
    // A GC of the second network takes its gate, then waits for a slot.
    let gc = {
        let socket = daemon.socket.clone();
        tokio::spawn(async move {
            let c = Client::connect(&socket).await.expect("connect");
            let req = GcRequest {
                valid_attachments: Vec::new(),
                timeout_ms: None,
            };
            c.gc(SECOND, &req).await.expect("GC");
            Instant::now()
        })
    };
    eventually_async(WAIT, "the GC running", || async {
        client
            .operations(None)
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == "GC" && o.state == "running")
    })
    .await;
    let released = Instant::now();
    gate.release();
    let (sandbox_done, gc_done) = (sandbox.await.unwrap(), gc.await.unwrap());
    // Nothing runs after the release but the sandbox's steps and the GC:
    // neither waits out a slot's 10 s lease.
    for (what, done) in [("sandbox", sandbox_done), ("GC", gc_done)] {
        let took = done - released;
        assert!(
            took < 2 * LOAD_MARGIN,
            "{what} done {took:?} after the gate opened"
        );
    }
}
