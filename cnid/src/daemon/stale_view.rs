//! What the stale-attachment reaper (`reaper`) found and did, shared by
//! the reaper (its passes), the engine (a reap's outcome, a runtime's DEL
//! of a reaped attachment, the listing) and the periodic CHECK (which
//! leaves alone what the reaper found gone). Every change of the state
//! goes through a method here, so each rule of the reaper's module docs
//! has one place: a retry's backoff, the bounded memory of reaps
//! ([`REAPED_MAX`]), a refusal kept until its record changes.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use cni_async::daemon::AttachmentKey;
use cni_async::stale::Candidate;
use tokio::sync::Notify;

use super::metrics::Metrics;
use crate::daemon::lock;

/// An attachment's key (network, container ID, ifname).
pub(crate) fn key(network: &str, container_id: &str, ifname: &str) -> AttachmentKey {
    (
        network.to_owned(),
        container_id.to_owned(),
        ifname.to_owned(),
    )
}

fn candidate_key(c: &Candidate) -> AttachmentKey {
    key(&c.network, &c.container_id, &c.ifname)
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

/// What the reaper found and did (see the module docs).
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
    gone: HashMap<AttachmentKey, SystemTime>,
    /// Stale at the last scan (and not reaped since).
    stale: HashSet<AttachmentKey>,
    /// Reaps queued or running.
    inflight: HashSet<AttachmentKey>,
    /// Reaps refused, with the record's mtime then and the error.
    failed: HashMap<AttachmentKey, (Option<SystemTime>, String)>,
    /// Reaps failed for a transient reason, to be tried again.
    retry: HashMap<AttachmentKey, Retry>,
    /// Reaped attachments not attached again since, in the order reaped.
    reaped: HashMap<AttachmentKey, u64>,
    reaped_seq: u64,
    /// Whether the scanner does not see the host's mounts (see the
    /// reaper's module docs).
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
    /// What the last scan found about the attachment (`None`: its
    /// namespace was not seen gone).
    pub(crate) fn state(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<ReapState> {
        let k = key(network, container_id, ifname);
        let v = lock(&self.inner);
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
        !lock(&self.inner).limited
    }

    pub(crate) fn set_sees_host_mounts(&self, sees: bool) {
        lock(&self.inner).limited = !sees;
    }

    pub(crate) fn was_reaped(&self, k: &AttachmentKey) -> bool {
        lock(&self.inner).reaped.contains_key(k)
    }

    /// The attachment was attached again, or its late DEL answered: a
    /// later DEL runs its plugins.
    pub(crate) fn forget(&self, k: &AttachmentKey) {
        lock(&self.inner).reaped.remove(k);
    }

    /// When the next retry is due.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        lock(&self.inner).retry.values().filter_map(|r| r.due).min()
    }

    /// Notified when a retry was scheduled.
    pub(crate) fn retry_added(&self) -> &Notify {
        &self.retry_added
    }

    /// A scan's findings: `gone` (since when each namespace is gone, as
    /// this scan saw it) and the `stale` among them. Returns the stale
    /// ones to queue a reap of: not queued already, no retry pending, not
    /// refused with the same record.
    pub(crate) fn scanned(
        &self,
        mut gone: HashMap<AttachmentKey, SystemTime>,
        stale: Vec<Candidate>,
        metrics: &Metrics,
    ) -> Vec<Candidate> {
        let due = Instant::now();
        let mut v = lock(&self.inner);
        // Seen gone before: since then (the first sighting stays).
        for (k, since) in &mut gone {
            if let Some(first) = v.gone.get(k) {
                *since = (*first).min(*since);
            }
        }
        v.gone = gone;
        v.stale = stale.iter().map(candidate_key).collect();
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
                let k = candidate_key(c);
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
        v.publish(metrics);
        todo
    }

    /// A reap of `k` was queued.
    pub(crate) fn queued(&self, k: AttachmentKey) {
        lock(&self.inner).inflight.insert(k);
    }

    /// The reap of `k` ended (or never ran): a retry of it that never ran
    /// (out of time while queued, cancelled) is due again after its
    /// backoff.
    pub(crate) fn settled(&self, k: &AttachmentKey) {
        let mut v = lock(&self.inner);
        v.inflight.remove(k);
        if let Some(r) = v.retry.get_mut(k)
            && r.due.is_none()
        {
            r.due = Some(Instant::now() + backoff(r.attempts));
            drop(v);
            self.retry_added.notify_one();
        }
    }

    /// The reap's DEL succeeded: remembered as reaped.
    pub(crate) fn reaped(&self, k: AttachmentKey, metrics: &Metrics) {
        let mut v = lock(&self.inner);
        v.stale.remove(&k);
        v.gone.remove(&k);
        v.failed.remove(&k);
        v.retry.remove(&k);
        v.remember_reaped(k);
        v.publish(metrics);
    }

    /// The record changed since the scan: nothing was reaped.
    pub(crate) fn changed(&self, k: &AttachmentKey, metrics: &Metrics) {
        let mut v = lock(&self.inner);
        v.stale.remove(k);
        v.gone.remove(k);
        v.retry.remove(k);
        v.publish(metrics);
    }

    /// A transient failure: tried again after a backoff. Returns the
    /// attempts so far and the wait.
    pub(crate) fn retry_later(&self, k: AttachmentKey, error: String) -> (u32, Duration) {
        let mut v = lock(&self.inner);
        let attempts = v.retry.get(&k).map_or(0, |r| r.attempts) + 1;
        let wait = backoff(attempts);
        let due = Some(Instant::now() + wait);
        v.retry.insert(
            k,
            Retry {
                attempts,
                due,
                error,
            },
        );
        drop(v);
        self.retry_added.notify_one();
        (attempts, wait)
    }

    /// A refusal: not tried again until the record (its mtime `written`)
    /// changes.
    pub(crate) fn refused(&self, k: AttachmentKey, written: Option<SystemTime>, error: String) {
        let mut v = lock(&self.inner);
        v.retry.remove(&k);
        v.failed.insert(k, (written, error));
    }
}

impl View {
    fn remember_reaped(&mut self, k: AttachmentKey) {
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
    fn publish(&self, metrics: &Metrics) {
        let stale = self.stale.len();
        let gone = self.gone.keys().filter(|k| !self.stale.contains(*k));
        let gone = gone.count();
        metrics.stale.store(stale as i64, Ordering::Relaxed);
        metrics.gone.store(gone as i64, Ordering::Relaxed);
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
}
