//! `Work::Reap`: the DEL of a stale attachment the reaper (`reaper`)
//! queued, and a runtime's DEL of an attachment it reaped. What the
//! reaper found and did is the shared `StaleView`.

use std::sync::atomic::Ordering;

use cni_async::CallOptions;
use cni_async::stale::{Candidate, Reaped, StaleReason};
use cni_core::{RuntimeConf, Version};

use super::Engine;
use crate::daemon::error::ApiError;
use crate::daemon::operation::{Done, Outcome};
use crate::daemon::stale_view::key;

impl Engine {
    /// Whether a DEL of `network`/`rt` finds its attachment deleted by the
    /// reaper (and not attached again since, not even by an ADD that
    /// failed and left its intent): then it answers success without
    /// running the plugins again.
    pub(super) async fn reaped_already(&self, network: &str, rt: &RuntimeConf) -> bool {
        let (cid, ifname) = (&rt.container_id, &rt.ifname);
        let k = key(network, cid, ifname);
        if !self.p.stale.was_reaped(&k) {
            return false;
        }
        let path = self.p.cni.cache().path(network, cid, ifname);
        let cached = path.is_ok_and(|p| std::fs::symlink_metadata(p).is_ok());
        // An ADD since the reap that failed and could not be rolled back
        // left its intent: that attachment's DEL must run.
        if cached || self.p.intents.read(network, cid, ifname).await.is_some() {
            return false;
        }
        self.p.stale.forget(&k);
        tracing::info!(
            "attachment already deleted by the stale-attachment reaper; DEL answers success"
        );
        true
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
            tracing::Instrument::instrument(self.p.cni.reap_stale(c, &opts), span.clone()).await;
        if let Ok(Reaped::Deleted) = &res {
            let rt = RuntimeConf::new(&c.container_id, &c.netns, &c.ifname);
            tracing::Instrument::instrument(self.deleted(&c.network, &rt), span.clone()).await;
        }
        let _enter = span.enter();
        match res {
            Ok(Reaped::Deleted) => {
                self.p.stale.reaped(k, &self.p.metrics);
                self.p.metrics.reaped[why][0].fetch_add(1, Ordering::Relaxed);
                tracing::warn!("stale attachment deleted: its namespace is gone ({reason})");
                Ok(Done::Nothing)
            }
            Ok(other) => {
                self.p.stale.changed(&k, &self.p.metrics);
                tracing::info!(outcome = ?other, "stale attachment not deleted: it changed since the scan");
                Ok(Done::Nothing)
            }
            Err(e) => {
                self.p.metrics.reaped[why][1].fetch_add(1, Ordering::Relaxed);
                let error = cni_core::error::Chain(&e).to_string();
                if transient(&e) {
                    // "Try again later" (code 11: a plugin's own, a DEL
                    // out of time, the attachment locked by another tool)
                    // is no refusal: tried again after a backoff.
                    let (attempts, wait) = self.p.stale.retry_later(k, error.clone());
                    tracing::error!(error = %error, attempts, retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        "cannot delete a stale attachment for now (try again later); retrying after a backoff");
                } else {
                    self.p.stale.refused(k, c.written, error.clone());
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
