//! Requests: reading each one (request ID, body within its cap and the
//! shared body budget), routing it by path, and answering what the engine
//! says. Decoding and validation of what a request carries is
//! [`crate::decode`] (pure); this module adds the netns existence check.
//!
//! Routing is by hand (a dozen fixed paths): no framework, small buffers,
//! nothing allocated per request beyond the body and the answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cni_core::trace::TraceContext;
use cni_core::{Command, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::HttpSettings;
use super::conns::{Conn, Phase};
use super::responses::{Resp, error_response, fresh_request_id, outcome_response, to_json};
use crate::api::{self, HealthResponse, OperationsResponse};
use crate::daemon::engine::{Engine, SandboxOps};
use crate::daemon::error::ApiError;
use crate::daemon::memory::MMAP_THRESHOLD;
use crate::daemon::networks;
use crate::decode::{
    decode_attachments_query, decode_container_filter, decode_network_name, decode_request,
    decode_sandbox_request,
};

/// The first bytes of each request body are not charged to the shared
/// body budget (small requests never wait for it).
const BODY_FREE: usize = 8 * 1024;
/// The first allocation for a body (it doubles from there).
const BODY_FIRST: usize = 1024;

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

pub(super) async fn handle(
    engine: Arc<Engine>,
    settings: &HttpSettings,
    slot: &Conn,
    req: Request<Incoming>,
) -> Resp {
    // The head is in; the body (if any) is bounded like the head was.
    slot.enter(Phase::Body);
    let started = Instant::now();
    let rid = request_id(&req);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let routed = route(&engine, settings, slot, &rid, req).await;
    let mut resp = routed.unwrap_or_else(|e| error_response(&e));
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert(api::REQUEST_ID_HEADER, v);
    }
    engine.metrics().http_response(resp.status().as_u16());
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
                let more = budget.clone().acquire_many_owned(owed).await;
                let more = more.map_err(|_| ApiError::shutting_down())?;
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
    slot: &Conn,
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
                let mut r = Response::new(Full::new(Bytes::from(engine.metrics().render())));
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
            let (cni, min) = engine.readiness_of();
            Ok(to_json(
                StatusCode::OK,
                &engine.networks().describe(cni, min).await,
            ))
        }
        ["networks", name] => {
            want(Method::GET)?;
            let name = decode_network_name(name)?;
            let networks = engine.networks();
            let n = networks
                .get(&name)
                .ok_or_else(|| networks.not_found(&name))?;
            let (cni, min) = engine.readiness_of();
            let unusable = engine.networks().unusable(cni, min).await;
            Ok(to_json(
                StatusCode::OK,
                &networks::mark(networks::info(&n, true), &unusable),
            ))
        }
        ["networks", _, verb] | ["sandboxes", verb] => {
            // A sandbox has no GC.
            let of_sandbox = segs[0] == "sandboxes";
            let verb = crate::daemon::metrics::VERBS
                .into_iter()
                .find(|c| {
                    c.as_str().to_ascii_lowercase() == *verb && !(of_sandbox && *c == Command::Gc)
                })
                .ok_or_else(|| ApiError::no_endpoint(&path))?;
            want(Method::POST)?;
            let name = match segs.as_slice() {
                ["networks", name, _] => Some(decode_network_name(name)?),
                _ => None,
            };
            let trace = trace_context(req.headers());
            let body = read_body(req, settings.body_limit, &settings.body_budget).await;
            slot.enter(Phase::Busy);
            match name {
                Some(name) => operation(engine, rid, verb, name, body?, trace).await,
                None => sandbox(engine, rid, verb, body?, trace).await,
            }
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
                    operations: engine.scheduler().list(cid.as_deref()),
                },
            ))
        }
        _ => Err(ApiError::no_endpoint(&path)),
    }
}

