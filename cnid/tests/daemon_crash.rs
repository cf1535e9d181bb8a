//! Crash safety: `kill -9` of the daemon while an ADD is half done (the
//! real bridge plugin ran, a slow plugin after it did not finish), then a
//! restart: the slow plugin, orphaned, finishes (`daemon_orphans.rs`), and
//! the daemon DELs the attachment from its recorded intent, and
//! nothing is leaked: no IP in host-local, no veth, no interface in the
//! namespace, no cache entry, no intent.

use crate::support;
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, kill_group};
use crate::support::gate::Gate;
use crate::support::netns::{LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips};
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "dcrash";

/// Kills the slow plugin the killed daemon left behind (its own process
/// group), also when the test fails.
struct Orphan(std::path::PathBuf);

impl Drop for Orphan {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            kill_group(pid);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_add_then_restart_leaks_nothing() {
    support::require_root!();
    crate::support::require_plugins(&["bridge"]);
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    let data_dir = dirs.data.join("host-local");
    let pid_file = dirs.data.join("slow.pid");
    let _orphan = Orphan(pid_file.clone());
    // Its ADD hangs at a gate, opened only once the daemon was killed.
    let hang = Gate::new(dirs.root());
    dirs.plugin(
        "slowpoke",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) echo $$ > {pid}
{wait}
echo '{{"cniVersion":"1.0.0"}}';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac
exit 0"#,
            pid = pid_file.display(),
            wait = hang.shell_wait(),
        ),
    );
    dirs.conf(
        "10-crash.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr()}]]}},
                {"type": "slowpoke"}
            ]
        }),
    );
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    let req = AttachmentRequest::new("crash-1", ns.path(), "eth0");
    let add = tokio::spawn(async move { client.add(NET, &req).await });

    // The bridge plugin has run (veth, IP), the slow one is running.
    hang.wait_started_blocking(1);
    assert_eq!(host_local_ips(&data_dir, NET).len(), 1);
    let veths = bridge_ports(br);
    assert_eq!(veths.len(), 1);
    assert_eq!(ns.ipv4_addrs("eth0").len(), 1);
    assert_eq!(dirs.intents(), ["dcrash:crash-1:eth0.json"]);

    assert!(!add.is_finished(), "the ADD is held in the slow plugin");
    daemon.kill9();
    // The client would send it again to a restart (within its deadline);
    // the runtime gives up on it here.
    add.abort();
    // Left as the crash left it: without recovery this would leak.
    assert_eq!(host_local_ips(&data_dir, NET).len(), 1);
    assert_eq!(dirs.intents().len(), 1);
    assert!(dirs.cached().is_empty());

    // The restart lets the orphaned slow plugin finish (within its
    // deadline) before the rollback: open its gate once the restart runs.
    let mut daemon = Daemon::spawn_with(&dirs, &[], |_| {});
    hang.release();
    daemon.wait_ready(Duration::from_secs(30));
    eventually(
        Duration::from_secs(30),
        "rollback of the unfinished ADD",
        || dirs.intents().is_empty() && host_local_ips(&data_dir, NET).is_empty(),
    );
    let ips = host_local_ips(&data_dir, NET);
    let ports = bridge_ports(br);
    let veth_left: Vec<&String> = veths
        .iter()
        .filter(|v| support::netns::link_exists(v))
        .collect();
    let eth0_left = ns.exec("ip", &["link", "show", "eth0"]).status.success();
    println!(
        "crash: after kill -9 mid-ADD and restart: IPs held {ips:?}, bridge ports {ports:?}, \
         veths left {veth_left:?}, eth0 in netns {eth0_left}, intents {:?}, cache {:?}",
        dirs.intents(),
        dirs.cached()
    );
    assert!(ips.is_empty());
    assert!(ports.is_empty());
    assert!(veth_left.is_empty());
    assert!(!eth0_left);
    assert!(dirs.cached().is_empty());
    let client = daemon.client().await;
    // The recovery's waiter counts the outcome, then logs it: that comes a
    // moment after the intent file is gone.
    eventually(Duration::from_secs(30), "rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
    let m = client.metrics().await.unwrap();
    assert!(
        m.contains("cnid_recovered_intents_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(client.operations(None).await.unwrap().is_empty());
}

/// Defect: the temp file of a cache writer killed between
/// writing a record and renaming it stayed in the shared `<cache>/results`
/// through every restart. A start removes ours whose writer is dead and
/// which are old enough; another tool's files and a live writer's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_files_of_killed_cache_writers_are_removed() {
    let dirs = Dirs::new();
    let results = dirs.cache.join("results");
    std::fs::create_dir_all(&results).unwrap();
    // A pid that names no process (above pid_max).
    let dead = cni_test_support::process::unused_pid();
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let plant = |name: String| {
        let p = results.join(name);
        std::fs::write(&p, b"{\"kind\":\"cniCacheV1\"").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(an_hour_ago)
            .unwrap();
        p
    };
    let abandoned = plant(format!(".{NET}-w2-eth0.tmp-{dead}-1764700000000000000"));
    let live = plant(format!(".{NET}-w3-eth0.tmp-{}-1", std::process::id()));
    let foreign = plant(format!(".{NET}-w4-eth0.partial-{dead}"));
    let daemon = Daemon::start(&dirs, &[]);
    assert!(!abandoned.exists(), "{}", daemon.log());
    assert!(live.exists(), "a live writer's temp file was removed");
    assert!(foreign.exists(), "another tool's file was removed");
}
