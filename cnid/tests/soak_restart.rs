//! Kill and restart soak (it reproduced the restart that stopped plugins
//! half way, and the failed immediate restarts): rounds of concurrent
//! ADDs on the real bridge + host-local chain, each in a namespace of its
//! own, `kill -9` of cnid, an immediate restart, a DEL of every container
//! sent at once (while cnid is down or restarting: the client waits for
//! it); every DEL must be answered 2xx, and after each round host-local's
//! dataDir must hold no reservation (empty files included), the bridge no
//! port (no veth), no namespace an `eth0`, and every restart must have
//! succeeded.
//!
//! The chain is `[bridge (host-local IPAM), gate]`; the gate plugin passes
//! through, except in the rounds that hold every ADD in it, which makes
//! "killed inside a plugin" certain. The kinds of rounds, in turn:
//!
//! - `random`: the kill comes 0 to 200 ms after the ADDs were sent (inside
//!   bridge or host-local, between plugins, or after the answers);
//! - `gated`: the ADDs held in the gate plugin; the restart finds them
//!   orphaned, serves (health) while they run, and holds the DELs of
//!   their containers; the gate opens; they finish, are rolled back, and
//!   the DELs run;
//! - `gated, killed while waiting`: as `gated`, and the restart itself is
//!   killed while it waits for the orphans (the DELs already sent to it),
//!   then restarted again;
//! - `gated, released before the restart`: the orphans finish with no
//!   daemon at all (or while the restart finds them);
//! - `random, restart killed`: as `random`, then the restart is killed 0
//!   to 30 ms after it began (lock, orphan scan, recovery) while the DELs
//!   are on their way, and started once more.
//!
//! Size: 8 rounds by default (`make test`), 200 with `SOAK_SCALE=full`
//! (`make soak`), `SOAK_RESTART_ROUNDS=N` sets it; `SOAK_RESTART_KINDS`
//! picks the kinds (see [`kinds`]). `SOAK_SEED` replays a run (the seed is
//! printed).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs};
use crate::support::gate::Gate;
use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips, ip_ok,
};
use crate::support::require_root;
use crate::support::soak::{OrphanSweep, Rng, recovery_over, seed, support_logs};
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use serde_json::json;

const NET: &str = "k27";
/// ADDs sent at once in each round, each in its own namespace.
const ADDS: usize = 6;
/// What cnid logs when it found orphans and waits for them.
const WAITING: &str = "waiting for orphaned plugins";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Random,
    Gated,
    GatedKilledWhileWaiting,
    GatedReleasedBeforeRestart,
    RandomRestartKilled,
}

const KINDS: [Kind; 5] = [
    Kind::Random,
    Kind::Gated,
    Kind::RandomRestartKilled,
    Kind::GatedKilledWhileWaiting,
    Kind::GatedReleasedBeforeRestart,
];

/// The kinds of rounds, in turn: all, or `SOAK_RESTART_KINDS` (a comma
/// list of `random`, `gated`, `gated-killed`, `gated-released`,
/// `restart-killed`).
fn kinds() -> Vec<Kind> {
    let Ok(list) = std::env::var("SOAK_RESTART_KINDS") else {
        return KINDS.to_vec();
    };
    list.split(',')
        .map(|k| match k.trim() {
            "random" => Kind::Random,
            "gated" => Kind::Gated,
            "gated-killed" => Kind::GatedKilledWhileWaiting,
            "gated-released" => Kind::GatedReleasedBeforeRestart,
            "restart-killed" => Kind::RandomRestartKilled,
            other => panic!("bad SOAK_RESTART_KINDS entry {other:?}"),
        })
        .collect()
}

fn rounds() -> usize {
    if let Ok(n) = std::env::var("SOAK_RESTART_ROUNDS") {
        return n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("bad SOAK_RESTART_ROUNDS {n:?}"));
    }
    match std::env::var("SOAK_SCALE").as_deref() {
        Ok("full") => 200,
        _ => 8,
    }
}

const PASS: &str = r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) echo '{"cniVersion":"1.0.0"}';;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}';;
esac"#;

fn gated(gate: &Gate) -> String {
    format!(
        r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD)
{}
echo '{{"cniVersion":"1.0.0"}}';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
        gate.shell_wait()
    )
}

