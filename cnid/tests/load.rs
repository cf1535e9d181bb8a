//! Load: thousands of concurrent requests from many clients over many
//! containers, through the real daemon, with a recording fake plugin.
//!
//! Client `k` works on container `k / 2`, interface `eth{k % 2}`, so each
//! container has two clients on two attachments, and a client's requests
//! all concern one attachment. Each client sends its requests one after the
//! other without waiting for answers (only until the daemon holds the
//! previous one), so nearly every request is in the daemon at once. The
//! plugin records every run (verb, container, interface, the request's
//! `SEQ` from `CNI_ARGS`, start and end), and fails ADDs that carry
//! `FAIL=1` with a CNI error (code 100), as a plugin can.
//!
//! Asserted: every answer is the one a run in submission order gives
//! (so the only errors are those the plugin caused, 409 for a second ADD,
//! 404 for a CHECK without ADD); each attachment's runs happened in its
//! client's submission order; no two runs of one container overlapped (its
//! two attachments included); containers ran in parallel. Printed: the
//! request latencies (p50, p99, max) and the daemon's RSS.
//!
//! Size: `SOAK_SCALE=full` (`make soak`) sends 2,000 requests from 200
//! clients over 100 containers (11 to 21 s on 2 busy cores); the default
//! (`make test`) 1,000 from the same clients (5 each);
//! `LOAD_SCALE=CLIENTS,REQUESTS_PER_CLIENT` sets any size.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, raise_nofile};
use cnid::api::AttachmentRequest;
use cnid::client::{Client, ClientError};
use serde_json::json;

const NET: &str = "load";

#[derive(Debug, Clone, Copy)]
struct Scale {
    clients: usize,
    per_client: usize,
}

fn scale() -> Scale {
    let Ok(v) = std::env::var("LOAD_SCALE") else {
        let full = std::env::var("SOAK_SCALE").is_ok_and(|s| s == "full");
        return Scale {
            clients: 200,
            per_client: if full { 10 } else { 5 },
        };
    };
    let n: Vec<usize> = v
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("bad LOAD_SCALE {v:?}"))
        })
        .collect();
    assert!(
        n.len() == 2 && n[0] >= 2 && n[0].is_multiple_of(2) && n[1] > 0,
        "LOAD_SCALE is CLIENTS,REQUESTS_PER_CLIENT with an even number of clients (got {v:?})"
    );
    Scale {
        clients: n[0],
        per_client: n[1],
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Add,
    /// An ADD the plugin fails (CNI code 100).
    AddFailing,
    Del,
    Check,
}

/// An answer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Ok,
    /// HTTP status and CNI code.
    Error(u16, u32),
    /// No answer at all.
    Lost(String),
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// The answers a run in submission order gives, and the SEQs of the
/// plugin runs it makes, in order (a failing ADD runs ADD, then the
/// rollback's DEL).
fn simulate(plan: &[Verb]) -> (Vec<Got>, Vec<(String, u64)>) {
    let mut attached = false;
    let mut answers = Vec::new();
    let mut runs = Vec::new();
    for (k, v) in plan.iter().enumerate() {
        let k = k as u64;
        match v {
            Verb::Add | Verb::AddFailing if attached => answers.push(Got::Error(409, 909)),
            Verb::Add => {
                attached = true;
                answers.push(Got::Ok);
                runs.push(("ADD".into(), k));
            }
            Verb::AddFailing => {
                answers.push(Got::Error(502, 100));
                runs.push(("ADD".into(), k));
                runs.push(("DEL".into(), k));
            }
            Verb::Del => {
                attached = false;
                answers.push(Got::Ok);
                runs.push(("DEL".into(), k));
            }
            Verb::Check if attached => {
                answers.push(Got::Ok);
                runs.push(("CHECK".into(), k));
            }
            Verb::Check => answers.push(Got::Error(404, 3)),
        }
    }
    (answers, runs)
}

/// The recording plugin: one file per run under `records`.
fn recorder(records: &Path) -> String {
    format!(
        r#"s=$(date +%s%N)
seq=-
case ";$CNI_ARGS;" in *";SEQ="*) seq=${{CNI_ARGS#*SEQ=}}; seq=${{seq%%;*}};; esac
out=
code=0
case "$CNI_COMMAND" in
ADD) case ";$CNI_ARGS;" in
     *";FAIL=1;"*) out='{{"cniVersion":"1.0.0","code":100,"msg":"told to fail"}}'; code=1;;
     *) out='{{"cniVersion":"1.0.0","ips":[{{"address":"10.99.0.2/24"}}]}}';;
     esac;;
