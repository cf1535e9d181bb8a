//! Names and IDs are validated on every verb before anything runs or is
//! created; plugin validation (VERSION) collects every problem.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::fake::{Fake, Response, Rig, conflist, version_reply};
use cni_async::{CallOptions, Error};
use cni_core::RuntimeConf;
use cni_core::stdin::GcAttachment;
use serde_json::json;

/// Every path under `root` (recursively).
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.insert(path);
        }
    }
    out
}

fn rig() -> Rig {
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(r#"{"cniVersion":"1.0.0"}"#)),
    );
    rig
}

#[tokio::test]
async fn traversal_names_are_refused_on_every_verb_before_anything_runs() {
    let rig = rig();
    let cni = rig.cni();
    // The cache dir exists, so that a path escaping it could be created.
    std::fs::create_dir_all(rig.cache_dir.join("results")).unwrap();
    let before = tree(rig.dir.root());
    // Where `<cache>/results/../../../x-c1-eth0` (and the lock of the same
    // name under `<cache>/locks/`) would land: next to the test dir.
    let outside = rig.dir.root().parent().unwrap().to_owned();
    let escaped = [outside.join("x-c1-eth0"), outside.join("x-c1-eth0.lock")];

    let good = conflist(json!({"cniVersion":"1.1.0","name":"net","plugins":[{"type":"a"}]}));
    let bad_net =
        conflist(json!({"cniVersion":"1.1.0","name":"../../../x","plugins":[{"type":"a"}]}));
    let ok_rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cases: Vec<(&str, &cni_core::NetworkConfigList, RuntimeConf, u32)> = vec![
        (
            "container ../x",
            &good,
            RuntimeConf::new("../x", "", "eth0"),
            4,
        ),
        (
            "container ../../../../escape",
            &good,
            RuntimeConf::new("../../../../escape", "", "eth0"),
            4,
        ),
        (
            "container with slash",
            &good,
            RuntimeConf::new("c1/../../x", "", "eth0"),
            4,
        ),
        (
            "empty container",
            &good,
            RuntimeConf::new("", "", "eth0"),
            3,
        ),
        ("ifname a/b", &good, RuntimeConf::new("c1", "", "a/b"), 4),
        ("ifname ..", &good, RuntimeConf::new("c1", "", ".."), 4),
        ("network ../../../x", &bad_net, ok_rt.clone(), 7),
    ];
    for (what, list, rt, code) in &cases {
        let opts = CallOptions::default();
        let errs = [
            (
                "ADD",
                cni.add_network_list(list, rt)
                    .options(&opts)
                    .await
                    .map(|_| ()),
            ),
            ("DEL", cni.del_network_list(list, rt).options(&opts).await),
            (
                "CHECK",
                cni.check_network_list(list, rt).options(&opts).await,
            ),
            (
                "cached_result",
                cni.cached_result(list, rt).await.map(|_| ()),
            ),
            (
                "cached_config",
                cni.cached_config(list.name(), rt).await.map(|_| ()),
            ),
            (
                "del_cached",
                cni.del_cached(list.name(), rt).options(&opts).await,
            ),
        ];
        for (verb, r) in errs {
            let err = r.expect_err(&format!("{verb} with {what} was accepted"));
            assert!(matches!(err, Error::Core(_)), "{verb} {what}: {err}");
            assert_eq!(err.code(), *code, "{verb} {what}: {err}");
        }
    }
    // Network-level verbs refuse a bad network name too.
    for r in [
        cni.status_network_list(&bad_net).await,
        cni.gc_network_list(&bad_net, &[]).await.map(|_| ()),
    ] {
        assert_eq!(r.unwrap_err().code(), 7);
    }
    assert!(cni.cached_attachments(Some("../x")).await.is_err());

    assert!(rig.dir.invocations().is_empty(), "a plugin ran");
    assert_eq!(
        tree(rig.dir.root()),
        before,
        "files created or removed in the test dir"
    );
    for path in &escaped {
        assert!(
            !path.exists(),
            "created outside the cache dir: {}",
            path.display()
        );
    }
    // GC with a traversal in a valid attachment is harmless: it is only data.
    let weird = [GcAttachment {
        container_id: "../x".into(),
        ifname: "eth0".into(),
    }];
    let good_cni = rig.cni();
    good_cni.gc_network_list(&good, &weird).await.expect("GC");
}

