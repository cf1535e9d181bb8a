//! What each plugin receives from the operations layer: its exact stdin (as
//! a JSON value) and its exact environment, for every verb and every position
//! in the chain; results chained as `prevResult` and converted to the list's
//! version.

use std::collections::BTreeMap;

use crate::support::fake::{
    Fake, Invocation, Response, Rig, assert_json_eq, cni_vars, conflist, our_env_without_cni,
    version_reply,
};
use cni_core::stdin::GcAttachment;
use cni_core::{CapabilityArgs, CniArgs, NetworkConfigList, RuntimeConf};
use serde_json::{Value, json};

/// Results of the three plugins of the chain: each one extends the one
/// before (plugin 2 adds a route, plugin 3 adds DNS and an interface).
fn r1() -> Value {
    json!({"cniVersion":"1.1.0",
        "interfaces":[{"name":"eth0","mac":"0a:58:0a:02:00:02","sandbox":"/run/netns/c1"}],
        "ips":[{"address":"10.200.0.2/24","gateway":"10.200.0.1","interface":0}]})
}
fn r2() -> Value {
    json!({"cniVersion":"1.1.0",
        "interfaces":[{"name":"eth0","mac":"0a:58:0a:02:00:02","sandbox":"/run/netns/c1"}],
        "ips":[{"address":"10.200.0.2/24","gateway":"10.200.0.1","interface":0}],
        "routes":[{"dst":"10.201.0.0/16","gw":"10.200.0.1"}]})
}
fn r3() -> Value {
    json!({"cniVersion":"1.1.0",
        "interfaces":[{"name":"eth0","mac":"0a:58:0a:02:00:02","sandbox":"/run/netns/c1"},
                      {"name":"veth1234","mac":"0a:58:0a:02:00:03"}],
        "ips":[{"address":"10.200.0.2/24","gateway":"10.200.0.1","interface":0}],
        "routes":[{"dst":"10.201.0.0/16","gw":"10.200.0.1"}],
        "dns":{"nameservers":["10.200.0.1"],"search":["example.test"]}})
}

/// A 1.1.0 list of three recording fakes. Plugin 1 declares a capability and
/// carries a number above 2^64; plugin 2 has its own name and version (both
/// overridden); plugin 3 has a static runtimeConfig.
fn chain_list() -> NetworkConfigList {
    conflist(json!({
        "cniVersion": "1.1.0",
        "name": "chain",
        "plugins": [
            {"type": "p1", "capabilities": {"portMappings": true, "bandwidth": false},
             "keep": {"big": 18446744073709551617u128, "s": "<&>é"}},
            {"type": "p2", "cniVersion": "0.3.1", "name": "own"},
            {"type": "p3", "runtimeConfig": {"static": 1}}
        ]
    }))
}

fn chain_rig() -> Rig {
    let rig = Rig::new();
    for (name, result) in [("p1", r1()), ("p2", r2()), ("p3", r3())] {
        rig.fake(
            name,
            &Fake::new(Response::ok(""))
                .on("ADD", Response::ok(&result.to_string()))
                .on("VERSION", version_reply(&["1.0.0", "1.1.0"])),
        );
    }
    rig
}

fn chain_rt() -> RuntimeConf {
    let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    rt.args = CniArgs::parse("K8S_POD_NAME=web;IgnoreUnknown=1").unwrap();
    rt.capability_args = CapabilityArgs::from_json(
        r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],"bandwidth":{"ingressRate":1}}"#,
    )
    .unwrap();
    rt
}

