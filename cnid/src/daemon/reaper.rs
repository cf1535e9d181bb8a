//! The stale-attachment reaper: cached attachments whose network
//! namespace is gone are DELed, so that no IPAM reservation outlives its
//! container when nobody sends the DEL (a reboot, a runtime that crashed or
//! lost its state). Which attachments are stale and how one is DELed is
//! the library's (`cni_async::stale`, shared with `cnitool gc --stale`);
//! this module schedules it in the daemon:
//!
//! - **At start**, after the recovery of unfinished ADDs and before any
//!   request is served, one pass queues a reap of every attachment written
//!   in an earlier boot whose namespace is gone.
//! - **While running** (unless `--stale-after 0`), a pass every
//!   [`interval`] queues a reap of every attachment whose namespace has
//!   been gone for `--stale-after`. With `--stale-after 0` the passes
//!   (every 30 s) judge only an earlier boot's attachments, so what the
//!   start's pass could not get done (out of time) is tried again.
//! - **Ordering.** A reap is an operation in its attachment's container
//!   queue under its network's shared gate (`Work::Reap`), like a DEL: it
//!   never runs alongside a runtime's DEL, ADD or CHECK of that container,
//!   nor during a GC of the network. When it runs it checks again that the
//!   record is the one scanned and its namespace still gone. Not
//!   started when a runtime request of its container arrives, it takes a
//!   runtime slot from then on: the request would otherwise wait behind
//!   it for a background slot. It does not coalesce with a runtime's DEL: a
//!   runtime's DEL queued behind it finds the attachment reaped and
//!   answers success without running the plugins again
//!   ([`Engine::reaped_already`]); one queued ahead of it leaves the reap
//!   nothing to do. Either way one DEL runs.
//! - **Background work.** A reap runs in a background slot (`slots`): at
//!   most a quarter of `--max-parallel` (at least one) reaps run at once,
//!   and a reap never takes a slot a runtime request waits for.
//! - **Reaped means reaped until attached again.** A reaped attachment is
//!   remembered (whatever the time since) until a runtime's DEL of it
//!   answered, or an ADD of it succeeded ([`Engine::forget_reap`]): from
//!   then on its DEL runs the plugins (without `prevResult` when its
//!   record is lost). The memory is bounded ([`REAPED_MAX`]); an
//!   attachment forgotten that way gets its DEL run, which is safe.
//! - **Transient failures** (CNI code 11 "try again later": an IPAM agent
//!   not up yet, a DEL out of time, the attachment locked by another tool)
//!   are retried with exponential backoff, from [`RETRY_FIRST`] to
//!   [`RETRY_MAX`] between tries.
//! - **Refusals** (any other error: a plugin that refuses a DEL without
//!   its namespace, such as host-device) are logged with the plugin's
//!   error and counted; the attachment stays listed as `stale` with the
//!   error and is not tried again until its record changes or cnid
//!   restarts.
//! - **Listing.** `/v1/attachments` shows what the last scan found: an
//!   attachment whose namespace is gone is `"state": "gone"` while it
//!   waits for `--stale-after`, then `"stale"` until it is reaped (with
//!   the last error once a reap failed), each with `goneSince` (when the
//!   reaper first saw the namespace gone). The gauge
//!   `cnid_stale_attachments{state}` counts the same.
//! - **Safety.** Nothing is reaped while the conf dir (also a missing
//!   one) or the cache cannot be read (a pass is skipped, with a warning).
//!   Only an attachment proven gone is reaped (`cni_async::stale`: another
//!   boot id, or its namespace not at its path and held by nothing), and
//!   its DEL gets no netns path. A cnid that does not see the host's
//!   mounts and processes reaps only an earlier boot's attachments, and
//!   says so once: a warning at start, `cnid_stale_host_mounts_visible`
//!   0, and a `staleReaper` detail in `GET /v1/health/ready`.
//!
//! # Caveats
//! A reap is a DEL: its record is removed only after the plugins'
//! DEL succeeded, so a daemon killed during a reap leaves the record,
//! and the next start (or pass) reaps it again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use cni_async::CallOptions;
use cni_async::stale::{Candidate, Reaped, StaleReason, StaleScanner, Verdict};
use cni_core::{RuntimeConf, Version};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::error::ApiError;
use super::operation::{Done, NewOp, Outcome, Work};

type Key = (String, String, String);

