//! How cnid schedules its stale-attachment reaps, from outside: a reap is
//! forgotten once its container is attached again (a later DEL runs the
//! plugins), hanging reaps hold at most a quarter of `--max-parallel` and
//! leave the rest to runtime requests, a "try again later" failure is
//! retried with backoff, and `/v1/attachments` and the gauge show an
//! attachment whose namespace is gone from the first scan that sees it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::daemon::{Daemon, Dirs, del_gated_plugin, eventually_async, recording_plugin};
use crate::support::gate::Gate;
use crate::support::netns::{TempNetns, bridge_ports, host_local_ips, link_exists_in};
use crate::support::reaper::{Chain, LIMIT, chain, metric, reaps_logged, simulate_reboot};
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use serde_json::json;

/// Network `hang` (a plugin whose DEL waits at the gate) and network `net`
/// (real bridge + host-local), cnid with `--max-parallel 4` (one
/// background slot) and `--stale-after 1s`, and four attachments
/// `<prefix>0..3` of `hang` whose namespaces are gone: once this returns,
/// the four reaps are queued and one of them is in its plugin.
async fn four_hanging_reaps(
    dirs: &Dirs,
    hang: &str,
    net: &str,
    prefix: &str,
) -> (Gate, Chain, Daemon, Client) {
    let gate = Gate::new(dirs.root());
    del_gated_plugin(dirs, "hang", &gate);
    dirs.conf(
        "10-hang.conflist",
        &json!({"cniVersion": "1.0.0", "name": hang, "plugins": [{"type": "hang"}]}),
    );
    let c = chain(dirs, net, &[]);
    let daemon = Daemon::start(dirs, &["--stale-after", "1s", "--max-parallel", "4"]);
    let client = daemon.client().await;
    let nss: Vec<TempNetns> = (0..4).map(|_| TempNetns::new()).collect();
    for (i, ns) in nss.iter().enumerate() {
        client
            .add(
                hang,
                &AttachmentRequest::new(format!("{prefix}{i}"), ns.path(), "eth0"),
            )
            .await
            .expect("ADD");
    }
    drop(nss);
    gate.wait_started(1).await;
    eventually_async(LIMIT, "four reaps queued or running", || async {
        client
            .operations(None)
            .await
            .unwrap()
            .iter()
            .filter(|o| o.request_id.starts_with("reap-"))
            .count()
            == 4
    })
    .await;
    (gate, c, daemon, client)
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A container reaped, ADDed again, whose record then turns corrupt: the
/// runtime's DEL runs the plugins without
/// `prevResult` (as any DEL without its record does), so host-local
/// releases the second ADD's address. The reap of the first attachment
/// says nothing about the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_after_a_reap_and_a_new_add_runs_the_plugins() {
    crate::support::require_root!();
    const NET: &str = "dsched5";
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let ns1 = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("again", ns1.path(), "eth0"))
        .await
        .expect("first ADD");
    drop(ns1);
    reaps_logged(&daemon, 1).await;
    assert!(host_local_ips(&c.data_dir, NET).is_empty());

    let ns2 = TempNetns::new();
    let req = AttachmentRequest::new("again", ns2.path(), "eth0");
    client.add(NET, &req).await.expect("ADD again");
    assert_eq!(host_local_ips(&c.data_dir, NET).len(), 1);
    assert_eq!(ns2.ipv4_addrs("eth0").len(), 1);
    // The record turns corrupt; a CHECK fails on it and leaves it in
    // place (only a DEL moves a corrupt record aside).
    let record = dirs.cache.join(format!("results/{NET}-again-eth0"));
    std::fs::write(&record, b"{not json").unwrap();
    let _ = client.check(NET, &req).await;

    client.del(NET, &req).await.expect("DEL");
    assert!(
        std::fs::read_dir(dirs.cache.join("corrupt"))
            .map(|d| d.count())
            .unwrap_or(0)
            >= 1,
        "the DEL did not move the corrupt record aside"
    );
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    let log = daemon.log();
    assert!(
        !log.contains("already deleted by the stale-attachment reaper"),
        "{log}"
    );
    assert!(
        host_local_ips(&c.data_dir, NET).is_empty(),
        "the second ADD's address leaked"
    );
    assert!(
        !link_exists_in(ns2.path(), "eth0"),
        "eth0 left in the netns"
    );
    assert!(bridge_ports(c.bridge.name()).is_empty());
}