/// The stdin plugin `index` of the chain should get for an attachment verb.
fn attachment_stdin(index: usize, prev: Option<Value>) -> Value {
    let mut v = match index {
        0 => json!({"type":"p1","keep":{"big":18446744073709551617u128,"s":"<&>é"},
            "name":"chain","cniVersion":"1.1.0",
            "runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}}),
        1 => json!({"type":"p2","cniVersion":"1.1.0","name":"chain"}),
        _ => json!({"type":"p3","runtimeConfig":{"static":1},"name":"chain","cniVersion":"1.1.0"}),
    };
    if let Some(prev) = prev {
        v["prevResult"] = prev;
    }
    v
}

/// The stdin of plugin `index` for STATUS (and, with the GC keys, for GC):
/// name and version injected, `capabilities` passed through (the spec
/// forbids it only for ADD, DEL and CHECK), nothing else.
fn network_stdin(index: usize) -> Value {
    match index {
        0 => json!({"type":"p1","capabilities":{"portMappings":true,"bandwidth":false},
            "keep":{"big":18446744073709551617u128,"s":"<&>é"},
            "name":"chain","cniVersion":"1.1.0"}),
        1 => json!({"type":"p2","cniVersion":"1.1.0","name":"chain"}),
        _ => json!({"type":"p3","runtimeConfig":{"static":1},"name":"chain","cniVersion":"1.1.0"}),
    }
}

fn cni_path(rig: &Rig) -> String {
    rig.dir.bin().display().to_string()
}

/// Checks one invocation: plugin, exact CNI_* variables, inherited
/// environment, stdin.
#[track_caller]
fn assert_call(
    call: &Invocation,
    plugin: &str,
    vars: &BTreeMap<String, String>,
    stdin: &Value,
    what: &str,
) {
    assert_eq!(call.plugin, plugin, "{what}: plugin order");
    pretty_assertions::assert_eq!(&call.cni_env(), vars, "{what}: CNI_* variables");
    pretty_assertions::assert_eq!(
        call.inherited_env(),
        our_env_without_cni(),
        "{what}: inherited environment"
    );
    assert_json_eq(&call.stdin_json(), stdin, &format!("{what}: stdin"));
}

#[tokio::test]
async fn every_verb_and_position_gets_exact_stdin_and_env() {
    let rig = chain_rig();
    let cni = rig.cni();
    let list = chain_list();
    let rt = chain_rt();
    let path = cni_path(&rig);
    let attach = |cmd: &str| {
        cni_vars(
            cmd,
            "c1",
            "/run/netns/c1",
            "eth0",
            "K8S_POD_NAME=web;IgnoreUnknown=1",
            &path,
        )
    };
    let network = |cmd: &str| cni_vars(cmd, "", "", "", "", &path);

    // ADD: first to last, the first without prevResult, then each the result
    // of the one before.
    let result = cni.add_network_list(&list, &rt).await.expect("ADD");
    assert_json_eq(&result.to_value(), &r3(), "ADD result");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 3, "{calls:#?}");
    assert_call(
        &calls[0],
        "p1",
        &attach("ADD"),
        &attachment_stdin(0, None),
        "ADD p1",
    );
    assert_call(
        &calls[1],
        "p2",
        &attach("ADD"),
        &attachment_stdin(1, Some(r1())),
        "ADD p2",
    );
    assert_call(
        &calls[2],
        "p3",
        &attach("ADD"),
        &attachment_stdin(2, Some(r2())),
        "ADD p3",
    );

    // CHECK: first to last, each with the cached final result.
    cni.check_network_list(&list, &rt).await.expect("CHECK");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 6);
    for (i, p) in ["p1", "p2", "p3"].into_iter().enumerate() {
        assert_call(
            &calls[3 + i],
            p,
            &attach("CHECK"),
            &attachment_stdin(i, Some(r3())),
            &format!("CHECK {p}"),
        );
    }

    // STATUS: first to last, only CNI_COMMAND and CNI_PATH non-empty.
    cni.status_network_list(&list).await.expect("STATUS");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 9);
    for (i, p) in ["p1", "p2", "p3"].into_iter().enumerate() {
        assert_call(
            &calls[6 + i],
            p,
            &network("STATUS"),
            &network_stdin(i),
            &format!("STATUS {p}"),
        );
    }

    // GC with c1/eth0 valid: no DEL, GC to every plugin with both keys.
    let valid = [GcAttachment {
        container_id: "c1".into(),
        ifname: "eth0".into(),
    }];
    let summary = cni.gc_network_list(&list, &valid).await.expect("GC");
    assert!(
        summary.deleted.is_empty() && summary.plugins_called,
        "{summary:?}"
    );
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 12);
    for (i, p) in ["p1", "p2", "p3"].into_iter().enumerate() {
        let mut stdin = network_stdin(i);
        stdin["cni.dev/valid-attachments"] = json!([{"containerID":"c1","ifname":"eth0"}]);
        stdin["cni.dev/attachments"] = json!([{"containerID":"c1","ifname":"eth0"}]);
        assert_call(&calls[9 + i], p, &network("GC"), &stdin, &format!("GC {p}"));
    }

    // DEL: last to first, each with the cached final result.
    cni.del_network_list(&list, &rt).await.expect("DEL");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 15);
    for (n, i) in [2, 1, 0].into_iter().enumerate() {
        let p = ["p1", "p2", "p3"][i];
        assert_call(
            &calls[12 + n],
            p,
            &attach("DEL"),
            &attachment_stdin(i, Some(r3())),
            &format!("DEL {p}"),
        );
    }

    // VERSION: our version on stdin; CNI_COMMAND and CNI_PATH set, and
    // "dummy" netns and ifname for plugins built on an old skel (as libcni).
    let info = cni.version_info("p2").await.expect("VERSION");
    assert_eq!(info.supported_versions, ["1.0.0", "1.1.0"]);
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 16);
    assert_call(
        &calls[15],
        "p2",
        &cni_vars("VERSION", "", "dummy", "dummy", "", &path),
        &json!({"cniVersion":"1.1.0"}),
        "VERSION",
    );
}

