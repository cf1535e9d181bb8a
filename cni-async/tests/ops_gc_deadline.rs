//! GC's deadline bounds the whole GC: the stale DELs share it (they do not
//! each get a fresh one), a DEL still running when it expires is killed,
//! the ones it leaves no time for are not started, and all of them are
//! reported as not deleted.

use std::time::{Duration, Instant};

use crate::support::fake::{
    Fake, GroupReaper, RIG_KILL_GRACE, Response, Rig, conflist, read_pids, sh_quote, wait_gone,
};
use cni_async::Error;
use cni_core::stdin::GcAttachment;
use cni_core::{NetworkConfigList, RuntimeConf};
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.217.0.2/24"}]}"#;
const STALE: usize = 8;
const GC_DEADLINE: Duration = Duration::from_secs(1);
/// What a loaded 2-core machine may add on top of the deadline and the
/// kill grace (spawns, the cache listing, reaping).
const MARGIN: Duration = Duration::from_secs(3);

/// `p`: ADD succeeds; once the file `hang` exists, DEL appends its pid to
/// `pids` and hangs; GC succeeds.
fn rig() -> (Rig, std::path::PathBuf, std::path::PathBuf) {
    let rig = Rig::new();
    let pids = rig.dir.scratch("pids");
    let hang = rig.dir.scratch("hang");
    let del = format!(
        "if [ -e {hang} ]; then echo $$ >> {pids}; sleep 1000; fi",
        hang = sh_quote(&hang.to_string_lossy()),
        pids = sh_quote(&pids.to_string_lossy()),
    );
    rig.fake(
        "p",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(RESULT))
            .on("DEL", Response::ok("").with_shell(&del))
            .without_recording(),
    );
    (rig, pids, hang)
}

fn list(version: &str) -> NetworkConfigList {
    conflist(json!({"cniVersion": version, "name":"gcdl","plugins":[{"type":"p"}]}))
}

fn rt(cid: &str) -> RuntimeConf {
    RuntimeConf::new(cid, format!("/run/netns/{cid}"), "eth0")
}

fn cids() -> Vec<String> {
    (0..STALE).map(|i| format!("stale-{i}")).collect()
}

/// Adds the stale attachments, then makes their DELs hang.
async fn populate(rig: &Rig, list: &NetworkConfigList, hang: &std::path::Path) {
    for cid in cids() {
        rig.cni()
            .add_network_list(list, &rt(&cid))
            .await
            .expect("ADD");
    }
    std::fs::write(hang, b"").unwrap();
}

fn attachments(list: &[GcAttachment]) -> Vec<String> {
    list.iter().map(|a| a.container_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_stale_dels_share_one_gc_deadline() {
    let (rig, pids, hang) = rig();
    let _reaper = GroupReaper(pids.clone());
    let list = list("1.0.0");
    populate(&rig, &list, &hang).await;
    let cni = rig.cni();

    let started = Instant::now();
    let out = cni.gc_network_list(&list, &[]).timeout(GC_DEADLINE).await;
    let elapsed = started.elapsed();
    println!("GC with {STALE} hanging DELs and a {GC_DEADLINE:?} deadline took {elapsed:?}");
    assert!(
        elapsed < GC_DEADLINE + RIG_KILL_GRACE + MARGIN,
        "GC took {elapsed:?} with a deadline of {GC_DEADLINE:?}"
    );

    // Nothing deleted; each stale attachment named with why.
    let summary = out.expect("GC of a 1.0.0 list answers with what it could not delete");
    assert!(summary.deleted.is_empty(), "{summary:?}");
    assert_eq!(
        summary
            .failed
            .iter()
            .map(|f| f.attachment.container_id.clone())
            .collect::<Vec<_>>(),
        cids()
    );
    for f in &summary.failed {
        assert!(
            matches!(f.error, Error::Timeout { .. }),
            "{}: {}",
            f.attachment.container_id,
            f.error
        );
        assert_eq!(f.error.code(), 11);
    }
    // Only the first DEL had time to start; it was killed.
    let started_dels = read_pids(&pids);
    assert_eq!(started_dels.len(), 1, "DELs started: {started_dels:?}");
    assert!(
        wait_gone(&started_dels, Duration::from_secs(10))
            .await
            .is_empty(),
        "a hanging DEL outlived the GC"
    );
    // Their records stay, for the next GC or DEL.
    assert_eq!(rig.result_files().len(), STALE);

    // The attachments are usable right after: a new ADD, and the DELs
    // once they no longer hang.
    std::fs::remove_file(&hang).unwrap();
    cni.add_network_list(&list, &rt("after"))
        .await
        .expect("ADD after GC");
    let summary = cni
        .gc_network_list(
            &list,
            &[GcAttachment {
                container_id: "after".into(),
                ifname: "eth0".into(),
            }],
        )
        .await
        .expect("second GC");
    assert_eq!(attachments(&summary.deleted), cids());
    assert!(summary.failed.is_empty(), "{summary:?}");
    assert_eq!(rig.result_files(), ["gcdl-after-eth0"]);
}

/// With a 1.1.0 list, the deadline also bounds the plugins' GC: none is
/// left for it, and the error says so and names every attachment left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_time_left_for_the_plugins_gc_is_an_error_naming_what_is_left() {
    let (rig, pids, hang) = rig();
    let _reaper = GroupReaper(pids.clone());
    let list = list("1.1.0");
    populate(&rig, &list, &hang).await;

    let started = Instant::now();
    let err = rig
        .cni()
        .gc_network_list(&list, &[])
        .timeout(GC_DEADLINE)
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        elapsed < GC_DEADLINE + RIG_KILL_GRACE + MARGIN,
        "GC took {elapsed:?} with a deadline of {GC_DEADLINE:?}"
    );
    let Error::Multiple { errors, .. } = &err else {
        panic!("expected Multiple, got {err}");
    };
    assert_eq!(errors.len(), STALE + 1, "{err}");
    for (e, cid) in errors.iter().zip(cids()) {
        match e {
            Error::Context { context, source } => {
                assert!(context.contains(&cid), "{context}");
                assert!(matches!(**source, Error::Timeout { .. }), "{source}");
            }
            other => panic!("expected the stale DEL of {cid}, got {other}"),
        }
    }
    assert!(
        matches!(errors[STALE], Error::Timeout { .. }),
        "{}",
        errors[STALE]
    );
    assert_eq!(err.code(), 11);
    assert!(
        wait_gone(&read_pids(&pids), Duration::from_secs(10))
            .await
            .is_empty()
    );
}
