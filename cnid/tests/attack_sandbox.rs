//! Attacks on cnid's sandbox operations (the library's one orchestration,
//! `cni_async::multi::setup_steps`, with cnid's journal steps). Fake
//! plugins that count what they allocate: one file per attachment, made by
//! ADD, removed by DEL, so whatever is left is a leak.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually};
use crate::support::gate::Gate;
use crate::support::netns::TempNetns;
use cnid::api::{SandboxNetwork, SandboxRequest};
use serde_json::json;

/// Plugin `ty` (network `net`, conf file `file`): ADD allocates
/// `alloc/<ty>.<container>.<ifname>` (then runs `extra`), DEL frees it
/// (after `del_extra`, and records itself in `dels/`).
fn allocating_network(
    dirs: &Dirs,
    file: &str,
    net: &str,
    ty: &str,
    extra: &str,
    del_extra: &str,
) -> PathBuf {
    let alloc = dirs.data.join("alloc");
    std::fs::create_dir_all(&alloc).unwrap();
    std::fs::create_dir_all(dirs.data.join("dels")).unwrap();
    dirs.plugin(
        ty,
        &format!(
            r#"cat > /dev/null
f="{alloc}/{ty}.$CNI_CONTAINERID.$CNI_IFNAME"
case "$CNI_COMMAND" in
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
ADD) : > "$f"
{extra}
printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.99.0.2/24"}}]}}';;
DEL) {del_extra}
mktemp "{dels}/{ty}.XXXXXXXX" > /dev/null
rm -f "$f";;
esac
exit 0"#,
            alloc = alloc.display(),
            dels = dirs.data.join("dels").display(),
        ),
    );
    dirs.conf(
        file,
        &json!({"cniVersion": "1.0.0", "name": net, "plugins": [{"type": ty}]}),
    );
    alloc
}

fn allocated(alloc: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(alloc)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    v.sort();
    v
}

