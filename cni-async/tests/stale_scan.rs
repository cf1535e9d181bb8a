//! `cni_async::stale`: the verdict on each cached attachment (kept while
//! its namespace exists, stale at once when another boot id wrote it (a
//! record without one: an mtime before the boot and a path that is no
//! namespace), otherwise after `stale_after` of being seen gone, the clock
//! reset when the namespace comes back), and the reap: a DEL with the
//! cached config, result and args and no netns, unless the record changed
//! or the namespace came back since the scan.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::stale::{Kept, Reaped, StaleReason, StaleScanner, Verdict};
use cni_async::{CallOptions, Cni};
use cni_core::{CniArgs, RuntimeConf};
use serde_json::json;

const NET: &str = "stalenet";

fn rig() -> Rig {
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.77.0.5/24"}]}"#),
        ),
    );
    rig
}

async fn attach(cni: &Cni, cid: &str, netns: &Path) -> RuntimeConf {
    let list = conflist(json!({"cniVersion":"1.0.0","name": NET,"plugins":[{"type":"a"}]}));
    let mut rt = RuntimeConf::new(cid, netns.to_str().unwrap(), "eth0");
    rt.args = CniArgs::parse("K8S_POD_NAME=web").unwrap();
    cni.add_network_list(&list, &rt).await.expect("ADD");
    rt
}

fn verdict_of(found: &[cni_async::stale::Candidate], cid: &str) -> Verdict {
    found
        .iter()
        .find(|c| c.container_id == cid)
        .unwrap_or_else(|| panic!("{cid} not listed"))
        .verdict
}

#[tokio::test]
async fn each_record_gets_its_verdict_and_a_namespace_gone_is_timed_from_the_first_scan() {
    let rig = rig();
    let cni = rig.cni();
    let alive = rig.dir.scratch("alive");
    std::os::unix::fs::symlink("/proc/self/ns/net", &alive).unwrap();
    let (gone, old) = (rig.dir.scratch("gone"), rig.dir.scratch("old"));
    attach(&cni, "alive", &alive).await;
    attach(&cni, "gone", &gone).await;
    attach(&cni, "old", &old).await;
    attach(&cni, "legacy", &old).await;
    // "old" was written in another boot (its boot id); "legacy" has no
    // identity (libcni's) and an mtime before the boot.
    rig.edit_record(NET, "old", "eth0", |v| {
        v["netnsIdentity"]["bootId"] = "another-boot".into()
    });
    rig.edit_record(NET, "legacy", "eth0", |v| {
        v.as_object_mut().unwrap().remove("netnsIdentity");
    });
    let boot = SystemTime::now() - Duration::from_secs(60);
    let f = std::fs::File::options()
        .write(true)
        .open(rig.cache_dir.join(format!("results/{NET}-legacy-eth0")))
        .unwrap();
    f.set_modified(boot - Duration::from_secs(3600)).unwrap();

    let mut scanner = StaleScanner::with_boot_time(Some(boot), Some(Duration::from_secs(3600)));
    let found = scanner.scan(cni.cache()).await.unwrap();
    assert_eq!(found.len(), 4);
    assert_eq!(
        verdict_of(&found, "alive"),
        Verdict::Kept(Kept::NamespaceExists)
    );
    for cid in ["old", "legacy"] {
        assert_eq!(
            verdict_of(&found, cid),
            Verdict::Stale(StaleReason::Rebooted),
            "{cid}"
        );
    }
    assert_eq!(
        verdict_of(&found, "gone"),
        Verdict::Waiting {
            gone_for: Duration::ZERO
        }
    );
    // Seen gone again: the clock runs from the first scan.
    let found = scanner.scan(cni.cache()).await.unwrap();
    let Verdict::Waiting { gone_for } = verdict_of(&found, "gone") else {
        panic!("still waiting")
    };
    assert!(gone_for > Duration::ZERO);
    // Back, then gone again: the clock starts over.
    std::os::unix::fs::symlink("/proc/self/ns/net", &gone).unwrap();
    let found = scanner.scan(cni.cache()).await.unwrap();
    assert_eq!(
        verdict_of(&found, "gone"),
        Verdict::Kept(Kept::NamespaceExists)
    );
    std::fs::remove_file(&gone).unwrap();
    let found = scanner.scan(cni.cache()).await.unwrap();
    assert_eq!(
        verdict_of(&found, "gone"),
        Verdict::Waiting {
            gone_for: Duration::ZERO
        }
    );
    // A one-shot caller's zero stale_after: gone now is stale.
    let found = StaleScanner::with_boot_time(Some(boot), Some(Duration::ZERO))
        .scan(cni.cache())
        .await
        .unwrap();
    assert_eq!(
        verdict_of(&found, "gone"),
        Verdict::Stale(StaleReason::NamespaceGone)
    );
    // Without a boot time, no record without identity is an earlier
    // boot's; the boot id still proves "old" one.
    let found = StaleScanner::with_boot_time(None, None)
        .scan(cni.cache())
        .await
        .unwrap();
    assert!(matches!(
        verdict_of(&found, "legacy"),
        Verdict::Waiting { .. }
    ));
    assert_eq!(
        verdict_of(&found, "old"),
        Verdict::Stale(StaleReason::Rebooted)
    );
}

