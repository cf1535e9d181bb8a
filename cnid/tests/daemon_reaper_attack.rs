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

/// After a reap, the runtime ADDs the container again; that ADD fails and
/// its rollback fails too (the ADD's intent stays). The runtime's DEL
/// that follows (the spec's cleanup after a failed ADD) must run the
/// plugins: the reap deleted the earlier attachment, not this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_after_a_failed_re_add_runs_though_the_container_was_reaped() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    let (fail_add, fail_del) = (dirs.data.join("fail-add"), dirs.data.join("fail-del"));
    let calls = dirs.data.join("calls");
    dirs.plugin(
        "flaky",
        &recording_plugin(
            &records,
            &format!(
                r#"echo "$CNI_COMMAND" >> {calls}
if [ "$CNI_COMMAND" = ADD ] && [ -e {fail_add} ]; then
printf '{{"cniVersion":"1.0.0","code":11,"msg":"add refused"}}'; exit 1; fi
if [ "$CNI_COMMAND" = DEL ] && [ -e {fail_del} ]; then rm -f {fail_del}
printf '{{"cniVersion":"1.0.0","code":11,"msg":"del refused once"}}'; exit 1; fi"#,
                calls = calls.display(),
                fail_add = fail_add.display(),
                fail_del = fail_del.display(),
            ),
        ),
    );
    dirs.conf(
        "10-flaky.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "flaky"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let dels = || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == "DEL")
            .count()
    };
    let ns1 = Netns::new();
    client
        .add(NET, &AttachmentRequest::new("reap-f", ns1.path(), "eth0"))
        .await
        .expect("ADD");
    drop(ns1);
    eventually_async(LIMIT, "reaped", || async {
        daemon.log().contains("stale attachment deleted")
    })
    .await;
    assert_eq!(dels(), 1);
    std::fs::write(&fail_add, "").unwrap();
    std::fs::write(&fail_del, "").unwrap();
    let ns2 = Netns::new();
    let req = AttachmentRequest::new("reap-f", ns2.path(), "eth0");
    client.add(NET, &req).await.expect_err("ADD refused");
    // Its rollback ran and failed.
    assert_eq!(dels(), 2);
    assert!(!fail_del.exists());
    client.del(NET, &req).await.expect("DEL");
    assert_eq!(dels(), 3, "the runtime's DEL ran no plugin");
}
