//! Node scale (`--only scale`): cnid with 0, 1,000 and 10,000 attachments
//! in its cache and ADD journal (as after a `kill -9` of a cnid that made
//! them within the last 30 s: one `commit` line per record, this boot's).
//! The runs per size are the report's own text, [`INTRO`], and its
//! table's note (how CPU and the admission are read).
//!
//! With `--scale-baseline CNID` the same runs alternate, per size, with
//! that cnid binary (a build before a change): one paired run.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;
use cnid::api::{AttachmentRequest, GcRequest};
use cnid::client::Client;

use crate::Cx;
use crate::chains::NOOP_NETNS;
use crate::procs::{metrics, threads_cpu_ns};
use crate::report::{Table, row, section as md};
use crate::setup::{Daemon, NOOP1, Tree};
use crate::stats::Summary;

/// The goals: at 10,000 attachments, and the admission at any size.
pub(crate) const READY_GOAL_S: f64 = 1.0;
pub(crate) const RSS_GOAL_MIB: f64 = 64.0;
pub(crate) const ADMISSION_GOAL_MS: f64 = 0.1;

/// The largest size: the goals are judged there.
pub(crate) const LARGEST: usize = 10_000;

const INTRO: &str = "Per size N: N `cniCacheV1` records of `bench-noop1` in a fresh cache \
dir and a commit line for each in cnid's ADD journal (as a `kill -9` would leave them within 30 s of the ADDs; start-up \
flushes their records, then empties the journal), each on its own netns path, which does not \
exist (`--stale-after 0`: the reaper leaves them). cnid is spawned and `GET /v1/health/ready` \
polled every 1 ms; then ADD+DEL of fresh containers, a full paging of `GET /v1/attachments`, \
a restart (SIGTERM, then a start from the cache alone), and at the largest N a GC of the network \
with no valid attachments (every cached one is deleted, noop plugin).";

/// One cnid's figures at one size: start to ready with the journal and
/// from the cache alone; RSS and HWM (KiB); cnid CPU per ADD+DEL
/// (seconds); the ADDs' admission from `/metrics` (mean seconds, share
/// within [`ADMISSION_GOAL_MS`]; `None` for a cnid without the metric); ADD
/// wall times (seconds); full paging by 100 and 1,000; the GC and what it
/// deleted.
struct Run {
    ready: [Duration; 2],
    rss: (u64, u64),
    cpu_per_op: f64,
    admission: Option<(f64, f64)>,
    add: Vec<f64>,
    paging: [Duration; 2],
    gc: Option<(Duration, usize)>,
}

/// Writes `n` records of [`NOOP1`] into `cache` and a commit line for each
/// into `state`'s journal.
fn populate(tree: &Tree, cache: &Path, state: &Path, n: usize) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let (results, intents) = (cache.join("results"), state.join("intents"));
    for d in [&results, &intents] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)?;
    }
    let config = std::fs::read(tree.conf.join("10-noop1.conflist"))?;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned();
    let result = serde_json::json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]});
    let mut journal = Vec::new();
    for i in 0..n {
        let cid = format!("scale{i:05}");
        let rt = RuntimeConf::new(&cid, format!("/run/netns/cnb-scale-{i}"), "eth0");
        let bytes = CacheRecord::new(NOOP1, &rt, config.clone(), Some(result.clone())).encode();
        std::fs::write(
            results.join(cni_core::cache::file_name(NOOP1, &cid, "eth0")?),
            &bytes,
        )?;
        let record = base64::engine::general_purpose::STANDARD.encode(&bytes);
        journal.extend(serde_json::to_vec(
            &serde_json::json!({"end": i + 1, "boot": boot, "record": record}),
        )?);
        journal.push(b'\n');
    }
    std::fs::write(intents.join("journal"), journal)?;
    // As after the writes reached the disk: start-up's flushes are its own.
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    Ok(())
}

