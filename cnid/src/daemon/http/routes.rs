//! HTTP/1.1 on the Unix socket: connections, peer checks, routing, reading
//! requests, responses. Decoding and validation of what a request carries is
//! [`crate::decode`] (pure); this module adds the netns existence check.
//!
//! Routing is by hand (a dozen fixed paths): no framework, small buffers,
//! nothing allocated per request beyond the body and the answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cni_core::error::code as cni_code;
use cni_core::{Command, RuntimeConf, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::conns::{
    Admit, Conns, Gates, HeapTrim, Limits, MMAP_THRESHOLD, Phase, Slot, raw_answer,
};
use crate::api::{self, HealthResponse, OperationsResponse};
use crate::daemon::auth::PeerPolicy;
use crate::daemon::engine::Engine;
use crate::daemon::error::{ApiError, ErrorKind};
use crate::daemon::networks;
use crate::daemon::queue::{Done, NewOp, Outcome, SandboxNet, Work};
use crate::decode::{
    DecodedRequest, decode_attachments_query, decode_container_filter, decode_network_name,
    decode_request, decode_sandbox_request,
};

/// hyper's read buffer cap: the largest request head (bodies stream
/// through it).
const MAX_BUF: usize = 16 * 1024;
/// The first bytes of each request body are not charged to the shared
/// body budget (small requests never wait for it).
const BODY_FREE: usize = 8 * 1024;
/// The first allocation for a body (it doubles from there).
const BODY_FIRST: usize = 1024;
/// Accept errors (EMFILE, ENFILE, ENOBUFS) back off from this, doubling...
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// ...up to this.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// HTTP settings.
#[derive(Debug)]
pub(crate) struct HttpSettings {
    pub(crate) peers: PeerPolicy,
    /// The request body cap (413 beyond).
    pub(crate) body_limit: usize,
    /// Bytes of request bodies buffered at once, over all connections
    /// (beyond [`BODY_FREE`] each); a body that does not fit waits, within
    /// its request deadline.
    pub(crate) body_budget: Arc<Semaphore>,
    pub(crate) limits: Limits,
    pub(crate) conns: Arc<Conns>,
    pub(crate) gates: Gates,
    pub(crate) trim: Arc<HeapTrim>,
}

type Resp = Response<Full<Bytes>>;

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
                if let Some(suppressed) = settings.gates.accept.pass() {
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
) -> Option<Arc<Slot>> {
    let (uid, gid) = match stream.peer_cred() {
        Ok(c) => (c.uid(), c.gid()),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read peer credentials; refusing");
            (u32::MAX, u32::MAX)
        }
    };
    let conns = &settings.conns;
    if !settings.peers.allows(uid, gid) {
        engine.metrics.refused.fetch_add(1, Ordering::Relaxed);
        engine.metrics.http_response(403);
        if let Some(suppressed) = settings.gates.refused.pass() {
            tracing::warn!(
                uid,
                gid,
                suppressed,
                "connection from a peer that is not allowed: answered 403 and closed \
                 (suppressed: refused connections not logged in the last 10 s)"
            );
        }
        let e = ApiError::forbidden(uid, gid);
        let answer = raw_answer(
            status_of(e.kind),
            &fresh_request_id(),
            e.error.to_json().as_bytes(),
            false,
        );
        tracker.spawn(conns.clone().answer_and_close(stream, answer, stop.clone()));
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
            engine.metrics.conn_replaced.fetch_add(1, Ordering::Relaxed);
            if let Some(suppressed) = settings.gates.replaced.pass() {
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
            engine.metrics.conn_rejected.fetch_add(1, Ordering::Relaxed);
            engine.metrics.http_response(503);
            if let Some(suppressed) = settings.gates.full.pass() {
                tracing::warn!(
                    cap = conns.cap(),
                    suppressed,
                    "connection cap reached and every connection has an operation in progress: \
                     answered 503 (suppressed: like refusals not logged in the last 10 s)"
                );
            }
            let e = ApiError::too_many_connections(conns.cap());
            let answer = raw_answer(
                status_of(e.kind),
                &fresh_request_id(),
                e.error.to_json().as_bytes(),
                true,
            );
            tracker.spawn(conns.clone().answer_and_close(stream, answer, stop.clone()));
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
    slot: Arc<Slot>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.conns.remove(&self.slot);
        self.engine
            .metrics
            .connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
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
    slot: Arc<Slot>,
    engine: Arc<Engine>,
    settings: Arc<HttpSettings>,
    stop: CancellationToken,
) {
    let open = engine.metrics.connections.fetch_add(1, Ordering::Relaxed) + 1;
    settings
        .trim
        .connections(usize::try_from(open).unwrap_or(0));
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
                break End::Done;
            }
            () = slot.evicted() => break End::Replaced,
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                match slot.phase() {
                    Phase::Head | Phase::Body => break End::Shutdown,
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
                    break if slot.phase() == Phase::Idle { End::Idle } else { End::TimedOut };
                }
            }
        }
    };
    match end {
        End::TimedOut => {
            engine
                .metrics
                .conn_timed_out
                .fetch_add(1, Ordering::Relaxed);
            if let Some(suppressed) = settings.gates.timed_out.pass() {
                tracing::warn!(
                    timeout_ms = settings.limits.request_timeout.as_millis() as u64,
                    suppressed,
                    "closed a connection whose request was not complete within the request \
                     timeout (suppressed: like closings not logged in the last 10 s)"
                );
            }
        }
        End::Replaced | End::Shutdown | End::Idle | End::Done => {
            tracing::trace!(?end, "connection closed");
        }
    }
}

