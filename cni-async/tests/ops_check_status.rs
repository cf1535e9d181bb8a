//! CHECK (refused before ADD and below 0.4.0, a no-op with `disableCheck`)
//! and STATUS (a no-op below 1.1.0, codes 50 and 51, first failure stops).

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::Error;
use cni_core::RuntimeConf;
use serde_json::json;

fn ok_rig(names: &[&str], version: &str) -> Rig {
    let rig = Rig::new();
    let result = json!({"cniVersion": version, "ips":[{"version":"4","address":"10.212.0.2/24"}]});
    for n in names {
        rig.fake(
            n,
            &Fake::new(Response::ok("")).on("ADD", Response::ok(&result.to_string())),
        );
    }
    rig
}

fn rt() -> RuntimeConf {
    RuntimeConf::new("c1", "/run/netns/c1", "eth0")
}

#[tokio::test]
async fn check_without_a_cached_result_is_refused_with_code_3() {
    let rig = ok_rig(&["a"], "1.0.0");
    let list = conflist(json!({"cniVersion":"1.0.0","name":"chk","plugins":[{"type":"a"}]}));
    let err = rig
        .cni()
        .check_network_list(&list, &rt())
        .await
        .unwrap_err()
        .into_innermost();
    match &err {
        Error::NotAttached {
            network,
            container_id,
            ifname,
        } => {
            assert_eq!(
                (network.as_str(), container_id.as_str(), ifname.as_str()),
                ("chk", "c1", "eth0")
            );
        }
        other => panic!("expected NotAttached, got {other}"),
    }
    assert_eq!(err.code(), 3);
    assert!(rig.dir.invocations().is_empty(), "a plugin ran");

    // After ADD it runs; after DEL it is refused again.
    let cni = rig.cni();
    cni.add_network_list(&list, &rt()).await.unwrap();
    cni.check_network_list(&list, &rt())
        .await
        .expect("CHECK after ADD");
    cni.del_network_list(&list, &rt()).await.unwrap();
    let err = cni
        .check_network_list(&list, &rt())
        .await
        .unwrap_err()
        .into_innermost();
    assert_eq!(err.code(), 3, "{err}");
    let commands: Vec<String> = rig
        .dir
        .invocations()
        .iter()
        .map(|c| c.command().to_owned())
        .collect();
    assert_eq!(commands, ["ADD", "CHECK", "DEL"]);
}

#[tokio::test]
async fn check_below_0_4_0_is_unsupported() {
    let rig = ok_rig(&["a"], "0.3.1");
    let list = conflist(json!({"cniVersion":"0.3.1","name":"old","plugins":[{"type":"a"}]}));
    let cni = rig.cni();
    cni.add_network_list(&list, &rt()).await.unwrap();
    let err = cni
        .check_network_list(&list, &rt())
        .await
        .unwrap_err()
        .into_innermost();
    match &err {
        Error::Unsupported {
            network,
            command,
            version,
        } => {
            assert_eq!(network, "old");
            assert_eq!(*command, cni_core::Command::Check);
            assert_eq!(*version, cni_core::Version::V0_3_1);
        }
        other => panic!("expected Unsupported, got {other}"),
    }
    assert_eq!(err.code(), 1);
    assert_eq!(rig.dir.invocations().len(), 1, "only the ADD ran");
}

#[tokio::test]
async fn check_with_disable_check_runs_nothing() {
    let rig = ok_rig(&["a", "b"], "1.0.0");
    for flag in [json!(true), json!("TRUE")] {
        let list = conflist(
            json!({"cniVersion":"1.0.0","name":"nochk","disableCheck": flag,
            "plugins":[{"type":"a"},{"type":"b"}]}),
        );
        let cni = rig.cni();
        // Not even the missing cache entry matters.
        cni.check_network_list(&list, &rt())
            .await
            .expect("CHECK without ADD");
        cni.add_network_list(&list, &rt()).await.unwrap();
        cni.check_network_list(&list, &rt())
            .await
            .expect("CHECK after ADD");
        cni.del_network_list(&list, &rt()).await.unwrap();
    }
    let commands: Vec<String> = rig
        .dir
        .invocations()
        .iter()
        .map(|c| c.command().to_owned())
        .collect();
    assert!(!commands.iter().any(|c| c == "CHECK"), "{commands:?}");
}

