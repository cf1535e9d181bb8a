//! Stale cached attachments: records whose network namespace is gone, and
//! whose DEL therefore nobody will send (a reboot, a runtime that lost its
//! state). Left alone they hold their IPAM reservations forever. This
//! module finds them ([`StaleScanner::scan`]) and DELs them
//! ([`Cni::reap_stale`](crate::Cni::reap_stale)) with what was cached at
//! ADD and **no netns path** (the path may hold someone else's namespace
//! by then).
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
//! # The verdict
//!
//! Nothing is stale on a path or a clock alone: "gone" is proven. Records
//! written by this library carry the namespace's identity taken at ADD
//! ([`cni_core::cache::NetnsIdentity`]: the boot id, the nsfs device,
//! inode and file handle, for a `/proc/PID/ns/net` path the process's
//! start time), kept only if the path is still that namespace after the
//! plugins ran.
//!
//! | record | what is found | verdict |
//! |---|---|---|
//! | no netns | | kept ([`Kept::NoNetns`]) |
//! | identity, another boot id | | stale at once ([`StaleReason::Rebooted`]) |
//! | identity, this boot | the path is the recorded namespace (same device and inode; for `/proc/PID/...` the same start time too) | kept ([`Kept::NamespaceExists`]) |
//! | identity, this boot | not at its path, and its file handle still opens it (anything holds it), or (no handle) held by a process or thread, a bind mount in any mount namespace, an open descriptor, or a socket made in it | kept ([`Kept::Held`]) |
//! | identity, this boot | not at its path, no handle, and not everything could be searched (a `/proc` entry unreadable, not the initial pid namespace) | kept ([`Kept::Unknown`]) |
//! | identity, this boot | not at its path, and its handle is stale (`ESTALE`), or (no handle) held by nothing | [`Verdict::Waiting`], stale ([`StaleReason::NamespaceGone`]) once seen so for `stale_after` |
//! | none (libcni's, older ones), or no namespace identified at ADD | the path is a network namespace now | kept ([`Kept::NamespaceExists`]), whatever the record's mtime |
//! | there but unreadable (damaged, forged) | | kept ([`Kept::Unknown`]) |
//! | none | the path cannot be looked at | kept ([`Kept::Unknown`]) |
//! | none | not a network namespace, record's mtime before the boot time | stale ([`StaleReason::Rebooted`]) |
//! | none | not a network namespace, written in this boot | waiting, then stale ([`StaleReason::NamespaceGone`]) |
//! | anything not proven by boot id | the caller does not see the host's mounts | kept ([`Kept::HostMountsUnseen`]) |
//!
//! How long a namespace has been gone is what the scanner saw: the first
//! scan that found it gone starts the clock, a scan that finds it back
//! stops it. A one-shot caller (cnitool) passes `stale_after` zero.
//!
//! # Caveats
//! - Records without identity (Go libcni's, this library's before it
//!   recorded one) still rest on the path and the record's mtime against
//!   the boot time: a namespace bind-mounted only in another mount
//!   namespace, or a clock stepped across the boot, can make one look gone
//!   (a path that is a namespace now is never judged on the clock).
//! - Nsfs inode numbers are reused once a namespace is freed: a new
//!   namespace at the recorded path with the recorded inode counts as the
//!   recorded one (kept: the safe side).
//! - A process may enter or open the namespace after the search: so
//!   [`Cni::reap_stale`](crate::Cni::reap_stale) judges the record again
//!   just before the DEL, under the attachment's lock, and checks that the
//!   record is exactly the scanned one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use cni_core::cache::{NetnsIdentity, proc_netns_pid};

use crate::cache::ResultCache;
use crate::error::Error;
use crate::store::{RecordScan, ScannedRecord};
use crate::sys::identity::{self, Holders};

