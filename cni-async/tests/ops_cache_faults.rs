//! The operations when the cache stands in the way: a colliding record, an
//! unusable cache dir, and the VERSION quirks of old plugins.

use crate::support::fake::{Fake, Response, Rig, conflist, runtime};
use cni_async::Error;
use serde_json::json;

fn ok_result() -> String {
    json!({"cniVersion":"1.0.0","ips":[{"address":"10.9.0.2/24"}]}).to_string()
}

/// `a-b` + `c` and `a` + `b-c` share a cache file name: the second ADD is
/// refused before any plugin runs, and the first attachment's record stays.
#[tokio::test]
async fn add_refuses_to_overwrite_a_colliding_attachments_record() {
    let rig = Rig::new();
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&ok_result())),
    );
    let first = conflist(json!({"cniVersion":"1.0.0","name":"a-b","plugins":[{"type":"p"}]}));
    let second = conflist(json!({"cniVersion":"1.0.0","name":"a","plugins":[{"type":"p"}]}));
    let cni = rig.cni();
    cni.add_network_list(&first, &runtime("c", "eth0"))
        .await
        .unwrap();
    let before = std::fs::read(rig.cache_file("a-b", "c", "eth0")).unwrap();
    let runs = rig.dir.invocations().len();

    let err = cni
        .add_network_list(&second, &runtime("b-c", "eth0"))
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::AttachmentCollision { .. }), "{err}");
    assert!(
        err.to_string().contains("\"a-b\""),
        "names the occupant: {err}"
    );
    assert_eq!(rig.dir.invocations().len(), runs, "no plugin ran");
    assert_eq!(
        std::fs::read(rig.cache_file("a-b", "c", "eth0")).unwrap(),
        before
    );
}

/// DEL must work when things are gone, also when the cache dir is unusable:
/// it runs the plugins unlocked and without prevResult.
#[tokio::test]
async fn del_runs_plugins_when_the_cache_dir_is_unusable() {
    let rig = Rig::new();
    rig.fake("p", &Fake::new(Response::ok("")));
    // A file where the cache dir should be: no lock, no read, no remove.
    std::fs::write(&rig.cache_dir, b"not a dir").unwrap();
    let list = conflist(json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"p"}]}));
    rig.cni()
        .del_network_list(&list, &runtime("c1", "eth0"))
        .await
        .unwrap();
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].command(), "DEL");
    assert!(calls[0].stdin_json().get("prevResult").is_none());

    // ADD, by contrast, refuses before running anything: it could not
    // record what it did.
    let err = rig
        .cni()
        .add_network_list(&list, &runtime("c1", "eth0"))
        .await
        .unwrap_err()
        .into_innermost();
    assert_eq!(err.code(), 5, "{err}");
    assert_eq!(rig.dir.invocations().len(), 1, "no plugin ran for the ADD");
}

/// VERSION passes the dummy values old skel-based plugins insist on, and a
/// plugin that predates VERSION counts as supporting 0.1.0 (as libcni).
#[tokio::test]
async fn version_quirks_of_old_plugins() {
    let rig = Rig::new();
    rig.fake(
        "modern",
        &Fake::new(Response::ok(
            r#"{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}"#,
        )),
    );
    rig.fake(
        "ancient",
        &Fake::new(Response::fail(1, "", "unknown CNI_COMMAND: VERSION")),
    );
    let cni = rig.cni();
    let info = cni.version_info("modern").await.unwrap();
    assert_eq!(info.supported_versions, ["1.0.0"]);
    let call = &rig.dir.invocations()[0];
    assert_eq!(call.var("CNI_COMMAND"), Some("VERSION"));
    assert_eq!(call.var("CNI_NETNS"), Some("dummy"));
    assert_eq!(call.var("CNI_IFNAME"), Some("dummy"));

    let old = cni.version_info("ancient").await.unwrap();
    assert_eq!(old.supported_versions, ["0.1.0"]);
}
