//! The stale-attachment reaper with the real bridge + host-local
//! chain in real namespaces: attachments whose namespaces are gone are
//! DELed with their cached config and result, so host-local releases their
//! addresses, after a (simulated) reboot at start and while cnid runs after
//! `--stale-after`; a namespace that exists is never touched; a runtime's
//! DEL racing a reap runs no second DEL and answers success. A plugin that
//! refuses the DEL is reported once, listed as `stale`, not retried.
//!
//! A reboot is simulated as the daemon sees one: cnid is killed, the
//! namespaces are deleted, the cache records get an mtime before this
//! boot's start (what a record written in an earlier boot has), and the
//! journal's commit lines another boot id.

use std::time::Duration;

use crate::support;
use crate::support::daemon::{
    Daemon, Dirs, bridge_emptied, del_gated_plugin, eventually_async, recording_plugin, runs,
    this_boot_again,
};
use crate::support::gate::Gate;
use crate::support::netns::{TempNetns, bridge_ports, host_local_ips};
use crate::support::reaper::{
    LIMIT, chain, data_dir_leftovers, metric, reaps_logged, simulate_reboot,
};
use cnid::api::AttachmentRequest;
use serde_json::json;

pub(crate) const NET: &str = "dreap";

/// (a) N attachments, cnid killed, their namespaces deleted, a reboot:
/// the next start DELs them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_the_start_releases_every_address_of_a_gone_namespace() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let nss: Vec<TempNetns> = (0..3).map(|_| TempNetns::new()).collect();
    for (i, ns) in nss.iter().enumerate() {
        let req = AttachmentRequest::new(format!("reap-a{i}"), ns.path(), "eth0");
        client.add(NET, &req).await.expect("ADD");
    }
    assert_eq!(host_local_ips(&c.data_dir, NET).len(), 3);
    assert_eq!(bridge_ports(c.bridge.name()).len(), 3);
    daemon.kill9();
    drop(nss);
    simulate_reboot(&dirs);

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    reaps_logged(&daemon, 3).await;
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    assert!(host_local_ips(&c.data_dir, NET).is_empty(), "IPs left");
    assert_eq!(data_dir_leftovers(&c.data_dir, NET), Vec::<String>::new());
    bridge_emptied(c.bridge.name()).await;
    assert!(client.attachments(None).await.unwrap().is_empty());
    let log = daemon.log();
    assert_eq!(log.matches("stale attachment deleted").count(), 3, "{log}");
    assert!(log.contains("rebooted"), "{log}");
    let m = client.metrics().await.unwrap();
    assert_eq!(
        metric(
            &m,
            "cnid_stale_reaped_total{reason=\"rebooted\",outcome=\"ok\"} "
        ),
        3,
        "{m}"
    );
}

/// (d) A namespace that exists, its record dated before the boot (no
/// namespace outlives a real reboot: here the record is this boot's, and
/// its mtime is what a clock stepped forward after boot gives): its
/// attachment is untouched, while the one of another boot goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachment_whose_namespace_exists_is_untouched_after_a_reboot() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let (kept, gone) = (TempNetns::new(), TempNetns::new());
    let req_kept = AttachmentRequest::new("reap-kept", kept.path(), "eth0");
    let res = client.add(NET, &req_kept).await.expect("ADD kept");
    client
        .add(
            NET,
            &AttachmentRequest::new("reap-gone", gone.path(), "eth0"),
        )
        .await
        .expect("ADD gone");
    daemon.kill9();
    drop(gone);
    simulate_reboot(&dirs);
    this_boot_again(&dirs, "reap-kept");

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    // Both were judged by the same pass at start: once the gone one is
    // reaped, that pass is over.
    reaps_logged(&daemon, 1).await;
    assert_eq!(dirs.cached(), vec![format!("{NET}-reap-kept-eth0")]);
    let ip = support::shim::ipv4_of(&res);
    assert_eq!(
        host_local_ips(&c.data_dir, NET),
        vec![ip.split('/').next().unwrap().to_owned()]
    );
    assert_eq!(kept.ipv4_addrs("eth0"), vec![ip]);
    assert_eq!(bridge_ports(c.bridge.name()).len(), 1);
    let att = client.attachments(None).await.unwrap();
    assert_eq!(att.len(), 1);
    assert_eq!(att[0].state, None);
    client.check(NET, &req_kept).await.expect("CHECK kept");
    client.del(NET, &req_kept).await.expect("DEL kept");
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
}

