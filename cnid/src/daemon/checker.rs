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
//!   round. A periodic CHECK is background
//!   work (`Work::PeriodicCheck`): it takes a background slot (`slots`,
//!   the share reaps use), and one still queued when a runtime request of
//!   its container arrives is dropped (`queue`).
//! - **Reporting** (`drift`): a failed CHECK marks the attachment drifted
//!   (`/v1/attachments`: `"state": "drifted"`, `checkError`), counted in
//!   `cnid_drifted_attachments`, with one log line when it drifts and one
//!   when its CHECK passes again (not one per round). A DEL or ADD of the
//!   attachment forgets its drift. Only a plugin's failure is drift; a
//!   CHECK out of time while queued, or whose record went meanwhile, is
//!   not.
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
            || self
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&k)
        {
            return;
        }
        self.queued += 1;
        let work = Work::PeriodicCheck {
            list: list.clone(),
            rt: rec.runtime_conf(),
        };
        let request_id = format!("check-{}", self.queued);
        let Ok(waiter) = self
            .submit
            .submit(request_id, net.clone(), list.version(), work)
        else {
            return;
        };
        self.inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(k.clone());
        let (inflight, drift) = (self.inflight.clone(), self.drift.clone());
        let (cache, metrics) = (self.cache.clone(), self.metrics.clone());
        self.submit.spawn(async move {
            let outcome = waiter.wait().await;
            inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&k);
            let cached = || {
                cache
                    .path(&k.0, &k.1, &k.2)
                    .is_ok_and(|p| std::fs::symlink_metadata(p).is_ok())
            };
            drift.checked(&k, outcome.as_ref(), cached, &metrics);
        });
    }
}
