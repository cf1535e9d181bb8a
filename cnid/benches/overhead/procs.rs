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
use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub(crate) const GNU_TIME: &str = "/usr/bin/time";

/// A run under GNU time.
pub(crate) struct Timed {
    pub(crate) wall: Duration,
    /// `%M`, KiB.
    pub(crate) max_rss: u64,
    /// The highest `VmHWM` of the program itself sampled every 5 ms (KiB).
    pub(crate) hwm: u64,
    pub(crate) stdout: Vec<u8>,
}

/// Runs `program args` with exactly `env` under GNU time.
pub(crate) fn gnu_time(
    program: &Path,
    args: &[&str],
    env: &[(OsString, OsString)],
    stdin: Option<&[u8]>,
    scratch: &Path,
) -> anyhow::Result<Timed> {
    let out_file = scratch.join("time.out");
    let started = Instant::now();
    let mut child = Command::new(GNU_TIME)
        .args(["-f", "%M", "-o"])
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
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {GNU_TIME} (apt-get install time)"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data)?;
    }
    // GNU time's child is the program.
    let tp = child.id();
    let children = format!("/proc/{tp}/task/{tp}/children");
    let sampler = PeakSampler::start(move || {
        let pid = std::fs::read_to_string(&children).ok()?;
        status_kib(pid.split_whitespace().next()?.parse().ok()?, "VmHWM:")
    });
    let out = child.wait_with_output();
    let wall = started.elapsed();
    let hwm = sampler.stop();
    let out = out?;
    if !out.status.success() {
        bail!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read_to_string(&out_file)?;
    let max_rss = text
        .lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("no RSS figure in {text:?}"))?;
    Ok(Timed {
        wall,
        max_rss,
        hwm,
        stdout: out.stdout,
    })
}

/// Peak RSS in KiB of `program args` with exactly `env`, via GNU time.
pub(crate) fn peak_rss_kib(
    program: &Path,
    args: &[&str],
    env: &[(OsString, OsString)],
    stdin: Option<&[u8]>,
    scratch: &Path,
) -> anyhow::Result<f64> {
    Ok(gnu_time(program, args, env, stdin, scratch)?.max_rss as f64)
}

/// A `KEY: N kB` field of `/proc/PID/status`.
pub(crate) fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let v = status.lines().find_map(|l| l.strip_prefix(key))?;
    v.split_whitespace().next()?.parse().ok()
}

/// Samples `read` every 5 ms on a thread of its own, keeping the highest.
pub(crate) struct PeakSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakSampler {
    pub(crate) fn start(read: impl Fn() -> Option<u64> + Send + 'static) -> PeakSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = AtomicU64::new(0);
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(k) = read() {
                    peak.fetch_max(k, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.load(Ordering::Relaxed)
        });
        PeakSampler { stop, thread }
    }

    pub(crate) fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
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
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
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
    after
        .keys()
        .filter_map(|k| {
            let (name, labels) = match k.split_once('{') {
                Some((n, l)) => (n, format!("{{{l}")),
                None => (k.as_str(), String::new()),
            };
            let base = name.strip_suffix("_count")?;
            let n = delta(k);
            let sum = delta(&format!("{base}_sum{labels}"));
            (n > 0.0).then(|| (format!("{base}{labels}"), sum / n, n))
        })
        .collect()
}
