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
use crate::spawn::env_with;
use crate::stats::Summary;

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let (tree, runs) = (&cx.tree, cx.sizes.rss_runs);
    let mut t = Table::new(
        "Peak RSS of short-lived processes (GNU time, `%M`)",
        &["process", "peak RSS KiB, median (min–max)"],
    );
    let env = cnitool_env(tree, &tree.cache(Storage::Disk))?;
    let cnitool = |network: &str, runs: usize| -> anyhow::Result<[Vec<f64>; 2]> {
        let mut v: [Vec<f64>; 2] = Default::default();
        for _ in 0..runs {
            for (i, verb) in ["add", "del"].into_iter().enumerate() {
                let args = [verb, network, NOOP_NETNS];
                v[i].push(peak_rss_kib(
                    &cx.bins.cnitool,
                    &args,
                    &env,
                    None,
                    tree.root(),
                )?);
            }
        }
        Ok(v)
    };
    let [add1, del1] = cnitool(NOOP1, runs)?;
    let [add8, _] = cnitool(NOOP8, runs.div_ceil(3))?;
    let penv = env_with(&[("CNI_COMMAND", Some("ADD".as_ref()))]);
    let stdin: &[u8] = br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#;
    let (mut noop, mut truth) = (Vec::new(), Vec::new());
    let rss = |p: &Path, stdin| peak_rss_kib(p, &[], &penv, stdin, tree.root());
    for _ in 0..runs.div_ceil(3) {
        noop.push(rss(&tree.bin.join("noop"), Some(stdin))?);
        truth.push(rss(Path::new("/bin/true"), None)?);
    }
    cx.findings.put("rss/cnitool/add1", Summary::of(&add1));
    for (what, v) in [
        ("cnitool add, noop ×1", &add1),
        ("cnitool del, noop ×1", &del1),
        ("cnitool add, noop ×8", &add8),
        ("cni-noop ADD (for scale)", &noop),
        ("/bin/true (for scale)", &truth),
    ] {
        row!(t, what, Summary::min_max(v).fmt(1.0, 0));
    }
    t.note(
        "A process's peak RSS includes its largest reaped child's (the noop plugin's is \
         smaller than cnitool's). Not measured through the floor's spawn: with vfork the \
         kernel counts the spawner's RSS in the child's peak.",
    );
    let adds = cx.sizes.inflight;
    let mut d = Table::new(
        "cnid RSS (`/proc/PID/status`)",
        &[
            "configuration",
            "idle after start",
            "idle after 100 requests",
            &format!("{adds} ADDs in flight: highest VmRSS"),
            "peak (VmHWM)",
            "running + queued 0.5 s in",
            "time for all",
        ],
    );
    let more = ["--max-parallel", "1000"];
    for (tag, extra) in [("mem64", &[][..]), ("mem1000", &more[..])] {
        let label = match extra {
            [] => "default (--max-parallel 64)".to_owned(),
            _ => extra.join(" "),
        };
        let m = cnid_memory(cx, tag, extra, adds)?;
        for (key, i) in [("idle_fresh", 0), ("idle_warm", 1), ("hwm", 3)] {
            let s = Summary::of(&[m[i] as f64]);
            cx.findings.put(format!("rss/cnid/{tag}/{key}"), s);
        }
        let mib = |k: u64| format!("{:.1} MiB", k as f64 / 1024.0);
        let secs = format!("{:.1} s", m[6] as f64 / 1e3);
        row!(
            d,
            label,
            mib(m[0]),
            mib(m[1]),
            mib(m[2]),
            mib(m[3]),
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
    let daemon = Daemon::start(&cx.bins, &cx.tree, Storage::Disk, tag, extra)?;
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
    let idle_warm = daemon.rss_kib()?.0;
    let pid = daemon.pid();
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
    let elapsed = started.elapsed().as_millis() as u64;
    let inflight_rss = sampler.stop();
    let (running, queued) = outcome.with_context(|| daemon.log_tail())?;
    let hwm = daemon.rss_kib()?.1;
    let (fresh, warm, peak) = (idle_fresh, idle_warm, inflight_rss);
    Ok([fresh, warm, peak, hwm, running, queued, elapsed])
}