/// Exact bytes, not just values: a number above 2^64 and non-ASCII text in
/// the plugin config reach the plugin unchanged.
#[tokio::test]
async fn stdin_bytes_keep_big_numbers_and_unicode() {
    let rig = chain_rig();
    rig.cni()
        .add_network_list(&chain_list(), &chain_rt())
        .await
        .expect("ADD");
    let first = &rig.dir.invocations()[0];
    let text = String::from_utf8(first.stdin.clone()).unwrap();
    assert!(
        text.starts_with(r#"{"type":"p1","keep":{"big":18446744073709551617,"s":"<&>é"},"name":"chain","cniVersion":"1.1.0","runtimeConfig":"#),
        "{text}"
    );
}

/// DEL of a 0.4.0 list gets the cached result as prevResult; DEL of a 0.3.1
/// list gets none (prevResult on DEL arrived in 0.4.0), even with a cache
/// entry present.
#[tokio::test]
async fn del_prev_result_only_from_0_4_0() {
    for (version, expect_prev) in [("0.4.0", true), ("0.3.1", false)] {
        let rig = Rig::new();
        let result = json!({"cniVersion": version,
            "interfaces":[{"name":"eth0"}],
            "ips":[{"version":"4","address":"10.202.0.2/24","interface":0}]});
        for p in ["a", "b"] {
            rig.fake(
                p,
                &Fake::new(Response::ok("")).on("ADD", Response::ok(&result.to_string())),
            );
        }
        let list = conflist(json!({"cniVersion": version, "name": "old",
            "plugins": [{"type": "a"}, {"type": "b"}]}));
        let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
        let cni = rig.cni();
        cni.add_network_list(&list, &rt).await.expect("ADD");
        assert!(rig.cache_file("old", "c1", "eth0").exists());
        cni.del_network_list(&list, &RuntimeConf::new("c1", "", "eth0"))
            .await
            .expect("DEL");
        let calls = rig.dir.invocations();
        let dels: Vec<&Invocation> = calls.iter().filter(|c| c.command() == "DEL").collect();
        assert_eq!(
            dels.iter().map(|c| c.plugin.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
        for call in dels {
            let path = rig.dir.bin().display().to_string();
            pretty_assertions::assert_eq!(
                call.cni_env(),
                cni_vars("DEL", "c1", "", "eth0", "", &path)
            );
            let mut want = json!({"type": call.plugin, "name": "old", "cniVersion": version});
            if expect_prev {
                // What the cache holds: the result as a 0.x result is
                // written (`dns` always present, as libcni writes it).
                let mut prev = result.clone();
                prev["dns"] = json!({});
                want["prevResult"] = prev;
            }
            assert_json_eq(
                &call.stdin_json(),
                &want,
                &format!("{version} DEL {}", call.plugin),
            );
        }
        assert!(!rig.cache_file("old", "c1", "eth0").exists());
    }
}

/// A 0.2.0 result from the first plugin of a 1.0.0 list reaches the second
/// plugin as 1.0.0; the second answers without `cniVersion` (taken as the
/// list's version); the returned and cached results are 1.0.0.
#[tokio::test]
async fn older_and_unlabelled_results_are_converted_to_the_list_version() {
    let rig = Rig::new();
    let old = json!({"cniVersion":"0.2.0",
        "ip4":{"ip":"10.203.0.5/24","gateway":"10.203.0.1","routes":[{"dst":"0.0.0.0/0"}]},
        "dns":{"nameservers":["10.203.0.1"]}});
    let unlabelled = json!({
        "interfaces":[{"name":"eth0","sandbox":"/run/netns/c1"}],
        "ips":[{"address":"10.203.0.5/24","gateway":"10.203.0.1","interface":0}],
        "routes":[{"dst":"0.0.0.0/0"}],
        "dns":{"nameservers":["10.203.0.1"]}});
    rig.fake(
        "old",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&old.to_string())),
    );
    rig.fake(
        "bare",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&unlabelled.to_string())),
    );
    let list = conflist(
        json!({"cniVersion":"1.0.0","name":"conv","plugins":[{"type":"old"},{"type":"bare"}]}),
    );
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cni = rig.cni();
    let result = cni.add_network_list(&list, &rt).await.expect("ADD");

    let converted = json!({"cniVersion":"1.0.0",
        "ips":[{"address":"10.203.0.5/24","gateway":"10.203.0.1"}],
        "routes":[{"dst":"0.0.0.0/0"}],
        "dns":{"nameservers":["10.203.0.1"]}});
    let calls = rig.dir.invocations();
    assert_json_eq(
        &calls[1].stdin_json()["prevResult"],
        &converted,
        "prevResult of plugin 2",
    );

    let mut labelled = unlabelled.clone();
    labelled["cniVersion"] = json!("1.0.0");
    assert_eq!(result.version(), cni_core::Version::V1_0_0);
    assert_json_eq(&result.to_value(), &labelled, "returned result");
    let cached = rig.cache_json("conv", "c1", "eth0").expect("cache entry");
    assert_json_eq(&cached["result"], &labelled, "cached result");
    let back = cni
        .cached_result(&list, &rt)
        .await
        .unwrap()
        .expect("cached result");
    assert_json_eq(&back.to_value(), &labelled, "cached_result()");

    // The unlabelled result in the middle of a chain reaches the next
    // plugin labelled with the list's version.
    let list = conflist(json!({"cniVersion":"1.0.0","name":"conv-mid",
        "plugins":[{"type":"old"},{"type":"bare"},{"type":"old"}]}));
    cni.add_network_list(&list, &rt).await.expect("ADD");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 5);
    assert_json_eq(
        &calls[4].stdin_json()["prevResult"],
        &labelled,
        "prevResult after the unlabelled result",
    );
}

