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
//!   (`Engine::reaped_already`); one queued ahead of it leaves the reap
//!   nothing to do. Either way one DEL runs.
//! - **Background work.** A reap runs in a background slot (`slots`; the
//!   queue's module docs).
//! - **Reaped means reaped until attached again.** A reaped attachment is
//!   remembered (whatever the time since) until a runtime's DEL of it
//!   answered, or an ADD of it succeeded (`Engine::add_result`): from
//!   then on its DEL runs the plugins (without `prevResult` when its
//!   record is lost). The memory is bounded (`stale_view::REAPED_MAX`); an
//!   attachment forgotten that way gets its DEL run, which is safe.
//! - **Transient failures** (CNI code 11 "try again later": an IPAM agent
//!   not up yet, a DEL out of time, the attachment locked by another tool)
//!   are retried with exponential backoff, from `stale_view::RETRY_FIRST`
//!   to `stale_view::RETRY_MAX` between tries.
//! - **Refusals** (any other error: a plugin that refuses a DEL without
//!   its namespace, such as host-device) are logged with the plugin's
//!   error and counted; the attachment stays listed as `stale` with the
//!   error and is not tried again until its record changes or cnid
//!   restarts.
//! - **Listing.** `/v1/attachments` shows what the last scan found
//!   (`state` `gone` or `stale`, `goneSince`, `reapError`: `cnid/API.md`),
//!   and the gauge `cnid_stale_attachments{state}` counts the same.
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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use cni_async::cache::ResultCache;
use cni_async::daemon::AttachmentKey;
use cni_async::stale::{Candidate, StaleScanner, Verdict};
use cni_core::{RuntimeConf, Version};
use tokio_util::sync::CancellationToken;

use super::engine::Submitter;
use super::metrics::Metrics;
use super::networks::Networks;
use super::operation::Work;
use super::stale_view::{RETRY_FIRST, StaleView, key};

/// How often the running reaper scans: a quarter of `stale_after`,
/// between 250 ms and 30 s.
pub(crate) fn interval(stale_after: Duration) -> Duration {
    (stale_after / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
}

/// Scans the cache and queues the reaps (the engine runs them:
/// `Work::Reap`).
#[derive(Debug)]
pub(crate) struct Reaper {
    submit: Submitter,
    cache: ResultCache,
    networks: Arc<Networks>,
    metrics: Arc<Metrics>,
    view: Arc<StaleView>,
    scanner: StaleScanner,
    queued: u64,
    /// Why the last pass was skipped (warned once per change).
    skipped: Option<String>,
}

impl Reaper {
    /// `stale_after`: how long a namespace of this boot must be gone
    /// (`None`: only an earlier boot's attachments are reaped).
    pub(crate) fn new(
        submit: Submitter,
        (cache, networks, metrics): (ResultCache, Arc<Networks>, Arc<Metrics>),
        view: Arc<StaleView>,
        stale_after: Option<Duration>,
    ) -> Self {
        let scanner = StaleScanner::new(stale_after);
        let sees = scanner.sees_host_mounts();
        view.set_sees_host_mounts(sees);
        metrics
            .host_mounts_visible
            .store(i64::from(sees), Ordering::Relaxed);
        if !sees {
            tracing::warn!(
                "stale-attachment reaper: cnid does not see the host's mounts and processes (not in pid 1's mount namespace or not in the initial pid namespace); only attachments of an earlier boot (another boot id) are reaped"
            );
        }
        Reaper {
            submit,
            cache,
            networks,
            metrics,
            view,
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
        let dir_error = match std::fs::read_dir(self.networks.dir()) {
            Err(e) => Some(e.to_string()),
            Ok(_) => self.networks.snapshot().dir_error.clone(),
        };
        if let Some(e) = dir_error {
            self.skip(format!(
                "conf dir {} unreadable: {e}",
                self.networks.dir().display()
            ));
            return 0;
        }
        let found = match self.scanner.scan(&self.cache).await {
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
        let mut gone: HashMap<AttachmentKey, SystemTime> = HashMap::new();
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
        let mut n = 0;
        for c in self.view.scanned(gone, stale, &self.metrics) {
            let rt = RuntimeConf::new(&c.container_id, &c.netns, &c.ifname);
            let k = key(&c.network, &c.container_id, &c.ifname);
            self.queued += 1;
            let network = c.network.clone();
            let work = Work::Reap {
                candidate: Box::new(c),
                rt,
            };
            let request_id = format!("reap-{}", self.queued);
            let queued = self
                .submit
                .submit(request_id, network, Version::CURRENT, work);
            match queued {
                Ok(w) => {
                    self.view.queued(k.clone());
                    let view = self.view.clone();
                    self.submit.spawn(async move {
                        let _ = w.wait().await;
                        view.settled(&k);
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
            let wake = match self.view.next_retry() {
                Some(retry) => retry.max(last_pass + RETRY_FIRST).min(next_pass),
                None => next_pass,
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(wake.into()) => {}
                // A new retry may be due before `wake`: look again.
                () = self.view.retry_added().notified() => continue,
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
    fn interval_is_a_quarter_within_bounds() {
        assert_eq!(interval(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(interval(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(
            interval(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
    }
}