fn key(network: &str, container_id: &str, ifname: &str) -> Key {
    (
        network.to_owned(),
        container_id.to_owned(),
        ifname.to_owned(),
    )
}

/// How many reaped attachments are remembered for a runtime's late DEL
/// (the oldest is forgotten first: its DEL then runs the plugins).
pub(crate) const REAPED_MAX: usize = 16_384;

/// The wait before the first retry of a transient failure; doubled at
/// each failure up to [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between retries of a transient failure.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(300);

/// The wait before retry number `attempt` (1 for the first).
pub(crate) fn backoff(attempt: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(20))
        .min(RETRY_MAX)
}

/// How often the running reaper scans: a quarter of `stale_after`,
/// between 250 ms and 30 s.
pub(crate) fn interval(stale_after: Duration) -> Duration {
    (stale_after / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
}

/// What the reaper found and did, shared with the engine (listing, DEL).
#[derive(Debug, Default)]
pub(crate) struct StaleView {
    inner: Mutex<View>,
    /// A retry was scheduled: the running reaper looks at its wake time.
    retry_added: Notify,
}

#[derive(Debug, Default)]
struct View {
    /// Namespace gone at the last scan (waiting or stale), since when the
    /// reaper has seen it gone.
    gone: HashMap<Key, SystemTime>,
    /// Stale at the last scan (and not reaped since).
    stale: HashSet<Key>,
    /// Reaps queued or running.
    inflight: HashSet<Key>,
    /// Reaps refused, with the record's mtime then and the error.
    failed: HashMap<Key, (Option<SystemTime>, String)>,
    /// Reaps failed for a transient reason, to be tried again.
    retry: HashMap<Key, Retry>,
    /// Reaped attachments not attached again since, in the order reaped.
    reaped: HashMap<Key, u64>,
    reaped_seq: u64,
    /// Whether the scanner does not see the host's mounts (see the module
    /// docs).
    limited: bool,
}

#[derive(Debug, Clone)]
struct Retry {
    attempts: u32,
    /// When to try again; `None` once queued again (until it fails).
    due: Option<Instant>,
    error: String,
}

/// An attachment's reaper state in the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReapState {
    /// `gone` (waiting for `--stale-after`) or `stale` (to be reaped).
    pub(crate) state: &'static str,
    /// When the reaper first saw its namespace gone.
    pub(crate) gone_since: Option<SystemTime>,
    /// The last reap's error (a refusal, or a transient failure to retry).
    pub(crate) error: Option<String>,
}

impl StaleView {
    fn lock(&self) -> MutexGuard<'_, View> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the last scan found about the attachment (`None`: its
    /// namespace was not seen gone).
    pub(crate) fn state(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<ReapState> {
        let k = key(network, container_id, ifname);
        let v = self.lock();
        let gone_since = v.gone.get(&k).copied();
        if v.stale.contains(&k) {
            let error = v
                .failed
                .get(&k)
                .map(|f| f.1.clone())
                .or_else(|| v.retry.get(&k).map(|r| r.error.clone()));
            return Some(ReapState {
                state: "stale",
                gone_since,
                error,
            });
        }
        gone_since.map(|since| ReapState {
            state: "gone",
            gone_since: Some(since),
            error: None,
        })
    }

    /// Whether the reaper sees the host's mounts and processes.
    pub(crate) fn sees_host_mounts(&self) -> bool {
        !self.lock().limited
    }

    fn was_reaped(&self, k: &Key) -> bool {
        self.lock().reaped.contains_key(k)
    }

    /// The attachment was attached again: a later DEL runs its plugins.
    pub(crate) fn forget(&self, network: &str, container_id: &str, ifname: &str) {
        self.lock()
            .reaped
            .remove(&key(network, container_id, ifname));
    }

    /// When the next retry is due.
    fn next_retry(&self) -> Option<Instant> {
        self.lock().retry.values().filter_map(|r| r.due).min()
    }
}

impl View {
    fn remember_reaped(&mut self, k: Key) {
        self.reaped_seq += 1;
        self.reaped.insert(k, self.reaped_seq);
        if self.reaped.len() > REAPED_MAX
            && let Some(oldest) = self
                .reaped
                .iter()
                .min_by_key(|(_, seq)| **seq)
                .map(|(k, _)| k.clone())
        {
            self.reaped.remove(&oldest);
        }
    }