#[tokio::test]
async fn validate_network_list_collects_every_problem() {
    let rig = Rig::new();
    rig.fake(
        "new",
        &Fake::new(version_reply(&["0.4.0", "1.0.0", "1.1.0"])),
    );
    rig.fake("old", &Fake::new(version_reply(&["0.3.0", "0.3.1"])));
    let cni = rig.cni();

    let ok = conflist(json!({"cniVersion":"1.0.0","name":"v","plugins":[
        {"type":"new","capabilities":{"portMappings":true,"mac":false}},
        {"type":"new","capabilities":{"bandwidth":true,"portMappings":true}}]}));
    assert_eq!(
        cni.validate_network_list(&ok).await.unwrap(),
        ["portMappings", "bandwidth"]
    );

    let bad = conflist(json!({"cniVersion":"1.0.0","name":"v","plugins":[
        {"type":"new"},{"type":"old"},{"type":"missing"}]}));
    let err = cni.validate_network_list(&bad).await.unwrap_err();
    let Error::Multiple { errors, .. } = &err else {
        panic!("expected Multiple, got {err}");
    };
    assert_eq!(errors.len(), 2, "{err}");
    let first = errors[0].to_string();
    assert!(
        first.contains("old") && first.contains("1.0.0") && first.contains("0.3.1"),
        "{first}"
    );
    assert_eq!(errors[0].code(), 1);
    assert!(
        matches!(&errors[1], Error::PluginNotFound { plugin_type, .. } if plugin_type == "missing"),
        "{}",
        errors[1]
    );

    // One problem alone comes back as itself.
    let one = conflist(
        json!({"cniVersion":"1.0.0","name":"v","plugins":[{"type":"new"},{"type":"missing"}]}),
    );
    let err = cni.validate_network_list(&one).await.unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    assert_eq!(err.code(), 7);
    let calls = rig.dir.invocations();
    assert!(
        calls.iter().all(|c| c.command() == "VERSION"),
        "only VERSION runs"
    );
}

#[tokio::test]
async fn version_info_accepts_a_legacy_0_2_0_reply() {
    let rig = Rig::new();
    rig.fake(
        "legacy",
        &Fake::new(Response::ok(r#"{"cniVersion":"0.2.0"}"#)),
    );
    rig.fake(
        "broken",
        &Fake::new(Response::ok(r#"{"cniVersion":"1.0.0"}"#)),
    );
    rig.fake(
        "garbage",
        &Fake::new(Response::fail(0, "not json", "oops\n")),
    );
    let cni = rig.cni();

    let info = cni.version_info("legacy").await.expect("legacy reply");
    assert_eq!(info.cni_version, "0.2.0");
    assert_eq!(info.supported_versions, ["0.1.0", "0.2.0"]);
    let list = conflist(json!({"cniVersion":"0.2.0","name":"v","plugins":[{"type":"legacy"}]}));
    cni.validate_network_list(&list)
        .await
        .expect("0.2.0 list with a 0.2.0 plugin");
    let list = conflist(json!({"cniVersion":"0.3.1","name":"v","plugins":[{"type":"legacy"}]}));
    assert_eq!(
        cni.validate_network_list(&list).await.unwrap_err().code(),
        1
    );

    // Only 0.2.0 may leave out supportedVersions.
    let err = cni.version_info("broken").await.unwrap_err();
    match &err {
        Error::PluginOutput {
            plugin_type,
            command,
            stdout,
            ..
        } => {
            assert_eq!(plugin_type, "broken");
            assert_eq!(*command, cni_core::Command::Version);
            assert_eq!(stdout, r#"{"cniVersion":"1.0.0"}"#);
        }
        other => panic!("expected PluginOutput, got {other}"),
    }
    let err = cni.version_info("garbage").await.unwrap_err();
    match &err {
        Error::PluginOutput { stdout, stderr, .. } => {
            assert_eq!(stdout, "not json");
            assert_eq!(stderr, "oops\n");
        }
        other => panic!("expected PluginOutput, got {other}"),
    }
    assert!(matches!(
        cni.version_info("absent").await.unwrap_err(),
        Error::PluginNotFound { .. }
    ));
    assert!(cni.version_info("../a").await.is_err());
}

/// Regression: a list without plugins (no `plugins` key, plugin files not
/// loaded) made DEL remove the cache entry without running anything.
#[tokio::test]
async fn a_list_without_plugins_is_refused_and_the_entry_kept() {
    let rig = rig();
    let cni = rig.cni();
    let full = conflist(json!({"cniVersion":"1.0.0","name":"bare","plugins":[{"type":"a"}]}));
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&full, &rt).await.expect("ADD");
    let empty = conflist(json!({"cniVersion":"1.0.0","name":"bare"}));
    assert!(empty.plugins().is_empty());
    let opts = CallOptions::default();
    for (verb, r) in [
        (
            "ADD",
            cni.add_network_list(&empty, &rt)
                .options(&opts)
                .await
                .map(|_| ()),
        ),
        (
            "DEL",
            cni.del_network_list(&empty, &rt).options(&opts).await,
        ),
        (
            "CHECK",
            cni.check_network_list(&empty, &rt).options(&opts).await,
        ),
    ] {
        let err = r.expect_err(verb);
        assert_eq!(err.code(), 7, "{verb}: {err}");
        assert!(err.to_string().contains("no plugins"), "{verb}: {err}");
    }
    assert!(
        rig.cache_file("bare", "c1", "eth0").exists(),
        "entry removed"
    );
    assert_eq!(rig.dir.invocations().len(), 1, "only the first ADD ran");
}