/// Processes that hold `lock` open (copies of a dead daemon's descriptor):
/// `pid comm`.
fn lock_holders(lock: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.filter_map(|f| f.ok())
                    .any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l == lock))
            })
        })
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} {}", comm.trim())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_immediate_restart_with_the_real_chain_leaks_no_reservation() {
    require_root!();
    crate::support::require_plugins(&["bridge", "host-local"]);
    let rounds = rounds();
    let kinds = kinds();
    let seed = seed();
    println!(
        "restart soak: seed {seed:#x} (replay with SOAK_SEED={seed:#x}), {rounds} rounds of {ADDS} ADDs"
    );
    let mut rng = Rng(seed);
    let dirs = Dirs::new();
    let _sweep = OrphanSweep(dirs.root().display().to_string());
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    dirs.plugin("k27gate", PASS);
    dirs.conf(
        "10-k27.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr()}]]}},
                {"type": "k27gate"}
            ]
        }),
    );
    let namespaces: Vec<TempNetns> = (0..ADDS).map(|_| TempNetns::new()).collect();
    let lock = dirs.state.join("cnid.lock");

    let mut daemon = Daemon::start(&dirs, &[]);
    let (mut restarts, mut answered, mut lost) = (0usize, 0usize, 0usize);
    let mut kills_in_gate = 0usize;
    let mut kills_while_waiting = 0usize;
    let mut restart_kills = 0usize;
    let mut kill_delays_ms: Vec<u64> = Vec::new();
    let mut copies_after_reap: Vec<String> = Vec::new();
    let mut dels_ok = 0usize;
    let started = Instant::now();

    for round in 0..rounds {
        let kind = kinds[round % kinds.len()];
        let gate = matches!(
            kind,
            Kind::Gated | Kind::GatedKilledWhileWaiting | Kind::GatedReleasedBeforeRestart
        )
        .then(|| {
            let g = Gate::new(dirs.root());
            dirs.plugin("k27gate", &gated(&g));
            g
        });
        let client = daemon.client().await;
        let mut adds = tokio::task::JoinSet::new();
        for (i, ns) in namespaces.iter().enumerate() {
            let req = AttachmentRequest::new(format!("r{round}-{i}"), ns.path(), "eth0");
            let c: Client = client.clone();
            adds.spawn(async move { c.add(NET, &req).await.is_ok() });
        }
        match &gate {
            Some(g) => {
                g.wait_started(ADDS).await;
                kills_in_gate += 1;
            }
            None => {
                let us = rng.below(200_000);
                kill_delays_ms.push(us / 1000);
                tokio::time::sleep(Duration::from_micros(us)).await;
            }
        }
        daemon.kill9();
        copies_after_reap.extend(lock_holders(&lock));
        // The runtime gives up on its ADDs (a client sends a request cut
        // off by a restart again; dropped here, so that the DELs below
        // come after whatever of them reached the restart).
        adds.abort_all();
        while let Some(r) = adds.join_next().await {
            match r {
                Ok(true) => answered += 1,
                _ => lost += 1,
            }
        }
        // The DELs go out at once, while cnid is down or restarting (the
        // clients wait for it), in every kind of round; each must be
        // answered 2xx.
        let send_dels = |round: usize| {
            let socket = dirs.socket.clone();
            let reqs: Vec<AttachmentRequest> = namespaces
                .iter()
                .enumerate()
                .map(|(i, ns)| AttachmentRequest::new(format!("r{round}-{i}"), ns.path(), "eth0"))
                .collect();
            tokio::spawn(async move {
                let client = Client::connect(&socket).await;
                let mut dels = tokio::task::JoinSet::new();
                for req in reqs {
                    let client = client
                        .as_ref()
                        .map_err(|e| cni_core::error::Chain(e).to_string())
                        .cloned();
                    dels.spawn(async move {
                        let id = req.container_id.clone();
                        let r = match client {
                            Ok(c) => c
                                .del_raw(NET, &req)
                                .await
                                .map(|r| r.status)
                                .map_err(|e| cni_core::error::Chain(&e).to_string()),
                            Err(e) => Err(format!("connect: {e}")),
                        };
                        (id, r)
                    });
                }
                let mut out = Vec::new();
                while let Some(r) = dels.join_next().await {
                    out.push(r.expect("DEL task"));
                }
                out
            })
        };
        let (next, dels) = match kind {
            Kind::Random => {
                let d = Daemon::spawn_with(&dirs, &[], |_| {});
                (d, send_dels(round))
            }
            Kind::RandomRestartKilled => {
                let mut first = Daemon::spawn_with(&dirs, &[], |_| {});
                let dels = send_dels(round);
                std::thread::sleep(Duration::from_micros(rng.below(30_000)));
                first.kill9();
                restart_kills += 1;
                restarts += 1;
                (Daemon::spawn_with(&dirs, &[], |_| {}), dels)
            }
            Kind::Gated => {
                let mut d = Daemon::spawn_with(&dirs, &[], |_| {});
                d.wait_log(WAITING, Duration::from_secs(30));
                // Served while the orphans run; the DELs wait for them.
                d.wait_ready(Duration::from_secs(30));
                let dels = send_dels(round);
                gate.as_ref().expect("gate").release();
                (d, dels)
            }
            Kind::GatedKilledWhileWaiting => {
                let mut first = Daemon::spawn_with(&dirs, &[], |_| {});
                first.wait_log(WAITING, Duration::from_secs(30));
                let dels = send_dels(round);
                first.kill9();
                kills_while_waiting += 1;
                restarts += 1;
                let mut d = Daemon::spawn_with(&dirs, &[], |_| {});
                d.wait_log(WAITING, Duration::from_secs(30));
                gate.as_ref().expect("gate").release();
                (d, dels)
            }
            Kind::GatedReleasedBeforeRestart => {
                gate.as_ref().expect("gate").release();
                (Daemon::spawn_with(&dirs, &[], |_| {}), send_dels(round))
            }
        };
        daemon = next;
        restarts += 1;
        let answers = dels.await.expect("DELs");
        let failed: Vec<&(String, Result<u16, String>)> = answers
            .iter()
            .filter(|(_, r)| !matches!(r, Ok(s) if (200..300).contains(s)))
            .collect();
        assert!(
            failed.is_empty() && answers.len() == ADDS,
            "round {round} ({kind:?}): DELs not answered 2xx: {failed:?}\n{}",
            daemon.log()
        );
        dels_ok += answers.len();
        daemon.wait_ready(Duration::from_secs(30));
        if gate.is_some() {
            dirs.plugin("k27gate", PASS);
        }
        let client = daemon.client().await;
        recovery_over(
            &dirs,
            &client,
            Duration::from_secs(30),
            &format!("round {round}"),
        )
        .await;
        let ips = host_local_ips(&data_dir, NET);
        let empty: Vec<&String> = ips
            .iter()
            .filter(|ip| {
                std::fs::metadata(data_dir.join(NET).join(ip.as_str())).is_ok_and(|m| m.len() == 0)
            })
            .collect();
        let with_eth0: Vec<usize> = (0..ADDS)
            .filter(|i| {
                namespaces[*i]
                    .exec("ip", &["link", "show", "eth0"])
                    .status
                    .success()
            })
            .collect();
        assert!(
            ips.is_empty(),
            "round {round} ({kind:?}): reservations left {ips:?} (empty files {empty:?})\n{}",
            daemon.log()
        );
        assert!(
            bridge_ports(br).is_empty(),
            "round {round} ({kind:?}): veths left {:?}",
            bridge_ports(br)
        );
        assert!(
            with_eth0.is_empty(),
            "round {round} ({kind:?}): eth0 left in namespaces {with_eth0:?}"
        );
        assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
    }
    let elapsed = started.elapsed();
    let logs = support_logs(dirs.root());
    let field = |l: &str, name: &str| -> usize {
        l.split(&format!("{name}="))
            .nth(1)
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let (finished, killed) = logs
        .lines()
        .filter(|l| l.contains("orphaned plugins of a previous cnid are gone"))
        .fold((0, 0), |(f, k), l| {
            (f + field(l, "finished"), k + field(l, "killed"))
        });
    let rolled_back = logs.matches("unfinished ADD rolled back").count();
    let lock_waits = logs.matches("state dir locked by another process").count();
    let stale_listeners = logs.matches("the socket's listener is dead").count();
    kill_delays_ms.sort_unstable();
    println!(
        "restart soak: {rounds} rounds in {:.1}s; {} kills of cnid ({} while all {ADDS} ADDs were inside the gate plugin, \
         {} at random 0-200 ms after the ADDs: {kill_delays_ms:?} ms; {kills_while_waiting} while a restart waited for orphans, \
         {restart_kills} 0-30 ms into a restart), {restarts} restarts, all succeeded; DELs sent at once, answered 2xx: {dels_ok}",
        elapsed.as_secs_f64(),
        rounds + kills_while_waiting + restart_kills,
        kills_in_gate,
        kill_delays_ms.len(),
    );
    println!(
        "restart soak: ADDs answered {answered}, lost to a kill {lost}; orphaned plugins finished {finished}, \
         killed at their deadline {killed}; unfinished ADDs rolled back {rolled_back}; lock waits {lock_waits}, \
         stale listeners replaced {stale_listeners}; copies of the lock file seen right after a reap: {copies_after_reap:?}"
    );
    assert_eq!(killed, 0, "no plugin here outlives its deadline");
    drop(daemon);
}