    /// The gauges: attachments listed `gone` and `stale`.
    fn publish(&self, metrics: &super::metrics::Metrics) {
        let stale = self.stale.len();
        let gone = self
            .gone
            .keys()
            .filter(|k| !self.stale.contains(*k))
            .count();
        metrics.stale.store(stale as i64, Ordering::Relaxed);
        metrics.gone.store(gone as i64, Ordering::Relaxed);
    }
}

impl Engine {
    /// Whether a DEL of `network`/`rt` finds its attachment deleted by the
    /// reaper (and not attached again since, not even by an ADD that
    /// failed and left its intent): then it answers success without
    /// running the plugins again.
    pub(super) async fn reaped_already(&self, network: &str, rt: &RuntimeConf) -> bool {
        let k = key(network, &rt.container_id, &rt.ifname);
        if !self.stale.was_reaped(&k) {
            return false;
        }
        let cached = self
            .cni
            .cache()
            .path(network, &rt.container_id, &rt.ifname)
            .is_ok_and(|p| std::fs::symlink_metadata(p).is_ok());
        // An ADD since the reap that failed and could not be rolled back
        // left its intent: that attachment's DEL must run.
        if cached
            || self
                .intents
                .read(network, &rt.container_id, &rt.ifname)
                .await
                .is_some()
        {
            return false;
        }
        self.stale.lock().reaped.remove(&k);
        tracing::info!(
            "attachment already deleted by the stale-attachment reaper; DEL answers success"
        );
        true
    }

    /// An ADD of the attachment succeeded: it is attached again, so a
    /// reap of it before is forgotten (its DEL must run).
    pub(super) fn forget_reap(&self, network: &str, rt: &RuntimeConf) {
        self.stale.forget(network, &rt.container_id, &rt.ifname);
    }

    /// `Work::Reap`: the DEL of a stale attachment, logged and counted.
    pub(super) async fn reap(&self, c: &Candidate, opts: CallOptions) -> Outcome {
        let Some(reason) = c.verdict.stale() else {
            return Ok(Done::Nothing);
        };
        let k = key(&c.network, &c.container_id, &c.ifname);
        let why = reason_index(reason);
        let span = tracing::info_span!("reap", network = %c.network, container = %c.container_id,
            ifname = %c.ifname, netns = %c.netns, why = %reason);
        let res =
            tracing::Instrument::instrument(self.cni.reap_stale(c, &opts), span.clone()).await;
        let _enter = span.enter();
        match res {
            Ok(Reaped::Deleted) => {
                drop(_enter);
                tracing::Instrument::instrument(
                    self.deleted(
                        &c.network,
                        &RuntimeConf::new(&c.container_id, &c.netns, &c.ifname),
                    ),
                    span.clone(),
                )
                .await;
                let _enter = span.enter();
                {
                    let mut v = self.stale.lock();
                    v.stale.remove(&k);
                    v.gone.remove(&k);
                    v.failed.remove(&k);
                    v.retry.remove(&k);
                    v.remember_reaped(k);
                    v.publish(&self.metrics);
                }
                self.metrics.reaped[why][0].fetch_add(1, Ordering::Relaxed);
                tracing::warn!("stale attachment deleted: its namespace is gone ({reason})");
                Ok(Done::Nothing)
            }
            Ok(other) => {
                let mut v = self.stale.lock();
                v.stale.remove(&k);
                v.gone.remove(&k);
                v.retry.remove(&k);
                v.publish(&self.metrics);
                drop(v);
                tracing::info!(outcome = ?other, "stale attachment not deleted: it changed since the scan");
                Ok(Done::Nothing)
            }
            Err(e) => {
                self.metrics.reaped[why][1].fetch_add(1, Ordering::Relaxed);
                let error = cni_core::error::Chain(&e).to_string();
                if transient(&e) {
                    // "Try again later" (code 11: a plugin's own, a DEL
                    // out of time, the attachment locked by another tool)
                    // is no refusal: tried again after a backoff.
                    let mut v = self.stale.lock();
                    let attempts = v.retry.get(&k).map_or(0, |r| r.attempts) + 1;
                    let wait = backoff(attempts);
                    v.retry.insert(
                        k,
                        Retry {
                            attempts,
                            due: Some(Instant::now() + wait),
                            error: error.clone(),
                        },
                    );
                    drop(v);
                    self.stale.retry_added.notify_one();
                    tracing::error!(error = %error, attempts, retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        "cannot delete a stale attachment for now (try again later); retrying after a backoff");
                } else {
                    let mut v = self.stale.lock();
                    v.retry.remove(&k);
                    v.failed.insert(k, (c.written, error.clone()));
                    drop(v);
                    tracing::error!(error = %error,
                        "cannot delete a stale attachment; it stays cached and listed as stale, not retried until its record changes or cnid restarts");
                }
                Err(ApiError::from_cni(&e, Version::CURRENT))
            }
        }
    }
}

/// Whether a reap's error is worth trying again soon: CNI code 11 ("try
/// again later"), which a DEL out of time and an attachment locked by
/// another tool also answer.
fn transient(e: &cni_async::Error) -> bool {
    e.code() == cni_core::error::code::TRY_AGAIN_LATER
        || matches!(
            e.kind(),
            cni_async::ErrorKind::Timeout | cni_async::ErrorKind::Busy
        )
}

fn reason_index(r: StaleReason) -> usize {
    match r {
        StaleReason::Rebooted => 0,
        StaleReason::NamespaceGone => 1,
    }
}

/// Scans the cache and queues the reaps.
#[derive(Debug)]
pub(crate) struct Reaper {
    engine: Arc<Engine>,
    scanner: StaleScanner,
    queued: u64,
    /// Why the last pass was skipped (warned once per change).
    skipped: Option<String>,
}

impl Reaper {
    /// `stale_after`: how long a namespace of this boot must be gone
    /// (`None`: only an earlier boot's attachments are reaped).
    pub(crate) fn new(engine: Arc<Engine>, stale_after: Option<Duration>) -> Self {
        let scanner = StaleScanner::new(stale_after);
        let sees = scanner.sees_host_mounts();
        engine.stale.lock().limited = !sees;
        engine
            .metrics
            .host_mounts_visible
            .store(i64::from(sees), Ordering::Relaxed);
        if !sees {
            tracing::warn!(
                "stale-attachment reaper: cnid does not see the host's mounts and processes (not in pid 1's mount namespace or not in the initial pid namespace); only attachments of an earlier boot (another boot id) are reaped"
            );
        }
        Reaper {
            engine,
            scanner,
            queued: 0,
            skipped: None,
        }
    }

