//! The single-network forms (libcni's `AddNetwork` and friends) with a
//! `.conf`-style plugin configuration: the plugin's own name and version,
//! its bytes in the cache.

use crate::support::fake::{Fake, Response, Rig, assert_json_eq, cni_vars, version_reply};
use cni_core::{CapabilityArgs, PluginConfig, RuntimeConf};
use serde_json::{Value, json};

const CONF: &[u8] = br#"{"cniVersion":"1.0.0","name":"single","type":"one","capabilities":{"mac":true},"extra":{"n":1}}"#;

fn result() -> Value {
    json!({"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/c1"}],
        "ips":[{"address":"10.216.0.2/24","interface":0}]})
}

fn rig() -> Rig {
    let rig = Rig::new();
    rig.fake(
        "one",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(&result().to_string()))
            .on("VERSION", version_reply(&["0.4.0", "1.0.0"])),
    );
    rig
}

fn rt() -> RuntimeConf {
    let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    rt.capability_args =
        CapabilityArgs::from_json(r#"{"mac":"0a:00:00:00:00:02","ips":["10.216.0.2/24"]}"#)
            .unwrap();
    rt
}

#[tokio::test]
async fn add_check_del_of_a_single_plugin_config() {
    let rig = rig();
    let cni = rig.cni();
    let conf = PluginConfig::from_bytes(CONF, None).unwrap();
    let rt = rt();
    let opts = Default::default();
    let path = rig.dir.bin().display().to_string();

    let got = cni
        .add_network(&conf, &rt)
        .options(&opts)
        .await
        .expect("ADD");
    assert_json_eq(&got.to_value(), &result(), "ADD result");
    let cached = rig
        .cache_json("single", "c1", "eth0")
        .expect("cache entry under the plugin's name");
    let rec = match cni_core::cache::CacheEntry::decode(&serde_json::to_vec(&cached).unwrap(), "t")
        .unwrap()
    {
        cni_core::cache::CacheEntry::Record(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        rec.config, CONF,
        "the cache holds the plugin config's bytes"
    );
    assert_eq!(
        cni.cached_network_result(&conf, &rt)
            .await
            .unwrap()
            .map(|r| r.to_value()),
        Some(result())
    );

    cni.check_network(&conf, &rt)
        .options(&opts)
        .await
        .expect("CHECK");
    cni.del_network(&conf, &rt)
        .options(&opts)
        .await
        .expect("DEL");
    assert!(rig.result_files().is_empty(), "cache entry removed");
    assert!(
        cni.cached_network_result(&conf, &rt)
            .await
            .unwrap()
            .is_none()
    );

    let calls = rig.dir.invocations();
    let base = json!({"cniVersion":"1.0.0","name":"single","type":"one","extra":{"n":1},
        "runtimeConfig":{"mac":"0a:00:00:00:00:02"}});
    let with_prev = {
        let mut v = base.clone();
        v["prevResult"] = result();
        v
    };
    for (call, (cmd, stdin)) in
        calls
            .iter()
            .zip([("ADD", &base), ("CHECK", &with_prev), ("DEL", &with_prev)])
    {
        assert_eq!(
            call.cni_env(),
            cni_vars(cmd, "c1", "/run/netns/c1", "eth0", "", &path),
            "{cmd}"
        );
        assert_json_eq(&call.stdin_json(), stdin, &format!("{cmd} stdin"));
    }
    assert_eq!(calls.len(), 3);

    assert_eq!(cni.validate_network(&conf).await.unwrap(), ["mac"]);
}

/// Regression: the cache of a single-network ADD holds a plugin config (no
/// `plugins` array); DEL from the cache must still run that plugin.
#[tokio::test]
async fn del_cached_after_a_single_network_add_runs_the_plugin() {
    let rig = rig();
    let cni = rig.cni();
    let conf = PluginConfig::from_bytes(CONF, None).unwrap();
    cni.add_network(&conf, &rt()).await.expect("ADD");
    drop(conf);

    cni.del_cached("single", &RuntimeConf::new("c1", "", "eth0"))
        .await
        .expect("del_cached");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 2, "DEL did not run the plugin: {calls:#?}");
    let del = &calls[1];
    assert_eq!(del.command(), "DEL");
    assert_eq!(del.var("CNI_NETNS"), Some("/run/netns/c1"));
    assert_json_eq(
        &del.stdin_json(),
        &json!({"cniVersion":"1.0.0","name":"single","type":"one","extra":{"n":1},
            "runtimeConfig":{"mac":"0a:00:00:00:00:02"},"prevResult": result()}),
        "DEL stdin from the cached plugin config",
    );
    assert!(rig.result_files().is_empty());
}

#[tokio::test]
async fn single_config_without_name_or_check_support_is_refused() {
    let rig = rig();
    let cni = rig.cni();
    let nameless =
        PluginConfig::from_bytes(br#"{"cniVersion":"1.0.0","type":"one"}"#, None).unwrap();
    let err = cni.add_network(&nameless, &rt()).await.unwrap_err();
    assert_eq!(err.code(), 7, "{err}");
    let old =
        PluginConfig::from_bytes(br#"{"cniVersion":"0.3.1","name":"old","type":"one"}"#, None)
            .unwrap();
    let err = cni
        .check_network(&old, &rt())
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, cni_async::Error::Unsupported { .. }), "{err}");
    let err = cni.validate_network(&old).await.unwrap_err();
    assert_eq!(err.code(), 1, "{err}");
    assert!(
        rig.dir
            .invocations()
            .iter()
            .all(|c| c.command() == "VERSION")
    );
}
