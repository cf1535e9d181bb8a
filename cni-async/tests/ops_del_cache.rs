//! DEL runs the plugins whenever they can run: with the result cache dir a
//! file (not a directory), so that no lock can be taken, no record read and
//! none removed, the library's DEL runs the plugins without prevResult and
//! answers what it went past ([`DelRequest::with_outcome`]). Real bridge
//! and host-local in a namespace, a bridge and a subnet of the test's own.
//! Needs root.
//!
//! [`DelRequest::with_outcome`]: cni_async::DelRequest::with_outcome
#![cfg(feature = "netns")]

use std::path::Path;

use crate::support::netns::{REAL_PLUGINS, TestNet, bridge_ports, host_local_ips, link_exists_in};
use crate::support::require_root;
use cni_async::{Cni, Error};
use cni_core::RuntimeConf;

#[tokio::test]
async fn del_with_the_cache_dir_a_file_runs_the_plugins_and_says_so() {
    require_root!();
    let mut net = TestNet::new();
    let data_dir = net.data_dir();
    let name = format!("delc-{}", net.id());
    let list = net.bridge_list(&name);
    let ns = net.netns();
    let rt = RuntimeConf::new(
        format!("delc-{}", net.id()),
        ns.path().to_str().unwrap(),
        "eth0",
    );
    let cni = net.real_cni();
    cni.add_network_list(&list, &rt).await.expect("ADD");
    assert_eq!(host_local_ips(&data_dir, &name).len(), 1);
    assert_eq!(bridge_ports(net.bridge()).len(), 1);

    let not_a_dir = net.dir().join("cache-is-a-file");
    std::fs::write(&not_a_dir, "not a directory\n").unwrap();
    let unusable = Cni::builder()
        .plugin_dirs([Path::new(REAL_PLUGINS)])
        .cache_dir(&not_a_dir)
        .build();
    let deleted = unusable
        .del_network_list(&list, &rt)
        .with_outcome()
        .await
        .expect("DEL runs the plugins without the cache");

    assert!(
        host_local_ips(&data_dir, &name).is_empty(),
        "reservation freed"
    );
    assert!(bridge_ports(net.bridge()).is_empty(), "bridge port gone");
    assert!(!link_exists_in(ns.path(), "eth0"), "eth0 gone");
    assert!(!deleted.prev_result, "no prevResult without a cache");
    let lock = deleted.cache_warnings.iter().any(|e| {
        matches!(e, Error::Cache { path, .. } if path.starts_with(&not_a_dir) && path.to_string_lossy().contains("lock"))
    });
    assert!(
        lock,
        "the lock it could not take: {:?}",
        deleted.cache_warnings
    );
    let read = deleted.cache_warnings.iter().any(
        |e| matches!(e, Error::Cache { path, op, .. } if path.starts_with(&not_a_dir) && *op == "read"),
    );
    assert!(
        read,
        "the record it could not read: {:?}",
        deleted.cache_warnings
    );

    // With a usable cache: prevResult, no warning, the record removed.
    cni.add_network_list(&list, &rt).await.expect("ADD again");
    let deleted = cni
        .del_network_list(&list, &rt)
        .with_outcome()
        .await
        .expect("DEL");
    assert!(deleted.prev_result);
    assert!(
        deleted.cache_warnings.is_empty(),
        "{:?}",
        deleted.cache_warnings
    );
    assert!(cni.cached_attachments(None).await.unwrap().is_empty());
    assert!(host_local_ips(&data_dir, &name).is_empty());
}
