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
//!   record is the one scanned and its namespace still gone. It does not
//!   coalesce with a runtime's DEL: a runtime's DEL queued behind it finds
//!   the attachment reaped and answers success without running the
//!   plugins again ([`Engine::reaped_already`]); one queued ahead of it
//!   leaves the reap nothing to do. Either way one DEL runs.
//! - **Failures** (a plugin that refuses a DEL without its namespace, such
//!   as host-device) are logged with the plugin's error and counted; the
//!   attachment stays listed as `stale` and is not tried again until its
//!   record changes or cnid restarts. A DEL out of time or an attachment
//!   locked by another tool is no refusal: the next pass tries again.
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
use cni_async::stale::{Candidate, Reaped, StaleReason, StaleScanner};
use cni_core::{RuntimeConf, Version};
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

/// How long a reaped attachment is remembered, for a runtime's late DEL.
const REAPED_KEPT: Duration = Duration::from_secs(3600);

/// How often the running reaper scans: a quarter of `stale_after`,
/// between 250 ms and 30 s.
pub(crate) fn interval(stale_after: Duration) -> Duration {
    (stale_after / 4).clamp(Duration::from_millis(250), Duration::from_secs(30))
}

/// What the reaper found and did, shared with the engine (listing, DEL).
#[derive(Debug, Default)]
pub(crate) struct StaleView {
    inner: Mutex<View>,
}

#[derive(Debug, Default)]
struct View {
    /// Stale at the last scan (and not reaped since).
    stale: HashSet<Key>,
    /// Reaps queued or running.
    inflight: HashSet<Key>,
    /// Reaps that failed, with the record's mtime then.
    failed: HashMap<Key, Option<SystemTime>>,
    /// Reaped attachments, when.
    reaped: HashMap<Key, Instant>,
    /// Whether the scanner sees the host's mounts (see the module docs).
    limited: bool,
}

impl StaleView {
    fn lock(&self) -> MutexGuard<'_, View> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Some("stale")` when the last scan found the attachment stale.
    pub(crate) fn state(&self, network: &str, container_id: &str, ifname: &str) -> Option<String> {
        self.lock()
            .stale
            .contains(&key(network, container_id, ifname))
            .then(|| "stale".to_owned())
    }

    /// Whether the reaper sees the host's mounts and processes.
    pub(crate) fn sees_host_mounts(&self) -> bool {
        !self.lock().limited
    }

    fn was_reaped(&self, k: &Key) -> bool {
        let mut v = self.lock();
        v.reaped.retain(|_, at| at.elapsed() < REAPED_KEPT);
        v.reaped.contains_key(k)
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
                    v.failed.remove(&k);
                    v.reaped.insert(k, Instant::now());
                    self.metrics
                        .stale
                        .store(v.stale.len() as i64, Ordering::Relaxed);
                }
                self.metrics.reaped[why][0].fetch_add(1, Ordering::Relaxed);
                tracing::warn!("stale attachment deleted: its namespace is gone ({reason})");
                Ok(Done::Nothing)
            }
            Ok(other) => {
                let mut v = self.stale.lock();
                v.stale.remove(&k);
                self.metrics
                    .stale
                    .store(v.stale.len() as i64, Ordering::Relaxed);
                drop(v);
                tracing::info!(outcome = ?other, "stale attachment not deleted: it changed since the scan");
                Ok(Done::Nothing)
            }
            Err(e) => {
                self.metrics.reaped[why][1].fetch_add(1, Ordering::Relaxed);
                // Out of time (a plugin slow or stuck once) or the
                // attachment locked by another tool is no refusal: the
                // next pass tries again (one reap at a time per
                // attachment, each bounded by the DEL deadline).
                if matches!(
                    e.kind(),
                    cni_async::ErrorKind::Timeout | cni_async::ErrorKind::Busy
                ) {
                    tracing::error!(error = %cni_core::error::Chain(&e),
                        "cannot delete a stale attachment in time; the next pass tries again");
                } else {
                    self.stale.lock().failed.insert(k, c.written);
                    tracing::error!(error = %cni_core::error::Chain(&e),
                        "cannot delete a stale attachment; it stays cached and listed as stale, not retried until its record changes or cnid restarts");
                }
                Err(ApiError::from_cni(&e, Version::CURRENT))
            }
        }
    }
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
        let stale: Vec<Candidate> = found
            .into_iter()
            .filter(|c| c.verdict.stale().is_some())
            .collect();
        let todo: Vec<Candidate> = {
            let mut v = self.engine.stale.lock();
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
                inflight,
                reaped,
                ..
            } = &mut *v;
            failed.retain(|k, _| keys.contains(k));
            reaped.retain(|_, at| at.elapsed() < REAPED_KEPT);
            stale
                .into_iter()
                .filter(|c| {
                    let (n, cid, i) = c.key();
                    let k = key(n, cid, i);
                    if inflight.contains(&k) {
                        return false;
                    }
                    match failed.get(&k) {
                        Some(w) if *w == c.written => false,
                        Some(_) => {
                            failed.remove(&k);
                            true
                        }
                        None => true,
                    }
                })
                .collect()
        };
        self.engine.metrics.stale.store(
            self.engine.stale.lock().stale.len() as i64,
            Ordering::Relaxed,
        );
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
            });
            match waiter {
                Ok(w) => {
                    self.engine.stale.lock().inflight.insert(k.clone());
                    let engine = self.engine.clone();
                    self.engine.tracker.spawn(async move {
                        let _ = w.wait().await;
                        engine.stale.lock().inflight.remove(&k);
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

    /// The running reaper: a pass every `every` until `stop`.
    pub(crate) async fn run(mut self, every: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
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
