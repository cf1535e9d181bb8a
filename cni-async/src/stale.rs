//! Stale cached attachments: records in the cache whose network namespace
//! is gone, and whose DEL therefore nobody will send (a reboot, a runtime
//! that crashed or lost its state between ADD and DEL). Left alone they
//! hold their IPAM reservations forever ("no IP addresses available in
//! range set"). This module finds them ([`StaleScanner::scan`]) and DELs
//! them ([`Cni::reap_stale`]) with what libcni would pass: the cached
//! configuration, the cached result as `prevResult`, the cached args and
//! the recorded netns path (the spec lets a plugin see a missing namespace
//! on DEL; a path that is there but is not the namespace any more, an
//! earlier boot's `/proc/PID/ns/net` or a file left by a bind mount, is
//! not passed: CNI_NETNS is empty then). cnid's reaper and `cnitool gc --stale` are both built on it.
//!
//! ```no_run
//! # async fn demo(cni: &cni_async::Cni) -> Result<(), cni_async::Error> {
//! use cni_async::stale::StaleScanner;
//! // Namespaces of this boot count once gone for 5 minutes.
//! let mut scanner = StaleScanner::new(Some(std::time::Duration::from_secs(300)));
//! for c in scanner.scan(cni.cache()).await? {
//!     if let Some(why) = c.verdict.stale() {
//!         let done = cni.reap_stale(&c, &Default::default()).await?;
//!         println!("{} {} {why}: {done:?}", c.network, c.container_id);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # The verdict ([`verdict`])
//!
//! | netns recorded | namespace | record written | verdict |
//! |---|---|---|---|
//! | none | | | kept ([`Kept::NoNetns`]): nothing to look at |
//! | a path | a network namespace | | kept ([`Kept::NamespaceExists`]) |
//! | a path | cannot be looked at (no permission, out of descriptors) | | kept ([`Kept::Unknown`]) |
//! | a path | gone | in an earlier boot | stale ([`StaleReason::Rebooted`]) |
//! | a path | gone | in this boot | stale ([`StaleReason::NamespaceGone`]) once seen gone for `stale_after`, [`Verdict::Waiting`] until then |
//!
//! "Gone" means the path is not a network namespace any more: missing, or
//! a file left after its bind mount went away. A `/proc/PID/ns/net` path
//! written in an earlier boot is gone whatever it points to now: that PID
//! is another process in this boot.
//!
//! "Written in an earlier boot" is the record file's mtime before the boot
//! time (`btime` of `/proc/stat`, [`boot_time`]): it holds for records of
//! every tool writing the cache's format (libcni, cnitool, cnid), none of
//! which writes a boot id into the record (`docs/decisions.md` D24). A
//! writer that rewrites an earlier boot's record in this boot dates it
//! back (cnid restoring a record a power loss lost dates it as its
//! journal); otherwise it counts as this boot's, reaped after
//! `stale_after`.
//!
//! How long a namespace has been gone is what the scanner saw: the first
//! scan that found it gone starts the clock, a scan that finds it back (or
//! the record gone) stops it. A one-shot caller (cnitool) passes
//! `stale_after` zero.
//!
//! # Caveats
//! - A clock set backwards across the reboot (no RTC, no NTP yet) can make
//!   an earlier boot's record look younger than the boot: it is then
//!   reaped as "namespace gone" after `stale_after`, not at once.
//! - The namespace is checked from the caller's mount namespace: a netns
//!   path valid only in another mount namespace looks gone.
//! - [`Cni::reap_stale`] checks again, just before the DEL, that the
//!   record file is the one scanned (same mtime; once more under the
//!   attachment's lock, so another tool's DEL and re-ADD in between is
//!   never DELed) and that its namespace is still gone; a caller racing
//!   other tools on the same attachment (cnid) also orders the reap with
//!   its own operations on it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use cni_core::RuntimeConf;
use cni_core::cache::{CacheEntry, CacheRecord};

use crate::cache::{RecordScan, ResultCache, ScannedRecord};
use crate::error::Error;
use crate::ops::{CallOptions, Cni};

/// Why a stale attachment is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// Written in an earlier boot, and its namespace is gone.
    Rebooted,
    /// Its namespace has been gone for `stale_after` while the node ran.
    NamespaceGone,
}

impl StaleReason {
    /// `rebooted` or `namespace gone`: what logs, metrics and listings say.
    pub fn as_str(self) -> &'static str {
        match self {
            StaleReason::Rebooted => "rebooted",
            StaleReason::NamespaceGone => "namespace gone",
        }
    }
}

