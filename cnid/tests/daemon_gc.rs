//! GC through the real daemon: exclusive with ADD and DEL on its network
//! (waits for the running ones, holds the later ones), and its results.

mod support;

use std::time::Duration;

use cni_core::stdin::GcAttachment;
use cnid::api::{AttachmentRequest, GcRequest};
use serde_json::json;
use support::daemon::{Daemon, Dirs, eventually_async, recording_plugin, runs};

const NET: &str = "gcn";
const NETNS: &str = "/proc/self/ns/net";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_never_overlaps_add_or_del_and_later_ones_wait_for_it() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "rec",
        &recording_plugin(
            &records,
            r#"case "$CNI_COMMAND" in GC) sleep 0.6;; ADD|DEL) sleep 0.2;; esac"#,
        ),
    );
    dirs.conf(
        "10-gc.conflist",
        &json!({"cniVersion": "1.1.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = |c: usize, phase: u32| {
        let mut r = AttachmentRequest::new(format!("gc-{c}"), NETNS, "eth0");
        r.cni_args = format!("SEQ={phase}");
        r
    };

    // Phase 1: eight ADDs in flight.
    let mut phase1 = Vec::new();
    for c in 0..8 {
        let (cl, r) = (client.clone(), req(c, 1));
        phase1.push(tokio::spawn(async move { cl.add(NET, &r).await }));
    }
    eventually_async(Duration::from_secs(5), "an ADD running", || async {
        client
            .operations(None)
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == "ADD" && o.state == "running")
    })
    .await;

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
    eventually_async(Duration::from_secs(5), "GC queued", || async {
        client
            .operations(None)
            .await
            .unwrap()
            .iter()
            .any(|o| o.request_id == "the-gc")
    })
    .await;

    // Phase 2, after GC arrived: ADDs of new containers, DELs of old ones.
    let mut phase2 = Vec::new();
    for c in 8..16 {
        let (cl, r) = (client.clone(), req(c, 2));
        phase2.push(tokio::spawn(
            async move { cl.add(NET, &r).await.map(|_| ()) },
        ));
    }
    for c in 0..4 {
        let (cl, r) = (client.clone(), req(c, 2));
        phase2.push(tokio::spawn(async move { cl.del(NET, &r).await }));
    }

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
    assert!(waited_for >= 1, "GC did not wait for any running ADD");
    println!(
        "gc: waited for {waited_for} running ADDs; {} operations held until it ended",
        all.iter().filter(|r| r.seq == Some(2)).count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_stale_cached_attachments_only() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin("rec", &recording_plugin(&records, ""));
    dirs.conf(
        "10-gc.conflist",
        &json!({"cniVersion": "1.1.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    for c in ["keep", "stale"] {
        client
            .add(NET, &AttachmentRequest::new(c, NETNS, "eth0"))
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
