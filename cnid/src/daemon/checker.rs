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
//! - **Reporting**: a failed CHECK marks the attachment drifted
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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use cni_core::Version;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::error::ErrorKind;
use super::operation::{NewOp, Work};

type Key = (String, String, String);

fn key(network: &str, container_id: &str, ifname: &str) -> Key {
    (
        network.to_owned(),
        container_id.to_owned(),
        ifname.to_owned(),
    )
}

/// Drifted attachments, shared with the engine (listing, DEL, ADD).
#[derive(Debug, Default)]
pub(crate) struct DriftView {
    inner: Mutex<HashMap<Key, Drift>>,
}

/// A drifted attachment: the failing CHECK's error, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drift {
    pub(crate) error: String,
    pub(crate) since: SystemTime,
}

impl DriftView {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Drift>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attachment's drift, if its last periodic CHECK failed.
    pub(crate) fn state(&self, network: &str, container_id: &str, ifname: &str) -> Option<Drift> {
        self.lock()
            .get(&key(network, container_id, ifname))
            .cloned()
    }

    /// The attachment was deleted or attached again: its drift is gone.
    pub(crate) fn forget(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        metrics: &super::metrics::Metrics,
    ) {
        let mut v = self.lock();
        if v.remove(&key(network, container_id, ifname)).is_some() {
            metrics.drifted.store(v.len() as i64, Ordering::Relaxed);
        }
    }
}

/// The periodic CHECK's rounds.
#[derive(Debug)]
pub(crate) struct Checker {
    engine: Arc<Engine>,
    every: Duration,
    queued: u64,
    inflight: Arc<Mutex<HashSet<Key>>>,
}

impl Checker {
    pub(crate) fn new(engine: Arc<Engine>, every: Duration) -> Self {
        Checker {
            engine,
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
            let records = match self.engine.cni.cache().list(None).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %cni_core::error::Chain(&e), "periodic CHECK: cannot list the cache; round skipped");
                    round += self.every;
                    continue;
                }
            };
            self.prune(&records);
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

    /// Drift of attachments no longer cached is forgotten.
    fn prune(&self, records: &[cni_core::cache::CacheRecord]) {
        let cached: HashSet<Key> = records
            .iter()
            .map(|r| key(&r.network_name, &r.container_id, &r.if_name))
            .collect();
        let mut v = self.engine.drift.lock();
        v.retain(|k, _| cached.contains(k));
        self.engine
            .metrics
            .drifted
            .store(v.len() as i64, Ordering::Relaxed);
    }

    /// Queues a CHECK of `rec`, unless it is skipped (module docs).
    fn check(&mut self, rec: cni_core::cache::CacheRecord) {
        let engine = &self.engine;
        let (net, cid, ifname) = (&rec.network_name, &rec.container_id, &rec.if_name);
        let k = key(net, cid, ifname);
        let Some(loaded) = engine.networks.get(net) else {
            return;
        };
        let list = loaded.list.clone();
        if list.disable_check()
            || list.version() < Version::V0_4_0
            || engine.stale.state(net, cid, ifname).is_some()
            // Gone since the reaper's last scan: the reaper's to judge.
            || rec.netns.is_empty()
            || std::fs::symlink_metadata(&rec.netns).is_err()
            || !engine.sched.list(Some(cid)).is_empty()
            || self
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&k)
        {
            return;
        }
        self.queued += 1;
        let waiter = engine.submit(NewOp {
            request_id: format!("check-{}", self.queued),
            network: net.clone(),
            version: list.version(),
            work: Work::PeriodicCheck {
                list,
                rt: rec.runtime_conf(),
            },
            deadline: Instant::now() + engine.deadlines.defaults.check,
            claim: None,
            // cnid's own work: no request's trace.
            trace: Default::default(),
        });
        let Ok(waiter) = waiter else {
            return;
        };
        self.inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(k.clone());
        let (engine, inflight) = (engine.clone(), self.inflight.clone());
        self.engine.tracker.spawn(async move {
            let outcome = waiter.wait().await;
            inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&k);
            engine.checked(&k, outcome.as_ref());
        });
    }
}

impl Engine {
    /// A periodic CHECK's outcome: drift recorded or cleared, logged once
    /// per change, counted.
    fn checked(&self, k: &Key, outcome: &super::operation::Outcome) {
        let (net, cid, ifname) = (&k.0, &k.1, &k.2);
        match outcome {
            Ok(_) => {
                self.metrics.checks[0].fetch_add(1, Ordering::Relaxed);
                let mut v = self.drift.lock();
                if v.remove(k).is_some() {
                    self.metrics
                        .drifted
                        .store(v.len() as i64, Ordering::Relaxed);
                    drop(v);
                    tracing::info!(network = %net, container = %cid, ifname = %ifname,
                        "attachment no longer drifted: its periodic CHECK passes");
                }
            }
            Err(e) if e.kind == ErrorKind::PluginFailed => {
                self.metrics.checks[1].fetch_add(1, Ordering::Relaxed);
                // Gone meanwhile (a DEL ran after the CHECK): no drift.
                let cached = self
                    .cni
                    .cache()
                    .path(net, cid, ifname)
                    .is_ok_and(|p| std::fs::symlink_metadata(p).is_ok());
                if !cached {
                    return;
                }
                let error = match e.plugin_label() {
                    None => e.error.msg.clone(),
                    Some(plugin) => format!("plugin {plugin}: {}", e.error.msg),
                };
                let mut v = self.drift.lock();
                let new = !v.contains_key(k);
                v.entry(k.clone())
                    .and_modify(|d| d.error.clone_from(&error))
                    .or_insert_with(|| Drift {
                        error: error.clone(),
                        since: SystemTime::now(),
                    });
                self.metrics
                    .drifted
                    .store(v.len() as i64, Ordering::Relaxed);
                drop(v);
                if new {
                    tracing::warn!(network = %net, container = %cid, ifname = %ifname,
                        error = %cni_core::validate::Escaped(&error),
                        "attachment drifted: its periodic CHECK fails (nothing is repaired)");
                }
            }
            Err(e) => {
                tracing::debug!(network = %net, container = %cid, ifname = %ifname, error = %e.error.msg,
                    "periodic CHECK did not run to a verdict");
            }
        }
    }
}