/// A request ID for an answer to a request that was not read.
fn fresh_request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("cnid-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn request_id(req: &Request<Incoming>) -> String {
    req.headers()
        .get(api::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= api::REQUEST_ID_MAX
                && s.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(str::to_owned)
        .unwrap_or_else(fresh_request_id)
}

async fn handle(
    engine: Arc<Engine>,
    settings: &HttpSettings,
    slot: &Slot,
    req: Request<Incoming>,
) -> Resp {
    // The head is in; the body (if any) is bounded like the head was.
    slot.enter(Phase::Body);
    let started = Instant::now();
    let rid = request_id(&req);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = route(&engine, settings, slot, &rid, req)
        .await
        .unwrap_or_else(|e| error_response(&e));
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert(api::REQUEST_ID_HEADER, v);
    }
    engine.metrics.http_response(resp.status().as_u16());
    if hyper::body::Body::size_hint(resp.body()).exact() > Some(MMAP_THRESHOLD as u64) {
        // Building a large answer (a page of big results, say) fragments
        // the heap.
        settings.trim.want();
    }
    tracing::debug!(request_id = %rid, %method, %path, status = resp.status().as_u16(),
        elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX), "request");
    slot.enter(Phase::Idle);
    resp
}

fn json_response(status: StatusCode, body: Bytes) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn to_json<T: Serialize>(status: StatusCode, v: &T) -> Resp {
    match serde_json::to_vec(v) {
        Ok(b) => json_response(status, Bytes::from(b)),
        Err(e) => error_response(&ApiError::internal(format!(
            "cannot encode the answer: {e}"
        ))),
    }
}

/// The HTTP status of each kind of failure: the one place where kinds
/// become statuses. A more severe kind never has a lower status (the
/// engine takes the maximum kind of several failures).
///
/// | kind | HTTP |
/// |---|---|
/// | `InvalidRequest` | 400 |
/// | `Forbidden` | 403 |
/// | `NotFound` | 404 |
/// | `MethodNotAllowed` | 405 |
/// | `Conflict` | 409 |
/// | `TooLarge` | 413 |
/// | `Internal`, `Io` | 500 |
/// | `PluginFailed` | 502 |
/// | `NotReady`, `Busy`, `ShuttingDown` | 503 (with `Retry-After: 1`) |
/// | `DeadlineExpired` | 504 |
pub(crate) fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Internal | ErrorKind::Io => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::PluginFailed => StatusCode::BAD_GATEWAY,
        ErrorKind::NotReady | ErrorKind::Busy | ErrorKind::ShuttingDown => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::DeadlineExpired => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// The answer to a failure: its status, the CNI error object, the