/// (b) A namespace deleted without DEL while cnid runs: reaped once gone
/// for `--stale-after`; the runtime's late DEL answers success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_deleted_without_del_is_reaped_after_stale_after() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let daemon = Daemon::start(&dirs, &["--stale-after", "2s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    let req = AttachmentRequest::new("reap-b", ns.path(), "eth0");
    client.add(NET, &req).await.expect("ADD");
    assert_eq!(host_local_ips(&c.data_dir, NET).len(), 1);
    drop(ns);
    let gone_at = std::time::Instant::now();
    reaps_logged(&daemon, 1).await;
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    // Not before it was gone for --stale-after.
    let took = gone_at.elapsed();
    eprintln!("reaped {} ms after the namespace went", took.as_millis());
    assert!(took >= Duration::from_secs(2));
    assert!(host_local_ips(&c.data_dir, NET).is_empty(), "IP left");
    assert_eq!(data_dir_leftovers(&c.data_dir, NET), Vec::<String>::new());
    bridge_emptied(c.bridge.name()).await;
    let log = daemon.log();
    assert!(
        log.contains("stale attachment deleted") && log.contains("namespace gone"),
        "{log}"
    );
    // The runtime's DEL, late: success, and no plugin runs again.
    let m = client.metrics().await.unwrap();
    let bridge_dels = "cnid_plugin_exec_duration_seconds_count{plugin=\"bridge\",command=\"DEL\"} ";
    assert_eq!(metric(&m, bridge_dels), 1, "{m}");
    client.del(NET, &req).await.expect("late DEL");
    let m = client.metrics().await.unwrap();
    assert_eq!(metric(&m, bridge_dels), 1, "{m}");
    assert!(
        daemon
            .log()
            .contains("already deleted by the stale-attachment reaper"),
        "{}",
        daemon.log()
    );
    assert_eq!(
        metric(
            &m,
            "cnid_stale_reaped_total{reason=\"namespace_gone\",outcome=\"ok\"} "
        ),
        1,
        "{m}"
    );
}

/// (c) A runtime's DEL arriving while the reaper's DEL runs: it waits in
/// the container's queue, then answers success without a second DEL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_del_racing_the_reaper_runs_no_second_del() {
    support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = del_gated_plugin(&dirs, "gated", &gate);
    let c = chain(&dirs, NET, &[json!({"type": "gated"})]);
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    let req = AttachmentRequest::new("reap-c", ns.path(), "eth0");
    client.add(NET, &req).await.expect("ADD");
    drop(ns);
    // The reap runs: bridge and host-local are done, the gated plugin
    // (first in the list, last in DEL) holds it.
    gate.wait_started(1).await;
    let socket = dirs.socket.clone();
    let del = tokio::spawn(async move {
        let client = cnid::client::Client::connect(&socket).await.unwrap();
        client.del(NET, &req).await
    });
    eventually_async(
        LIMIT,
        "the runtime's DEL queued behind the reap",
        || async {
            client
                .operations(Some("reap-c"))
                .await
                .unwrap()
                .iter()
                .any(|o| o.verb == "DEL" && o.state == "queued")
        },
    )
    .await;
    gate.release();
    del.await.unwrap().expect("the runtime's DEL succeeds");
    assert!(dirs.cached().is_empty());
    let dels: Vec<_> = runs(&records)
        .into_iter()
        .filter(|r| r.command == "DEL")
        .collect();
    assert_eq!(dels.len(), 1, "{dels:?}");
    let m = client.metrics().await.unwrap();
    assert_eq!(
        metric(
            &m,
            "cnid_plugin_exec_duration_seconds_count{plugin=\"bridge\",command=\"DEL\"} "
        ),
        1,
        "{m}"
    );
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
}

