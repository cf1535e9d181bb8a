//! The opt-in periodic CHECK (`--check-every DUR`, off by default): each
//! cached attachment is CHECKed about once per interval, with its cached
//! runtime parameters and its network's current configuration, and a
//! CHECK that fails ("drift": an interface, address or route a plugin
//! expects is gone or changed) is reported. Nothing is repaired.
//!
//! - **Spread**: a round lists the cache and CHECKs its attachments one
//!   after the other, spaced evenly over the interval.
//! - **Never in the way**: an attachment with an operation queued or
//!   running, one whose network is not loaded, has `disableCheck`, or a
//!   version before 0.4.0 (no CHECK), and one whose namespace the reaper
//!   found gone (or whose netns path is not there now), is skipped this
//!   round. A periodic CHECK is background work (`Work::PeriodicCheck`):
//!   it takes a background slot (`slots`, the share reaps use), and one
//!   still queued when a runtime request of its container arrives is
//!   dropped (`queue`).
//! - **Reporting** (`drift`): a failed CHECK marks the attachment drifted
//!   (`/v1/attachments`: `"state": "drifted"`, `checkError`), counted in
//!   `cnid_drifted_attachments`, with one log line when it drifts and one
//!   when its CHECK passes again (not one per round). A DEL or ADD of the
//!   attachment forgets its drift. Only a plugin's failure is drift; a
//!   CHECK out of time while queued, or whose record went or was replaced
//!   (a DEL, a reap, a new ADD) before its outcome was recorded, is not.
//!
//! # Caveats
//! A periodic CHECK that has started runs to its end (bounded by the
//! CHECK deadline): a runtime request of its container arriving then
//! waits for it, as behind any operation of the container.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni_async::cache::ResultCache;
use cni_async::daemon::AttachmentKey;
use cni_core::Version;
use tokio_util::sync::CancellationToken;

use super::drift::DriftView;
use super::engine::Submitter;
use super::metrics::Metrics;
use super::networks::Networks;
use super::operation::Work;
use super::stale_view::{StaleView, key};
use crate::daemon::lock;

/// The periodic CHECK's rounds.
#[derive(Debug)]
pub(crate) struct Checker {
    submit: Submitter,
    cache: ResultCache,
    networks: Arc<Networks>,
    metrics: Arc<Metrics>,
    drift: Arc<DriftView>,
    stale: Arc<StaleView>,
    every: Duration,
    queued: u64,
    inflight: Arc<Mutex<HashSet<AttachmentKey>>>,
}

impl Checker {
    pub(crate) fn new(
        submit: Submitter,
        (cache, networks, metrics): (ResultCache, Arc<Networks>, Arc<Metrics>),
        (drift, stale): (Arc<DriftView>, Arc<StaleView>),
        every: Duration,
    ) -> Self {
        Checker {
            submit,
            cache,
            networks,
            metrics,
            drift,
            stale,
            every,
            queued: 0,
            inflight: Arc::default(),
        }
    }

