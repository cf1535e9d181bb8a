//! Serialization through the real daemon: per-container FIFO with no
//! overlap, parallelism across containers, coalescing of duplicate DELs.
//!
//! The fake plugin records, per invocation and in a file of its own, its
//! verb, container, the `SEQ` from `CNI_ARGS`, and start and end times.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::daemon::{
    Daemon, Dirs, Run, eventually_async, raise_nofile, recording_plugin, runs,
};
use crate::support::gate::Gate;
use cnid::api::AttachmentRequest;
use cnid::client::{Client, ClientError};
use serde_json::json;

const NET: &str = "ord";
const NETNS: &str = "/proc/self/ns/net";
/// How long a test waits for a state it caused (generous: a busy machine).
const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    Del,
    Check,
}

/// What a request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Ok,
    Status(u16),
    Failed(String),
}

fn got(r: Result<(), ClientError>) -> Got {
    match r {
        Ok(()) => Got::Ok,
        Err(e) => match e.status() {
            Some(s) => Got::Status(s),
            None => Got::Failed(e.to_string()),
        },
    }
}

async fn send(client: &Client, verb: Verb, req: &AttachmentRequest) -> Got {
    match verb {
        Verb::Add => got(client.add(NET, req).await.map(|_| ())),
        Verb::Del => got(client.del(NET, req).await),
        Verb::Check => got(client.check(NET, req).await),
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The outcome each request must have when a container's requests run in
/// submission order, and the SEQs that run plugins.
fn simulate(plan: &[Verb]) -> (Vec<Got>, Vec<u64>) {
    let mut attached = false;
    let mut outcomes = Vec::new();
    let mut ran = Vec::new();
    for (k, v) in plan.iter().enumerate() {
        let k = k as u64;
        match v {
            Verb::Add if attached => outcomes.push(Got::Status(409)),
            Verb::Add => {
                attached = true;
                outcomes.push(Got::Ok);
                ran.push(k);
            }
            Verb::Del => {
                attached = false;
                outcomes.push(Got::Ok);
                ran.push(k);
            }
            Verb::Check if attached => {
                outcomes.push(Got::Ok);
                ran.push(k);
            }
            Verb::Check => outcomes.push(Got::Status(404)),
        }
    }
    (outcomes, ran)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_fifo_per_container_parallel_across_containers() {
    // 300 requests (1,000 before): the same invariants at 1,000 and more
    // requests are load.rs's (`make soak`: 2,000), so this one keeps to
    // what the ordering needs: many containers, each with a long mixed
    // plan, in flight at once.
    const CONTAINERS: usize = 25;
    const PER_CONTAINER: usize = 12;
    raise_nofile();
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    let seed = 0x005e_ed0f_c41d_u64;
    let mut rng = Rng(seed);
    let plans: Vec<Vec<Verb>> = (0..CONTAINERS)
        .map(|_| {
            (0..PER_CONTAINER)
                .map(|_| match rng.next() % 10 {
                    0..=3 => Verb::Add,
                    4..=6 => Verb::Del,
                    _ => Verb::Check,
                })
                .collect()
        })
        .collect();
    // The first plugin runs of containers 0 and 1 wait for each other at a
    // gate: parallelism across containers is then a certainty, not luck.
    let gate = Gate::new(dirs.root());
    let first = |c: usize| simulate(&plans[c]).1[0];
    dirs.plugin(
        "rec",
        &recording_plugin(
            &records,
            &format!(
                "case \"$CNI_CONTAINERID:$seq\" in ord-0:{}|ord-1:{})\n{}\n;; esac",
                first(0),
                first(1),
                gate.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-ord.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--max-parallel", "64"]);
    let client = daemon.client().await;

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let opener = async {
        gate.wait_started(2).await;
        gate.release();
    };
    for (c, plan) in plans.iter().cloned().enumerate() {
        let client = client.clone();
        // Each container on a netns path of its own: the daemon refuses a
        // request on another attached container's netns and ifname.
        let netns = dirs.netns(&format!("ord-{c}"));
        tasks.spawn(async move {
            let cid = format!("ord-{c}");
            let mut pending = Vec::new();
            for (k, verb) in plan.into_iter().enumerate() {
                let rid = format!("{cid}-{k}");
                let cl = client.with_request_id(&rid);
                let mut req = AttachmentRequest::new(&cid, &netns, "eth0");
                req.cni_args = format!("SEQ={k}");
                // The daemon's longest deadline: queueing counts against a request's
                // deadline, and on a loaded machine the last of a container's
                // queued requests can wait past the default 60 s. This test is
                // about order and loss; deadlines have tests of their own.
                req.timeout_ms = Some(300_000);
                let h = tokio::spawn(async move { send(&cl, verb, &req).await });
                // Submit the next one only once the daemon holds this one
                // (queued or running) or answered it: submission order is
                // then arrival order.
                loop {
                    if h.is_finished() {
                        break;
                    }
                    let ops = client.operations(Some(&cid)).await.expect("operations");
                    if ops.iter().any(|o| o.request_id == rid) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
                pending.push(h);
            }
            let mut outcomes = Vec::new();
            for h in pending {
                outcomes.push(h.await.expect("request task"));
            }
            (c, outcomes)
        });
    }
    let mut answered: HashMap<usize, Vec<Got>> = HashMap::new();
    let collect = async {
        while let Some(r) = tasks.join_next().await {
            let (c, outcomes) = r.expect("container task");
            answered.insert(c, outcomes);
        }
    };
    tokio::join!(opener, collect);
    let elapsed = started.elapsed();

    let all = runs(&records);
    let mut by_container: HashMap<&str, Vec<&Run>> = HashMap::new();
    for r in &all {
        by_container
            .entry(r.container.as_str())
            .or_default()
            .push(r);
    }
    for (c, plan) in plans.iter().enumerate() {
        let cid = format!("ord-{c}");
        let (want, want_ran) = simulate(plan);
        // Every answer is the one of a run in submission order.
        assert_eq!(answered[&c], want, "answers of {cid} (plan {plan:?})");
        let mine = by_container.get(cid.as_str()).cloned().unwrap_or_default();
        // Plugins ran for exactly the requests that must run them, in
        // submission order...
        let seqs: Vec<u64> = mine.iter().map(|r| r.seq.expect("SEQ recorded")).collect();
        assert_eq!(seqs, want_ran, "plugin runs of {cid} by start time");
        // ...and never two at once.
        for w in mine.windows(2) {
            assert!(
                w[1].start > w[0].end,
                "{cid}: SEQ {:?} started before SEQ {:?} ended",
                w[1].seq,
                w[0].seq
            );
        }
    }
    // Across containers: overlapping pairs, and the most running at once.
    let mut overlaps = 0u64;
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if b.start >= a.end {
                break;
            }
            if b.container != a.container {
                overlaps += 1;
            }
        }
    }
    let mut events: Vec<(u128, i32)> = all
        .iter()
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut max_parallel) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        max_parallel = max_parallel.max(now);
    }
    let requests = CONTAINERS * PER_CONTAINER;
    println!(
        "ordering: {requests} requests across {CONTAINERS} containers in {:.1}s (seed {seed:#x}); \
         {} plugin runs; per-container overlaps 0; overlapping pairs across containers {overlaps}; \
         max plugins running at once {max_parallel}",
        elapsed.as_secs_f64(),
        all.len()
    );
    assert!(overlaps > 0, "no parallelism across containers observed");
    assert!(max_parallel > 1);
    assert!(
        client.operations(None).await.unwrap().is_empty(),
        "operations left over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_queued_dels_share_one_execution() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    // CHECK holds at a gate, so that the DELs queue behind it.
    let gate = Gate::new(dirs.root());
    dirs.plugin(
        "rec",
        &recording_plugin(
            &records,
            &format!(
                "if [ \"$CNI_COMMAND\" = CHECK ]; then\n{}\nfi",
                gate.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-ord.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = AttachmentRequest::new("co-1", NETNS, "eth0");
    client.add(NET, &req).await.expect("ADD");
    let check = {
        let (c, r) = (client.clone(), req.clone());
        tokio::spawn(async move { c.check(NET, &r).await })
    };
    gate.wait_started(1).await;
    let mut dels = Vec::new();
    for i in 0..4 {
        let (c, r) = (client.with_request_id(&format!("del-{i}")), req.clone());
        dels.push(tokio::spawn(async move { c.del_raw(NET, &r).await }));
        // In order: the next one only once this one waits, i.e. the queued
        // DEL (the first one's) has i + 1 waiters.
        let want = u32::try_from(i + 1).unwrap();
        eventually_async(WAIT, &format!("DEL {i} queued"), || async {
            client
                .operations(Some("co-1"))
                .await
                .unwrap()
                .iter()
                .any(|o| o.verb == "DEL" && o.request_id == "del-0" && o.waiters == want)
        })
        .await;
    }
    // One queued DEL with four waiters, behind the CHECK still running.
    let ops = client.operations(Some("co-1")).await.unwrap();
    let del_ops: Vec<_> = ops.iter().filter(|o| o.verb == "DEL").collect();
    assert_eq!(del_ops.len(), 1, "{ops:?}");
    assert_eq!(del_ops[0].waiters, 4, "{ops:?}");
    assert_eq!(del_ops[0].state, "queued", "{ops:?}");
    assert!(
        ops.iter()
            .any(|o| o.verb == "CHECK" && o.state == "running"),
        "{ops:?}"
    );
    gate.release();
    check.await.unwrap().expect("CHECK");
    let mut coalesced = 0;
    for d in dels {
        let r = d.await.unwrap().expect("DEL");
        assert_eq!(r.status, 204);
        coalesced += usize::from(r.coalesced);
    }
    assert_eq!(coalesced, 3);
    let del_runs = runs(&records)
        .into_iter()
        .filter(|r| r.command == "DEL")
        .count();
    assert_eq!(del_runs, 1, "the four DELs ran the plugin once");
    // A later DEL (nothing queued) runs again: DEL is idempotent, not cached.
    client.del(NET, &req).await.unwrap();
    assert_eq!(
        runs(&records)
            .into_iter()
            .filter(|r| r.command == "DEL")
            .count(),
        2
    );
    let metrics = client.metrics().await.unwrap();
    assert!(
        metrics.contains("cnid_operations_total{verb=\"DEL\",outcome=\"coalesced\"} 3"),
        "{metrics}"
    );
}
