//! A rollback keeps off an interface it cannot prove is its ADD's alone:
//! it DELs without the netns when the cache holds another container's
//! attachment on that netns and ifname (written by anyone, at any time
//! before the rollback), or when the cache's attachments cannot be read.
//! Fake plugins record whether their DEL got `CNI_NETNS`.

use crate::support::fake::{Fake, Response, Rig, conflist, sh_quote};
use cni_async::{CallOptions, Cni};
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;
use serde_json::json;

const NETNS: &str = "/run/netns/shared";

fn list() -> cni_core::NetworkConfigList {
    conflist(json!({"cniVersion":"1.0.0","name":"own","plugins":[{"type":"ok"},{"type":"broken"}]}))
}

/// `ok` succeeds; `broken` fails its ADD (after `add_shell(rig)`); both
/// DELs succeed.
fn rig(add_shell: impl FnOnce(&Rig) -> String) -> Rig {
    let rig = Rig::new();
    let result = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.9.2/24"}]}"#;
    rig.fake(
        "ok",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(result)),
    );
    let shell = add_shell(&rig);
    rig.fake(
        "broken",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::cni_error(110, "broken", "").with_shell(&shell),
        ),
    );
    rig
}

/// A failing ADD of `cid` on [`NETNS`]'s eth0 with rollback; answers the
/// `CNI_NETNS` of each rollback DEL, last plugin first.
async fn failed_add(rig: &Rig, cni: &Cni, cid: &str) -> Vec<String> {
    let before = rig.dir.invocations_of("DEL").len();
    let opts = CallOptions {
        rollback: true,
        ..Default::default()
    };
    cni.add_network_list(&list(), &RuntimeConf::new(cid, NETNS, "eth0"))
        .options(&opts)
        .await
        .expect_err("broken fails its ADD");
    let dels = rig.dir.invocations_of("DEL");
    let ours: Vec<_> = dels[before..]
        .iter()
        .map(|d| {
            assert_eq!(d.var("CNI_CONTAINERID"), Some(cid));
            d.var("CNI_NETNS").unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(ours.len(), 2, "both plugins rolled back: {ours:?}");
    ours
}

/// `network`'s record of `cid` on `netns`'s eth0, written as libcni does
/// (straight into place) by another process.
fn write_foreign(rig: &Rig, network: &str, cid: &str, netns: &str) {
    let rec = CacheRecord::new(
        network,
        &RuntimeConf::new(cid, netns, "eth0"),
        br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#.to_vec(),
        Some(json!({"cniVersion": "1.0.0"})),
    );
    let file = rig.cache_file(network, cid, "eth0");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, rec.encode()).unwrap();
}

/// A cache whose owner index is warm (a rollback asked it already) sees a
/// record another tool wrote afterwards: the next rollback on that netns
/// and ifname, of another container, keeps off the owner's interface;
/// once the record is removed, a rollback runs in the netns again. With
/// the cache's I/O on the pool and inline (few changes read inline).
#[tokio::test]
async fn a_warm_index_sees_another_writers_record_before_a_rollback() {
    for inline in [false, true] {
        let rig = rig(|_| String::new());
        let cni = rig.cni_inline_io(inline);
        // `results/` exists from the start (a watch can be set on it).
        write_foreign(&rig, "other", "bystander", "/run/netns/elsewhere");
        let warm = failed_add(&rig, &cni, "first").await;
        assert_eq!(warm, [NETNS, NETNS], "inline {inline}: nobody else there");
        write_foreign(&rig, "net", "owner", NETNS);
        let kept = failed_add(&rig, &cni, "intruder").await;
        assert_eq!(
            kept,
            ["", ""],
            "inline {inline}: the owner's interface was DELed in its netns"
        );
        std::fs::remove_file(rig.cache_file("net", "owner", "eth0")).unwrap();
        let freed = failed_add(&rig, &cni, "later").await;
        assert_eq!(freed, [NETNS, NETNS], "inline {inline}: the owner is gone");
    }
}

/// Regression test: a rollback that could not read the cache's
/// attachments (here `results/`, which held another container's record on
/// the same netns and ifname, replaced by a file while the ADD ran) rolled
/// back in the netns, taking down what may be the other container's
/// interface on the absence of evidence. Now it runs without the netns.
#[tokio::test]
async fn a_rollback_that_cannot_read_the_cache_keeps_the_interface() {
    for inline in [false, true] {
        let rig = rig(|rig| {
            let results = rig.cache_dir.join("results");
            format!(
                "mv {p} {away} && echo 'in the way' > {p}",
                p = sh_quote(&results.to_string_lossy()),
                away = sh_quote(&rig.cache_dir.join("away").to_string_lossy()),
            )
        });
        let cni = rig.cni_inline_io(inline);
        write_foreign(&rig, "net", "owner", NETNS);
        let kept = failed_add(&rig, &cni, "intruder").await;
        assert_eq!(
            kept,
            ["", ""],
            "inline {inline}: rolled back in the netns without proof it was the ADD's alone"
        );
        // What was moved away is intact: nothing touched the owner's record.
        assert!(rig.cache_dir.join("away/net-owner-eth0").is_file());
    }
}
