//! Memory: cnitool's peak RSS for one ADD, cnid's RSS idle and with 1,000
//! ADDs in flight.
//!
//! Peak RSS of a short-lived process is `ru_maxrss` from `/usr/bin/time`
//! (GNU time forks, so the figure starts from time's own small RSS). Never
//! from a vfork-based spawn (`posix_spawn`): the kernel then folds the
//! spawner's RSS at exec time into the child's `ru_maxrss`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use tokio::runtime::Runtime;

use crate::chains::{NOOP_NETNS, cnitool_env};
use crate::setup::{Bins, Daemon, NOOP1, SLOW, Storage, Tree};

pub(crate) const GNU_TIME: &str = "/usr/bin/time";

/// Peak RSS in KiB of `program args` with exactly `env`, via GNU time.
pub(crate) fn peak_rss_kib(
    program: &Path,
    args: &[&str],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    stdin: Option<&[u8]>,
    scratch: &Path,
) -> anyhow::Result<u64> {
    let out_file = scratch.join("time.out");
    let mut child = Command::new(GNU_TIME)
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&out_file)
        .arg(program)
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {GNU_TIME} (apt-get install time)"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(data)?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read_to_string(&out_file)?;
    text.lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("no RSS figure in {text:?}"))
}

/// Peak RSS samples (KiB) of `cnitool add` and `cnitool del` on `network`.
pub(crate) fn cnitool_rss(
    bins: &Bins,
    tree: &Tree,
    network: &str,
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let cni_path = std::env::join_paths(&tree.plugin_dirs)?;
    let env = cnitool_env(tree, &cni_path, &tree.cache(Storage::Disk));
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        add.push(peak_rss_kib(
            &bins.cnitool,
            &["add", network, NOOP_NETNS],
            &env,
            None,
            tree.root(),
        )? as f64);
        del.push(peak_rss_kib(
            &bins.cnitool,
            &["del", network, NOOP_NETNS],
            &env,
            None,
            tree.root(),
        )? as f64);
    }
    Ok((add, del))
}

/// Peak RSS samples (KiB) of a plugin ADD of cni-noop and of `/bin/true`,
/// for scale.
pub(crate) fn reference_rss(tree: &Tree, runs: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let env: Vec<_> = crate::spawn::env_with(&[("CNI_COMMAND", Some("ADD".as_ref()))]);
    let stdin = br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#;
    let (mut noop, mut truth) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        noop.push(
            peak_rss_kib(&tree.bin.join("noop"), &[], &env, Some(stdin), tree.root())? as f64,
        );
        truth.push(peak_rss_kib(Path::new("/bin/true"), &[], &env, None, tree.root())? as f64);
    }
    Ok((noop, truth))
}

/// cnid's memory, in KiB.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CnidMemory {
    /// `VmRSS` half a second after start, before any request.
    pub(crate) idle_fresh: u64,
    /// `VmRSS` after 100 requests (50 ADD + DEL), idle again.
    pub(crate) idle_warm: u64,
    /// The highest `VmRSS` sampled (every 5 ms) while the 1,000 ADDs ran.
    pub(crate) inflight_rss: u64,
    /// `VmHWM` (peak RSS) after they all finished.
    pub(crate) inflight_hwm: u64,
    /// Operations running and queued, 500 ms after the ADDs were sent.
    pub(crate) running: u64,
    pub(crate) queued: u64,
    /// How long the 1,000 ADDs took.
    pub(crate) elapsed: Duration,
}

/// Starts a daemon with `extra` flags and measures it.
pub(crate) fn cnid_memory(
    bins: &Bins,
    tree: &Tree,
    tokio: &Runtime,
    tag: &str,
    extra: &[&str],
    adds: usize,
) -> anyhow::Result<CnidMemory> {
    let daemon = Daemon::start(bins, tree, Storage::Disk, tag, extra)?;
    std::thread::sleep(Duration::from_millis(500));
    let idle_fresh = daemon.rss_kib()?.0;
    let client = tokio.block_on(Client::connect(&daemon.socket))?;
    for i in 0..50 {
        // One interface name per attachment: they all share the placeholder
        // netns, and cnid refuses a second container on a (netns, ifname).
        let req =
            AttachmentRequest::new(format!("{tag}-warm-{i}"), NOOP_NETNS, format!("{tag}w{i}"));
        tokio.block_on(client.add(NOOP1, &req))?;
        tokio.block_on(client.del(NOOP1, &req))?;
    }
    std::thread::sleep(Duration::from_millis(200));
    let idle_warm = daemon.rss_kib()?.0;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let status = format!("/proc/{}/status", daemon.pid());
        std::thread::spawn(move || {
            let mut max = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(&status)
                    && let Some(v) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                {
                    max = max.max(v);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            max
        })
    };
    let started = Instant::now();
    let outcome: anyhow::Result<(u64, u64)> = tokio.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..adds {
            let c = client.clone();
            let tag = tag.to_owned();
            set.spawn(async move {
                let req =
                    AttachmentRequest::new(format!("{tag}-{i}"), NOOP_NETNS, format!("{tag}-{i}"));
                c.add(SLOW, &req).await.map(drop)
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let health = client.health().await?;
        let mut failed = 0usize;
        let mut first = None;
        while let Some(r) = set.join_next().await {
            if let Err(e) = r
                .map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(Into::into))
            {
                failed += 1;
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            return Err(e.context(format!("{failed} of {adds} ADDs failed")));
        }
        Ok((health.in_flight, health.queued))
    });
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let inflight_rss = sampler.join().unwrap_or(0);
    let (running, queued) = outcome.with_context(|| daemon.log_tail())?;
    let inflight_hwm = daemon.rss_kib()?.1;
    Ok(CnidMemory {
        idle_fresh,
        idle_warm,
        inflight_rss,
        inflight_hwm,
        running,
        queued,
        elapsed,
    })
}