impl std::fmt::Display for StaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attachment is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// Its netns path is a network namespace.
    NamespaceExists,
    /// No netns path was recorded: nothing tells whether it is gone.
    NoNetns,
    /// The netns path cannot be looked at (no permission, out of file
    /// descriptors): nothing tells whether it is gone.
    Unknown,
}

/// What to do with a cached attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Never reaped.
    Kept(Kept),
    /// Its namespace is gone since `gone_for`, not yet `stale_after`.
    Waiting {
        /// How long the scanner has seen it gone.
        gone_for: Duration,
    },
    /// To be deleted.
    Stale(StaleReason),
}

impl Verdict {
    /// The reason, when stale.
    pub fn stale(self) -> Option<StaleReason> {
        match self {
            Verdict::Stale(r) => Some(r),
            _ => None,
        }
    }
}

/// Whether an attachment's recorded namespace is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Netns {
    /// No netns path in the record.
    Unrecorded,
    /// The path is a network namespace.
    Alive,
    /// The path is not a network namespace (missing, or not one any more).
    Gone,
    /// The path cannot be looked at: neither alive nor gone.
    Unknown,
}

/// The verdict on one attachment (see the [module docs](self)):
/// `earlier_boot` says the record was written before this boot,
/// `gone_for` how long the namespace has been seen gone, `stale_after`
/// how long that must be for a record of this boot (`None`: never).
pub fn verdict(
    netns: Netns,
    earlier_boot: bool,
    gone_for: Duration,
    stale_after: Option<Duration>,
) -> Verdict {
    match netns {
        Netns::Unrecorded => Verdict::Kept(Kept::NoNetns),
        Netns::Alive => Verdict::Kept(Kept::NamespaceExists),
        Netns::Unknown => Verdict::Kept(Kept::Unknown),
        Netns::Gone if earlier_boot => Verdict::Stale(StaleReason::Rebooted),
        Netns::Gone => match stale_after {
            Some(after) if gone_for >= after => Verdict::Stale(StaleReason::NamespaceGone),
            _ => Verdict::Waiting { gone_for },
        },
    }
}

/// Whether `netns` (a record's path) is a network namespace now;
/// `earlier_boot`: a `/proc/PID/...` path of an earlier boot is gone.
pub fn netns_state(netns: &str, earlier_boot: bool) -> Netns {
    if netns.is_empty() {
        Netns::Unrecorded
    } else if earlier_boot && netns.starts_with("/proc/") {
        Netns::Gone
    } else {
        match crate::sys::nsfs::network_namespace(Path::new(netns)) {
            Ok(true) => Netns::Alive,
            Ok(false) => Netns::Gone,
            Err(_) => Netns::Unknown,
        }
    }
}

/// When this boot began: `btime` of `/proc/stat` (whole seconds). `None`
/// when it cannot be read: then no record counts as an earlier boot's.
pub fn boot_time() -> Option<SystemTime> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_btime(&stat)
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

/// Whether a record written at `written` was written before `boot`. The
/// boot time is whole seconds and moves by one with clock adjustments; a
/// reboot takes longer than the margin.
fn before_boot(written: Option<SystemTime>, boot: Option<SystemTime>) -> bool {
    const MARGIN: Duration = Duration::from_secs(2);
    match (written, boot) {
        (Some(w), Some(b)) => w + MARGIN < b,
        _ => false,
    }
}

/// A cached attachment and the verdict on it: what identifies it, not its
/// record (results can be megabytes; the reap reads the record again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// `networkName`.
    pub network: String,
    /// `containerId`.
    pub container_id: String,
    /// `ifName`.
    pub ifname: String,
    /// The recorded netns path (empty when none).
    pub netns: String,
    /// The record file's mtime.
    pub written: Option<SystemTime>,
    /// The verdict.
    pub verdict: Verdict,
}

impl Candidate {
    /// `(network, container, ifname)`.
    pub fn key(&self) -> (&str, &str, &str) {
        (&self.network, &self.container_id, &self.ifname)
    }
}

type Key = (String, String, String);

/// Lists a cache's attachments with their verdicts, remembering from scan
/// to scan since when each namespace has been seen gone. The records are
/// followed with [`ResultCache::scan_blocking`]: a scan reads only the
/// record files new or replaced since the last one, and only their
/// identity and netns (not their results), so it costs a directory
/// listing and a `stat` per attachment, whatever the size of the cache.
#[derive(Debug)]
pub struct StaleScanner {
    boot: Option<SystemTime>,
    stale_after: Option<Duration>,
    state: ScanState,
}

#[derive(Debug, Default)]
struct ScanState {
    scan: RecordScan,
    records: BTreeMap<Key, ScannedRecord>,
    gone_since: HashMap<Key, Instant>,
}