VERSION) printf '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}'; exit 0;;
esac
e=$(date +%s%N)
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME $seq $s $e" > "{dir}/$$.$s"
printf '%s' "$out"
exit $code
"#,
        dir = records.display()
    )
}

#[derive(Debug, Clone)]
struct Run {
    command: String,
    container: String,
    ifname: String,
    seq: u64,
    start: u128,
    end: u128,
}

fn runs(records: &Path) -> Vec<Run> {
    let mut out: Vec<Run> = std::fs::read_dir(records)
        .expect("records dir")
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let f: Vec<&str> = text.split_whitespace().collect();
            (f.len() == 6).then(|| Run {
                command: f[0].to_owned(),
                container: f[1].to_owned(),
                ifname: f[2].to_owned(),
                seq: f[3].parse().expect("SEQ"),
                start: f[4].parse().expect("start"),
                end: f[5].parse().expect("end"),
            })
        })
        .collect();
    out.sort_by_key(|r| (r.start, r.end));
    out
}

fn got<T>(r: Result<T, ClientError>) -> Got {
    match r {
        Ok(_) => Got::Ok,
        Err(ClientError::Api { status, error, .. }) => Got::Error(status, error.code),
        Err(e) => Got::Lost(e.to_string()),
    }
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
fn rss_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_requests_keep_order_and_lose_nothing() {
    let scale = scale();
    let containers = scale.clients / 2;
    let requests = scale.clients * scale.per_client;
    raise_nofile();
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).expect("records dir");
    dirs.plugin("rec", &recorder(&records));
    dirs.conf(
        "10-load.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let (rss_idle, _) = rss_kib(daemon.pid());

    let seed = 0x10ad_5eed_u64;
    let mut rng = Rng(seed);
    let plans: Vec<Vec<Verb>> = (0..scale.clients)
        .map(|_| {
            (0..scale.per_client)
                .map(|_| match rng.next() % 20 {
                    0..=7 => Verb::Add,
                    8 => Verb::AddFailing,
                    9..=14 => Verb::Del,
                    _ => Verb::Check,
                })
                .collect()
        })
        .collect();

    // One client (its own connections) per attachment.
    let mut clients = Vec::with_capacity(scale.clients);
    for _ in 0..scale.clients {
        clients.push(Client::connect(&daemon.socket).await.expect("connect"));
    }
    let poller = Client::connect(&daemon.socket).await.expect("connect");

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (k, plan) in plans.iter().cloned().enumerate() {
        let client = clients[k].clone();
        let poller = poller.clone();
        // Each container on a netns path of its own (its two interfaces
        // share it): the daemon refuses a request on another attached
        // container's netns and ifname.
        let netns = dirs.netns(&format!("load-{}", k / 2));
        tasks.spawn(async move {
            let (cid, ifname) = (format!("load-{}", k / 2), format!("eth{}", k % 2));
            let mut pending = Vec::new();
            for (seq, verb) in plan.into_iter().enumerate() {
                let rid = format!("{cid}-{ifname}-{seq}");
                let cl = client.with_request_id(&rid);
                let mut req = AttachmentRequest::new(&cid, &netns, &ifname);
                req.cni_args = format!("SEQ={seq}");
                // The daemon's longest deadline: queueing counts against a request's
                // deadline, and on a loaded machine the last of a container's
                // queued requests can wait past the default 60 s. This test is
                // about order and loss; deadlines have tests of their own.
                req.timeout_ms = Some(300_000);
                if verb == Verb::AddFailing {
                    req.cni_args.push_str(";FAIL=1");
                }
                let h = tokio::spawn(async move {
                    let t = Instant::now();
                    let g = match verb {
                        Verb::Add | Verb::AddFailing => got(cl.add(NET, &req).await),
                        Verb::Del => got(cl.del(NET, &req).await),
                        Verb::Check => got(cl.check(NET, &req).await),
                    };
                    (g, t.elapsed())
                });
                // The next one only once the daemon holds this one: the
                // submission order is then the arrival order.
                let mut pause = Duration::from_micros(200);
                loop {
                    if h.is_finished() {
                        break;
                    }
                    let ops = poller.operations(Some(&cid)).await.expect("operations");
                    if ops.iter().any(|o| o.request_id == rid) {
                        break;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                pending.push(h);
            }
            let mut answers = Vec::new();
            for h in pending {
                answers.push(h.await.expect("request task"));
            }
            (k, answers)
        });
    }
    // The daemon's memory while everything is queued.
    let mut rss_busy = 0;
    let mut answered: HashMap<usize, Vec<(Got, Duration)>> = HashMap::new();
    loop {
        tokio::select! {
            r = tasks.join_next() => match r {
                Some(r) => {
                    let (k, a) = r.expect("client task");
                    answered.insert(k, a);
                }
                None => break,
            },
            () = tokio::time::sleep(Duration::from_millis(100)) => {
                rss_busy = rss_busy.max(rss_kib(daemon.pid()).0);
            }
        }
    }
    let elapsed = started.elapsed();
    let (rss_end, rss_peak) = rss_kib(daemon.pid());

    // Answers: exactly those of a run in submission order.
    let mut mismatches = Vec::new();
    let mut latencies = Vec::with_capacity(requests);
    let mut plugin_errors = 0;
    for (k, plan) in plans.iter().enumerate() {
        let (want, _) = simulate(plan);
        let got: Vec<Got> = answered[&k].iter().map(|(g, _)| g.clone()).collect();
        latencies.extend(answered[&k].iter().map(|(_, d)| *d));
        plugin_errors += got.iter().filter(|g| **g == Got::Error(502, 100)).count();
        if got != want {
            mismatches.push(format!(
                "client {k} (plan {plan:?}): got {got:?}, want {want:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} client(s) got answers no run in submission order gives:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );

    // Runs: in submission order per attachment, never overlapping per container.
    let all = runs(&records);
    let mut by_attachment: HashMap<(String, String), Vec<(String, u64)>> = HashMap::new();
    let mut by_container: HashMap<&str, Vec<&Run>> = HashMap::new();
    for r in &all {
        by_attachment
            .entry((r.container.clone(), r.ifname.clone()))
            .or_default()
            .push((r.command.clone(), r.seq));
        by_container
            .entry(r.container.as_str())
            .or_default()
            .push(r);
    }
    for (k, plan) in plans.iter().enumerate() {
        let key = (format!("load-{}", k / 2), format!("eth{}", k % 2));
        let (_, want) = simulate(plan);
        let got = by_attachment.get(&key).cloned().unwrap_or_default();
        assert_eq!(got, want, "plugin runs of {key:?} by start time");
    }
    let mut overlaps_within = 0;
    for (c, rs) in &by_container {
        for w in rs.windows(2) {
            if w[1].start <= w[0].end {
                overlaps_within += 1;
                eprintln!("{c}: {:?} overlaps {:?}", w[1], w[0]);
            }
        }
    }
    assert_eq!(overlaps_within, 0, "runs of one container overlapped");
    let mut events: Vec<(u128, i32)> = all
        .iter()
        .flat_map(|r| [(r.start, 1), (r.end, -1)])
        .collect();
    events.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    assert!(most > 1, "containers never ran in parallel");

    // Where the time went, from the daemon's own histograms.
    let metrics = poller.metrics().await.expect("metrics");
    let mean_ms = |name: &str| {
        let total = |suffix: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| l.starts_with(&format!("{name}_{suffix}{{")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        1e3 * total("sum") / total("count").max(1.0)
    };
    let (running_ms, queued_ms) = (
        mean_ms("cnid_operation_duration_seconds"),
        mean_ms("cnid_operation_queue_seconds"),
    );
    latencies.sort();
    println!(
        "load: {requests} requests from {} clients over {containers} containers in {:.1}s \
         ({:.0} requests/s); {} plugin runs, at most {most} at once; errors: {plugin_errors} \
         caused by the plugin, 0 others; per-container overlaps 0",
        scale.clients,
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64(),
        all.len()
    );
    println!(
        "load: latency p50 {} ms, p99 {} ms, max {} ms (per operation: {queued_ms:.0} ms queued \
         behind its container, {running_ms:.1} ms running, means); daemon RSS idle {} KiB, \
         busy {} KiB, after {} KiB, peak {} KiB",
        percentile(&latencies, 0.50).as_millis(),
        percentile(&latencies, 0.99).as_millis(),
        latencies.last().map_or(0, Duration::as_millis),
        rss_idle,
        rss_busy,
        rss_end,
        rss_peak
    );
    assert!(
        poller
            .operations(None)
            .await
            .expect("operations")
            .is_empty(),
        "operations left over"
    );
}
