//! How many of the node's CPUs idled between two readings of `/proc/stat`:
//! what lets pacing (`pace`) lend a waiting operation a run while a CPU
//! idles, so that it never keeps a CPU idle that a waiting operation
//! could use.
//!
//! # Caveats
//! - `/proc/stat` counts the whole node (the host's CPUs, in a container):
//!   a CPU quota or cpuset of cnid's cgroup (or its CPU affinity) is not
//!   seen, nor whose work kept a CPU busy; a CPU idle outside cnid's
//!   cpuset lends a run its plugins cannot use.
//! - The kernel counts in ticks of 10 ms (`USER_HZ`), so a reading over
//!   100 ms on 2 CPUs is 20 ticks: good to about a tenth of a CPU.
//! - Time waiting for I/O (`iowait`) counts as idle: the CPU was free.
//! - The read runs on the lender's runtime thread (a procfs read does not
//!   wait). Where `/proc/stat` is a FUSE file (lxcfs in a container), a
//!   hung lxcfs would hold that thread.

use std::fmt::Debug;

/// The node's CPU time since boot, in ticks, summed over its CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// Idle, and idle waiting for I/O.
    pub(crate) idle: u64,
    /// All of it (guest time is part of user time, not added again).
    pub(crate) total: u64,
    /// CPUs counted.
    pub(crate) cpus: u32,
}

impl CpuTimes {
    /// How many CPUs idled on average from `self` to `later`: 0 when the
    /// counters did not advance (or went back).
    pub(crate) fn idle_cpus_until(self, later: CpuTimes) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        let idle = later.idle.saturating_sub(self.idle).min(total);
        idle as f64 / total as f64 * f64::from(later.cpus)
    }
}

/// Where the CPU times come from: `/proc/stat`, or a test's own.
pub(crate) trait CpuProbe: Debug + Send + Sync {
    /// The times now; `None` when they cannot be read.
    fn read(&self) -> Option<CpuTimes>;
}

/// The kernel's counters.
#[derive(Debug)]
pub(crate) struct ProcStat;

impl CpuProbe for ProcStat {
    fn read(&self) -> Option<CpuTimes> {
        // A procfs read: it never waits for a disk.
        parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }
}

/// Reads the `cpu` line (all CPUs) and counts the `cpuN` lines.
fn parse(text: &str) -> Option<CpuTimes> {
    let mut lines = text.lines();
    let mut fields = lines.next()?.split_ascii_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let ticks: Vec<u64> = fields
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if ticks.len() < 5 {
        return None;
    }
    let cpus = lines
        .take_while(|l| l.starts_with("cpu"))
        .filter(|l| l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    // Checked: counters that overflow are no reading (a panic in a debug
    // build, and a wrapped total in a release one).
    Some(CpuTimes {
        idle: ticks[3].checked_add(ticks[4])?,
        total: ticks.iter().try_fold(0u64, |sum, &t| sum.checked_add(t))?,
        cpus: u32::try_from(cpus).ok().filter(|&n| n > 0)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_reads_the_all_cpus_line_and_counts_the_cpus() {
        let text = "cpu  100 5 50 800 45 0 0 0 0 0\n\
                    cpu0 50 2 25 400 20 0 0 0 0 0\n\
                    cpu1 50 3 25 400 25 0 0 0 0 0\n\
                    intr 1 2 3\n";
        assert_eq!(
            parse(text),
            Some(CpuTimes {
                idle: 845,
                total: 1000,
                cpus: 2
            })
        );
        assert_eq!(parse("intr 1 2\n"), None, "no cpu line");
        assert_eq!(parse("cpu  1 2 x 4 5\ncpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse("cpu  1 2 3 4 5 0 0 0\n"), None, "no CPU counted");
    }

    #[test]
    fn idle_counters_whose_sum_overflows_are_unreadable_not_a_panic() {
        let max = u64::MAX;
        assert_eq!(
            parse(&format!("cpu  {max} 1 0 0 0 0 0 0\ncpu0 0 0 0 0 0\n")),
            None
        );
        assert_eq!(
            parse(&format!("cpu  0 0 0 {max} 1 0 0 0\ncpu0 0 0 0 0 0\n")),
            None
        );
    }

    #[test]
    fn idle_cpus_between_two_readings() {
        let at = |idle, total| CpuTimes {
            idle,
            total,
            cpus: 2,
        };
        assert_eq!(at(0, 0).idle_cpus_until(at(20, 20)), 2.0, "both idle");
        assert_eq!(at(0, 0).idle_cpus_until(at(10, 20)), 1.0);
        assert_eq!(at(0, 0).idle_cpus_until(at(0, 20)), 0.0, "both busy");
        assert_eq!(at(5, 20).idle_cpus_until(at(5, 20)), 0.0, "no time");
        assert_eq!(at(50, 90).idle_cpus_until(at(0, 0)), 0.0, "went back");
    }

    #[test]
    fn idle_the_kernels_counters_read() {
        let now = ProcStat.read().expect("/proc/stat");
        assert!(now.cpus >= 1 && now.idle <= now.total);
    }
}