/// plugin's headers, `Retry-After` on 503.
fn error_response(e: &ApiError) -> Resp {
    let status = status_of(e.kind);
    let mut r = json_response(status, Bytes::from(e.error.to_json().into_bytes()));
    if let Some((plugin, command)) = &e.plugin
        && let Ok(v) = HeaderValue::from_str(plugin)
    {
        r.headers_mut().insert(api::PLUGIN_HEADER, v);
        if let Ok(c) = HeaderValue::from_str(command.as_str()) {
            r.headers_mut().insert(api::PLUGIN_COMMAND_HEADER, c);
        }
    }
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// A request body, and its share of the body budget (released with it).
struct Body {
    bytes: Vec<u8>,
    _budget: Option<OwnedSemaphorePermit>,
}

/// Reads a request body of at most `limit` bytes. A declared length over
/// the cap is refused before anything is read; the buffer grows with what
/// arrives (never to more than twice that, nor past the declared length),
/// and beyond [`BODY_FREE`] every byte of it is taken from the shared
/// budget first, waiting for room if need be. The request deadline (the
/// connection's watchdog) bounds the whole read, waiting included.
async fn read_body(
    req: Request<Incoming>,
    limit: usize,
    budget: &Arc<Semaphore>,
) -> Result<Body, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let ceiling = declared.map_or(limit, |n| n as usize);
    let mut body = req.into_body();
    let mut bytes: Vec<u8> = Vec::new();
    let mut permit: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_body(format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let need = bytes.len() + data.len();
        if need > limit {
            return Err(ApiError::too_large(limit));
        }
        if need > bytes.capacity() {
            let want = need
                .max(bytes.capacity() * 2)
                .max(BODY_FIRST)
                .min(ceiling)
                .max(need);
            let charged = permit.as_ref().map_or(0, |p| p.num_permits());
            let owed = want.saturating_sub(BODY_FREE).saturating_sub(charged);
            if owed > 0 {
                let owed = u32::try_from(owed).map_err(|_| ApiError::too_large(limit))?;
                let more = budget
                    .clone()
                    .acquire_many_owned(owed)
                    .await
                    .map_err(|_| ApiError::shutting_down())?;
                match permit.as_mut() {
                    Some(p) => p.merge(more),
                    None => permit = Some(more),
                }
            }
            bytes.reserve_exact(want - bytes.len());
        }
        bytes.extend_from_slice(&data);
    }
    Ok(Body {
        bytes,
        _budget: permit,
    })
}