#[tokio::test]
async fn check_failure_stops_the_chain_and_passes_through() {
    let rig = ok_rig(&["a", "c"], "1.0.0");
    let result = json!({"cniVersion":"1.0.0","ips":[{"address":"10.212.1.2/24"}]}).to_string();
    rig.fake(
        "b",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(&result))
            .on(
                "CHECK",
                Response::cni_error(104, "address gone", "eth0 has no 10.212.1.2"),
            ),
    );
    let list = conflist(
        json!({"cniVersion":"1.0.0","name":"chk2","plugins":[{"type":"a"},{"type":"b"},{"type":"c"}]}),
    );
    let cni = rig.cni();
    cni.add_network_list(&list, &rt()).await.unwrap();
    let err = cni
        .check_network_list(&list, &rt())
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(104), "{err}");
    assert!(err.to_string().contains("plugin b CHECK failed"), "{err}");
    let checks: Vec<String> = rig
        .dir
        .invocations()
        .iter()
        .filter(|c| c.command() == "CHECK")
        .map(|c| c.plugin.clone())
        .collect();
    assert_eq!(checks, ["a", "b"]);
}

#[tokio::test]
async fn status_below_1_1_0_is_a_no_op() {
    let rig = Rig::new();
    rig.fake("a", &Fake::new(Response::cni_error(50, "never asked", "")));
    for version in ["1.0.0", "0.4.0", "0.2.0"] {
        let list = conflist(json!({"cniVersion": version,"name":"st","plugins":[{"type":"a"}]}));
        rig.cni()
            .status_network_list(&list)
            .await
            .unwrap_or_else(|e| panic!("{version}: {e}"));
    }
    assert!(rig.dir.invocations().is_empty());
}

/// Three plugins; the second answers `code`: the third never runs.
async fn status_with_second_failing(second: Response) -> (Error, Vec<String>) {
    let rig = Rig::new();
    rig.fake("a", &Fake::new(Response::ok("")));
    rig.fake("b", &Fake::new(second));
    rig.fake("c", &Fake::new(Response::ok("")));
    let list = conflist(
        json!({"cniVersion":"1.1.0","name":"st","plugins":[{"type":"a"},{"type":"b"},{"type":"c"}]}),
    );
    let err = rig
        .cni()
        .status_network_list(&list)
        .await
        .unwrap_err()
        .into_innermost();
    let ran = rig
        .dir
        .invocations()
        .iter()
        .map(|c| c.plugin.clone())
        .collect();
    (err, ran)
}

#[tokio::test]
async fn status_codes_50_and_51_and_other_failures() {
    let mut resp = Response::cni_error(50, "no IPAM", "dhcp daemon down");
    resp.stderr = b"cannot reach daemon\n".to_vec();
    let (err, ran) = status_with_second_failing(resp).await;
    assert_eq!(ran, ["a", "b"]);
    match &err {
        Error::NotReady {
            network,
            plugin_type,
            error,
            stderr,
        } => {
            assert_eq!(network, "st");
            assert_eq!(plugin_type, "b");
            assert_eq!(
                (error.code, error.msg.as_str(), error.details.as_str()),
                (50, "no IPAM", "dhcp daemon down")
            );
            assert_eq!(stderr.trim_end(), "cannot reach daemon");
        }
        other => panic!("expected NotReady, got {other}"),
    }
    assert_eq!(err.code(), 50);

    let (err, ran) = status_with_second_failing(Response::cni_error(51, "degraded", "")).await;
    assert_eq!(ran, ["a", "b"]);
    match &err {
        Error::NotReadyLimitedConnectivity {
            plugin_type, error, ..
        } => {
            assert_eq!(plugin_type, "b");
            assert_eq!(error.code, 51);
        }
        other => panic!("expected NotReadyLimitedConnectivity, got {other}"),
    }
    assert_eq!(err.code(), 51);

    // Other codes and plain failures pass through as plugin errors.
    let (err, ran) = status_with_second_failing(Response::cni_error(100, "own code", "")).await;
    assert_eq!(ran, ["a", "b"]);
    assert!(
        matches!(err, Error::Plugin { .. }) && err.is_plugin_code(100),
        "{err}"
    );
    let (err, ran) = status_with_second_failing(Response::fail(3, "", "segfault-ish\n")).await;
    assert_eq!(ran, ["a", "b"]);
    match &err {
        Error::Plugin {
            plugin_type,
            status,
            error: None,
            stderr,
            ..
        } => {
            assert_eq!(plugin_type, "b");
            assert_eq!(*status, cni_async::PluginExit::Code(3));
            assert_eq!(stderr.trim_end(), "segfault-ish");
        }
        other => panic!("expected a plugin error, got {other}"),
    }
}