/// `--max-parallel 4`, four stale attachments whose DEL hangs: one reap
/// runs (a quarter of the slots), the other three wait, and an ADD of a
/// new container on another network (real bridge + host-local) gets a
/// slot at once instead of timing out in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_reaps_leave_the_runtime_its_slots() {
    crate::support::require_root!();
    const HANG: &str = "dsched6h";
    const NET: &str = "dsched6";
    let dirs = Dirs::new();
    let (gate, c, _daemon, client) = four_hanging_reaps(&dirs, HANG, NET, "hang").await;

    let ns = TempNetns::new();
    let mut req = AttachmentRequest::new("runtime", ns.path(), "eth0");
    req.timeout_ms = Some(20_000);
    let res = client
        .add(NET, &req)
        .await
        .expect("the runtime's ADD got a slot");
    assert_eq!(
        ns.ipv4_addrs("eth0"),
        vec![crate::support::shim::ipv4_of(&res)]
    );
    let ops = client.operations(None).await.unwrap();
    let running: Vec<_> = ops
        .iter()
        .filter(|o| o.request_id.starts_with("reap-") && o.state == "running")
        .collect();
    assert_eq!(running.len(), 1, "{ops:?}");
    assert_eq!(gate.started(), 1, "more than one reap ran its plugin");

    gate.release();
    eventually_async(LIMIT, "every hanging reap done", || async {
        dirs.cached() == vec![format!("{NET}-runtime-eth0")]
    })
    .await;
    client.del(NET, &req).await.expect("DEL");
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
}

/// An earlier boot's record whose DEL fails with CNI code 11 ("try again
/// later": an IPAM agent not up yet), twice: retried after a backoff, not
/// left until cnid restarts; listed as stale with the error meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_again_later_reap_is_retried_with_backoff() {
    crate::support::require_root!();
    const NET: &str = "dsched7";
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    let tokens = dirs.data.join("fail-tokens");
    let calls = dirs.data.join("calls");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::create_dir_all(&tokens).unwrap();
    dirs.plugin(
        "agent",
        &recording_plugin(
            &records,
            &format!(
                r#"if [ "$CNI_COMMAND" = DEL ]; then echo DEL >> {calls}
t=$(ls {tokens} | head -n 1)
if [ -n "$t" ]; then rm -f {tokens}/"$t"
printf '{{"cniVersion":"1.0.0","code":11,"msg":"ipam agent not up yet"}}'; exit 1; fi; fi"#,
                calls = calls.display(),
                tokens = tokens.display(),
            ),
        ),
    );
    dirs.conf(
        "10-agent.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "agent"}]}),
    );
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("later", ns.path(), "eth0"))
        .await
        .expect("ADD");
    daemon.kill9();
    drop(ns);
    simulate_reboot(&dirs);
    for t in ["1", "2"] {
        std::fs::write(tokens.join(t), "").unwrap();
    }

    // The default --stale-after: passes every 30 s; the retries come
    // sooner, on their own timer.
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    reaps_logged(&daemon, 1).await;
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    let dels = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(dels.lines().count(), 3, "{dels}");
    let log = daemon.log();
    assert_eq!(log.matches("retrying after a backoff").count(), 2, "{log}");
    assert!(log.contains("ipam agent not up yet"), "{log}");
    let m = client.metrics().await.unwrap();
    let reaped = "cnid_stale_reaped_total{reason=\"rebooted\",outcome=";
    assert_eq!(metric(&m, &format!("{reaped}\"error\"}} ")), 2, "{m}");
    assert_eq!(metric(&m, &format!("{reaped}\"ok\"}} ")), 1, "{m}");
    assert_eq!(metric(&m, "cnid_stale_attachments{state=\"stale\"} "), 0);
}

