//! Drifted attachments: those whose periodic CHECK (`checker`) fails,
//! shared by the checker (which records each CHECK's outcome) and the
//! engine (the listing, and a DEL or ADD that forgets it).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use cni_async::daemon::AttachmentKey;

use super::error::ErrorKind;
use super::metrics::Metrics;
use super::operation::Outcome;
use super::stale_view::key;
use crate::daemon::lock;

/// Drifted attachments (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DriftView {
    inner: Mutex<HashMap<AttachmentKey, Drift>>,
}

/// A drifted attachment: the failing CHECK's error, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Drift {
    pub(crate) error: String,
    pub(crate) since: SystemTime,
}

impl DriftView {
    /// The attachment's drift, if its last periodic CHECK failed.
    pub(crate) fn state(&self, network: &str, container_id: &str, ifname: &str) -> Option<Drift> {
        lock(&self.inner)
            .get(&key(network, container_id, ifname))
            .cloned()
    }

    /// The attachment was deleted or attached again: its drift is gone.
    pub(crate) fn forget(&self, k: &AttachmentKey, metrics: &Metrics) {
        let mut v = lock(&self.inner);
        if v.remove(k).is_some() {
            metrics.drifted.store(v.len() as i64, Ordering::Relaxed);
        }
    }

    /// Drift of attachments no longer cached is forgotten.
    pub(crate) fn prune(&self, records: &[cni_core::cache::CacheRecord], metrics: &Metrics) {
        let cached: HashSet<AttachmentKey> = records
            .iter()
            .map(|r| key(&r.network_name, &r.container_id, &r.if_name))
            .collect();
        let mut v = lock(&self.inner);
        v.retain(|k, _| cached.contains(k));
        metrics.drifted.store(v.len() as i64, Ordering::Relaxed);
    }

    /// A periodic CHECK's outcome: drift recorded or cleared, logged once
    /// per change, counted. `cached`: whether the record the CHECK ran on
    /// is still there (one deleted or replaced after the CHECK has no
    /// drift); asked under the view's lock, so that a DEL that removes the
    /// record and then forgets the drift ([`DriftView::forget`]) is either
    /// seen or comes after.
    pub(crate) fn checked(
        &self,
        k: &AttachmentKey,
        outcome: &Outcome,
        cached: impl FnOnce() -> bool,
        metrics: &Metrics,
    ) {
        let (net, cid, ifname) = (&k.0, &k.1, &k.2);
        match outcome {
            Ok(_) => {
                metrics.checks[0].fetch_add(1, Ordering::Relaxed);
                let mut v = lock(&self.inner);
                if v.remove(k).is_some() {
                    metrics.drifted.store(v.len() as i64, Ordering::Relaxed);
                    drop(v);
                    tracing::info!(network = %net, container = %cid, ifname = %ifname,
                        "attachment no longer drifted: its periodic CHECK passes");
                }
            }
            Err(e) if e.kind == ErrorKind::PluginFailed => {
                metrics.checks[1].fetch_add(1, Ordering::Relaxed);
                let error = match e.plugin_label() {
                    None => e.error.msg.clone(),
                    Some(plugin) => format!("plugin {plugin}: {}", e.error.msg),
                };
                let mut v = lock(&self.inner);
                // Gone or replaced meanwhile (a DEL ran after the CHECK):
                // no drift.
                if !cached() {
                    return;
                }
                let new = !v.contains_key(k);
                v.entry(k.clone())
                    .and_modify(|d| d.error.clone_from(&error))
                    .or_insert_with(|| Drift {
                        error: error.clone(),
                        since: SystemTime::now(),
                    });
                metrics.drifted.store(v.len() as i64, Ordering::Relaxed);
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
