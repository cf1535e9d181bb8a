//! Trace context: inside `trace::scope`, every plugin of every verb gets
//! the scope's TRACEPARENT, TRACESTATE and BAGGAGE (absent ones empty),
//! also when the ADD runs on a task of its own; outside a scope the
//! plugins inherit the process's own.

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::trace::{TraceContext, scope};
use cni_core::RuntimeConf;
use cni_core::stdin::GcAttachment;
use serde_json::json;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn rig() -> Rig {
    let rig = Rig::new();
    let fake = Fake::new(Response::ok("")).on(
        "ADD",
        Response::ok(
            &json!({"cniVersion":"1.1.0","ips":[{"address":"10.217.0.2/24"}]}).to_string(),
        ),
    );
    rig.fake("a", &fake);
    rig.fake("b", &fake);
    rig
}

fn list() -> cni_core::NetworkConfigList {
    conflist(json!({"cniVersion":"1.1.0","name":"tracenet","plugins":[{"type":"a"},{"type":"b"}]}))
}

fn trace_vars(call: &crate::support::fake::Invocation) -> [Option<&str>; 3] {
    [
        call.var("TRACEPARENT"),
        call.var("TRACESTATE"),
        call.var("BAGGAGE"),
    ]
}

#[tokio::test]
async fn every_plugin_of_every_verb_gets_the_scope() {
    let rig = rig();
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let ctx = std::sync::Arc::new(TraceContext::new(Some(TP), None, Some("pod=p1")));
    scope(ctx.clone(), async {
        cni.add_network_list(&list, &rt).await.expect("ADD");
        cni.check_network_list(&list, &rt).await.expect("CHECK");
        cni.status_network_list(&list).await.expect("STATUS");
        let valid = [GcAttachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
        }];
        cni.gc_network_list(&list, &valid).await.expect("GC");
        cni.del_network_list(&list, &rt).await.expect("DEL");
    })
    .await;
    let calls = rig.dir.invocations();
    let verbs: Vec<String> = calls
        .iter()
        .map(|c| format!("{} {}", c.command(), c.plugin))
        .collect();
    assert_eq!(
        verbs,
        [
            "ADD a", "ADD b", "CHECK a", "CHECK b", "STATUS a", "STATUS b", "GC a", "GC b",
            "DEL b", "DEL a"
        ]
    );
    for call in &calls {
        assert_eq!(
            trace_vars(call),
            [Some(TP), Some(""), Some("pod=p1")],
            "{} {}",
            call.command(),
            call.plugin
        );
    }
}

/// An ADD with `rollback_on_cancel` runs on a spawned task: the scope
/// goes with it, to the chain and to the rollback of a failed chain.
#[tokio::test]
async fn a_detached_add_and_its_rollback_keep_the_scope() {
    let rig = rig();
    rig.fake(
        "fails",
        &Fake::new(Response::ok("")).on("ADD", Response::cni_error(11, "later", "")),
    );
    let cni = rig.cni();
    let list = conflist(json!({"cniVersion":"1.1.0","name":"tracenet2",
        "plugins":[{"type":"a"},{"type":"fails"}]}));
    let rt = RuntimeConf::new("c2", "/run/netns/c2", "eth0");
    let ctx = TraceContext::new(Some(TP), Some("congo=t61rcWkgMzE"), None);
    let err = scope(ctx, cni.add_network_list(&list, &rt).rollback_on_cancel())
        .await
        .expect_err("the second plugin fails");
    assert_eq!(err.code(), 11, "{err}");
    let calls = rig.dir.invocations();
    let verbs: Vec<String> = calls
        .iter()
        .map(|c| format!("{} {}", c.command(), c.plugin))
        .collect();
    assert_eq!(verbs, ["ADD a", "ADD fails", "DEL fails", "DEL a"]);
    for call in &calls {
        assert_eq!(
            trace_vars(call),
            [Some(TP), Some("congo=t61rcWkgMzE"), Some("")],
            "{} {}",
            call.command(),
            call.plugin
        );
    }
}

/// Outside a scope nothing is set: the plugin inherits what the process
/// has (libcni's behaviour).
#[tokio::test]
async fn outside_a_scope_the_environment_is_inherited() {
    let rig = rig();
    let cni = rig.cni();
    let list = list();
    cni.status_network_list(&list).await.expect("STATUS");
    for call in rig.dir.invocations() {
        assert_eq!(
            call.var("TRACEPARENT"),
            std::env::var("TRACEPARENT").ok().as_deref()
        );
    }
}