/// Why a stale attachment is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleReason {
    /// Written in an earlier boot (another boot id; for a record without
    /// one, an mtime before the boot time and its path no namespace).
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
    /// Its netns path is its namespace (or, for a record without
    /// identity, a network namespace).
    NamespaceExists,
    /// No netns path was recorded: nothing tells whether it is gone.
    NoNetns,
    /// Whether it is gone cannot be told: the path cannot be looked at,
    /// the boot id cannot be read, or the search for holders could not
    /// read everything.
    Unknown,
    /// Its namespace is not at its path but is still held (a process or
    /// thread in it, a bind mount of it, an open descriptor).
    Held,
    /// The caller does not see the host's mounts and processes
    /// ([`StaleScanner::sees_host_mounts`]): only another boot id proves
    /// a namespace gone.
    HostMountsUnseen,
}

impl Kept {
    /// What logs and listings say.
    pub fn as_str(self) -> &'static str {
        match self {
            Kept::NamespaceExists => "namespace exists",
            Kept::NoNetns => "no netns recorded",
            Kept::Unknown => "cannot tell",
            Kept::Held => "namespace held",
            Kept::HostMountsUnseen => "host mounts not visible",
        }
    }
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
    /// The path is the namespace.
    Alive,
    /// Proven gone (another boot; or not at its path and held by nothing;
    /// for a record without identity: the path is no namespace).
    Gone,
    /// Cannot be told: neither alive nor gone.
    Unknown,
    /// Not at its path, but held by something.
    Held,
    /// Not proven gone, and the caller does not see the host's mounts.
    Unseen,
}

/// The verdict on one attachment (see the [module docs](self)):
/// `earlier_boot` says the record was written before this boot,
/// `gone_for` how long the namespace has been seen gone, `stale_after`
/// how long that must be for a record of this boot (`None`: never).
pub(crate) fn verdict(
    netns: Netns,
    earlier_boot: bool,
    gone_for: Duration,
    stale_after: Option<Duration>,
) -> Verdict {
    match netns {
        Netns::Unrecorded => Verdict::Kept(Kept::NoNetns),
        Netns::Alive => Verdict::Kept(Kept::NamespaceExists),
        Netns::Unknown => Verdict::Kept(Kept::Unknown),
        Netns::Held => Verdict::Kept(Kept::Held),
        Netns::Unseen => Verdict::Kept(Kept::HostMountsUnseen),
        Netns::Gone if earlier_boot => Verdict::Stale(StaleReason::Rebooted),
        Netns::Gone => match stale_after {
            Some(after) if gone_for >= after => Verdict::Stale(StaleReason::NamespaceGone),
            _ => Verdict::Waiting { gone_for },
        },
    }
}

/// Whether `netns` (the path of a record without identity) is a network
/// namespace now. A path that is no namespace is [`Netns::Gone`] only for
/// a caller that sees the host's mounts (`host`).
pub fn netns_state(netns: &str, host: bool) -> Netns {
    if netns.is_empty() {
        return Netns::Unrecorded;
    }
    match crate::sys::nsfs::network_namespace(Path::new(netns)) {
        Ok(true) => Netns::Alive,
        Ok(false) if host => Netns::Gone,
        Ok(false) => Netns::Unseen,
        Err(_) => Netns::Unknown,
    }
}

/// What the caller knows of the host when judging.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    pub(crate) boot_id: Option<String>,
    pub(crate) boot_time: Option<SystemTime>,
    pub(crate) sees_host_mounts: bool,
}

impl Host {
    /// This host as it is now, with `boot_time` as given.
    pub(crate) fn now(boot_time: Option<SystemTime>) -> Host {
        Host {
            boot_id: crate::sys::boot_id().map(str::to_owned),
            boot_time,
            sees_host_mounts: identity::sees_host_mounts(),
        }
    }
}

/// Whether a record's namespace is gone, and whether it was written in an
/// earlier boot: the table of the [module docs](self).
pub(crate) fn judge_one(
    netns: &str,
    identity: Option<&NetnsIdentity>,
    written: Option<SystemTime>,
    host: &Host,
) -> (Netns, bool) {
    if netns.is_empty() {
        return (Netns::Unrecorded, false);
    }
    let Some(id) = identity else {
        let earlier = before_boot(written, host.boot_time);
        return (netns_state(netns, host.sees_host_mounts), earlier);
    };
    match host.boot_id.as_deref() {
        // An identity there but unreadable (damaged, forged): not a
        // record without one, whose path and mtime would decide.
        _ if id.boot_id.is_empty() => (Netns::Unknown, false),
        None => (Netns::Unknown, false),
        Some(b) if b != id.boot_id => (Netns::Gone, true),
        Some(_) => match id.ns {
            None => (netns_state(netns, host.sees_host_mounts), false),
            Some(ns) => (identified(netns, ns, id, host), false),
        },
    }
}