/// `kill -9` of cnid while a sandbox ADD over three networks is blocked in
/// the second network's plugin (the first is set up, the third never ran),
/// then a restart, in the same boot or (`reboot`, simulated: the journal's
/// lines marked with another boot id, the cache files lost) after the
/// machine went down: the start rolls back the second network's unfinished
/// ADD; the first stays cached (restored from its commit line after the
/// reboot): a DEL path, the sandbox's DEL, which frees everything.
async fn kill_9_mid_sandbox_add(reboot: bool) {
    let dirs = Dirs::new();
    let hang = Gate::new(dirs.root());
    let alloc = allocating_network(&dirs, "10-a.conflist", "atksba", "alloca", "", "");
    allocating_network(
        &dirs,
        "20-b.conflist",
        "atksbb",
        "allocb",
        &hang.shell_wait(),
        "",
    );
    allocating_network(&dirs, "30-c.conflist", "atksbc", "allocc", "", "");
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let request = SandboxRequest {
        container_id: "sb-kill".into(),
        netns: dirs.netns("sb-kill"),
        networks: vec![
            SandboxNetwork::new("atksba"),
            SandboxNetwork::new("atksbb"),
            SandboxNetwork::new("atksbc"),
        ],
        ..Default::default()
    };
    let add = {
        let request = request.clone();
        tokio::spawn(async move { client.sandbox_add(&request).await })
    };
    hang.wait_started_blocking(1);
    assert_eq!(allocated(&alloc).len(), 2, "{:?}", allocated(&alloc));
    assert_eq!(dirs.intents().len(), 1, "{:?}", dirs.intents());
    assert!(!add.is_finished(), "the sandbox ADD is held in its plugin");
    daemon.kill9();
    // The client would send it again to a restart; the runtime gives up.
    add.abort();
    // The orphaned plugin finishes (its allocation stays).
    hang.release();
    if reboot {
        let journal = dirs.state.join("intents/journal");
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let text = std::fs::read_to_string(&journal).unwrap();
        assert!(text.contains(boot.trim()), "{text}");
        std::fs::write(&journal, text.replace(boot.trim(), "another-boot")).unwrap();
        for f in dirs.cached() {
            std::fs::remove_file(dirs.cache.join("results").join(f)).unwrap();
        }
    }

    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    daemon.wait_ready(Duration::from_secs(30));
    eventually(
        Duration::from_secs(30),
        "rollback of the second network's unfinished ADD",
        || dirs.intents().is_empty() && allocated(&alloc).len() == 1,
    );
    assert_eq!(allocated(&alloc), ["alloca.sb-kill.eth0"]);
    assert_eq!(dirs.cached().len(), 1, "{:?}", dirs.cached());
    // The runtime's DEL of the sandbox frees the rest.
    let client = daemon.client().await;
    client.sandbox_del(&request).await.unwrap();
    assert!(allocated(&alloc).is_empty(), "{:?}", allocated(&alloc));
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    assert!(dirs.intents().is_empty(), "{:?}", dirs.intents());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_sandbox_add_then_restart_leaks_nothing() {
    kill_9_mid_sandbox_add(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_sandbox_add_then_reboot_leaks_nothing() {
    kill_9_mid_sandbox_add(true).await;
}

/// A sandbox ADD whose second network fails and whose every DEL of that
/// network fails too (its own rollback and the orchestration's): the
/// answer keeps the evidence of both failures (plugin type, code, msg,
/// stderr), the first network is deleted again, and the failed one stays
/// recorded (its intent) until the runtime's sandbox DEL, once the plugin
/// works, frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_setup_whose_rollback_fails_keeps_evidence_and_a_del_path() {
    let dirs = Dirs::new();
    let broken = dirs.data.join("broken");
    std::fs::write(&broken, "").unwrap();
    let alloc = allocating_network(&dirs, "10-a.conflist", "atksra", "allocra", "", "");
    // ADD allocates, then fails; DEL fails while `broken` exists.
    dirs.plugin(
        "allocrb",
        &format!(
            r#"cat > /dev/null
f="{alloc}/allocrb.$CNI_CONTAINERID.$CNI_IFNAME"
case "$CNI_COMMAND" in
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
ADD) : > "$f"
echo b-add-stderr >&2
printf '{{"cniVersion":"1.0.0","code":100,"msg":"add refused on purpose"}}'; exit 1;;
DEL) if [ -e "{broken}" ]; then echo b-del-stderr >&2
printf '{{"cniVersion":"1.0.0","code":101,"msg":"del refused on purpose"}}'; exit 1; fi
rm -f "$f";;
esac
exit 0"#,
            alloc = alloc.display(),
            broken = broken.display(),
        ),
    );
    dirs.conf(
        "20-b.conflist",
        &json!({"cniVersion": "1.0.0", "name": "atksrb", "plugins": [{"type": "allocrb"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let request = SandboxRequest {
        container_id: "sb-rbf".into(),
        netns: dirs.netns("sb-rbf"),
        networks: vec![SandboxNetwork::new("atksra"), SandboxNetwork::new("atksrb")],
        ..Default::default()
    };
    let err = client.sandbox_add(&request).await.unwrap_err();
    let cnid::client::ClientError::Api { error, plugin, .. } = &err else {
        panic!("{err}");
    };
    let text = format!("{} {}", error.msg, error.details);
    for part in [
        "atksrb",
        "allocrb",
        "add refused on purpose",
        "b-add-stderr",
        "del refused on purpose",
        "b-del-stderr",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    assert_eq!(error.code, 100, "{error:?}");
    assert_eq!(plugin.as_deref(), Some("allocrb ADD"), "{err}");
    // The first network was deleted again; the second is left, recorded.
    assert_eq!(allocated(&alloc), ["allocrb.sb-rbf.eth1"]);
    assert_eq!(dirs.intents(), ["atksrb:sb-rbf:eth1.json"]);
    std::fs::remove_file(&broken).unwrap();
    client.sandbox_del(&request).await.unwrap();
    assert!(allocated(&alloc).is_empty(), "{:?}", allocated(&alloc));
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    assert!(dirs.intents().is_empty(), "{:?}", dirs.intents());
}

/// The plugins' DELs so far, by plugin type.
fn dels(dirs: &Dirs) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dirs.data.join("dels"))
        .unwrap()
        .filter_map(|e| {
            Some(
                e.ok()?
                    .file_name()
                    .into_string()
                    .ok()?
                    .split('.')
                    .next()?
                    .to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A sandbox's DEL arriving while the reaper reaps one of its networks
/// (the namespace is gone; the reap's DEL is held in the plugin): it waits
/// in the container's queue, then answers success, and each network's
/// plugin ran its DEL once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_del_racing_the_reaper_deletes_each_network_once() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let alloc = allocating_network(
        &dirs,
        "10-a.conflist",
        "atksga",
        "allocga",
        "",
        &gate.shell_wait(),
    );
    allocating_network(&dirs, "20-b.conflist", "atksgb", "allocgb", "", "");
    let daemon = Daemon::start(&dirs, &["--stale-after", "100ms"]);
    let client = daemon.client().await;
    // A namespace of its own, which can really go: the reaper acts only on
    // one proven gone.
    let ns = TempNetns::new();
    let request = SandboxRequest {
        container_id: "sb-reap".into(),
        netns: ns.path(),
        networks: vec![SandboxNetwork::new("atksga"), SandboxNetwork::new("atksgb")],
        ..Default::default()
    };
    client.sandbox_add(&request).await.unwrap();
    assert_eq!(allocated(&alloc).len(), 2);
    // The namespace goes away without a DEL: the reaper's DEL of the first
    // network is held in its plugin.
    drop(ns);
    gate.wait_started(1).await;
    let del = {
        let socket = dirs.socket.clone();
        let request = request.clone();
        tokio::spawn(async move {
            let client = cnid::client::Client::connect(&socket).await.unwrap();
            client.sandbox_del(&request).await
        })
    };
    crate::support::daemon::eventually_async(
        Duration::from_secs(60),
        "the sandbox's DEL queued behind the reap",
        || async {
            client
                .operations(Some("sb-reap"))
                .await
                .unwrap()
                .iter()
                // The sandbox's operation: its ifnames joined.
                .any(|o| o.state == "queued" && o.ifname.as_deref() == Some("eth0,eth1"))
        },
    )
    .await;
    gate.release();
    del.await.unwrap().expect("the sandbox's DEL succeeds");
    eventually(Duration::from_secs(60), "nothing left", || {
        allocated(&alloc).is_empty() && dirs.cached().is_empty()
    });
    assert_eq!(dels(&dirs), ["allocga", "allocgb"]);
    assert!(dirs.intents().is_empty(), "{:?}", dirs.intents());
}

/// A GC of a sandbox's second network arriving while the sandbox's ADD
/// runs its first, with one operation at a time (`--max-parallel 1`): the
/// GC takes its network's gate at once and waits for the permit; the
/// sandbox's step on that network waits for the gate. Neither may wait
/// for the other: both finish well within their deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_and_a_sandbox_add_over_its_networks_do_not_deadlock() {
    let dirs = Dirs::new();
    let hang = Gate::new(dirs.root());
    let alloc = allocating_network(
        &dirs,
        "10-a.conflist",
        "atksda",
        "allocda",
        &hang.shell_wait(),
        "",
    );
    allocating_network(&dirs, "20-b.conflist", "atksdb", "allocdb", "", "");
    let daemon = Daemon::start(&dirs, &["--max-parallel", "1"]);
    let client = daemon.client().await;
    let request = SandboxRequest {
        container_id: "sb-gc".into(),
        netns: dirs.netns("sb-gc"),
        networks: vec![SandboxNetwork::new("atksda"), SandboxNetwork::new("atksdb")],
        ..Default::default()
    };
    let add = {
        let socket = dirs.socket.clone();
        let request = request.clone();
        tokio::spawn(async move {
            let client = cnid::client::Client::connect(&socket).await.unwrap();
            client.sandbox_add(&request).await
        })
    };
    hang.wait_started(1).await;
    let gc = {
        let socket = dirs.socket.clone();
        tokio::spawn(async move {
            let client = cnid::client::Client::connect(&socket).await.unwrap();
            client
                .gc(
                    "atksdb",
                    &cnid::api::GcRequest {
                        valid_attachments: vec![cni_core::stdin::GcAttachment {
                            container_id: "sb-gc".into(),
                            ifname: "eth1".into(),
                        }],
                        timeout_ms: None,
                    },
                )
                .await
        })
    };
    crate::support::daemon::eventually_async(Duration::from_secs(60), "the GC queued", || async {
        client
            .operations(None)
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == "GC")
    })
    .await;
    hang.release();
    let limit = Duration::from_secs(20);
    tokio::time::timeout(limit, add)
        .await
        .expect("the sandbox's ADD is not stuck")
        .unwrap()
        .expect("sandbox ADD");
    tokio::time::timeout(limit, gc)
        .await
        .expect("the GC is not stuck")
        .unwrap()
        .expect("GC");
    assert_eq!(allocated(&alloc).len(), 2, "{:?}", allocated(&alloc));
    client.sandbox_del(&request).await.unwrap();
    assert!(allocated(&alloc).is_empty(), "{:?}", allocated(&alloc));
}