impl StaleScanner {
    /// A scanner for this boot ([`boot_time`]); `stale_after`: how long a
    /// namespace of this boot's record must be seen gone (`None`: only
    /// earlier boots' records are ever stale).
    pub fn new(stale_after: Option<Duration>) -> Self {
        StaleScanner::with_boot_time(boot_time(), stale_after)
    }

    /// A scanner taking `boot` as this boot's start.
    pub fn with_boot_time(boot: Option<SystemTime>, stale_after: Option<Duration>) -> Self {
        StaleScanner {
            boot,
            stale_after,
            state: ScanState::default(),
        }
    }

    /// Every `cniCacheV1` record of `cache` with its verdict, sorted by
    /// network, container and interface. An unreadable cache dir is an
    /// error (nothing is stale then; a missing one is an empty cache);
    /// unusable record files are left out.
    pub async fn scan(&mut self, cache: &ResultCache) -> Result<Vec<Candidate>, Error> {
        let (boot, stale_after, cache) = (self.boot, self.stale_after, cache.clone());
        let dir = cache.results_dir();
        let mut state = std::mem::take(&mut self.state);
        let (state, res) = tokio::task::spawn_blocking(move || {
            let res = cache.scan_blocking(&mut state.scan).map(|changes| {
                for k in changes.removed {
                    state.records.remove(&k);
                }
                for r in changes.added {
                    let k = (
                        r.network_name.clone(),
                        r.container_id.clone(),
                        r.if_name.clone(),
                    );
                    state.records.insert(k, r);
                }
                judge(&cache, &mut state, boot, stale_after)
            });
            (state, res)
        })
        .await
        .map_err(|e| Error::Cache {
            path: dir,
            op: "scan",
            source: std::io::Error::other(e),
        })?;
        self.state = state;
        res
    }
}

/// The verdict on every record of `state`; the gone-clocks of the
/// attachments not seen gone now start over.
fn judge(
    cache: &ResultCache,
    state: &mut ScanState,
    boot: Option<SystemTime>,
    stale_after: Option<Duration>,
) -> Vec<Candidate> {
    let now = Instant::now();
    let mut gone_since = HashMap::new();
    let mut out = Vec::with_capacity(state.records.len());
    for (key, r) in &state.records {
        let written = cache
            .path(&r.network_name, &r.container_id, &r.if_name)
            .ok()
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .and_then(|m| m.modified().ok());
        let earlier = before_boot(written, boot);
        let ns = netns_state(&r.netns, earlier);
        let mut gone_for = Duration::ZERO;
        if ns == Netns::Gone {
            let since = state.gone_since.get(key).copied().unwrap_or(now);
            gone_for = now.saturating_duration_since(since);
            gone_since.insert(key.clone(), since);
        }
        out.push(Candidate {
            verdict: verdict(ns, earlier, gone_for, stale_after),
            network: r.network_name.clone(),
            container_id: r.container_id.clone(),
            ifname: r.if_name.clone(),
            netns: r.netns.clone(),
            written,
        });
    }
    state.gone_since = gone_since;
    out
}

/// What [`Cni::reap_stale`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// The DEL ran and succeeded; the record is removed.
    Deleted,
    /// Nothing to do: the record is gone or was written again since the
    /// scan (a DEL or a new ADD came first).
    Changed,
    /// Nothing done: the namespace is there again (or cannot be looked at).
    Alive,
}