/// The namespace `ns` recorded at `netns` in this boot: alive at its path,
/// held elsewhere, or proven gone.
fn identified(netns: &str, ns: (u64, u64), id: &NetnsIdentity, host: &Host) -> Netns {
    let start = id.pid_start_time;
    match identity::netns_id(Path::new(netns)) {
        Err(_) => return Netns::Unknown,
        Ok(Some(now)) if now == ns => {
            let same_process = match (proc_netns_pid(netns), start) {
                (Some(pid), Some(t)) => match identity::start_time(pid) {
                    Ok(now) => now == Some(t),
                    Err(_) => return Netns::Unknown,
                },
                _ => true,
            };
            if same_process {
                return Netns::Alive;
            }
        }
        Ok(_) => {}
    }
    if !host.sees_host_mounts {
        return Netns::Unseen;
    }
    // The kernel's answer, where it has one: the namespace by its id.
    // A handle that is not of the recorded namespace (damaged, forged)
    // proves nothing: the kernel's ESTALE for it would say nothing of it.
    let handle = id
        .handle
        .as_ref()
        .filter(|h| identity::handle_is_of(h, ns.1));
    if let Some(alive) = handle.and_then(|h| identity::ns_alive(h).ok()) {
        return if alive { Netns::Held } else { Netns::Gone };
    }
    match identity::holders(ns) {
        Holders::Held => Netns::Held,
        Holders::Unknown => Netns::Unknown,
        Holders::None => Netns::Gone,
    }
}

/// Whether a record written at `written` was written before `boot`.
fn before_boot(written: Option<SystemTime>, boot: Option<SystemTime>) -> bool {
    written.is_some_and(|w| crate::sys::before_boot(w, boot))
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
    /// The recorded namespace identity (`None` for records without one;
    /// one with an empty boot id when it is there but unreadable).
    pub identity: Option<NetnsIdentity>,
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
/// to scan since when each namespace has been seen gone. A scan reads only
/// the record files new or replaced since the last one, and keeps only
/// their identity and netns.
#[derive(Debug)]
pub struct StaleScanner {
    host: Host,
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
    /// A scanner for this boot (its boot id and boot time);
    /// `stale_after`: how long a namespace of this boot's record must be
    /// seen gone (`None`: only earlier boots' records are ever stale).
    pub fn new(stale_after: Option<Duration>) -> Self {
        StaleScanner::with_boot_time(crate::sys::boot_time(), stale_after)
    }

    /// A scanner taking `boot` as this boot's start (for records without
    /// a boot id).
    pub fn with_boot_time(boot: Option<SystemTime>, stale_after: Option<Duration>) -> Self {
        StaleScanner {
            host: Host::now(boot),
            stale_after,
            state: ScanState::default(),
        }
    }

    /// Whether this process sees the host's mounts and processes (the
    /// initial pid namespace, pid 1's mount namespace; a unit with a
    /// private `/run` does not). When it does not, only attachments another
    /// boot id proves gone are ever stale ([`Kept::HostMountsUnseen`]).
    pub fn sees_host_mounts(&self) -> bool {
        self.host.sees_host_mounts
    }

    /// Every `cniCacheV1` record of `cache` with its verdict, sorted by
    /// network, container and interface. An unreadable cache dir is an
    /// error; unusable record files are left out.
    pub async fn scan(&mut self, cache: &ResultCache) -> Result<Vec<Candidate>, Error> {
        let (host, stale_after, cache) = (self.host.clone(), self.stale_after, cache.clone());
        let dir = cache.results_dir();
        let mut state = std::mem::take(&mut self.state);
        let (state, res) = tokio::task::spawn_blocking(move || {
            let res = cache.store.scan(&mut state.scan).map(|changes| {
                for k in changes.removed {
                    state.records.remove(&k);
                }
                for r in changes.added {
                    state.records.insert(r.key(), r);
                }
                judge(&cache, &mut state, &host, stale_after)
            });
            (state, res)
        })
        .await
        .map_err(|e| crate::store::io_err(&dir, "scan", std::io::Error::other(e)))?;
        self.state = state;
        res
    }
}

/// The verdict on every record of `state`; the gone-clocks of the
/// attachments not seen gone now start over.
fn judge(
    cache: &ResultCache,
    state: &mut ScanState,
    host: &Host,
    stale_after: Option<Duration>,
) -> Vec<Candidate> {
    let now = Instant::now();
    let mut gone_since = HashMap::new();
    let mut out = Vec::with_capacity(state.records.len());
    for (key, r) in &state.records {
        let written = mtime(cache, &r.network_name, &r.container_id, &r.if_name);
        let (ns, earlier) = judge_one(&r.netns, r.identity.as_ref(), written, host);
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
            identity: r.identity.clone(),
        });
    }
    state.gone_since = gone_since;
    out
}