    fn skip(&mut self, why: String) {
        if self.skipped.as_ref() != Some(&why) {
            tracing::warn!(reason = %why, "stale-attachment reaper: pass skipped, nothing is reaped");
            self.skipped = Some(why);
        }
    }

    /// One pass: scans the cache and queues a reap of every stale
    /// attachment not queued already and not failed with the same record.
    /// Returns how many were queued.
    pub(crate) async fn pass(&mut self) -> usize {
        // A missing conf dir counts: the loader takes it as empty, but a
        // conf dir not there (yet) says the host is not set up.
        let dir_error = match std::fs::read_dir(self.engine.networks.dir()) {
            Err(e) => Some(e.to_string()),
            Ok(_) => self.engine.networks.snapshot().dir_error.clone(),
        };
        if let Some(e) = dir_error {
            self.skip(format!(
                "conf dir {} unreadable: {e}",
                self.engine.networks.dir().display()
            ));
            return 0;
        }
        let found = match self.scanner.scan(self.engine.cni.cache()).await {
            Ok(f) => f,
            Err(e) => {
                self.skip(format!("cache unreadable: {}", cni_core::error::Chain(&e)));
                return 0;
            }
        };
        if self.skipped.take().is_some() {
            tracing::info!("stale-attachment reaper: conf dir and cache readable again");
        }
        let now = SystemTime::now();
        let mut gone: HashMap<Key, SystemTime> = HashMap::new();
        let mut stale: Vec<Candidate> = Vec::new();
        for c in found {
            let gone_for = match c.verdict {
                Verdict::Waiting { gone_for } => gone_for,
                Verdict::Stale(_) => Duration::ZERO,
                Verdict::Kept(_) => continue,
            };
            let (n, cid, i) = c.key();
            gone.insert(key(n, cid, i), now.checked_sub(gone_for).unwrap_or(now));
            if c.verdict.stale().is_some() {
                stale.push(c);
            }
        }
        let due = Instant::now();
        let todo: Vec<Candidate> = {
            let mut v = self.engine.stale.lock();
            // Seen gone before: since then (the first sighting stays).
            for (k, since) in &mut gone {
                if let Some(first) = v.gone.get(k) {
                    *since = (*first).min(*since);
                }
            }
            v.gone = gone;
            v.stale = stale
                .iter()
                .map(|c| {
                    let (n, cid, i) = c.key();
                    key(n, cid, i)
                })
                .collect();
            let View {
                stale: keys,
                failed,
                retry,
                inflight,
                ..
            } = &mut *v;
            failed.retain(|k, _| keys.contains(k));
            retry.retain(|k, _| keys.contains(k));
            let todo = stale
                .into_iter()
                .filter(|c| {
                    let (n, cid, i) = c.key();
                    let k = key(n, cid, i);
                    if inflight.contains(&k) {
                        return false;
                    }
                    match retry.get_mut(&k) {
                        // Not yet; or queued again already.
                        Some(r) if r.due.is_none_or(|d| d > due) => return false,
                        // Due: queued now, so no longer due.
                        Some(r) => r.due = None,
                        None => {}
                    }
                    match failed.get(&k) {
                        Some((w, _)) if *w == c.written => false,
                        Some(_) => {
                            failed.remove(&k);
                            true
                        }
                        None => true,
                    }
                })
                .collect();
            v.publish(&self.engine.metrics);
            todo
        };
        let mut n = 0;
        for c in todo {
            let rt = RuntimeConf::new(&c.container_id, &c.netns, &c.ifname);
            let k = key(&c.network, &c.container_id, &c.ifname);
            self.queued += 1;
            let network = c.network.clone();
            let waiter = self.engine.submit(NewOp {
                request_id: format!("reap-{}", self.queued),
                network,
                version: Version::CURRENT,
                work: Work::Reap {
                    candidate: Box::new(c),
                    rt,
                },
                deadline: Instant::now() + self.engine.deadlines.defaults.del,
                claim: None,
                trace: Default::default(),
            });
            match waiter {
                Ok(w) => {
                    self.engine.stale.lock().inflight.insert(k.clone());
                    let engine = self.engine.clone();
                    self.engine.tracker.spawn(async move {
                        let _ = w.wait().await;
                        let mut v = engine.stale.lock();
                        v.inflight.remove(&k);
                        // A retry that never ran (out of time while
                        // queued, cancelled): due again after its backoff.
                        if let Some(r) = v.retry.get_mut(&k)
                            && r.due.is_none()
                        {
                            r.due = Some(Instant::now() + backoff(r.attempts));
                            drop(v);
                            engine.stale.retry_added.notify_one();
                        }
                    });
                    n += 1;
                }
                Err(e) => {
                    tracing::warn!(error = %e.error.msg, "cannot queue the reap of a stale attachment");
                }
            }
        }
        n
    }

