//! `CniBuilder::check_netns`: ADD and CHECK need an absolute path to a
//! network namespace, and every other path gets the same answer; DEL may
//! name one that is gone, or none. On by default (libcni leaves the netns
//! to the plugins, which fail deep inside: the bridge's `failed to
//! Statfs`); `check_netns(false)` leaves it to them.

use std::os::unix::fs::symlink;

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_core::{Command, RuntimeConf};
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.217.0.2/24"}]}"#;

fn rig() -> (Rig, cni_async::Cni, cni_core::NetworkConfigList) {
    let rig = Rig::new();
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    let cni = cni_async::Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        .cache_dir(&rig.cache_dir)
        .build();
    let list = conflist(json!({"cniVersion":"1.0.0","name":"nsck","plugins":[{"type":"p"}]}));
    (rig, cni, list)
}

#[tokio::test]
async fn add_and_check_refuse_what_is_not_a_network_namespace_alike() {
    let (rig, cni, list) = rig();
    let file = rig.dir.scratch("file");
    std::fs::write(&file, b"").unwrap();
    let fifo = rig.dir.scratch("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = rig.dir.scratch("link-to-file");
    symlink(&file, &link).unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    for netns in [
        s(&rig.dir.scratch("missing")),
        s(&file),
        s(&fifo),
        s(&link),
        "/etc".to_owned(),
        "/dev/null".to_owned(),
        "/proc/self/ns/uts".to_owned(),
    ] {
        let rt = RuntimeConf::new("c1", &netns, "eth0");
        let e = cni.add_network_list(&list, &rt).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid netns path {netns:?}: not a network namespace")
        );
        assert_eq!(e.code(), 4);
        let e = cni.check_network_list(&list, &rt).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid netns path {netns:?}: not a network namespace")
        );
        // The same through the function cnid calls before queueing.
        let e = cni_async::check_netns(&netns, Command::Add).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid netns path {netns:?}: not a network namespace")
        );
        // DEL does not look.
        cni.del_network_list(&list, &rt).await.unwrap();
    }
    for (netns, reason) in [
        ("", "required for ADD and CHECK"),
        ("proc/self/ns/net", "must be an absolute path"),
    ] {
        let rt = RuntimeConf::new("c1", netns, "eth0");
        let e = cni.add_network_list(&list, &rt).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("invalid netns path {netns:?}: {reason}")
        );
    }
    assert!(
        rig.dir.invocations().iter().all(|i| i.command() == "DEL"),
        "only DELs ran"
    );
    assert!(rig.result_files().is_empty());
}

#[tokio::test]
async fn a_network_namespace_is_accepted() {
    let (rig, cni, list) = rig();
    let link = rig.dir.scratch("link-to-netns");
    symlink("/proc/self/ns/net", &link).unwrap();
    for (cid, netns) in [
        ("self", "/proc/self/ns/net".to_owned()),
        ("thread", "/proc/thread-self/ns/net".to_owned()),
        ("link", link.to_str().unwrap().to_owned()),
    ] {
        let rt = RuntimeConf::new(cid, &netns, "eth0");
        cni.add_network_list(&list, &rt).await.unwrap();
        cni.check_network_list(&list, &rt).await.unwrap();
        cni.del_network_list(&list, &RuntimeConf::new(cid, "", "eth0"))
            .await
            .unwrap();
    }
}

/// `check_netns(false)`: a path that is no namespace reaches the plugins,
/// as with libcni (for fakes, or a path valid in the plugins' mount
/// namespace only).
#[tokio::test]
async fn turned_off_the_plugins_get_any_absolute_path() {
    let (rig, _, list) = rig();
    let cni = cni_async::Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        .cache_dir(&rig.cache_dir)
        .check_netns(false)
        .build();
    let missing = rig.dir.scratch("missing");
    let rt = RuntimeConf::new("c1", missing.to_str().unwrap(), "eth0");
    cni.add_network_list(&list, &rt)
        .await
        .expect("ADD reaches the plugin");
    cni.check_network_list(&list, &rt).await.expect("CHECK too");
    cni.del_network_list(&list, &rt).await.unwrap();
    assert_eq!(rig.dir.invocations().len(), 3);
}