    /// Rounds until `stop`: the first one interval after start.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut round = Instant::now() + self.every;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(round.into()) => {}
            }
            let records = match self.cache.list(None).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %cni_core::error::Chain(&e), "periodic CHECK: cannot list the cache; round skipped");
                    round += self.every;
                    continue;
                }
            };
            self.drift.prune(&records, &self.metrics);
            let step = self.every / u32::try_from(records.len().max(1)).unwrap_or(u32::MAX);
            for (i, rec) in records.into_iter().enumerate() {
                let at = round + step * u32::try_from(i).unwrap_or(u32::MAX);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep_until(at.into()) => {}
                }
                self.check(rec);
            }
            round += self.every;
            // A round that took longer (a huge cache) starts the next at once.
            round = round.max(Instant::now());
        }
    }

    /// Queues a CHECK of `rec`, unless it is skipped (module docs).
    fn check(&mut self, rec: cni_core::cache::CacheRecord) {
        let (net, cid, ifname) = (&rec.network_name, &rec.container_id, &rec.if_name);
        let k = key(net, cid, ifname);
        let Some(loaded) = self.networks.get(net) else {
            return;
        };
        let list = loaded.list.clone();
        if list.disable_check()
            || list.version() < Version::V0_4_0
            || self.stale.state(net, cid, ifname).is_some()
            // Gone since the reaper's last scan: the reaper's to judge.
            || rec.netns.is_empty()
            || std::fs::symlink_metadata(&rec.netns).is_err()
            || self.submit.busy(cid)
            || lock(&self.inflight)
                .contains(&k)
        {
            return;
        }
        self.queued += 1;
        let written = record_written(&self.cache, &k);
        let work = Work::PeriodicCheck {
            list: list.clone(),
            rt: rec.runtime_conf(),
        };
        let request_id = format!("check-{}", self.queued);
        let queued = self
            .submit
            .submit(request_id, net.clone(), list.version(), work);
        let Ok(waiter) = queued else {
            return;
        };
        lock(&self.inflight).insert(k.clone());
        let (inflight, drift) = (self.inflight.clone(), self.drift.clone());
        let (cache, metrics) = (self.cache.clone(), self.metrics.clone());
        self.submit.spawn(async move {
            let outcome = waiter.wait().await;
            lock(&inflight).remove(&k);
            recorded(&drift, &cache, &k, written, outcome.as_ref(), &metrics);
        });
    }
}

/// The mtime of `k`'s record (`None`: none, or it cannot be read).
fn record_written(cache: &ResultCache, k: &AttachmentKey) -> Option<std::time::SystemTime> {
    let path = cache.path(&k.0, &k.1, &k.2).ok()?;
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
}

/// A periodic CHECK's outcome, recorded in the drift view against the
/// record it ran on (`written`: that record's mtime when it was queued).
/// A record gone or replaced since (a DEL or a reap, then maybe a new
/// ADD, ran before the outcome was recorded) is not the one CHECKed: its
/// failure is no drift of what is there now.
fn recorded(
    drift: &DriftView,
    cache: &ResultCache,
    k: &AttachmentKey,
    written: Option<std::time::SystemTime>,
    outcome: &super::operation::Outcome,
    metrics: &Metrics,
) {
    let same_record = || written.is_some() && record_written(cache, k) == written;
    drift.checked(k, outcome, same_record, metrics);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::error::{ApiError, ErrorKind};
    use crate::daemon::stale_view::key;

    fn failed() -> super::super::operation::Outcome {
        Err(ApiError::new(ErrorKind::PluginFailed, 100, "check refused"))
    }

    /// A CHECK that failed on an attachment the runtime then DELed and
    /// ADDed again before its outcome was recorded (the checker's task
    /// ran late) says nothing about the new attachment: no drift. The
    /// same record still there is drift; a record gone is not.
    #[test]
    fn a_failed_check_of_a_replaced_record_is_no_drift_of_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(dir.path());
        let (drift, metrics) = (DriftView::default(), Metrics::default());
        let k = key("n", "c", "eth0");
        let path = cache.path("n", "c", "eth0").unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let write = |at: std::time::SystemTime| {
            std::fs::write(&path, b"{}").unwrap();
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(at).unwrap();
        };
        let t0 = std::time::SystemTime::now() - Duration::from_secs(60);
        write(t0);
        let written = record_written(&cache, &k);
        assert!(written.is_some());

        // The CHECKed record is still there: drift.
        recorded(&drift, &cache, &k, written, &failed(), &metrics);
        assert!(drift.state("n", "c", "eth0").is_some());
        // A DEL and an ADD of the attachment came between the CHECK and
        // its outcome: the DEL forgot the drift, the ADD wrote a new record.
        drift.forget(&k, &metrics);
        write(t0 + Duration::from_secs(1));
        drift.forget(&k, &metrics);
        recorded(&drift, &cache, &k, written, &failed(), &metrics);
        assert_eq!(
            drift.state("n", "c", "eth0"),
            None,
            "the new attachment drifted"
        );
        assert_eq!(
            metrics.drifted.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // Reaped (or DELed) meanwhile: no record, no drift.
        std::fs::remove_file(&path).unwrap();
        recorded(&drift, &cache, &k, written, &failed(), &metrics);
        assert_eq!(drift.state("n", "c", "eth0"), None);
    }
}