async fn route(
    engine: &Arc<Engine>,
    settings: &HttpSettings,
    slot: &Slot,
    rid: &str,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let method = req.method().clone();
    let segs: Vec<&str> = path
        .strip_prefix(api::PREFIX)
        .and_then(|r| r.strip_prefix('/'))
        .map(|r| r.split('/').collect())
        .unwrap_or_default();
    // Only operations read a body; everything else is being answered now.
    if !matches!(segs.as_slice(), ["networks", _, _] | ["sandboxes", _]) {
        slot.enter(Phase::Busy);
    }
    if path == "/metrics" {
        return match method {
            Method::GET => {
                let mut r = Response::new(Full::new(Bytes::from(engine.metrics.render())));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                Ok(r)
            }
            _ => Err(ApiError::method_not_allowed(method.as_str(), &path)),
        };
    }
    if segs.is_empty() {
        return Err(ApiError::no_endpoint(&path));
    }
    let want = |m: Method| -> Result<(), ApiError> {
        if method == m {
            Ok(())
        } else {
            Err(ApiError::method_not_allowed(method.as_str(), &path))
        }
    };
    match segs.as_slice() {
        ["health"] => {
            want(Method::GET)?;
            Ok(to_json(StatusCode::OK, &health(engine, false).await))
        }
        ["health", "ready"] => {
            want(Method::GET)?;
            let h = health(engine, true).await;
            let status = if h.ready == Some(true) {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Ok(to_json(status, &h))
        }
        ["networks"] => {
            want(Method::GET)?;
            Ok(to_json(StatusCode::OK, &engine.networks.describe()))
        }
        ["networks", name] => {
            want(Method::GET)?;
            let name = decode_network_name(name)?;
            let n = engine
                .networks
                .get(&name)
                .ok_or_else(|| engine.networks.not_found(&name))?;
            Ok(to_json(StatusCode::OK, &networks::info(&n, true)))
        }
        ["networks", name, verb] => {
            let verb = match *verb {
                "add" => Command::Add,
                "del" => Command::Del,
                "check" => Command::Check,
                "status" => Command::Status,
                "gc" => Command::Gc,
                _ => return Err(ApiError::no_endpoint(&path)),
            };
            want(Method::POST)?;
            let name = decode_network_name(name)?;
            let body = read_body(req, settings.body_limit, &settings.body_budget).await;
            slot.enter(Phase::Busy);
            operation(engine, rid, verb, name, body?).await
        }
        ["sandboxes", verb @ ("add" | "del" | "check" | "status")] => {
            let verb = match *verb {
                "add" => Command::Add,
                "del" => Command::Del,
                "check" => Command::Check,
                _ => Command::Status,
            };
            want(Method::POST)?;
            let body = read_body(req, settings.body_limit, &settings.body_budget).await;
            slot.enter(Phase::Busy);
            sandbox(engine, rid, verb, body?).await
        }
        ["attachments"] => {
            want(Method::GET)?;
            let q = decode_attachments_query(query.as_deref())?;
            let page = cni_async::cache::ListPage {
                after: q.after,
                limit: q.limit,
                max_bytes: api::ATTACHMENTS_PAGE_BYTES,
            };
            Ok(to_json(
                StatusCode::OK,
                &engine.attachments(q.container_id.as_deref(), page).await?,
            ))
        }
        ["operations"] => {
            want(Method::GET)?;
            let cid = decode_container_filter(query.as_deref())?;
            Ok(to_json(
                StatusCode::OK,
                &OperationsResponse {
                    operations: engine.sched.list(cid.as_deref()),
                },
            ))
        }
        _ => Err(ApiError::no_endpoint(&path)),
    }
}

/// `GET /v1/health` (liveness: 200 while serving) and, `with_readiness`,
/// `GET /v1/health/ready` (200 when ready, else 503 with the reason).
async fn health(engine: &Engine, with_readiness: bool) -> HealthResponse {
    let snap = engine.networks.snapshot();
    let m = &engine.metrics;
    let accepting = engine.sched.accepting();
    let (ready, reason) = if with_readiness {
        match engine
            .networks
            .readiness(&engine.cni, engine.min_networks)
            .await
        {
            Ok(_) if accepting => (Some(true), None),
            Ok(_) => (Some(false), Some("shutting down".to_owned())),
            Err(e) => (Some(false), Some(e.reason)),
        }
    } else {
        (None, None)
    };
    HealthResponse {
        ready,
        reason,
        status: if accepting { "ok" } else { "draining" }.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        cni_version: Version::CURRENT.to_string(),
        networks: snap.networks.len() as u64,
        config_errors: networks::errors(&snap).len() as u64,
        in_flight: u64::try_from(m.in_flight.load(Ordering::Relaxed)).unwrap_or(0),
        queued: u64::try_from(m.queued.load(Ordering::Relaxed)).unwrap_or(0),
        uptime_seconds: engine.started.elapsed().as_secs(),
    }
}

/// ADD and CHECK need a netns that is a network namespace, checked by the
/// library's rule ([`cni_async::check_netns`]: one answer for a missing
/// path, a file, a dir, no permission), before anything is queued. The
/// engine's `Cni` checks it again when the operation runs. [`decode_request`]
/// checked the rest of the attachment; DEL may name a netns that is gone.
fn netns_exists(rt: &RuntimeConf, verb: Command) -> Result<(), ApiError> {
    cni_async::check_netns(&rt.netns, verb).map_err(|e| ApiError::from_cni(&e, Version::CURRENT))
}

async fn operation(
    engine: &Arc<Engine>,
    rid: &str,
    verb: Command,
    network: String,
    body: Body,
) -> Result<Resp, ApiError> {
    let loaded = engine.networks.get(&network);
    let version = loaded
        .as_ref()
        .map_or(Version::CURRENT, |n| n.list.version());
    let need = || {
        loaded
            .as_ref()
            .map(|n| n.list.clone())
            .ok_or_else(|| engine.networks.not_found(&network))
    };
    let decoded = decode_request(verb, &network, &body.bytes)
        .map_err(|e| ApiError::from(e).in_version(version))?;
    // The body (and its share of the budget) is not kept while the
    // operation waits and runs.
    drop(body);
    let mut claim = None;
    let (work, timeout_ms) = match decoded {
        DecodedRequest::Attachment {
            rt,
            timeout_ms,
            force,
        } => {
            netns_exists(&rt, verb).map_err(|e| e.in_version(version))?;
            if verb == Command::Add || verb == Command::Check {
                need()?;
            }
            claim = engine
                .admit(verb, &[(&network, &rt)], force)
                .await
                .map_err(|e| e.in_version(version))?;
            let work = match verb {
                Command::Add => Work::Add { list: need()?, rt },
                Command::Check => Work::Check { list: need()?, rt },
                _ => Work::Del {
                    list: loaded.as_ref().map(|n| n.list.clone()),
                    rt,
                },
            };
            (work, timeout_ms)
        }
        DecodedRequest::Status { timeout_ms } => (Work::Status { list: need()? }, timeout_ms),
        DecodedRequest::Gc {
            valid_attachments,
            timeout_ms,
        } => (
            Work::Gc {
                list: need()?,
                valid: valid_attachments,
            },
            timeout_ms,
        ),
    };
    let timeout = engine
        .deadlines
        .for_request(verb, timeout_ms)
        .map_err(|e| e.in_version(version))?;
    let waiter = engine.submit(NewOp {
        request_id: rid.to_owned(),
        network,
        version,
        work,
        deadline: Instant::now() + timeout,
        claim,
    })?;
    let coalesced = waiter.coalesced();
    let outcome = waiter.wait().await;
    let mut resp = outcome_response(&outcome);
    if coalesced {
        resp.headers_mut()
            .insert(api::COALESCED_HEADER, HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// `POST /v1/sandboxes/{verb}`: a container on several networks in one
/// call. ADD, DEL and CHECK are one operation in the container's queue
/// (see `Engine::sandbox`); STATUS asks each network as
/// `/v1/networks/{name}/status` does, ready iff all are.
async fn sandbox(
    engine: &Arc<Engine>,
    rid: &str,
    verb: Command,
    body: Body,
) -> Result<Resp, ApiError> {
    let decoded = decode_sandbox_request(verb, &body.bytes).map_err(ApiError::from)?;
    drop(body);
    if verb != Command::Del && verb != Command::Status {
        let rt = decoded.default_rt("eth0");
        netns_exists(&rt, verb)?;
    }
    let snap = engine.networks.snapshot();
    let mut nets: Vec<SandboxNet> = Vec::new();
    if decoded.loopback {
        nets.push(SandboxNet {
            name: cni_async::multi::LOOPBACK_NETWORK.to_owned(),
            list: Some(Arc::new(cni_async::multi::loopback_network())),
            rt: decoded.default_rt(cni_async::multi::LOOPBACK_IFNAME),
        });
    }
    if decoded.networks.is_empty() {
        let Some(default) = snap.default_network() else {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                cni_code::INVALID_NETWORK_CONFIG,
                format!(
                    "no default network: no usable network configuration in {}",
                    engine.networks.dir().display()
                ),
            ));
        };
        nets.push(SandboxNet {
            name: default.list.name().to_owned(),
            list: Some(default.list.clone()),
            rt: decoded.default_rt(api::DEFAULT_IFNAME),
        });
    }
    for (name, rt) in &decoded.networks {
        let list = snap.get(name).map(|n| n.list.clone());
        // DEL of a network gone from the conf dir uses the cached config.
        if list.is_none() && verb != Command::Del {
            return Err(engine.networks.not_found(name));
        }
        nets.push(SandboxNet {
            name: name.clone(),
            list,
            rt: rt.clone(),
        });
    }
    drop(snap);
    let timeout = engine.deadlines.for_request(verb, decoded.timeout_ms)?;
    let deadline = Instant::now() + timeout;
    if verb == Command::Status {
        return sandbox_status(engine, rid, nets, deadline).await;
    }
    let version = nets
        .iter()
        .find_map(|n| n.list.as_ref().map(|l| l.version()))
        .unwrap_or(Version::CURRENT);
    let slots: Vec<(&str, &RuntimeConf)> = nets.iter().map(|n| (n.name.as_str(), &n.rt)).collect();
    let claim = engine
        .admit(verb, &slots, decoded.force)
        .await
        .map_err(|e| e.in_version(version))?;
    drop(slots);
    let waiter = engine.submit(NewOp {
        request_id: rid.to_owned(),
        network: nets
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        version,
        work: Work::Sandbox {
            verb,
            container_id: decoded.container_id,
            networks: nets,
        },
        deadline,
        claim,
    })?;
    let outcome = waiter.wait().await;
    Ok(outcome_response(&outcome))
}

/// The answer to an operation's outcome: 200 with the JSON of what it
/// produced, 204 when it has nothing to say, or the failure's answer.
fn outcome_response(outcome: &Outcome) -> Resp {
    match outcome {
        Ok(Done::Result(v)) => to_json(StatusCode::OK, v),
        Ok(Done::Gc(gc)) => to_json(StatusCode::OK, gc),
        Ok(Done::Sandbox(merged)) => to_json(StatusCode::OK, merged),
        Ok(Done::Nothing) => empty(StatusCode::NO_CONTENT),
        Err(e) => error_response(e),
    }
}

/// STATUS of a sandbox's networks: each as its own network operation;
/// ready (204) iff all are, else the first failure, naming every network
/// that is not ready.
async fn sandbox_status(
    engine: &Arc<Engine>,
    rid: &str,
    nets: Vec<SandboxNet>,
    deadline: Instant,
) -> Result<Resp, ApiError> {
    let mut errors = cni_async::Errors::new("status of the sandbox's networks");
    // The error object is written in the version of the first network
    // that failed, whose code it has.
    let mut failed_version = None;
    for n in nets {
        let Some(list) = n.list else { continue };
        let version = list.version();
        let waiter = engine.submit(NewOp {
            request_id: rid.to_owned(),
            network: n.name.clone(),
            version,
            work: Work::Status { list },
            deadline,
            claim: None,
        })?;
        if let Err(e) = waiter.wait().await.as_ref() {
            failed_version.get_or_insert(version);
            errors.push(cni_async::Error::Context {
                context: format!("network {:?}", n.name),
                source: Box::new(e.clone().into_cni(version)),
            });
        }
    }
    Ok(match errors.into_result() {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(e) => error_response(&ApiError::from_cni(
            &e,
            failed_version.unwrap_or(Version::CURRENT),
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_must_exist_for_add_and_check() {
        let rt = |netns: &str| RuntimeConf::new("c1", netns, "eth0");
        assert!(netns_exists(&rt("/proc/self/ns/net"), Command::Add).is_ok());
        for verb in [Command::Add, Command::Check] {
            let e = netns_exists(&rt("/nonexistent/netns"), verb).unwrap_err();
            assert_eq!((e.kind, e.error.code), (ErrorKind::InvalidRequest, 4));
            assert!(
                e.error.msg.contains("not a network namespace"),
                "{}",
                e.error.msg
            );
        }
        assert!(netns_exists(&rt("/nonexistent/netns"), Command::Del).is_ok());
        assert!(netns_exists(&rt(""), Command::Del).is_ok());
    }

    /// Every kind and its status, in declaration (severity) order.
    const STATUSES: [(ErrorKind, u16); 13] = [
        (ErrorKind::InvalidRequest, 400),
        (ErrorKind::Forbidden, 403),
        (ErrorKind::NotFound, 404),
        (ErrorKind::MethodNotAllowed, 405),
        (ErrorKind::Conflict, 409),
        (ErrorKind::TooLarge, 413),
        (ErrorKind::Internal, 500),
        (ErrorKind::Io, 500),
        (ErrorKind::PluginFailed, 502),
        (ErrorKind::NotReady, 503),
        (ErrorKind::Busy, 503),
        (ErrorKind::ShuttingDown, 503),
        (ErrorKind::DeadlineExpired, 504),
    ];

    #[test]
    fn each_kind_maps_to_its_status() {
        for (kind, status) in STATUSES {
            assert_eq!(status_of(kind).as_u16(), status, "{kind:?}");
        }
        // Severity order is status order: the maximum kind of several
        // failures answers the highest status, as before kinds existed.
        for w in STATUSES.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?} declared before {:?}", w[0].0, w[1].0);
            assert!(w[0].1 <= w[1].1);
        }
        // The statuses cnid-api's decoding answers read back as themselves.
        for s in [400, 404, 500, 502] {
            let kind = crate::daemon::error::kind_of_status(s);
            assert_eq!(status_of(kind).as_u16(), s, "{kind:?}");
        }
    }

    #[test]
    fn failures_answer_their_status_and_headers() {
        let plugin = ApiError {
            plugin: Some(("bridge".to_owned(), Command::Check)),
            ..ApiError::new(ErrorKind::PluginFailed, 7, "bad")
        };
        let r = error_response(&plugin);
        assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(r.headers()[api::PLUGIN_HEADER], "bridge");
        assert_eq!(r.headers()[api::PLUGIN_COMMAND_HEADER], "CHECK");
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
        let r = error_response(&ApiError::shutting_down());
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        assert!(r.headers().get(api::PLUGIN_HEADER).is_none());
        assert_eq!(
            outcome_response(&Ok(Done::Nothing)).status(),
            StatusCode::NO_CONTENT
        );
        let r = outcome_response(&Ok(Done::Result(
            serde_json::json!({"cniVersion": "1.0.0"}),
        )));
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
    }
}
