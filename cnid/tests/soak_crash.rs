//! Crash soak: random ADD, CHECK and DEL operations over many containers
//! with the real bridge chain (bridge + host-local), while the daemon is
//! killed with `kill -9` at random moments and restarted. At the end, a GC
//! whose valid list is exactly the attachments the test knows completed
//! (an ADD answered 200 and not deleted since) must leave the host holding
//! those and nothing else: no IP in host-local beyond them, no stray veth,
//! no interface in a dead container's netns, cache entries equal to them,
//! no ADD intent.
//!
//! Operations that were in flight when the daemon died have an unknown
//! outcome; the test never counts them as live, so whatever they left must
//! be undone by the daemon (recovery of its ADD intents at restart, the
//! final GC of cached attachments).
//!
//! Size: `SOAK_SCALE=full` (`make soak`) runs 300 operations over 30
//! containers with 10 kills; the default (`make test`) 60 over 10 with 3;
//! `SOAK_SCALE=OPS,CONTAINERS,KILLS` sets all three. `SOAK_SEED` replays a
//! run (the seed is printed).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs};
use crate::support::netns::{LinkGuard, SubnetLease, TempNetns, ip_ok};
use crate::support::require_root;
use crate::support::soak::{OrphanSweep, Rng, recovery_over, seed, support_logs};
use cni_core::stdin::GcAttachment;
use cnid::api::{AttachmentRequest, GcRequest};
use cnid::client::{Client, ClientError};
use serde_json::json;

const NET: &str = "soak";
/// Operations the test keeps in flight at once (each on its own container).
const PARALLEL: usize = 6;

#[derive(Debug, Clone, Copy)]
struct Scale {
    ops: usize,
    containers: usize,
    kills: usize,
}