fn mtime(cache: &ResultCache, network: &str, cid: &str, ifname: &str) -> Option<SystemTime> {
    cache
        .path(network, cid, ifname)
        .ok()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
        .and_then(|m| m.modified().ok())
}

/// What [`Cni::reap_stale`](crate::Cni::reap_stale) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// The DEL ran and succeeded; the record is removed.
    Deleted,
    /// Nothing to do: the record is gone or was written again since the
    /// scan (a DEL or a new ADD came first).
    Changed,
    /// Nothing done: the namespace is there again, held, or whether it is
    /// gone cannot be told any more.
    Alive,
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
    fn a_path_that_is_a_namespace_now_is_never_judged_on_the_clock() {
        let host = |mounts| Host {
            boot_id: Some("this".into()),
            boot_time: Some(SystemTime::now()),
            sees_host_mounts: mounts,
        };
        let old = Some(SystemTime::now() - Duration::from_secs(3600));
        // Without identity: a /proc path that resolves is kept, however old.
        assert_eq!(
            judge_one("/proc/self/ns/net", None, old, &host(true)).0,
            Netns::Alive
        );
        assert_eq!(
            judge_one("/nonexistent/netns", None, old, &host(true)),
            (Netns::Gone, true)
        );
        // A path not seen from outside the host's mounts proves nothing.
        assert_eq!(
            judge_one("/nonexistent/netns", None, old, &host(false)).0,
            Netns::Unseen
        );
        assert_eq!(netns_state("", true), Netns::Unrecorded);
        // A plain file (a bind mount's mount point left behind).
        assert_eq!(netns_state("/proc/stat", true), Netns::Gone);
        // Another boot id: gone at once, seen or not.
        let other = NetnsIdentity {
            boot_id: "other".into(),
            ns: Some((1, 2)),
            handle: None,
            pid_start_time: None,
        };
        for mounts in [true, false] {
            assert_eq!(
                judge_one("/proc/self/ns/net", Some(&other), None, &host(mounts)),
                (Netns::Gone, true)
            );
        }
        // This boot: the path's namespace with the recorded inode is alive;
        // one not at its path proves nothing to a caller outside the
        // host's mounts.
        let own = identity::netns_id(Path::new("/proc/self/ns/net"))
            .unwrap()
            .unwrap();
        let this = |ns| NetnsIdentity {
            boot_id: "this".into(),
            ns: Some(ns),
            handle: None,
            pid_start_time: None,
        };
        for mounts in [true, false] {
            assert_eq!(
                judge_one("/proc/self/ns/net", Some(&this(own)), None, &host(mounts)).0,
                Netns::Alive
            );
        }
        assert_eq!(
            judge_one(
                "/nonexistent/x",
                Some(&this((own.0, 1))),
                None,
                &host(false)
            )
            .0,
            Netns::Unseen
        );
        // No boot id to compare with: cannot tell.
        let blind = Host {
            boot_id: None,
            ..host(true)
        };
        assert_eq!(
            judge_one("/x", Some(&other), None, &blind).0,
            Netns::Unknown
        );
    }
}
