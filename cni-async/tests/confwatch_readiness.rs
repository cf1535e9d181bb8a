//! Regressions: readiness stayed 200 after a
//! network's plugin was removed (a success was fresh for the whole conf
//! generation), and the first readiness of 1,001 networks sharing one
//! plugin ran VERSION 1,001 times (4.8 - 7.4 s). Now: once ready, the
//! usable networks' binaries are looked at again (a stat each) after a
//! second; checking stops once `min_networks` are usable; VERSION runs
//! once per binary and change.
#![cfg(feature = "watch")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::confwatch::{conflist_text, version_fake};
use crate::support::fake::PluginDir;
use crate::support::gate::LOAD_MARGIN;
use cni_async::Cni;
use cni_async::confwatch::NetworkSet;

#[tokio::test]
async fn a_plugin_removed_while_ready_makes_it_not_ready_within_about_a_second() {
    let plugins = PluginDir::new();
    version_fake(&plugins, "alloc");
    let cni = Cni::builder().plugin_dirs(plugins.dirs()).build();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("10-a.conflist"),
        conflist_text("a", "alloc"),
    )
    .unwrap();
    let set = Arc::new(NetworkSet::new(tmp.path()));
    set.reload().await;
    set.readiness(&cni, 1).await.expect("ready");
    assert_eq!(plugins.invocations_of("VERSION").len(), 1);

    // Probes while nothing changes: no process, whatever their number.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        set.readiness(&cni, 1).await.expect("still ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(plugins.invocations_of("VERSION").len(), 1);

    let path = plugins.bin().join("alloc");
    std::fs::rename(&path, plugins.root().join("alloc.away")).unwrap();
    let removed = Instant::now();
    let bound = Duration::from_secs(1) + LOAD_MARGIN;
    let e = loop {
        match set.readiness(&cni, 1).await {
            Err(e) => break e,
            Ok(_) => assert!(
                removed.elapsed() < bound + Duration::from_secs(5),
                "still ready {:?} after the plugin was removed",
                removed.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = removed.elapsed();
    assert!(took < bound, "noticed after {took:?}");
    assert!(e.reason.contains("alloc"), "{e}");

    // Back: ready again (VERSION asked again: a new file).
    version_fake(&plugins, "alloc");
    let back = Instant::now();
    while set.readiness(&cni, 1).await.is_err() {
        assert!(back.elapsed() < bound, "not ready again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn many_networks_sharing_a_plugin_ask_it_for_version_once() {
    const N: usize = 300;
    let plugins = PluginDir::new();
    version_fake(&plugins, "shared");
    let cni = Cni::builder().plugin_dirs(plugins.dirs()).build();
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..N {
        std::fs::write(
            tmp.path().join(format!("{i:04}.conflist")),
            conflist_text(&format!("n{i}"), "shared"),
        )
        .unwrap();
    }
    let set = Arc::new(NetworkSet::new(tmp.path()));
    set.reload().await;
    let ready = set.readiness(&cni, 1).await.expect("ready");
    // Every network is checked (so the answer can name the unusable
    // ones), the one binary asked once.
    assert_eq!(ready.usable.len(), N);
    assert!(ready.unusable.is_empty());
    assert_eq!(plugins.invocations_of("VERSION").len(), 1);
    // All of them needed: the one binary is not asked again.
    let ready = set.readiness(&cni, N).await.expect("ready");
    assert_eq!(ready.usable.len(), N);
    assert_eq!(plugins.invocations_of("VERSION").len(), 1);
    // A reload (a new generation) that changes no binary: not asked again.
    std::fs::write(
        tmp.path().join("9999.conflist"),
        conflist_text("last", "shared"),
    )
    .unwrap();
    set.reload().await;
    set.readiness(&cni, N + 1).await.expect("ready");
    assert_eq!(plugins.invocations_of("VERSION").len(), 1);
}

/// Defect: fewer networks than needed, all usable, left the
/// reason ending in a dangling "; " (the list of unusable ones was empty).
#[tokio::test]
async fn too_few_networks_all_usable_is_said_without_a_dangling_separator() {
    let plugins = PluginDir::new();
    version_fake(&plugins, "alloc");
    let cni = Cni::builder().plugin_dirs(plugins.dirs()).build();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("10-a.conflist"),
        conflist_text("a", "alloc"),
    )
    .unwrap();
    let set = Arc::new(NetworkSet::new(tmp.path()));
    set.reload().await;
    let e = set.readiness(&cni, 2).await.expect_err("one of two");
    assert_eq!(
        e.reason,
        format!("1 usable network(s) in {}, 2 needed", tmp.path().display())
    );
    // With an unusable one, it is named after the separator.
    std::fs::write(
        tmp.path().join("20-b.conflist"),
        conflist_text("b", "absent"),
    )
    .unwrap();
    set.reload().await;
    let e = set.readiness(&cni, 2).await.expect_err("b is unusable");
    let head = format!(
        "1 usable network(s) in {}, 2 needed; network \"b\": ",
        tmp.path().display()
    );
    assert!(e.reason.starts_with(&head), "{}", e.reason);
}