/// While `--stale-after` runs, an attachment whose namespace is gone is
/// listed `"state": "gone"` with the time the reaper first saw it gone,
/// and counted in `cnid_stale_attachments{state="gone"}`; a namespace
/// that exists is listed without a state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_shows_a_gone_namespace_before_the_reap() {
    crate::support::require_root!();
    const NET: &str = "dsched37";
    let dirs = Dirs::new();
    dirs.recording_network("10-rec.conflist", NET, "1.0.0");
    // Passes every 10 s; the reap not before 40 s.
    let daemon = Daemon::start(&dirs, &["--stale-after", "40s"]);
    let client = daemon.client().await;
    let (kept, gone) = (TempNetns::new(), TempNetns::new());
    for (id, ns) in [("kept", &kept), ("gone", &gone)] {
        client
            .add(NET, &AttachmentRequest::new(id, ns.path(), "eth0"))
            .await
            .expect("ADD");
    }
    let before = now_ms();
    drop(gone);
    eventually_async(LIMIT, "listed as gone", || async {
        let att = client.attachments(Some("gone")).await.unwrap();
        att.first().and_then(|a| a.state.as_deref()) == Some("gone")
    })
    .await;
    let seen = now_ms();
    let att = client.attachments(Some("gone")).await.unwrap();
    let since = att[0].gone_since_ms.expect("goneSinceMs");
    assert!(
        since + 1000 >= before && since <= seen,
        "since {since}, dropped at {before}, seen at {seen}"
    );
    assert_eq!(att[0].reap_error, None);
    let kept_att = client.attachments(Some("kept")).await.unwrap();
    assert_eq!(kept_att[0].state, None);
    assert_eq!(kept_att[0].gone_since_ms, None);
    let m = client.metrics().await.unwrap();
    assert_eq!(
        metric(&m, "cnid_stale_attachments{state=\"gone\"} "),
        1,
        "{m}"
    );
    assert_eq!(metric(&m, "cnid_stale_attachments{state=\"stale\"} "), 0);
    // The wire form is what the README shows.
    let raw = crate::support::daemon::get(&dirs.socket, "/v1/attachments?containerId=gone");
    let body = raw.json();
    assert_eq!(body["attachments"][0]["state"], "gone", "{body}");
    assert!(body["attachments"][0]["goneSinceMs"].is_u64(), "{body}");
    drop(kept);
}

/// An earlier boot's record whose attachment another tool holds locked
/// (a `cnitool` DEL stuck, say) when cnid starts: the reap fails "try
/// again later" (code 11) and is retried after a backoff, well before the
/// next pass (every 30 s), once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reap_of_a_locked_attachment_is_retried_once_unlocked() {
    use std::os::fd::AsRawFd;
    crate::support::require_root!();
    const NET: &str = "dsched7l";
    let dirs = Dirs::new();
    dirs.recording_network("10-rec.conflist", NET, "1.0.0");
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("locked", ns.path(), "eth0"))
        .await
        .expect("ADD");
    daemon.kill9();
    drop(ns);
    simulate_reboot(&dirs);
    let locks = dirs.cache.join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(locks.join(format!("{NET}-locked-eth0.lock")))
        .unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) },
        0,
        "{}",
        std::io::Error::last_os_error()
    );

    let daemon = Daemon::start(&dirs, &["--timeout-del", "1s"]);
    eventually_async(LIMIT, "the locked reap to be retried", || async {
        daemon.log().contains("retrying after a backoff")
    })
    .await;
    assert_eq!(dirs.cached(), vec![format!("{NET}-locked-eth0")]);
    let released = std::time::Instant::now();
    drop(lock);
    reaps_logged(&daemon, 1).await;
    let took = released.elapsed();
    eprintln!("reaped {} ms after the lock went", took.as_millis());
    // The passes come every 30 s: this one was a retry.
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(dirs.cached().is_empty());
}