/// A plugin that refuses DEL without its namespace (as host-device does):
/// reported, counted, listed as `stale`, and not tried again by later
/// passes (which go on reaping others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_refusing_del_without_netns_is_reported_not_retried() {
    support::require_root!();
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "picky",
        &recording_plugin(
            &records,
            r#"if [ "$CNI_COMMAND" = DEL ] && [ ! -e "$CNI_NETNS" ] && [ "$CNI_CONTAINERID" = refused ]; then
echo "DEL $CNI_CONTAINERID $CNI_IFNAME - 0 0" > "$(dirname "$0")/../data/records/refused.$$"
printf '{"cniVersion":"1.0.0","code":999,"msg":"netns gone: cannot find the device"}'; exit 1; fi"#,
        ),
    );
    dirs.conf(
        "10-picky.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "picky"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("refused", ns.path(), "eth0"))
        .await
        .expect("ADD");
    drop(ns);
    let refused_dels = || {
        runs(&records)
            .iter()
            .filter(|r| r.command == "DEL" && r.container == "refused")
            .count()
    };
    eventually_async(LIMIT, "the refused reap reported", || async {
        daemon.log().contains("cannot delete a stale attachment")
    })
    .await;
    // A later attachment goes the same way: its reap needs later passes.
    let ns2 = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("later", ns2.path(), "eth0"))
        .await
        .expect("ADD later");
    drop(ns2);
    reaps_logged(&daemon, 1).await;
    assert_eq!(dirs.cached(), vec![format!("{NET}-refused-eth0")]);
    assert_eq!(refused_dels(), 1, "the refused reap was retried");
    let att = client.attachments(Some("refused")).await.unwrap();
    assert_eq!(att[0].state.as_deref(), Some("stale"));
    // With the refusal and since when the namespace is gone.
    let error = att[0].reap_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("netns gone: cannot find the device"),
        "{att:?}"
    );
    assert!(att[0].gone_since_ms.is_some(), "{att:?}");
    let log = daemon.log();
    assert!(log.contains("netns gone: cannot find the device"), "{log}");
    let m = client.metrics().await.unwrap();
    assert_eq!(
        metric(
            &m,
            "cnid_stale_reaped_total{reason=\"namespace_gone\",outcome=\"error\"} "
        ),
        1,
        "{m}"
    );
    assert_eq!(
        metric(&m, "cnid_stale_attachments{state=\"stale\"} "),
        1,
        "{m}"
    );
}

/// Nothing is reaped while the conf dir cannot be read (say, not mounted
/// yet at boot): the attachments wait, and go once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_reaped_while_the_conf_dir_is_unreadable() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("reap-e", ns.path(), "eth0"))
        .await
        .expect("ADD");
    daemon.kill9();
    drop(ns);
    simulate_reboot(&dirs);
    let away = dirs.root().join("net.d.away");
    std::fs::rename(&dirs.conf, &away).unwrap();

    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    // The pass at start ran before cnid answered.
    let log = daemon.log();
    assert!(log.contains("pass skipped"), "{log}");
    assert!(!log.contains("stale attachment deleted"), "{log}");
    assert_eq!(dirs.cached().len(), 1);
    assert_eq!(host_local_ips(&c.data_dir, NET).len(), 1);

    std::fs::rename(&away, &dirs.conf).unwrap();
    eventually_async(LIMIT, "reaped once the conf dir is back", || async {
        dirs.cached().is_empty()
    })
    .await;
    assert!(host_local_ips(&c.data_dir, NET).is_empty(), "IP left");
}

/// A reap is a DEL: cnid killed while the reap's plugin runs leaves the
/// record (it goes only after the DEL succeeded), and the next start
/// reaps it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_reap_leaves_the_record_for_the_next_start() {
    support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = del_gated_plugin(&dirs, "gated", &gate);
    dirs.conf(
        "10-gated.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "gated"}]}),
    );
    let mut daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("reap-k", ns.path(), "eth0"))
        .await
        .expect("ADD");
    drop(ns);
    gate.wait_started(1).await;
    daemon.kill9();
    assert_eq!(dirs.cached(), vec![format!("{NET}-reap-k-eth0")]);
    // The orphaned DEL finishes; the restart waits for it, then reaps.
    gate.release();
    let _daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    eventually_async(LIMIT, "reaped by the next start", || async {
        dirs.cached().is_empty()
    })
    .await;
    let dels = runs(&records)
        .into_iter()
        .filter(|r| r.command == "DEL")
        .count();
    assert_eq!(dels, 2, "the killed reap's DEL and the repeat");
}

/// A record a power loss lost, put back at start from cnid's journal
/// (another boot's commit line), whose namespace is gone: dated as the
/// earlier boot's, so the same start reaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_restored_from_the_journal_after_a_reboot_is_reaped_at_start() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("reap-r", ns.path(), "eth0"))
        .await
        .expect("ADD");
    daemon.kill9();
    drop(ns);
    simulate_reboot(&dirs);
    // The power loss kept the journal's commit line, not the cache file.
    std::fs::remove_file(dirs.cache.join(format!("results/{NET}-reap-r-eth0"))).unwrap();

    let daemon = Daemon::start(&dirs, &[]);
    reaps_logged(&daemon, 1).await;
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    let log = daemon.log();
    assert!(log.contains("restored the cached result"), "{log}");
    assert!(log.contains("stale attachment deleted"), "{log}");
    assert!(host_local_ips(&c.data_dir, NET).is_empty(), "IP left");
}