/// `GET /v1/health/ready`'s status, or `None` when cnid does not answer.
fn ready_status(socket: &Path) -> Option<u16> {
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.write_all(b"GET /v1/health/ready HTTP/1.1\r\nHost: cnid\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Starts cnid and waits for readiness: the time from spawn to 200.
fn start_ready(
    cx: &Cx,
    cnid: &Path,
    cache: &Path,
    state: &Path,
    tag: &str,
) -> anyhow::Result<(Daemon, Duration)> {
    let t = Instant::now();
    let extra = ["--stale-after", "0", "--max-timeout", "10m"];
    let d = Daemon::spawn(cnid, &cx.tree, cache, state, tag, &extra)?;
    while ready_status(&d.socket) != Some(200) {
        if t.elapsed() > Duration::from_secs(120) {
            bail!("cnid not ready after 120 s: {}", d.log_tail());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok((d, t.elapsed()))
}

/// The ADDs' admission between two `/metrics` texts: mean seconds and
/// the share within [`ADMISSION_GOAL_MS`] (its `le="0.0001"` bucket, as
/// cnid writes it); `None` when cnid has no such metric or no new ADD.
fn admission_between(before: &str, after: &str) -> Option<(f64, f64)> {
    let get = |text: &str| {
        let m = metrics(text);
        let v = |s: &str| {
            m.get(&format!("cnid_admission_duration_seconds{s}"))
                .copied()
        };
        Some((
            v("_sum{verb=\"ADD\"}")?,
            v("_count{verb=\"ADD\"}")?,
            v("_bucket{verb=\"ADD\",le=\"0.0001\"}")?,
        ))
    };
    let ((s0, n0, g0), (s1, n1, g1)) = (get(before)?, get(after)?);
    let n = n1 - n0;
    (n > 0.0).then(|| ((s1 - s0) / n, (g1 - g0) / n))
}

/// A check of the `/metrics` arithmetic above, run by `cargo test`.
pub(crate) fn self_check() -> Result<(), String> {
    let text = |sum: f64, count: u32, within: u32| {
        format!(
            "cnid_admission_duration_seconds_bucket{{verb=\"ADD\",le=\"0.00005\"}} 0\n\
             cnid_admission_duration_seconds_bucket{{verb=\"ADD\",le=\"0.0001\"}} {within}\n\
             cnid_admission_duration_seconds_sum{{verb=\"ADD\"}} {sum}\n\
             cnid_admission_duration_seconds_count{{verb=\"ADD\"}} {count}\n\
             cnid_admission_duration_seconds_sum{{verb=\"DEL\"}} 9\n"
        )
    };
    let got = admission_between(&text(0.001, 10, 10), &text(0.005, 50, 40));
    let ok = got.is_some_and(|(mean, within)| {
        (mean - 0.0001).abs() < 1e-12 && (within - 0.75).abs() < 1e-12
    }) && admission_between("", &text(1.0, 1, 1)).is_none()
        && admission_between(&text(1.0, 1, 1), &text(1.0, 1, 1)).is_none();
    ok.then_some(())
        .ok_or(format!("scale self-check failed: {got:?}"))
}

/// Pages through all attachments `limit` at a time; how many there are.
async fn page_all(client: &Client, limit: Option<usize>) -> anyhow::Result<usize> {
    let (mut n, mut after) = (0, None);
    loop {
        let p = client
            .attachments_page(None, after.as_deref(), limit)
            .await?;
        n += p.attachments.len();
        match p.next {
            Some(next) => after = Some(next),
            None => return Ok(n),
        }
    }
}

fn run_one(
    cx: &Cx,
    cnid: &Path,
    n: usize,
    probes: usize,
    gc: bool,
    tag: &str,
) -> anyhow::Result<Run> {
    let (tokio, dir) = (&cx.tokio, cx.tree.root().join(format!("scale-{tag}")));
    let _ = std::fs::remove_dir_all(&dir);
    let (cache, state) = (dir.join("cache"), dir.join("state"));
    populate(&cx.tree, &cache, &state, n)?;
    let (daemon, ready_journal) = start_ready(cx, cnid, &cache, &state, tag)?;
    std::thread::sleep(Duration::from_millis(300));
    let rss = daemon.rss_kib()?;
    let client = tokio.block_on(Client::connect(&daemon.socket))?;
    let probe = |j: usize| AttachmentRequest::new(format!("probe{j}"), NOOP_NETNS, "eth0");
    // Warm-up (the first requests start pool threads).
    for j in 0..5 {
        tokio.block_on(client.add(NOOP1, &probe(j)))?;
        tokio.block_on(client.del(NOOP1, &probe(j)))?;
    }
    let (metrics0, cpu0) = (
        tokio.block_on(client.metrics())?,
        threads_cpu_ns(daemon.pid())?,
    );
    let mut add = Vec::with_capacity(probes);
    for j in 0..probes {
        let (req, t) = (probe(j + 5), Instant::now());
        tokio
            .block_on(client.add(NOOP1, &req))
            .with_context(|| daemon.log_tail())?;
        add.push(t.elapsed().as_secs_f64());
        tokio.block_on(client.del(NOOP1, &req))?;
    }
    let cpu_per_op = (threads_cpu_ns(daemon.pid())? - cpu0) as f64 / 1e9 / probes as f64;
    let admission = admission_between(&metrics0, &tokio.block_on(client.metrics())?);
    let mut paging = [Duration::ZERO; 2];
    for (i, limit) in [None, Some(1000)].into_iter().enumerate() {
        let t = Instant::now();
        let listed = tokio.block_on(page_all(&client, limit))?;
        paging[i] = t.elapsed();
        anyhow::ensure!(
            listed == n,
            "paging by {limit:?} listed {listed} attachments of {n}"
        );
    }
    drop((client, daemon));
    let (daemon, ready_cache) = start_ready(cx, cnid, &cache, &state, tag)?;
    let gc = gc.then(|| -> anyhow::Result<_> {
        let client = tokio.block_on(Client::connect(&daemon.socket))?;
        let (req, t) = (
            GcRequest {
                valid_attachments: Vec::new(),
                timeout_ms: Some(600_000),
            },
            Instant::now(),
        );
        let r = tokio
            .block_on(client.gc(NOOP1, &req))
            .with_context(|| daemon.log_tail())?;
        Ok((t.elapsed(), r.deleted.len()))
    });
    let gc = gc.transpose()?;
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Run {
        ready: [ready_journal, ready_cache],
        rss,
        cpu_per_op,
        admission,
        add,
        paging,
        gc,
    })
}

/// The section; `--scale-baseline`: another cnid binary run alongside.
pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let sizes: &[usize] = if cx.args.quick {
        &[0, 1000]
    } else {
        &[0, 1000, LARGEST]
    };
    let probes = cx.n(30, 200);
    let baseline = cx
        .args
        .scale_baseline
        .iter()
        .map(|b| ("baseline", b.clone()));
    let builds: Vec<(&str, _)> = baseline
        .chain([("this build", cx.bins.cnid.clone())])
        .collect();
    let title = "cnid with N attachments in its cache and ADD journal (cache and state on disk)";
    let header = "cnid|N|start to ready, with journal / cache only|RSS idle (VmRSS / VmHWM)|cnid CPU per ADD+DEL|admission: CPU over N = 0|admission per ADD, measured (mean; share ≤ 0.1 ms)|ADD, median (p10–p90)|full paging, pages of 100 / 1,000|GC, all N stale";
    let mut t = Table::new(title, header);
    let mut cpu_at_zero: Vec<f64> = vec![f64::NAN; builds.len()];
    for &n in sizes {
        for (b, (label, cnid)) in builds.iter().enumerate() {
            eprintln!("overhead: scale, {label}, {n} attachments");
            let gc = n == *sizes.last().unwrap_or(&0);
            let r = run_one(cx, cnid, n, probes, gc, &format!("s{n}-{b}"))?;
            if n == 0 {
                cpu_at_zero[b] = r.cpu_per_op;
            }
            let over_zero = r.cpu_per_op - cpu_at_zero[b];
            let (mib, ms) = (
                |k: u64| k as f64 / 1024.0,
                |d: Duration| d.as_secs_f64() * 1e3,
            );
            if b == builds.len() - 1 {
                let mut put = |what: &str, v: f64| {
                    cx.findings
                        .put(format!("scale/{what}/{n}"), Summary::of(&[v]))
                };
                put("ready", r.ready[0].as_secs_f64());
                put("ready_cache", r.ready[1].as_secs_f64());
                put("rss", mib(r.rss.0));
                put("cpu_over_zero", over_zero);
                if let Some((mean, within)) = r.admission {
                    put("admission", mean);
                    put("admission_within", within);
                }
            }
            let over = if n == 0 {
                "–".into()
            } else {
                format!("{:+.2} ms", over_zero * 1e3)
            };
            let admission = r.admission.map_or("– (no metric)".into(), |(m, w)| {
                format!("{:.3} ms; {:.0}%", m * 1e3, w * 100.0)
            });
            let gc = r.gc.map_or("–".into(), |(d, k)| {
                format!("{:.1} s ({k} deleted)", d.as_secs_f64())
            });
            let ready = format!("{:.0} / {:.0} ms", ms(r.ready[0]), ms(r.ready[1]));
            let rss = format!("{:.1} / {:.1} MiB", mib(r.rss.0), mib(r.rss.1));
            let (cpu, add) = (
                format!("{:.2} ms", r.cpu_per_op * 1e3),
                format!("{} ms", Summary::of(&r.add).fmt(1e3, 2)),
            );
            let paging = format!("{:.0} / {:.0} ms", ms(r.paging[0]), ms(r.paging[1]));
            row!(
                t, label, n, ready, rss, cpu, over, admission, add, paging, gc
            );
        }
    }
    t.note(format!(
        "{probes} ADD+DEL pairs of fresh containers per size (noop ×1, `{NOOP_NETNS}`), after 5 \
         for warm-up; CPU is the sum of cnid's threads' run time (`/proc/PID/task/*/schedstat`) \
         over them; the measured admission is cnid's `cnid_admission_duration_seconds{{verb=\"ADD\"}}` \
         (wall time of `Engine::admit`) over the same ADDs. Goals (at {LARGEST}): \
         ready ≤ {READY_GOAL_S} s, RSS ≤ {RSS_GOAL_MIB} MiB, admission ≤ {ADMISSION_GOAL_MS} ms \
         at any size."
    ));
    Ok(Some(md(
        "Node scale: cnid with 10,000 attachments",
        INTRO,
        &[t],
    )))
}