/// `--max-parallel 1`, its one slot held by a runtime ADD: a reap queued
/// for a slot first, a runtime ADD second. When the slot frees, the
/// runtime's ADD runs first and the reap after it: background work never
/// goes ahead of a runtime request waiting for a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freed_slot_goes_to_the_waiting_runtime_request_before_a_reap() {
    crate::support::require_root!();
    const NET: &str = "dsched6p";
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "slot",
        &recording_plugin(
            &records,
            &format!(
                "if [ \"$CNI_COMMAND\" = ADD ] && [ \"$CNI_CONTAINERID\" = holder ]; then\n{}\nfi",
                gate.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-slot.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "slot"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s", "--max-parallel", "1"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    client
        .add(NET, &AttachmentRequest::new("stale", ns.path(), "eth0"))
        .await
        .expect("ADD stale");
    let add = |id: &'static str, ns: String| {
        let socket = dirs.socket.clone();
        tokio::spawn(async move {
            let client = cnid::client::Client::connect(&socket).await.unwrap();
            client
                .add(NET, &AttachmentRequest::new(id, ns, "eth0"))
                .await
        })
    };
    let (ns_holder, ns_second) = (TempNetns::new(), TempNetns::new());
    let holder = add("holder", ns_holder.path());
    gate.wait_started(1).await;
    // The slot is held: the reap of the namespace dropped now waits.
    drop(ns);
    eventually_async(LIMIT, "the reap waiting for a slot", || async {
        client
            .operations(Some("stale"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.request_id.starts_with("reap-") && o.state == "queued")
    })
    .await;
    let second = add("second", ns_second.path());
    eventually_async(LIMIT, "the runtime's ADD waiting for a slot", || async {
        client
            .operations(Some("second"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.state == "queued")
    })
    .await;
    gate.release();
    holder.await.unwrap().expect("holder ADD");
    second.await.unwrap().expect("second ADD");
    reaps_logged(&daemon, 1).await;
    let runs = crate::support::daemon::runs(&records);
    let second_add = runs
        .iter()
        .find(|r| r.command == "ADD" && r.container == "second")
        .expect("second ADD ran");
    let reap = runs
        .iter()
        .find(|r| r.command == "DEL" && r.container == "stale")
        .expect("the reap ran");
    assert!(
        second_add.end <= reap.start,
        "the reap went ahead of the waiting runtime ADD: {runs:?}"
    );
}

/// `--max-parallel 4` (one background slot), four stale attachments whose
/// DEL hangs: one reap runs, three wait for the background slot. A
/// runtime request for the container of a waiting reap (an ADD on another
/// network, real bridge + host-local) must not wait behind that reap for
/// the background slot: the reap takes a runtime slot and runs while the
/// first still holds the background one, then the ADD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_request_is_not_held_behind_its_containers_waiting_reap() {
    crate::support::require_root!();
    const HANG: &str = "dsched8h";
    const NET: &str = "dsched8";
    let dirs = Dirs::new();
    let (gate, c, _daemon, client) = four_hanging_reaps(&dirs, HANG, NET, "hold").await;
    let ops = client.operations(None).await.unwrap();
    let waiting = ops
        .iter()
        .find(|o| o.request_id.starts_with("reap-") && o.state == "queued")
        .and_then(|o| o.container_id.clone())
        .expect("a queued reap");

    let ns = TempNetns::new();
    let mut req = AttachmentRequest::new(&waiting, ns.path(), "eth1");
    req.timeout_ms = Some(60_000);
    let add = {
        let (client, req) = (client.clone(), req.clone());
        tokio::spawn(async move { client.add(NET, &req).await })
    };
    // The waiting reap runs its plugin though the background slot is
    // still held by the first.
    gate.wait_started(2).await;
    gate.release();
    let res = add
        .await
        .unwrap()
        .expect("the runtime's ADD after its container's reap");
    assert_eq!(
        ns.ipv4_addrs("eth1"),
        vec![crate::support::shim::ipv4_of(&res)]
    );
    client.del(NET, &req).await.expect("DEL");
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
}

/// A container whose reap waits for the background slot is DELed and
/// ADDed again by its runtime (same network, container and ifname, a new
/// namespace). The reap goes first (it was there first, and takes a
/// runtime slot), the DEL finds the attachment reaped and runs no plugin,
/// the ADD makes the new attachment; the reap never touches the new one,
/// nor does a later pass (witness: a reap queued after the ADD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_add_behind_its_containers_waiting_reap_is_left_alone() {
    crate::support::require_root!();
    const HANG: &str = "dsched9h";
    const NET: &str = "dsched9";
    let dirs = Dirs::new();
    let (gate, _c, daemon, client) = four_hanging_reaps(&dirs, HANG, NET, "again").await;
    let records = dirs.data.join("records");
    let ops = client.operations(None).await.unwrap();
    let waiting = ops
        .iter()
        .find(|o| o.request_id.starts_with("reap-") && o.state == "queued")
        .and_then(|o| o.container_id.clone())
        .expect("a queued reap");

    let mut del = AttachmentRequest::new(&waiting, "", "eth0");
    del.timeout_ms = Some(60_000);
    let del = {
        let (client, del) = (client.clone(), del.clone());
        tokio::spawn(async move { client.del(HANG, &del).await })
    };
    let queued = |verb: &'static str| {
        let (client, waiting) = (client.clone(), waiting.clone());
        async move {
            client
                .operations(Some(&waiting))
                .await
                .unwrap()
                .iter()
                .any(|o| o.verb == verb && !o.request_id.starts_with("reap-"))
        }
    };
    eventually_async(LIMIT, "the runtime's DEL queued", || queued("DEL")).await;
    let ns = TempNetns::new();
    let mut add = AttachmentRequest::new(&waiting, ns.path(), "eth0");
    add.timeout_ms = Some(60_000);
    let add_task = {
        let (client, add) = (client.clone(), add.clone());
        tokio::spawn(async move { client.add(HANG, &add).await })
    };
    eventually_async(LIMIT, "the runtime's ADD queued", || queued("ADD")).await;
    // The waiting reap runs (a runtime slot) beside the first one.
    gate.wait_started(2).await;
    gate.release();
    del.await.unwrap().expect("the runtime's DEL");
    add_task.await.unwrap().expect("the runtime's ADD");
    let mine = |runs: Vec<crate::support::daemon::Run>| -> Vec<String> {
        runs.into_iter()
            .filter(|r| r.container == waiting)
            .map(|r| r.command)
            .collect()
    };
    assert_eq!(
        mine(crate::support::daemon::runs(&records)),
        ["ADD", "DEL", "ADD"],
        "one DEL (the reap's), before the new ADD"
    );
    let record = format!("{HANG}-{waiting}-eth0");
    assert!(dirs.cached().contains(&record), "{:?}", dirs.cached());

    // A witness stale attachment made after the ADD: once its reap is
    // logged, a pass ran that saw the new attachment too.
    let witness = TempNetns::new();
    client
        .add(
            HANG,
            &AttachmentRequest::new("again-witness", witness.path(), "eth0"),
        )
        .await
        .expect("witness ADD");
    drop(witness);
    reaps_logged(&daemon, 5).await;
    assert!(dirs.cached().contains(&record), "{:?}", dirs.cached());
    assert_eq!(
        mine(crate::support::daemon::runs(&records)),
        ["ADD", "DEL", "ADD"]
    );
    client.del(HANG, &add).await.expect("final DEL");
    assert!(!dirs.cached().contains(&record), "{:?}", dirs.cached());
}