#[tokio::test]
async fn a_reap_dels_with_the_cached_record_unless_it_changed_or_the_namespace_is_back() {
    let rig = rig();
    let cni = rig.cni();
    let (gone, changed, back) = (
        rig.dir.scratch("gone"),
        rig.dir.scratch("changed"),
        rig.dir.scratch("back"),
    );
    attach(&cni, "gone", &gone).await;
    let rt_changed = attach(&cni, "changed", &changed).await;
    attach(&cni, "back", &back).await;
    let found = StaleScanner::with_boot_time(None, Some(Duration::ZERO))
        .scan(cni.cache())
        .await
        .unwrap();
    assert!(found.iter().all(|c| c.verdict.stale().is_some()));
    let candidate = |cid: &str| {
        found
            .iter()
            .find(|c| c.container_id == cid)
            .unwrap()
            .clone()
    };
    rig.dir.clear_records();
    let opts = CallOptions::default();

    // The runtime's DEL came first: nothing to do.
    cni.del_cached(NET, &rt_changed).await.expect("DEL");
    rig.dir.clear_records();
    assert_eq!(
        cni.reap_stale(&candidate("changed"), &opts).await.unwrap(),
        Reaped::Changed
    );
    // The namespace is there again: left alone.
    std::os::unix::fs::symlink("/proc/self/ns/net", &back).unwrap();
    assert_eq!(
        cni.reap_stale(&candidate("back"), &opts).await.unwrap(),
        Reaped::Alive
    );
    // The record holds another netns than the scan saw (rewritten in
    // place, its inode reused): not this reap's to DEL.
    let mut moved = candidate("gone");
    moved.netns = rig.dir.scratch("elsewhere").to_str().unwrap().to_owned();
    assert_eq!(
        cni.reap_stale(&moved, &opts).await.unwrap(),
        Reaped::Changed
    );
    assert!(rig.dir.invocations().is_empty());

    assert_eq!(
        cni.reap_stale(&candidate("gone"), &opts).await.unwrap(),
        Reaped::Deleted
    );
    let dels = rig.dir.invocations_of("DEL");
    assert_eq!(dels.len(), 1);
    // No path: the namespace is gone, and the path may be another's.
    assert_eq!(dels[0].var("CNI_NETNS"), Some(""));
    assert_eq!(dels[0].var("CNI_ARGS"), Some("K8S_POD_NAME=web"));
    assert_eq!(
        dels[0].stdin_json()["prevResult"]["ips"][0]["address"],
        "10.77.0.5/24"
    );
    let left: Vec<String> = cni
        .cache()
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.container_id)
        .collect();
    assert_eq!(left, vec!["back".to_owned()]);
}

/// A record rewritten in place (Go libcni writes with `O_TRUNC`, keeping
/// the inode, when the same attachment is added again; a file system may
/// also give a new record the inode of one just deleted) is read again by
/// a scanner that read it before: judged on what it says now, not on the
/// namespace it named then. Otherwise a re-added attachment whose new
/// namespace died would never be reaped (and every reap of it would find
/// the record "changed").
#[tokio::test]
async fn a_record_rewritten_in_place_is_judged_again() {
    let rig = rig();
    let cni = rig.cni();
    let alive = rig.dir.scratch("alive");
    std::os::unix::fs::symlink("/proc/self/ns/net", &alive).unwrap();
    attach(&cni, "inplace", &alive).await;
    let mut scanner = StaleScanner::with_boot_time(None, Some(Duration::ZERO));
    let found = scanner.scan(cni.cache()).await.unwrap();
    assert_eq!(
        verdict_of(&found, "inplace"),
        Verdict::Kept(Kept::NamespaceExists)
    );
    // Added again by libcni in a namespace that is gone by now: same
    // file, no identity, another netns.
    let gone = rig.dir.scratch("gone");
    rig.edit_record(NET, "inplace", "eth0", |v| {
        v.as_object_mut().unwrap().remove("netnsIdentity");
        v["netns"] = gone.to_str().unwrap().into();
    });
    let found = scanner.scan(cni.cache()).await.unwrap();
    assert_eq!(found[0].netns, gone.to_str().unwrap());
    assert_eq!(
        verdict_of(&found, "inplace"),
        Verdict::Stale(StaleReason::NamespaceGone)
    );
    assert_eq!(
        cni.reap_stale(&found[0], &CallOptions::default())
            .await
            .unwrap(),
        Reaped::Deleted
    );
}