/// The last plugin answering 0.2.0: the returned and cached results are the
/// list's version, and DEL gets the converted result as prevResult.
#[tokio::test]
async fn last_plugin_answering_0_2_0_is_returned_and_cached_as_1_0_0() {
    let rig = Rig::new();
    let old =
        json!({"cniVersion":"0.2.0","ip4":{"ip":"10.204.0.5/24"},"ip6":{"ip":"fd00:204::5/64"}});
    rig.fake(
        "old",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&old.to_string())),
    );
    let list = conflist(json!({"cniVersion":"1.0.0","name":"conv2","plugins":[{"type":"old"}]}));
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cni = rig.cni();
    let result = cni.add_network_list(&list, &rt).await.expect("ADD");
    let want = json!({"cniVersion":"1.0.0","ips":[{"address":"10.204.0.5/24"},{"address":"fd00:204::5/64"}]});
    assert_json_eq(&result.to_value(), &want, "returned result");
    let cached = rig.cache_json("conv2", "c1", "eth0").expect("cache entry");
    assert_json_eq(&cached["result"], &want, "cached result");
    cni.del_network_list(&list, &rt).await.expect("DEL");
    let del = rig.dir.invocations().pop().unwrap();
    assert_eq!(del.command(), "DEL");
    assert_json_eq(&del.stdin_json()["prevResult"], &want, "DEL prevResult");
}

/// The list's version changed between ADD (0.4.0) and DEL (1.0.0): the
/// cached result is converted to the DEL list's version for prevResult.
#[tokio::test]
async fn cached_result_is_converted_when_the_list_version_changed() {
    let rig = Rig::new();
    let result = json!({"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],
        "ips":[{"version":"4","address":"10.205.0.2/24","interface":0}]});
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&result.to_string())),
    );
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cni = rig.cni();
    let old = conflist(json!({"cniVersion":"0.4.0","name":"bump","plugins":[{"type":"a"}]}));
    cni.add_network_list(&old, &rt).await.expect("ADD");
    let new = conflist(json!({"cniVersion":"1.0.0","name":"bump","plugins":[{"type":"a"}]}));
    cni.del_network_list(&new, &rt).await.expect("DEL");
    let del = rig.dir.invocations().pop().unwrap();
    assert_json_eq(
        &del.stdin_json(),
        &json!({"type":"a","name":"bump","cniVersion":"1.0.0",
            "prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}],
                "ips":[{"address":"10.205.0.2/24","interface":0}]}}),
        "DEL stdin",
    );
}