    /// The running reaper: a pass every `every` until `stop`, and one as
    /// soon as a retry is due.
    pub(crate) async fn run(mut self, every: Duration, stop: CancellationToken) {
        let mut next_pass = Instant::now() + every;
        let mut last_pass = Instant::now();
        loop {
            // A retry the last pass could not queue (a pass skipped: conf
            // dir or cache unreadable) waits at least RETRY_FIRST.
            let wake = match self.engine.stale.next_retry() {
                Some(retry) => retry.max(last_pass + RETRY_FIRST).min(next_pass),
                None => next_pass,
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake.into()) => {}
                // A new retry may be due before `wake`: look again.
                () = self.engine.stale.retry_added.notified() => continue,
            }
            last_pass = Instant::now();
            if last_pass >= next_pass {
                next_pass = last_pass + every;
            }
            self.pass().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_bounds() {
        assert_eq!(backoff(1), RETRY_FIRST);
        assert_eq!(backoff(2), RETRY_FIRST * 2);
        assert_eq!(backoff(3), RETRY_FIRST * 4);
        assert_eq!(backoff(30), RETRY_MAX);
        assert_eq!(backoff(u32::MAX), RETRY_MAX);
    }

    #[test]
    fn reaped_memory_is_bounded_and_forgets_the_oldest() {
        let mut v = View::default();
        for i in 0..=REAPED_MAX {
            v.remember_reaped(key("n", &format!("c{i}"), "eth0"));
        }
        assert_eq!(v.reaped.len(), REAPED_MAX);
        assert!(!v.reaped.contains_key(&key("n", "c0", "eth0")));
        assert!(v.reaped.contains_key(&key("n", "c1", "eth0")));
    }

    #[test]
    fn interval_is_a_quarter_within_bounds() {
        assert_eq!(interval(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(interval(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(
            interval(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
    }
}
