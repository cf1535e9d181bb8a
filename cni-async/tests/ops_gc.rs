//! GC: stale cached attachments get DEL and lose their entry, valid ones are
//! untouched, 1.1.0 lists get GC with both attachment keys, errors are
//! collected while the rest still runs.

use crate::support::fake::{Fake, Invocation, Response, Rig, assert_json_eq, conflist};
use cni_async::Error;
use cni_core::stdin::GcAttachment;
use cni_core::{CniArgs, NetworkConfigList, RuntimeConf};
use serde_json::{Value, json};

/// A fake answering ADD with a result, other verbs with success, after
/// running `shell` (which may `exit` early).
fn fake(shell: &str) -> Fake {
    Fake::new(Response::ok("").with_shell(shell)).on(
        "ADD",
        Response::ok(
            &json!({"cniVersion":"1.1.0","ips":[{"address":"10.213.0.2/24"}]}).to_string(),
        ),
    )
}

fn gc_list(version: &str, extra: Value) -> NetworkConfigList {
    let mut v = json!({"cniVersion": version, "name": "gcnet",
        "plugins":[{"type":"a","capabilities":{"mac":true}},{"type":"b"}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    conflist(v)
}

fn attachment(cid: &str, ifname: &str) -> GcAttachment {
    GcAttachment {
        container_id: cid.into(),
        ifname: ifname.into(),
    }
}

fn rt(cid: &str) -> RuntimeConf {
    let mut rt = RuntimeConf::new(cid, format!("/run/netns/{cid}"), "eth0");
    rt.args = CniArgs::parse(&format!("POD={cid}")).unwrap();
    rt.capability_args.insert("mac", json!("0a:00:00:00:00:01"));
    rt
}

/// ADDs c1, c2, c3 on `gcnet` and c4 on `othernet`; clears the records.
async fn populate(rig: &Rig, list: &NetworkConfigList) {
    let cni = rig.cni();
    for cid in ["c1", "c2", "c3"] {
        cni.add_network_list(list, &rt(cid)).await.expect("ADD");
    }
    let other = conflist(json!({"cniVersion":"1.1.0","name":"othernet","plugins":[{"type":"a"}]}));
    cni.add_network_list(&other, &rt("c4"))
        .await
        .expect("ADD othernet");
    std::fs::remove_dir_all(rig.dir.records()).unwrap();
    std::fs::create_dir(rig.dir.records()).unwrap();
}

fn summary(calls: &[Invocation]) -> Vec<String> {
    calls
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c.command(),
                c.plugin,
                c.var("CNI_CONTAINERID").unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test]
async fn disable_gc_runs_nothing() {
    let rig = Rig::new();
    rig.fake("a", &fake(""));
    rig.fake("b", &fake(""));
    let list = gc_list("1.1.0", json!({"disableGC": true}));
    populate(&rig, &list).await;
    let s = rig.cni().gc_network_list(&list, &[]).await.expect("GC");
    assert!(
        s.disabled && !s.plugins_called && s.deleted.is_empty(),
        "{s:?}"
    );
    assert!(rig.dir.invocations().is_empty());
    assert_eq!(rig.result_files().len(), 4);
}

#[tokio::test]
async fn stale_attachments_get_del_and_plugins_get_gc() {
    let rig = Rig::new();
    rig.fake("a", &fake(""));
    rig.fake("b", &fake(""));
    let list = gc_list("1.1.0", json!({}));
    populate(&rig, &list).await;
    let c1_before = std::fs::read(rig.cache_file("gcnet", "c1", "eth0")).unwrap();

    let valid = [attachment("c1", "eth0"), attachment("c9", "eth0")];
    let s = rig.cni().gc_network_list(&list, &valid).await.expect("GC");
    assert_eq!(
        s.deleted,
        [attachment("c2", "eth0"), attachment("c3", "eth0")]
    );
    assert!(s.plugins_called && !s.disabled);

    let calls = rig.dir.invocations();
    assert_eq!(
        summary(&calls),
        [
            "DEL b c2", "DEL a c2", "DEL b c3", "DEL a c3", "GC a ", "GC b "
        ]
    );
    // The stale DEL runs with the cached netns, args, capability args and result.
    let del_a_c2 = &calls[1];
    assert_eq!(del_a_c2.var("CNI_NETNS"), Some("/run/netns/c2"));
    assert_eq!(del_a_c2.var("CNI_ARGS"), Some("POD=c2"));
    assert_json_eq(
        &del_a_c2.stdin_json(),
        &json!({"type":"a","name":"gcnet","cniVersion":"1.1.0",
            "runtimeConfig":{"mac":"0a:00:00:00:00:01"},
            "prevResult":{"cniVersion":"1.1.0","ips":[{"address":"10.213.0.2/24"}]}}),
        "stale DEL stdin",
    );
    let valid_json =
        json!([{"containerID":"c1","ifname":"eth0"},{"containerID":"c9","ifname":"eth0"}]);
    assert_json_eq(
        &calls[4].stdin_json(),
        &json!({"type":"a","capabilities":{"mac":true},"name":"gcnet","cniVersion":"1.1.0",
            "cni.dev/valid-attachments": valid_json, "cni.dev/attachments": valid_json}),
        "GC stdin",
    );
    // Stale entries gone; the valid one and the other network's untouched.
    assert_eq!(rig.result_files(), ["gcnet-c1-eth0", "othernet-c4-eth0"]);
    assert_eq!(
        std::fs::read(rig.cache_file("gcnet", "c1", "eth0")).unwrap(),
        c1_before
    );
}

#[tokio::test]
async fn a_1_0_0_list_gets_stale_dels_but_no_gc_call() {
    let rig = Rig::new();
    rig.fake("a", &fake(""));
    rig.fake("b", &fake(""));
    let list = gc_list("1.0.0", json!({}));
    populate(&rig, &list).await;
    let s = rig
        .cni()
        .gc_network_list(&list, &[attachment("c2", "eth0")])
        .await
        .expect("GC");
    assert_eq!(
        s.deleted,
        [attachment("c1", "eth0"), attachment("c3", "eth0")]
    );
    assert!(!s.plugins_called);
    let calls = rig.dir.invocations();
    assert_eq!(
        summary(&calls),
        ["DEL b c1", "DEL a c1", "DEL b c3", "DEL a c3"]
    );
    assert_eq!(rig.result_files(), ["gcnet-c2-eth0", "othernet-c4-eth0"]);
}

/// The stale DEL of c2 fails in `b` and the GC of `a` fails: both errors come
/// back, the DEL of c3 and the GC of `b` still ran, c2 keeps its entry.
#[tokio::test]
async fn errors_are_collected_and_the_rest_still_runs() {
    let rig = Rig::new();
    rig.fake(
        "a",
        &fake(r#"if [ "$CNI_COMMAND" = GC ]; then echo '{"code":120,"msg":"gc a broke"}'; exit 1; fi"#),
    );
    rig.fake(
        "b",
        &fake(r#"if [ "$CNI_COMMAND" = DEL ] && [ "$CNI_CONTAINERID" = c2 ]; then echo '{"code":121,"msg":"del c2 broke"}'; exit 1; fi"#),
    );
    let list = gc_list("1.1.0", json!({}));
    populate(&rig, &list).await;
    let err = rig
        .cni()
        .gc_network_list(&list, &[attachment("c1", "eth0")])
        .await
        .unwrap_err();
    let Error::Multiple { operation, errors } = &err else {
        panic!("expected Multiple, got {err}");
    };
    assert_eq!(operation, "GC of network gcnet");
    assert_eq!(errors.len(), 2, "{err}");
    match &errors[0] {
        Error::Context { context, source } => {
            assert!(
                context.contains("c2") && context.contains("eth0"),
                "{context}"
            );
            assert!(source.is_plugin_code(121), "{source}");
        }
        other => panic!("expected the stale DEL error first, got {other}"),
    }
    assert!(errors[1].is_plugin_code(120), "{}", errors[1]);
    assert_eq!(err.code(), 121, "the first error's code");

    let calls = rig.dir.invocations();
    assert_eq!(
        summary(&calls),
        ["DEL b c2", "DEL b c3", "DEL a c3", "GC a ", "GC b "]
    );
    assert_eq!(
        rig.result_files(),
        ["gcnet-c1-eth0", "gcnet-c2-eth0", "othernet-c4-eth0"]
    );
}