impl Cni {
    /// DELs a stale attachment `c` found by [`StaleScanner::scan`] with
    /// its cached configuration, result (`prevResult`), args and netns
    /// path (none when the path is there but is not its namespace any
    /// more), and removes its record, unless the record changed (is gone,
    /// or its file was written since the scan) or the namespace came back
    /// since the scan. A failed DEL leaves the record (a later reap or a
    /// DEL tries again).
    pub async fn reap_stale(&self, c: &Candidate, opts: &CallOptions) -> Result<Reaped, Error> {
        let path = self.cache().path(&c.network, &c.container_id, &c.ifname)?;
        let earlier = matches!(c.verdict, Verdict::Stale(StaleReason::Rebooted));
        let (netns, written) = (c.netns.clone(), c.written);
        let (now, there) = tokio::task::spawn_blocking(move || {
            let same = std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|m| Some(m) == written);
            if !same {
                return (Reaped::Changed, true);
            }
            let there = std::fs::metadata(&netns).is_ok();
            match netns_state(&netns, earlier) {
                Netns::Gone => (Reaped::Deleted, there),
                Netns::Alive | Netns::Unrecorded | Netns::Unknown => (Reaped::Alive, there),
            }
        })
        .await
        .unwrap_or((Reaped::Changed, true));
        if now != Reaped::Deleted {
            return Ok(now);
        }
        // The scan may have read the record before the file was rewritten
        // in place: the netns to DEL in is the one the record holds now.
        match self
            .cache()
            .read(&c.network, &c.container_id, &c.ifname)
            .await?
        {
            Some(CacheEntry::Record(r)) if r.netns == c.netns => {}
            _ => return Ok(Reaped::Changed),
        }
        // The record's own config, args and capability args (`del_cached`
        // takes them when `rt` has none). The DEL checks again, under the
        // attachment's lock, that the record is still the scanned one:
        // another tool's DEL and re-ADD may have come between the checks
        // above and the lock.
        // A path that is there but is not the record's namespace (an
        // earlier boot's /proc/PID/ns/net, another process's now; a file
        // left where a namespace was bind-mounted) is not handed to the
        // plugins: they would enter another namespace, or refuse the
        // file. The spec lets CNI_NETNS be empty when the namespace is
        // gone. A missing path is passed on, as libcni would.
        let mut rt = RuntimeConf::new(&c.container_id, &c.netns, &c.ifname);
        if there {
            rt.netns.clear();
        }
        let path = self.cache().path(&c.network, &c.container_id, &c.ifname)?;
        let scanned = |r: &CacheRecord| {
            r.netns == c.netns
                && std::fs::symlink_metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| Some(m) == c.written)
        };
        match self
            .del_cached_expecting(&c.network, &rt, opts, Some(&scanned))
            .await
        {
            Ok(()) => Ok(Reaped::Deleted),
            Err(e) if e.kind() == crate::ErrorKind::NotAttached => Ok(Reaped::Changed),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn verdicts() {
        use Netns::*;
        let five = Some(5 * MIN);
        // A namespace that exists is never reaped, whatever the boot.
        for earlier in [false, true] {
            assert_eq!(
                verdict(Alive, earlier, Duration::ZERO, Some(Duration::ZERO)),
                Verdict::Kept(Kept::NamespaceExists)
            );
            assert_eq!(
                verdict(Unrecorded, earlier, 10 * MIN, five),
                Verdict::Kept(Kept::NoNetns)
            );
        }
        // Gone after a reboot: at once, even with the reaper off.
        assert_eq!(
            verdict(Gone, true, Duration::ZERO, None),
            Verdict::Stale(StaleReason::Rebooted)
        );
        // Gone in this boot: after stale_after, never with None.
        assert_eq!(
            verdict(Gone, false, 4 * MIN, five),
            Verdict::Waiting { gone_for: 4 * MIN }
        );
        assert_eq!(
            verdict(Gone, false, 5 * MIN, five),
            Verdict::Stale(StaleReason::NamespaceGone)
        );
        assert_eq!(
            verdict(Gone, false, 60 * MIN, None),
            Verdict::Waiting { gone_for: 60 * MIN }
        );
        assert_eq!(
            verdict(Gone, false, Duration::ZERO, Some(Duration::ZERO)),
            Verdict::Stale(StaleReason::NamespaceGone)
        );
    }

    #[test]
    fn earlier_boot_is_the_mtime_before_btime() {
        let boot = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let before = boot - Duration::from_secs(60);
        assert!(before_boot(Some(before), Some(boot)));
        // Within the margin of btime's jitter: this boot's.
        assert!(!before_boot(
            Some(boot - Duration::from_secs(1)),
            Some(boot)
        ));
        assert!(!before_boot(Some(boot + MIN), Some(boot)));
        // Unknown either way: this boot's (never reaped at once).
        assert!(!before_boot(None, Some(boot)));
        assert!(!before_boot(Some(before), None));
    }

    #[test]
    fn btime_is_parsed_from_proc_stat() {
        let stat = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n";
        assert_eq!(
            parse_btime(stat),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(parse_btime("cpu 1\n"), None);
        assert!(boot_time().is_some_and(|b| b < SystemTime::now()));
    }

    #[test]
    fn proc_paths_of_an_earlier_boot_are_gone() {
        // /proc/self/ns/net is a network namespace now, but a PID of an
        // earlier boot is another process in this one.
        assert_eq!(netns_state("/proc/self/ns/net", false), Netns::Alive);
        assert_eq!(netns_state("/proc/self/ns/net", true), Netns::Gone);
        assert_eq!(netns_state("", true), Netns::Unrecorded);
        assert_eq!(netns_state("/nonexistent/netns", false), Netns::Gone);
        // A plain file (a bind mount's mount point left behind).
        assert_eq!(netns_state("/proc/stat", false), Netns::Gone);
    }
}
