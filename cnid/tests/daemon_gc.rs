//! GC through the real daemon: exclusive with ADD and DEL on its network
//! (waits for the running ones, holds the later ones), and its results.

use crate::support;
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually_async, recording_plugin, runs};
use crate::support::gate::Gate;
use cni_core::stdin::GcAttachment;
use cnid::api::OperationInfo;
use cnid::api::{AttachmentRequest, GcRequest};
use serde_json::json;

const NET: &str = "gcn";
/// How long a test waits for a state it caused (generous: a busy machine).
const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_never_overlaps_add_or_del_and_later_ones_wait_for_it() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    // Phase 1 ADDs hold at one gate, GC at another.
    let adds = Gate::new(dirs.root());
    let gc_gate = Gate::new(dirs.root());
    dirs.plugin(
        "rec",
        &recording_plugin(
            &records,
            &format!(
                "case \"$CNI_COMMAND:$seq\" in\nADD:1)\n{}\n;;\nGC:*)\n{}\n;;\nesac",
                adds.shell_wait(),
                gc_gate.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-gc.conflist",
        &json!({"cniVersion": "1.1.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = |c: usize, phase: u32| {
        let mut r =
            AttachmentRequest::new(format!("gc-{c}"), dirs.netns(&format!("gc-{c}")), "eth0");
        r.cni_args = format!("SEQ={phase}");
        r
    };
    let ops = || async { client.operations(None).await.unwrap() };

    // Phase 1: eight ADDs running their plugins.
    let mut phase1 = Vec::new();
    for c in 0..8 {
        let (cl, r) = (client.clone(), req(c, 1));
        phase1.push(tokio::spawn(async move { cl.add(NET, &r).await }));
    }
    adds.wait_started(8).await;

    // GC arrives, with every container of the test valid.
    let valid: Vec<GcAttachment> = (0..16)
        .map(|c| GcAttachment {
            container_id: format!("gc-{c}"),
            ifname: "eth0".into(),
        })
        .collect();
    let gc = {
        let cl = client.with_request_id("the-gc");
        let body = GcRequest {
            valid_attachments: valid,
            timeout_ms: None,
        };
        tokio::spawn(async move { cl.gc(NET, &body).await })
    };
    eventually_async(WAIT, "GC queued", || async {
        ops().await.iter().any(|o| o.request_id == "the-gc")
    })
    .await;

    // Phase 2, after GC arrived: ADDs of new containers, DELs of old ones.
    let mut phase2 = Vec::new();
    for c in 8..16 {
        let (cl, r) = (client.with_request_id(&format!("p2-{c}")), req(c, 2));
        phase2.push(tokio::spawn(
            async move { cl.add(NET, &r).await.map(|_| ()) },
        ));
    }
    for c in 0..4 {
        let (cl, r) = (client.with_request_id(&format!("p2-{c}")), req(c, 2));
        phase2.push(tokio::spawn(async move { cl.del(NET, &r).await }));
    }
    let phase2_ops = |ops: &[OperationInfo]| {
        ops.iter()
            .filter(|o| o.request_id.starts_with("p2-"))
            .cloned()
            .collect::<Vec<_>>()
    };
    eventually_async(WAIT, "phase 2 arrived", || async {
        phase2_ops(&ops().await).len() == 12
    })
    .await;
    // The running ADDs hold the network: GC waits, and so does phase 2.
    let now = ops().await;
    let waiting: Vec<_> = now
        .iter()
        .filter(|o| o.request_id == "the-gc" || o.request_id.starts_with("p2-"))
        .collect();
    assert_eq!(gc_gate.started(), 0, "GC ran during the ADDs: {now:?}");
    assert_eq!(waiting.len(), 13, "{now:?}");

    // The ADDs finish; GC runs (held at its gate), phase 2 still waits.
    adds.release();
    gc_gate.wait_started(1).await;
    let now = ops().await;
    assert!(
        now.iter()
            .all(|o| o.request_id == "the-gc" || o.request_id.starts_with("p2-")),
        "phase 1 left over while GC runs: {now:?}"
    );
    assert_eq!(phase2_ops(&now).len(), 12, "{now:?}");
    assert!(
        phase2_ops(&now).iter().all(|o| o.state == "queued"),
        "phase 2 started while GC runs: {now:?}"
    );
    gc_gate.release();

    for h in phase1 {
        h.await.unwrap().expect("phase 1 ADD");
    }
    let summary = gc.await.unwrap().expect("GC");
    assert!(summary.deleted.is_empty(), "{summary:?}");
    assert!(summary.plugins_called);
    for h in phase2 {
        h.await.unwrap().expect("phase 2 operation");
    }

    let all = runs(&records);
    let gcs: Vec<_> = all.iter().filter(|r| r.command == "GC").collect();
    assert_eq!(gcs.len(), 1, "{all:?}");
    let g = gcs[0];
    let mut waited_for = 0;
    for r in all
        .iter()
        .filter(|r| r.command == "ADD" || r.command == "DEL")
    {
        assert!(
            r.end < g.start || r.start > g.end,
            "{} of {} (phase {:?}) overlaps GC: {}..{} vs {}..{}",
            r.command,
            r.container,
            r.seq,
            r.start,
            r.end,
            g.start,
            g.end
        );
        if r.seq == Some(2) {
            assert!(
                r.start > g.end,
                "{} of {} arrived after GC but started before it ended",
                r.command,
                r.container
            );
        } else if r.end < g.start {
            waited_for += 1;
        }
    }
    assert_eq!(waited_for, 8, "GC did not wait for every running ADD");
    println!(
        "gc: waited for {waited_for} running ADDs; {} operations held until it ended",
        all.iter().filter(|r| r.seq == Some(2)).count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_stale_cached_attachments_only() {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-gc.conflist", NET, "1.1.0");
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    for c in ["keep", "stale"] {
        client
            .add(NET, &AttachmentRequest::new(c, dirs.netns(c), "eth0"))
            .await
            .expect("ADD");
    }
    let summary = client
        .gc(
            NET,
            &GcRequest {
                valid_attachments: vec![GcAttachment {
                    container_id: "keep".into(),
                    ifname: "eth0".into(),
                }],
                timeout_ms: Some(10_000),
            },
        )
        .await
        .expect("GC");
    assert_eq!(
        summary.deleted,
        vec![GcAttachment {
            container_id: "stale".into(),
            ifname: "eth0".into()
        }]
    );
    let left: Vec<String> = client
        .attachments(None)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.container_id)
        .collect();
    assert_eq!(left, ["keep"]);
    // The stale one got its DEL before the plugins' GC.
    let cmds: Vec<(String, String)> = runs(&records)
        .into_iter()
        .filter(|r| r.command != "ADD")
        .map(|r| (r.command, r.container))
        .collect();
    assert_eq!(
        cmds,
        [("DEL".into(), "stale".into()), ("GC".into(), "-".into())]
    );
    // validAttachments is required: forgetting it must not delete everything.
    let r = support::daemon::post(&dirs.socket, "/v1/networks/gcn/gc", "{}");
    assert_eq!(r.status, 400);
    assert_eq!(r.cni_error(), 6);
    assert_eq!(client.attachments(None).await.unwrap().len(), 1);
}
