//! Attacks on the stale-attachment reaper (issue 26) that `daemon_reaper.rs`
//! does not make: failures that are not a plugin's refusal.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually_async, recording_plugin, runs};
use crate::support::gate::Gate;
use crate::support::netns::Netns;
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "dreapx";
/// What a loaded machine keeps for the reaper to act.
const LIMIT: Duration = Duration::from_secs(60);

/// A reap whose DEL ran out of time (a plugin slow or stuck once: a busy
/// node after a reboot) is not a plugin refusing the DEL: a later pass
/// tries it again, so the address is not held until cnid restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reap_that_timed_out_is_tried_again() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "stuck",
        &recording_plugin(
            &records,
            &format!(
                "if [ \"$CNI_COMMAND\" = DEL ]; then\n{}\nfi",
                gate.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-stuck.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "stuck"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s", "--timeout-del", "1s"]);
    let client = daemon.client().await;
    let ns = Netns::new();
    client
        .add(NET, &AttachmentRequest::new("reap-t", ns.path(), "eth0"))
        .await
        .expect("ADD");
    drop(ns);
    // The first reap's DEL hangs until cnid kills it at its deadline.
    gate.wait_started(1).await;
    eventually_async(LIMIT, "the timed-out reap reported", || async {
        daemon.log().contains("cannot delete a stale attachment")
    })
    .await;
    gate.release();
    eventually_async(LIMIT, "reaped by a later pass", || async {
        dirs.cached().is_empty()
    })
    .await;
    assert!(
        daemon.log().contains("stale attachment deleted"),
        "{}",
        daemon.log()
    );
    // The killed DEL never wrote its run record; the retry did.
    let dels = runs(&records)
        .into_iter()
        .filter(|r| r.command == "DEL")
        .count();
    assert_eq!(dels, 1);
}
