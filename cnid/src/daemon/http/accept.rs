//! Accepting connections and serving each one: the peer check, the
//! connection cap (the table is [`super::conns`]), and each connection's
//! watchdog (phase deadlines, eviction, shutdown). Requests on a served
//! connection go to [`super::routes`].

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::HttpSettings;
use super::conns::{Admit, Conn, Conns, Phase};
use super::responses::{fresh_request_id, raw_answer, status_of};
use super::routes::handle;
use crate::daemon::engine::Engine;
use crate::daemon::error::ApiError;

/// hyper's read buffer cap: the largest request head (bodies stream
/// through it).
const MAX_BUF: usize = 16 * 1024;

/// Accept errors (EMFILE, ENFILE, ENOBUFS) back off from this, doubling...
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);

/// ...up to this.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections until `stop` is cancelled.
pub(crate) async fn serve(
    listener: UnixListener,
    engine: Arc<Engine>,
    settings: Arc<HttpSettings>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                if let Some(victim) = accept(stream, &engine, &settings, &stop, &tracker) {
                    // Accept no more until the connection replaced has let
                    // its descriptor go: at the cap, a flood must not run
                    // the process out of descriptors.
                    tokio::select! {
                        () = victim.closed() => {}
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF_MAX) => {}
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted
                ) =>
            {
                tracing::debug!(error = %e, "accept failed");
            }
            Err(e) => {
                // EMFILE and friends: the pending connection stays in the
                // backlog; do not spin on it.
                if let Some(suppressed) = settings.warnings.accept.pass() {
                    tracing::warn!(error = %e, retry_ms = backoff.as_millis() as u64, suppressed,
                        "accept failed; backing off (suppressed: like failures not logged in the last 10 s)");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

/// Sorts a new connection: a refused peer is answered 403 and closed, one
/// over the cap with every connection busy 503; the others are served.
/// Returns the connection told to close to make room, if one was.
fn accept(
    stream: UnixStream,
    engine: &Arc<Engine>,
    settings: &Arc<HttpSettings>,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) -> Option<Arc<Conn>> {
    let (uid, gid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read peer credentials; refusing");
            (u32::MAX, u32::MAX)
        }
    };
    let (conns, metrics) = (&settings.conns, engine.metrics());
    // Answers `e` and closes the connection.
    let refuse = |stream: UnixStream, e: &ApiError, retry_after: bool| {
        let body = e.error.to_json();
        let answer = raw_answer(
            status_of(e.kind),
            &fresh_request_id(),
            body.as_bytes(),
            retry_after,
        );
        tracker.spawn(conns.clone().answer_and_close(stream, answer, stop.clone()));
    };
    if !settings.peers.allows(uid, gid) {
        metrics.refused.fetch_add(1, Ordering::Relaxed);
        metrics.http_response(403);
        if let Some(suppressed) = settings.warnings.refused.pass() {
            tracing::warn!(
                uid,
                gid,
                suppressed,
                "connection from a peer that is not allowed: answered 403 and closed \
                 (suppressed: refused connections not logged in the last 10 s)"
            );
        }
        refuse(stream, &ApiError::forbidden(uid, gid), false);
        return None;
    }
    let (slot, victim) = match conns.admit() {
        Admit::Admitted(slot) => (slot, None),
        Admit::Replaced {
            slot,
            victim,
            phase,
            waited,
        } => {
            metrics.conn_replaced.fetch_add(1, Ordering::Relaxed);
            if let Some(suppressed) = settings.warnings.replaced.pass() {
                tracing::warn!(
                    cap = conns.cap(),
                    closed_phase = ?phase,
                    closed_waited_ms = waited.as_millis() as u64,
                    suppressed,
                    "connection cap reached: closed the connection that waited longest \
                     without a request in progress to make room (suppressed: like closings not \
                     logged in the last 10 s)"
                );
            }
            (slot, Some(victim))
        }
        Admit::Full => {
            metrics.conn_rejected.fetch_add(1, Ordering::Relaxed);
            metrics.http_response(503);
            if let Some(suppressed) = settings.warnings.full.pass() {
                tracing::warn!(
                    cap = conns.cap(),
                    suppressed,
                    "connection cap reached and every connection has an operation in progress: \
                     answered 503 (suppressed: like refusals not logged in the last 10 s)"
                );
            }
            refuse(stream, &ApiError::too_many_connections(conns.cap()), true);
            return None;
        }
    };
    tracker.spawn(connection(
        stream,
        slot,
        engine.clone(),
        settings.clone(),
        stop.clone(),
    ));
    victim
}

struct ConnGuard {
    engine: Arc<Engine>,
    conns: Arc<Conns>,
    slot: Arc<Conn>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.conns.remove(&self.slot);
        let metrics = &self.engine.metrics();
        metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnEnd {
    /// hyper finished it (the peer closed, or a graceful shutdown).
    Done,
    /// A newer connection took its place at the cap.
    Replaced,
    /// Shutdown, with no request in progress (or one not fully received).
    Shutdown,
    /// Its request did not arrive within the request deadline.
    TimedOut,
    /// Idle past the keep-alive timeout.
    Idle,
}

/// Serves one allowed connection, under its watchdog: the phase deadlines
/// of [`super::conns`], eviction at the cap, and shutdown (at once unless a
/// request is being answered).
async fn connection(
    stream: UnixStream,
    slot: Arc<Conn>,
    engine: Arc<Engine>,
    settings: Arc<HttpSettings>,
    stop: CancellationToken,
) {
    let metrics = engine.metrics();
    let open = metrics.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let open = usize::try_from(open).unwrap_or(0);
    settings.trim.connections(open);
    let _guard = ConnGuard {
        engine: engine.clone(),
        conns: settings.conns.clone(),
        slot: slot.clone(),
    };
    let svc = {
        let (engine, settings, slot) = (engine.clone(), settings.clone(), slot.clone());
        service_fn(move |req| {
            let (engine, settings, slot) = (engine.clone(), settings.clone(), slot.clone());
            async move { Ok::<_, Infallible>(handle(engine, &settings, &slot, req).await) }
        })
    };
    let mut builder = http1::Builder::new();
    // Time bounds are the watchdog's below, not hyper's.
    builder
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(MAX_BUF);
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let mut limits = settings.limits;
    let mut stopping = false;
    let end = loop {
        let deadline = slot.deadline(&limits);
        let expiry = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break ConnEnd::Done;
            }
            () = slot.evicted() => break ConnEnd::Replaced,
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                match slot.phase() {
                    Phase::Head | Phase::Body => break ConnEnd::Shutdown,
                    // Finish the answer in progress, then close; an idle
                    // connection closes at once. Writing an answer to a
                    // peer that does not read is bounded like a request.
                    Phase::Busy | Phase::Idle => {
                        limits.idle_timeout = limits.idle_timeout.min(limits.request_timeout);
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            () = slot.changed() => {}
            () = expiry => {
                if slot.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    break if slot.phase() == Phase::Idle { ConnEnd::Idle } else { ConnEnd::TimedOut };
                }
            }
        }
    };
    match end {
        ConnEnd::TimedOut => {
            metrics.conn_timed_out.fetch_add(1, Ordering::Relaxed);
            if let Some(suppressed) = settings.warnings.timed_out.pass() {
                tracing::warn!(
                    timeout_ms = settings.limits.request_timeout.as_millis() as u64,
                    suppressed,
                    "closed a connection whose request was not complete within the request \
                     timeout (suppressed: like closings not logged in the last 10 s)"
                );
            }
        }
        ConnEnd::Replaced | ConnEnd::Shutdown | ConnEnd::Idle | ConnEnd::Done => {
            tracing::trace!(?end, "connection closed");
        }
    }
}
