//! Memory (`--only memory`): cnitool's peak RSS for one ADD and DEL (GNU
//! time, see `procs.rs`), and cnid's RSS idle and with 1,000 ADDs in
//! flight (`/proc/PID/status`: `VmRSS` sampled every 5 ms, `VmHWM`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use cnid::api::AttachmentRequest;
use cnid::client::Client;

use crate::Cx;
use crate::chains::{NOOP_NETNS, cnitool_env};
use crate::procs::{PeakSampler, peak_rss_kib, status_kib};
use crate::report::{Table, row, section as md};
use crate::setup::{Daemon, NOOP1, NOOP8, SLOW, SLOW_ADD_MS, Storage};
use crate::spawn::env_set;
use crate::stats::Summary;

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let (tree, runs) = (&cx.tree, cx.n(3, 15));
    let mut t = Table::new(
        "Peak RSS of short-lived processes (GNU time, `%M`)",
        "process|peak RSS KiB, median (min–max)",
    );
    let env = cnitool_env(tree, &tree.cache(Storage::Disk))?;
    let penv = env_set(&[("CNI_COMMAND", "ADD")]);
    let rss = |p: &Path, args: &[&str], env, stdin| peak_rss_kib(p, args, env, stdin, tree.root());
    let cnitool = |net: &str, runs: usize| -> anyhow::Result<[Vec<f64>; 2]> {
        let mut v: [Vec<f64>; 2] = Default::default();
        for _ in 0..runs {
            for (i, verb) in ["add", "del"].into_iter().enumerate() {
                v[i].push(rss(&cx.bins.cnitool, &[verb, net, NOOP_NETNS], &env, None)?);
            }
        }
        Ok(v)
    };
    let ([add1, del1], [add8, _]) = (cnitool(NOOP1, runs)?, cnitool(NOOP8, runs.div_ceil(3))?);
    let (mut noop, mut truth) = (Vec::new(), Vec::new());
    let stdin: &[u8] = br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#;
    for _ in 0..runs.div_ceil(3) {
        noop.push(rss(&tree.bin.join("noop"), &[], &penv, Some(stdin))?);
        truth.push(rss(Path::new("/bin/true"), &[], &penv, None)?);
    }
    cx.findings.put("rss/cnitool/add1", Summary::of(&add1));
    let all: [(&str, &Vec<f64>); 5] = [
        ("cnitool add, noop ×1", &add1),
        ("cnitool del, noop ×1", &del1),
        ("cnitool add, noop ×8", &add8),
        ("cni-noop ADD (for scale)", &noop),
        ("/bin/true (for scale)", &truth),
    ];
    for (what, v) in all {
        row!(t, what, Summary::min_max(v).fmt(1.0, 0));
    }
    t.note(
        "A process's peak RSS includes its largest reaped child's (the noop plugin's is \
         smaller than cnitool's). Not measured through the floor's spawn: with vfork the \
         kernel counts the spawner's RSS in the child's peak.",
    );
    let adds = cx.n(200, 1000);
    let header = format!(
        "configuration|idle after start|idle after 100 requests|{adds} ADDs in flight: highest VmRSS|peak (VmHWM)|running + queued 0.5 s in|time for all"
    );
    let mut d = Table::new("cnid RSS (`/proc/PID/status`)", &header);
    for (tag, extra) in [
        ("mem64", &[][..]),
        ("mem1000", &["--max-parallel", "1000"][..]),
    ] {
        let label = if extra.is_empty() {
            "default (--max-parallel 64)".to_owned()
        } else {
            extra.join(" ")
        };
        let m = cnid_memory(cx, tag, extra, adds)?;
        for (key, i) in [("idle_fresh", 0), ("idle_warm", 1), ("hwm", 3)] {
            cx.findings
                .put(format!("rss/cnid/{tag}/{key}"), Summary::of(&[m[i] as f64]));
        }
        let mib = |i: usize| format!("{:.1} MiB", m[i] as f64 / 1024.0);
        let secs = format!("{:.1} s", m[6] as f64 / 1e3);
        row!(
            d,
            label,
            mib(0),
            mib(1),
            mib(2),
            mib(3),
            format!("{} + {}", m[4], m[5]),
            secs
        );
    }
    d.note(format!(
        "{adds} ADDs for {adds} containers sent at once over {adds} connections to the \
         `bench-slow` network (a noop that sleeps {SLOW_ADD_MS} ms in ADD), so they stay in flight."
    ));
    Ok(Some(md("Memory", "", &[t, d])))
}

/// A cnid with `extra` flags: `VmRSS` half a second after start, after 100
/// requests (50 ADD + DEL), the highest while `adds` ADDs run, `VmHWM`
/// after them (KiB); operations running and queued 0.5 s after they were
/// sent; how long they took (ms).
fn cnid_memory(cx: &Cx, tag: &str, extra: &[&str], adds: usize) -> anyhow::Result<[u64; 7]> {
    let tokio = &cx.tokio;
    let daemon = Daemon::start(&cx.bins.cnid, &cx.tree, Storage::Disk, tag, extra)?;
    std::thread::sleep(Duration::from_millis(500));
    let idle_fresh = daemon.rss_kib()?.0;
    let client = tokio.block_on(Client::connect(&daemon.socket))?;
    // One interface name per attachment: they all share the placeholder
    // netns, and cnid refuses a second container on a (netns, ifname).
    let req = |i: usize, w: &str| {
        AttachmentRequest::new(format!("{tag}-{w}{i}"), NOOP_NETNS, format!("{tag}{w}{i}"))
    };
    for i in 0..50 {
        tokio.block_on(client.add(NOOP1, &req(i, "w")))?;
        tokio.block_on(client.del(NOOP1, &req(i, "w")))?;
    }
    std::thread::sleep(Duration::from_millis(200));
    let (idle_warm, pid) = (daemon.rss_kib()?.0, daemon.pid());
    let sampler = PeakSampler::start(move || status_kib(pid, "VmRSS:"));
    let started = Instant::now();
    let outcome: anyhow::Result<(u64, u64)> = tokio.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..adds {
            let (c, r) = (client.clone(), req(i, "-"));
            set.spawn(async move { c.add(SLOW, &r).await.map(drop) });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let health = client.health().await?;
        let (mut failed, mut first) = (0usize, None);
        while let Some(r) = set.join_next().await {
            if let Err(e) = r
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(Into::into))
            {
                failed += 1;
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e.context(format!("{failed} of {adds} ADDs failed"))),
            None => Ok((health.in_flight, health.queued)),
        }
    });
    let (elapsed, inflight_rss) = (started.elapsed().as_millis() as u64, sampler.stop());
    let (running, queued) = outcome.with_context(|| daemon.log_tail())?;
    Ok([
        idle_fresh,
        idle_warm,
        inflight_rss,
        daemon.rss_kib()?.1,
        running,
        queued,
        elapsed,
    ])
}