/// `GET /v1/health` (liveness: 200 while serving) and, `with_readiness`,
/// `GET /v1/health/ready` (200 when ready, else 503 with the reason).
async fn health(engine: &Engine, with_readiness: bool) -> HealthResponse {
    let snap = engine.networks().snapshot();
    let m = engine.metrics();
    let accepting = engine.scheduler().accepting();
    let (ready, reason) = if with_readiness {
        let (cni, min) = engine.readiness_of();
        match engine.networks().readiness(cni, min).await {
            Ok(r) if accepting => (Some(true), r.degraded()),
            Ok(_) => (Some(false), Some("shutting down".to_owned())),
            Err(e) => (Some(false), Some(e.reason)),
        }
    } else {
        (None, None)
    };
    let stale_reaper = (with_readiness && !engine.sees_host_mounts()).then(|| {
        "limited: cnid does not see the host's mounts and processes; only attachments of an earlier boot are reaped".to_owned()
    });
    HealthResponse {
        ready,
        reason,
        stale_reaper,
        status: if accepting { "ok" } else { "draining" }.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        cni_version: Version::CURRENT.to_string(),
        networks: snap.networks.len() as u64,
        config_errors: networks::errors(&snap).len() as u64,
        in_flight: u64::try_from(m.in_flight.load(Ordering::Relaxed)).unwrap_or(0),
        queued: u64::try_from(m.queued.load(Ordering::Relaxed)).unwrap_or(0),
        uptime_seconds: engine.uptime().as_secs(),
    }
}

/// `POST /v1/networks/{network}/{verb}`: admitted by the engine
/// ([`Engine::admit`]), queued, answered when it ends (`Cnid-Coalesced`
/// when it joined an identical DEL).
async fn operation(
    engine: &Arc<Engine>,
    rid: &str,
    verb: Command,
    network: String,
    body: Body,
    trace: TraceContext,
) -> Result<Resp, ApiError> {
    let decoded = decode_request(verb, &network, &body.bytes)
        .map_err(|e| ApiError::from(e).in_version(engine.version_of(&network)))?;
    // The body (and its share of the budget) is not kept while the
    // operation waits and runs.
    drop(body);
    let mut op = engine.admit(rid, verb, network, decoded).await?;
    op.trace = Arc::new(trace);
    let waiter = engine.submit(op)?;
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
/// call ([`Engine::admit_sandbox`]). ADD, DEL and CHECK are one operation
/// in the container's queue (see `Engine::sandbox`); STATUS asks each
/// network as `/v1/networks/{name}/status` does, ready iff all are.
async fn sandbox(
    engine: &Arc<Engine>,
    rid: &str,
    verb: Command,
    body: Body,
    trace: TraceContext,
) -> Result<Resp, ApiError> {
    let decoded = decode_sandbox_request(verb, &body.bytes).map_err(ApiError::from)?;
    drop(body);
    let trace = Arc::new(trace);
    let outcome = match engine.admit_sandbox(rid, verb, decoded).await? {
        SandboxOps::One(mut op) => {
            op.trace = trace;
            engine.submit(*op)?.wait().await
        }
        SandboxOps::Each(mut ops) => {
            for op in &mut ops {
                op.trace = trace.clone();
            }
            Arc::new(engine.status_each(ops).await)
        }
    };
    Ok(outcome_response(&outcome))
}

/// The W3C trace context of a request's headers (`traceparent`,
/// `tracestate`, `baggage`), kept only where well-formed
/// ([`TraceContext::new`]). Several `tracestate` or `baggage` lines are
/// one list (HTTP's rule for list headers); several `traceparent` lines
/// are none.
fn trace_context(headers: &hyper::HeaderMap) -> TraceContext {
    let joined = |name: &str| -> Option<String> {
        let mut values = Vec::new();
        for v in headers.get_all(name) {
            match v.to_str() {
                Ok(v) => values.push(v.trim()),
                Err(_) => {
                    tracing::debug!(header = name, "trace context header is not ASCII; dropped");
                    return None;
                }
            }
        }
        (!values.is_empty()).then(|| values.join(","))
    };
    let parents = headers.get_all(api::TRACEPARENT_HEADER).iter().count();
    let traceparent = if parents > 1 {
        tracing::debug!(count = parents, "several traceparent headers; dropped");
        None
    } else {
        joined(api::TRACEPARENT_HEADER)
    };
    TraceContext::new(
        traceparent.as_deref(),
        joined(api::TRACESTATE_HEADER).as_deref(),
        joined(api::BAGGAGE_HEADER).as_deref(),
    )
}