fn scale() -> Scale {
    let full = Scale {
        ops: 300,
        containers: 30,
        kills: 10,
    };
    let reduced = Scale {
        ops: 60,
        containers: 10,
        kills: 3,
    };
    match std::env::var("SOAK_SCALE").as_deref() {
        Ok("full") => full,
        Ok("") | Err(_) => reduced,
        Ok(other) => {
            let n: Vec<usize> = other
                .split(',')
                .map(|s| {
                    s.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("bad SOAK_SCALE {other:?}"))
                })
                .collect();
            assert!(
                n.len() == 3 && n[1] > 0 && n[1] <= 200,
                "SOAK_SCALE is `full` or OPS,CONTAINERS,KILLS (got {other:?})"
            );
            Scale {
                ops: n[0],
                containers: n[1],
                kills: n[2],
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    Check,
    Del,
}

/// What the test knows of an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Absent,
    Live,
    /// An ADD or DEL was in flight when the daemon died.
    Unknown,
}

/// How one request ended.
#[derive(Debug)]
enum Outcome {
    Ok,
    /// The daemon answered with an error.
    Refused(u16, String),
    /// No answer: the daemon died under it.
    Lost,
}

async fn send(client: &Client, verb: Verb, req: &AttachmentRequest) -> Outcome {
    let r = match verb {
        Verb::Add => client.add(NET, req).await.map(|_| ()),
        Verb::Check => client.check(NET, req).await,
        Verb::Del => client.del(NET, req).await,
    };
    match r {
        Ok(()) => Outcome::Ok,
        Err(ClientError::Api { status, error, .. }) => Outcome::Refused(status, error.msg),
        Err(_) => Outcome::Lost,
    }
}

fn bridge_ports(bridge: &str) -> Vec<String> {
    std::fs::read_dir(format!("/sys/class/net/{bridge}/brif"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// host-local's allocations for NET: IP -> the container ID in the file.
fn held_ips(data_dir: &Path) -> BTreeMap<String, String> {
    let dir = data_dir.join(NET);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.parse::<std::net::IpAddr>().ok()?;
            let owner = std::fs::read_to_string(e.path()).unwrap_or_default();
            let cid = owner.lines().next().unwrap_or_default().trim().to_owned();
            Some((name, cid))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_leaks_nothing() {
    require_root!();
    crate::support::require_plugins(&["bridge", "host-local"]);
    let scale = scale();
    let seed = seed();
    println!(
        "soak: seed {seed:#x} (replay with SOAK_SEED={seed:#x}), {} operations over {} containers, {} kills",
        scale.ops, scale.containers, scale.kills
    );
    let mut rng = Rng(seed);

    let dirs = Dirs::new();
    let _sweep = OrphanSweep(dirs.root().display().to_string());
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    // A fixed MAC: otherwise the bridge's changes as ports come and go, and
    // the bridge plugin's CHECK of earlier containers fails.
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "address", "02:cd:00:00:50:01"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    dirs.conf(
        "10-soak.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr()}]]}}
            ]
        }),
    );
    let namespaces: Vec<TempNetns> = (0..scale.containers).map(|_| TempNetns::new()).collect();
    let cid = |c: usize| format!("soak-{c}");

    // Kill points: after these operation indices were sent (sorted, distinct).
    let mut kill_at: BTreeSet<usize> = BTreeSet::new();
    while kill_at.len() < scale.kills.min(scale.ops.saturating_sub(1)) {
        kill_at.insert(1 + rng.below(scale.ops.saturating_sub(1) as u64) as usize);
    }

    let mut daemon = Daemon::start(&dirs, &[]);
    let mut client = daemon.client().await;
    let mut known = vec![Known::Absent; scale.containers];
    let mut busy = vec![false; scale.containers];
    let mut in_flight = tokio::task::JoinSet::new();
    let (mut sent, mut adds, mut checks, mut dels) = (0usize, 0usize, 0usize, 0usize);
    let (mut lost, mut kills, mut restarts) = (0usize, 0usize, 0usize);
    let mut unexpected: Vec<String> = Vec::new();
    let mut latencies: Vec<Duration> = Vec::new();
    let started = Instant::now();

    let settle = |known: &mut Vec<Known>,
                  busy: &mut Vec<bool>,
                  unexpected: &mut Vec<String>,
                  lost: &mut usize,
                  latencies: &mut Vec<Duration>,
                  (c, verb, outcome, took): (usize, Verb, Outcome, Duration)| {
        busy[c] = false;
        match outcome {
            Outcome::Ok => {
                latencies.push(took);
                match verb {
                    Verb::Add => known[c] = Known::Live,
                    Verb::Del => known[c] = Known::Absent,
                    Verb::Check => {}
                }
            }
            Outcome::Lost => {
                *lost += 1;
                if verb != Verb::Check {
                    known[c] = Known::Unknown;
                }
            }
            Outcome::Refused(status, msg) => {
                unexpected.push(format!("{verb:?} of container {c}: HTTP {status}: {msg}"));
                if verb != Verb::Check {
                    known[c] = Known::Unknown;
                }
            }
        }
    };

    while sent < scale.ops {
        // Keep PARALLEL operations in flight, each on an idle container.
        while in_flight.len() >= PARALLEL || busy.iter().all(|b| *b) {
            let done = in_flight
                .join_next()
                .await
                .expect("a task")
                .expect("op task");
            settle(
                &mut known,
                &mut busy,
                &mut unexpected,
                &mut lost,
                &mut latencies,
                done,
            );
        }
        let idle: Vec<usize> = (0..scale.containers).filter(|c| !busy[*c]).collect();
        let c = idle[rng.below(idle.len() as u64) as usize];
        let verb = match known[c] {
            Known::Absent => Verb::Add,
            Known::Unknown => Verb::Del,
            Known::Live => {
                if rng.below(10) < 6 {
                    Verb::Del
                } else {
                    Verb::Check
                }
            }
        };
        match verb {
            Verb::Add => adds += 1,
            Verb::Check => checks += 1,
            Verb::Del => dels += 1,
        }
        busy[c] = true;
        let req = AttachmentRequest::new(cid(c), namespaces[c].path(), "eth0");
        let cl = client.clone();
        in_flight.spawn(async move {
            let t = Instant::now();
            let outcome = send(&cl, verb, &req).await;
            (c, verb, outcome, t.elapsed())
        });
        sent += 1;

        if kill_at.contains(&sent) {
            // A random moment while operations run: often mid-plugin.
            tokio::time::sleep(Duration::from_micros(rng.below(120_000))).await;
            daemon.kill9();
            kills += 1;
            // The requests in flight are sent again by the client to the
            // restart (those cnid cannot have acted on, and those cut off
            // before an answer): it answers them.
            daemon = Daemon::start(&dirs, &[]);
            while let Some(done) = in_flight.join_next().await {
                let done = done.expect("op task");
                settle(
                    &mut known,
                    &mut busy,
                    &mut unexpected,
                    &mut lost,
                    &mut latencies,
                    done,
                );
            }
            client = daemon.client().await;
            restarts += 1;
        }
    }
    while let Some(done) = in_flight.join_next().await {
        let done = done.expect("op task");
        settle(
            &mut known,
            &mut busy,
            &mut unexpected,
            &mut lost,
            &mut latencies,
            done,
        );
    }
    let ops_elapsed = started.elapsed();

    // The daemon rolls back the ADDs that never completed ahead of any
    // request; wait for that to be over.
    recovery_over(
        &dirs,
        &client,
        Duration::from_secs(60),
        "after the last restart",
    )
    .await;

    // GC with exactly what the test knows to be live.
    let live: BTreeSet<String> = (0..scale.containers)
        .filter(|c| known[*c] == Known::Live)
        .map(cid)
        .collect();
    let unknown = known.iter().filter(|k| **k == Known::Unknown).count();
    let gc = client
        .gc(
            NET,
            &GcRequest {
                valid_attachments: live
                    .iter()
                    .map(|c| GcAttachment {
                        container_id: c.clone(),
                        ifname: "eth0".into(),
                    })
                    .collect(),
                timeout_ms: None,
            },
        )
        .await
        .expect("GC");
    // What the restarts did, from every daemon's log.
    let logs: String = support_logs(dirs.root());
    let recovered = logs.matches("unfinished ADD rolled back").count();
    let field = |l: &str, name: &str| -> u64 {
        l.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let (orphans_finished, orphans_killed): (u64, u64) = logs
        .lines()
        .filter(|l| l.contains("orphaned plugins of a previous cnid are gone"))
        .fold((0, 0), |(f, k), l| {
            (f + field(l, "finished"), k + field(l, "killed"))
        });

    // What the host holds now.
    let ips = held_ips(&data_dir);
    let ip_owners: BTreeSet<String> = ips.values().cloned().collect();
    let ports = bridge_ports(br);
    let with_eth0: BTreeSet<String> = (0..scale.containers)
        .filter(|c| {
            namespaces[*c]
                .exec("ip", &["link", "show", "eth0"])
                .status
                .success()
        })
        .map(cid)
        .collect();
    let cached: BTreeSet<String> = dirs
        .cached()
        .into_iter()
        .filter_map(|f| {
            f.strip_prefix(&format!("{NET}-"))?
                .strip_suffix("-eth0")
                .map(str::to_owned)
        })
        .collect();
    let intents = dirs.intents();
    let stray_veths = ports.len().saturating_sub(live.len());
    let ips_beyond_live = ips.values().filter(|c| !live.contains(*c)).count();
    let mut sorted = latencies.clone();
    sorted.sort();
    let pct = |p: f64| {
        sorted
            .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
            .map_or(0, |d| d.as_millis())
    };
    println!(
        "soak: {sent} operations (ADD {adds}, CHECK {checks}, DEL {dels}) in {:.1}s; \
         {kills} kills, {restarts} restarts; {lost} answers lost to a kill; \
         unexpected errors {}; latency p50 {} ms, p99 {} ms",
        ops_elapsed.as_secs_f64(),
        unexpected.len(),
        pct(0.50),
        pct(0.99)
    );
    println!(
        "soak: known live {}, unknown {unknown}; at restarts: orphaned plugins finished {orphans_finished} \
         (killed at their deadline {orphans_killed}), \
         unfinished ADDs rolled back {recovered}; GC deleted {}",
        live.len(),
        gc.deleted.len()
    );
    println!(
        "soak: after GC: IPs held {} (beyond live {ips_beyond_live}), bridge ports {} (stray veths {stray_veths}), \
         netns with eth0 {} (not live {}), cache entries {} (== live: {}), intents {}",
        ips.len(),
        ports.len(),
        with_eth0.len(),
        with_eth0.difference(&live).count(),
        cached.len(),
        cached == live,
        intents.len()
    );

    assert!(
        unexpected.is_empty(),
        "errors the crashes did not cause:\n{}",
        unexpected.join("\n")
    );
    assert_eq!(
        ip_owners, live,
        "host-local's IPs belong to the live attachments, one each"
    );
    assert_eq!(ips.len(), live.len(), "one IP per live attachment: {ips:?}");
    assert_eq!(
        ports.len(),
        live.len(),
        "one veth per live attachment: {ports:?}"
    );
    assert_eq!(
        with_eth0, live,
        "eth0 exactly in the live containers' netns"
    );
    assert_eq!(
        cached, live,
        "cache entries are exactly the live attachments"
    );
    assert!(intents.is_empty(), "intents left: {intents:?}");
    assert_eq!(
        orphans_killed, 0,
        "no plugin here outlives its deadline: an orphan was killed"
    );
    assert_eq!(kills, scale.kills.min(scale.ops.saturating_sub(1)));

    // And the live ones are healthy: CHECK passes, DEL cleans up.
    for c in &live {
        let idx: usize = c.trim_start_matches("soak-").parse().expect("index");
        let req = AttachmentRequest::new(c, namespaces[idx].path(), "eth0");
        client
            .check(NET, &req)
            .await
            .expect("CHECK of a live attachment");
        client
            .del(NET, &req)
            .await
            .expect("DEL of a live attachment");
    }
    assert!(held_ips(&data_dir).is_empty());
    assert!(dirs.cached().is_empty());
    drop(daemon);
}
