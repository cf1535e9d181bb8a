//! This boot: its id (what a record written in another boot differs in)
//! and when it began (what dates a record without an id, and tells a dir
//! unchanged since the boot). The one notion of "this boot" for the
//! library and cnid.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

/// This boot's id (`/proc/sys/kernel/random/boot_id`, trimmed), read once
/// per process; `None` when it cannot be read.
pub fn boot_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// When this boot began: `btime` of `/proc/stat` (whole seconds). `None`
/// when it cannot be read: then no record counts as an earlier boot's,
/// and no dir as unchanged since the boot.
pub fn boot_time() -> Option<SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_btime(&stat)
}

/// Whether `t` is more than two seconds before `boot` (`false` without
/// one): the boot time is whole seconds and moves by one with clock
/// adjustments; a reboot takes longer than the margin.
pub(crate) fn before_boot(t: SystemTime, boot: Option<SystemTime>) -> bool {
    boot.is_some_and(|b| t + Duration::from_secs(2) < b)
}

fn parse_btime(stat: &str) -> Option<SystemTime> {
    let secs = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btime_is_parsed_from_proc_stat() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n";
        assert_eq!(
            parse_btime(stat),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
        assert!(boot_time().is_some_and(|b| b < SystemTime::now()));
        assert!(boot_id().is_some_and(|id| !id.is_empty()));
    }
}
