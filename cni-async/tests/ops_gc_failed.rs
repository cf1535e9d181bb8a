//! One attachment whose DEL the plugin refuses does not poison GC: the
//! others are deleted, the plugins still get GC, and the outcome names the
//! one left and why, every time GC runs, until its DEL succeeds.

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_core::stdin::GcAttachment;
use cni_core::{CniArgs, RuntimeConf};
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.1.0","ips":[{"address":"10.218.0.2/24"}]}"#;

/// `p` refuses DEL when `CNI_ARGS` holds `BAD=1` (as the bridge plugin
/// refuses arguments it does not know); everything else succeeds.
fn rig() -> Rig {
    let rig = Rig::new();
    let del = r#"case ";$CNI_ARGS;" in *";BAD=1;"*) echo '{"cniVersion":"1.1.0","code":4,"msg":"ARGS: unknown args [\"BAD\"]"}'; exit 1;; esac"#;
    rig.fake(
        "p",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(RESULT))
            .on("DEL", Response::ok("").with_shell(del)),
    );
    rig
}

fn rt(cid: &str, args: &str) -> RuntimeConf {
    let mut rt = RuntimeConf::new(cid, format!("/run/netns/{cid}"), "eth0");
    rt.args = CniArgs::parse(args).unwrap();
    rt
}

fn ids(list: &[GcAttachment]) -> Vec<&str> {
    list.iter().map(|a| a.container_id.as_str()).collect()
}

#[tokio::test]
async fn a_refused_del_is_named_and_the_others_are_deleted() {
    let rig = rig();
    let cni = rig.cni();
    let list = conflist(json!({"cniVersion":"1.1.0","name":"gcbad","plugins":[{"type":"p"}]}));
    for (cid, args) in [("a", "K=1"), ("bad", "K=1;BAD=1"), ("c", "K=1")] {
        cni.add_network_list(&list, &rt(cid, args))
            .await
            .expect("ADD");
    }

    for round in 1..=2 {
        let summary = cni
            .gc_network_list(&list, &[])
            .await
            .unwrap_or_else(|e| panic!("GC {round} failed as a whole: {e}"));
        let expect_deleted: &[&str] = if round == 1 { &["a", "c"] } else { &[] };
        assert_eq!(ids(&summary.deleted), expect_deleted, "round {round}");
        assert!(summary.plugins_called, "round {round}: the plugins' GC ran");
        let [failed] = summary.failed.as_slice() else {
            panic!("round {round}: expected one failure: {summary:?}");
        };
        assert_eq!(
            failed.attachment,
            GcAttachment {
                container_id: "bad".into(),
                ifname: "eth0".into()
            }
        );
        assert!(failed.error.is_plugin_code(4), "{}", failed.error);
        assert!(
            failed.error.to_string().contains("ARGS: unknown args"),
            "{}",
            failed.error
        );
        assert_eq!(rig.result_files(), ["gcbad-bad-eth0"], "round {round}");
    }
    let gcs = rig
        .dir
        .invocations()
        .iter()
        .filter(|i| i.var("CNI_COMMAND") == Some("GC"))
        .count();
    assert_eq!(gcs, 2, "each GC called the plugin's GC");
}
