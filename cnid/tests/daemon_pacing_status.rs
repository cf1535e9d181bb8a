//! STATUS is not paced: while every pacing slot is held by an ADD whose
//! plugin hangs, a STATUS of the same network is answered at once instead
//! of waiting for a slot (a readiness probe must not wait out a burst).

use std::time::{Duration, Instant};

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, gated_network};
use crate::support::gate::{Gate, LOAD_MARGIN};
use cnid::api::AttachmentRequest;

const NET: &str = "pstat";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_status_does_not_wait_for_a_slot_held_by_a_burst() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    gated_network(
        &dirs,
        ("10-pstat.conflist", NET, "rec"),
        r#"[ "$CNI_COMMAND" = ADD ]"#,
        &gate,
    );
    // The CPUs busy, whatever the machine does: the slots hold (nothing
    // is lent a run), as this test needs.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| cpus.install(c));
    let client = daemon.client().await;
    let add = {
        let client = daemon.client().await;
        let r = AttachmentRequest::new("holder", dirs.netns("holder"), "eth0");
        tokio::spawn(async move { client.add(NET, &r).await })
    };
    // The ADD holds the only slot and stays in its plugin.
    gate.wait_started(1).await;
    // A slot wait would be the shorter of 15 s and a quarter of the
    // deadline: 15 s here, past the margin.
    let sent = Instant::now();
    client
        .status(NET, Some(Duration::from_secs(120)))
        .await
        .expect("STATUS while the slot is held");
    let took = sent.elapsed();
    assert!(
        took < LOAD_MARGIN,
        "STATUS answered after {took:?}: it waited for the ADD's slot"
    );
    assert!(!add.is_finished(), "the ADD still holds its slot");
    gate.release();
    add.await.unwrap().expect("the ADD, released");
}