/// SIGTERM while one reap runs (its DEL at the gate) and three wait for
/// the background slot: the three are refused, their records stay (no
/// DEL ran for them); the running one finishes during the drain and
/// removes its record. The next start reaps the three, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaps_refused_at_shutdown_are_reaped_by_the_next_start() {
    crate::support::require_root!();
    const HANG: &str = "dsched10h";
    const NET: &str = "dsched10";
    let dirs = Dirs::new();
    let (gate, _c, mut daemon, _client) = four_hanging_reaps(&dirs, HANG, NET, "term").await;
    let records = dirs.data.join("records");
    daemon.signal(libc::SIGTERM);
    daemon.wait_log("queued operations refused count=3", LIMIT);
    let dels = || {
        crate::support::daemon::runs(&records)
            .into_iter()
            .filter(|r| r.command == "DEL")
            .count()
    };
    // The running reap's DEL is at the gate (a run is recorded when it
    // ends); no other reached its plugin.
    assert_eq!(
        gate.started(),
        1,
        "only the running reap reached its plugin"
    );
    assert_eq!(dels(), 0);
    gate.release();
    let status = daemon.wait(LIMIT).expect("cnid exits after the drain");
    assert!(status.success(), "{status}:\n{}", daemon.log());
    assert_eq!(dels(), 1);
    let left: Vec<String> = dirs
        .cached()
        .into_iter()
        .filter(|r| r.starts_with(HANG))
        .collect();
    assert_eq!(left.len(), 3, "the refused reaps' records stay: {left:?}");

    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    reaps_logged(&daemon, 3).await;
    assert!(
        !dirs.cached().iter().any(|r| r.starts_with(HANG)),
        "{:?}",
        dirs.cached()
    );
    let mut reaped: Vec<String> = crate::support::daemon::runs(&records)
        .into_iter()
        .filter(|r| r.command == "DEL")
        .map(|r| r.container)
        .collect();
    reaped.sort();
    assert_eq!(reaped, ["term0", "term1", "term2", "term3"], "each once");
}
