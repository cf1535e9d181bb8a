//! What other processes cost: peak RSS through GNU time, `/proc` fields
//! (RSS, CPU), a sampler of a running process's peak, and cnid's
//! `/metrics` histograms.
//!
//! # Caveats
//!
//! - Peak RSS of a short-lived process is `ru_maxrss` from `/usr/bin/time`
//!   (GNU time forks, so the figure starts from time's own small RSS), and
//!   includes its largest reaped child's. Never from a vfork-based spawn
//!   (`posix_spawn`): the kernel then folds the spawner's RSS at exec time
//!   into the child's `ru_maxrss`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::spawn::Env;

/// A run under GNU time: wall time, `%M` (KiB), the highest `VmHWM` of the
/// program itself sampled every 5 ms (KiB), stdout.
pub(crate) struct Timed(
    pub(crate) Duration,
    pub(crate) u64,
    pub(crate) u64,
    pub(crate) Vec<u8>,
);

/// Runs `program args` with exactly `env` under GNU time, in `scratch`.
pub(crate) fn gnu_time(
    program: &Path,
    args: &[&str],
    env: &Env,
    stdin: Option<&[u8]>,
    scratch: &Path,
) -> anyhow::Result<Timed> {
    let out_file = scratch.join("time.out");
    let started = Instant::now();
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%M", "-o"])
        .arg(&out_file)
        .arg(program)
        .args(args)
        .env_clear()
        .envs(env.iter().cloned());
    let input = if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    let child = cmd
        .stdin(input)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = child.context("running /usr/bin/time (apt-get install time)")?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data)?;
    }
    // GNU time's child is the program.
    let children = format!("/proc/{0}/task/{0}/children", child.id());
    let sampler = PeakSampler::start(move || {
        let pid = std::fs::read_to_string(&children).ok()?;
        status_kib(pid.split_whitespace().next()?.parse().ok()?, "VmHWM:")
    });
    let out = child.wait_with_output();
    let (wall, hwm, out) = (started.elapsed(), sampler.stop(), out?);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            err.trim()
        );
    }
    let text = std::fs::read_to_string(&out_file)?;
    let max_rss = text.lines().rev().find_map(|l| l.trim().parse().ok());
    Ok(Timed(
        wall,
        max_rss.with_context(|| format!("no RSS figure in {text:?}"))?,
        hwm,
        out.stdout,
    ))
}

/// Peak RSS in KiB of `program args` with exactly `env`, via GNU time.
pub(crate) fn peak_rss_kib(
    p: &Path,
    args: &[&str],
    env: &Env,
    stdin: Option<&[u8]>,
    scratch: &Path,
) -> anyhow::Result<f64> {
    Ok(gnu_time(p, args, env, stdin, scratch)?.1 as f64)
}

/// A `KEY: N kB` field of `/proc/PID/status`.
pub(crate) fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix(key))?;
    v.split_whitespace().next()?.parse().ok()
}

/// Samples `read` every 5 ms on a thread of its own, keeping the highest.
pub(crate) struct PeakSampler(Arc<AtomicBool>, std::thread::JoinHandle<u64>);

impl PeakSampler {
    pub(crate) fn start(read: impl Fn() -> Option<u64> + Send + 'static) -> PeakSampler {
        let (stop, peak) = (Arc::new(AtomicBool::new(false)), AtomicU64::new(0));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                read().map(|k| peak.fetch_max(k, Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.load(Ordering::Relaxed)
        });
        PeakSampler(stop, thread)
    }

    pub(crate) fn stop(self) -> u64 {
        self.0.store(true, Ordering::Relaxed);
        self.1.join().unwrap_or(0)
    }
}

/// User + system time of `pid` itself and of its reaped children, seconds
/// (`/proc/PID/stat` fields 14–17).
pub(crate) fn proc_cpu(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // After "pid (comm) ": field 3 (state) is at index 0.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    anyhow::ensure!(f.len() == 4, "/proc/{pid}/stat: {stat:?}");
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(((f[0] + f[1]) as f64 / hz, (f[2] + f[3]) as f64 / hz))
}

/// The run time of all of `pid`'s threads so far (ns, `schedstat`).
pub(crate) fn threads_cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let mut sum = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = std::fs::read_to_string(t?.path().join("schedstat")).unwrap_or_default();
        sum += s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(sum)
}

/// The samples of a Prometheus text (`/metrics`), by series
/// (`name{labels}` as written).
pub(crate) fn metrics(text: &str) -> BTreeMap<String, f64> {
    let samples = text.lines().filter(|l| !l.starts_with('#'));
    samples
        .filter_map(|l| {
            l.rsplit_once(' ')
                .and_then(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        })
        .collect()
}

/// Per histogram series whose count grew from `before` to `after`: the
/// mean of the new observations (seconds) and their number.
pub(crate) fn histogram_means(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64, f64)> {
    let delta =
        |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
    let series = |k: &String| {
        let (name, labels) = k
            .split_once('{')
            .map_or((k.as_str(), String::new()), |(n, l)| (n, format!("{{{l}")));
        let (base, n) = (name.strip_suffix("_count")?, delta(k));
        let sum = delta(&format!("{base}_sum{labels}"));
        (n > 0.0).then(|| (format!("{base}{labels}"), sum / n, n))
    };
    after.keys().filter_map(series).collect()
}
