//! Attacks on the stale-attachment reaper that `daemon_reaper.rs`
//! does not make: failures that are not a plugin's refusal.

use std::time::Duration;

use crate::support::daemon::{
    Daemon, Dirs, bridge_emptied, date_records_before_boot, del_gated_plugin, eventually_async,
    recording_plugin, runs,
};
use crate::support::gate::Gate;
use crate::support::netns::TempNetns;
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
    let records = del_gated_plugin(&dirs, "stuck", &gate);
    dirs.conf(
        "10-stuck.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "stuck"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s", "--timeout-del", "1s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
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
    // The log line is the reap's last step, after the record's removal.
    eventually_async(LIMIT, "reaped by a later pass", || async {
        daemon.log().contains("stale attachment deleted")
    })
    .await;
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
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
    let ns1 = TempNetns::new();
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
    let ns2 = TempNetns::new();
    let req = AttachmentRequest::new("reap-f", ns2.path(), "eth0");
    client.add(NET, &req).await.expect_err("ADD refused");
    // Its rollback ran and failed.
    assert_eq!(dels(), 2);
    assert!(!fail_del.exists());
    client.del(NET, &req).await.expect("DEL");
    assert_eq!(dels(), 3, "the runtime's DEL ran no plugin");
}

/// With `--stale-after 0` (the running reaper off) the reaps of an
/// earlier boot's attachments that the start-up pass queued but that did
/// not get done (a DEL out of time; the others out of time while queued
/// behind it) are tried again, not left until the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_reaps_left_undone_are_retried_with_stale_after_0() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    del_gated_plugin(&dirs, "slow", &gate);
    dirs.conf(
        "10-slow.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "slow"}]}),
    );
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let nss: Vec<TempNetns> = (0..3).map(|_| TempNetns::new()).collect();
    for (i, ns) in nss.iter().enumerate() {
        client
            .add(
                NET,
                &AttachmentRequest::new(format!("reap-s{i}"), ns.path(), "eth0"),
            )
            .await
            .expect("ADD");
    }
    daemon.kill9();
    drop(nss);
    simulate_reboot(&dirs);

    let daemon = Daemon::start(
        &dirs,
        &[
            "--stale-after",
            "0",
            "--max-parallel",
            "1",
            "--timeout-del",
            "2s",
        ],
    );
    // One reap at a time: the first one's DEL hangs until killed at its
    // deadline, which the two queued behind it share.
    gate.wait_started(1).await;
    eventually_async(LIMIT, "the first reap out of time", || async {
        daemon.log().contains("cannot delete a stale attachment")
    })
    .await;
    gate.release();
    eventually_async(LIMIT, "every reap done", || async {
        dirs.cached().is_empty()
    })
    .await;
}

/// A file left where the namespace was bind-mounted (a runtime that
/// unmounted it and died before removing the file; a netns dir on a
/// persistent filesystem across a reboot) is no namespace: the real bridge
/// plugin refuses to enter it ("unknown FS magic"), so the reap's DEL runs
/// without it and host-local releases the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_left_at_the_netns_path_does_not_stop_the_reap() {
    crate::support::require_root!();
    use crate::support::netns::{LinkGuard, SubnetLease, host_local_ips, ip_ok, unique_netns_name};
    /// Removes the file the test leaves at the path.
    struct Leftover(String);
    impl Drop for Leftover {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    crate::support::require_plugins(&["bridge", "host-local"]);
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    dirs.conf(
        "10-reap.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [
            {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
             "ipam": {"type": "host-local", "dataDir": data_dir,
                      "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1).to_string()}]]}}]}),
    );
    let name = unique_netns_name();
    ip_ok(&["netns", "add", &name]);
    let path = format!("/run/netns/{name}");
    let _leftover = Leftover(path.clone());
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    client
        .add(NET, &AttachmentRequest::new("file-c", &path, "eth0"))
        .await
        .expect("ADD");
    assert_eq!(host_local_ips(&data_dir, NET).len(), 1);
    daemon.kill9();
    ip_ok(&["netns", "del", &name]);
    std::fs::write(&path, "").unwrap();
    simulate_reboot(&dirs);

    let daemon = Daemon::start(&dirs, &[]);
    eventually_async(LIMIT, "the reap done", || async {
        daemon.log().contains("stale attachment deleted")
            || daemon.log().contains("cannot delete a stale attachment")
    })
    .await;
    assert!(dirs.cached().is_empty(), "{}", daemon.log());
    assert!(host_local_ips(&data_dir, NET).is_empty(), "IP left");
    bridge_emptied(br).await;
}

/// The daemon "rebooted" (as `daemon_reaper.rs` simulates it): every cache
/// record dated before this boot.
fn simulate_reboot(dirs: &Dirs) {
    date_records_before_boot(dirs);
}
