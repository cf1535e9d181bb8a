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

use cni_core::{Command, RuntimeConf, Version};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::PeerPolicy;
use super::engine::Engine;
use super::error::ApiError;
use super::networks;
use super::queue::{NewOp, Work};
use crate::api::{self, HealthResponse, OperationsResponse};
use crate::decode::{DecodedRequest, decode_container_filter, decode_network_name, decode_request};

/// Idle keep-alive connections (and slow request heads) are closed after this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// The same for peers that are refused: they get their 403 and go.
const REFUSED_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's read buffer cap (bodies stream through it).
const MAX_BUF: usize = 16 * 1024;

/// HTTP settings.
#[derive(Debug, Clone)]
pub(crate) struct HttpSettings {
    pub(crate) peers: PeerPolicy,
    pub(crate) body_limit: usize,
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    uid: u32,
    gid: u32,
    allowed: bool,
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
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let (engine, settings, stop) = (engine.clone(), settings.clone(), stop.clone());
                tracker.spawn(connection(stream, engine, settings, stop));
            }
            Err(e) => {
                // EMFILE and friends: do not spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

struct ConnGuard(Arc<Engine>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.metrics.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    stream: UnixStream,
    engine: Arc<Engine>,
    settings: Arc<HttpSettings>,
    stop: CancellationToken,
) {
    let peer = match stream.peer_cred() {
        Ok(c) => Peer {
            uid: c.uid(),
            gid: c.gid(),
            allowed: settings.peers.allows(c.uid(), c.gid()),
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot read peer credentials; refusing");
            Peer {
                uid: u32::MAX,
                gid: u32::MAX,
                allowed: false,
            }
        }
    };
    if !peer.allowed {
        engine.metrics.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            uid = peer.uid,
            gid = peer.gid,
            "connection from a peer that is not allowed"
        );
    }
    engine.metrics.connections.fetch_add(1, Ordering::Relaxed);
    let _guard = ConnGuard(engine.clone());
    let svc_engine = engine.clone();
    let svc = service_fn(move |req| {
        let engine = svc_engine.clone();
        let settings = settings.clone();
        async move { Ok::<_, Infallible>(handle(engine, &settings, peer, req).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(if peer.allowed {
            HEADER_TIMEOUT
        } else {
            REFUSED_HEADER_TIMEOUT
        })
        .keep_alive(peer.allowed)
        .max_buf_size(MAX_BUF);
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let res = tokio::select! {
        r = conn.as_mut() => r,
        () = stop.cancelled() => {
            // Finish the request in progress, then close.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = res {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

fn request_id(req: &Request<Incoming>) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    req.headers()
        .get(api::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| {
            !s.is_empty()
                && s.len() <= api::REQUEST_ID_MAX
                && s.bytes().all(|b| b.is_ascii_graphic())
        })
        .map(str::to_owned)
        .unwrap_or_else(|| format!("cnid-{}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

async fn handle(
    engine: Arc<Engine>,
    settings: &HttpSettings,
    peer: Peer,
    req: Request<Incoming>,
) -> Resp {
    let started = Instant::now();
    let rid = request_id(&req);
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let mut resp = if peer.allowed {
        route(&engine, settings, &rid, req)
            .await
            .unwrap_or_else(|e| error_response(&e))
    } else {
        error_response(&ApiError::forbidden(peer.uid, peer.gid))
    };
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert(api::REQUEST_ID_HEADER, v);
    }
    engine.metrics.http_response(resp.status().as_u16());
    tracing::debug!(request_id = %rid, %method, %path, status = resp.status().as_u16(),
        elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX), "request");
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

fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.status, Bytes::from(e.error.to_json().into_bytes()));
    if e.status == StatusCode::SERVICE_UNAVAILABLE {
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

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_body(format!(
            "cannot read the request body: {e}"
        ))),
    }
}

async fn route(
    engine: &Arc<Engine>,
    settings: &HttpSettings,
    rid: &str,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let method = req.method().clone();
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
    let Some(rest) = path
        .strip_prefix(api::PREFIX)
        .and_then(|r| r.strip_prefix('/'))
    else {
        return Err(ApiError::no_endpoint(&path));
    };
    let segs: Vec<&str> = rest.split('/').collect();
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
            Ok(to_json(StatusCode::OK, &health(engine)))
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
                .ok_or_else(|| ApiError::unknown_network(&name))?;
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
            let body = read_body(req, settings.body_limit).await?;
            operation(engine, rid, verb, name, &body).await
        }
        ["attachments"] => {
            want(Method::GET)?;
            let cid = decode_container_filter(query.as_deref())?;
            Ok(to_json(
                StatusCode::OK,
                &engine.attachments(cid.as_deref()).await?,
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

fn health(engine: &Engine) -> HealthResponse {
    let snap = engine.networks.snapshot();
    let m = &engine.metrics;
    HealthResponse {
        status: if engine.sched.accepting() {
            "ok"
        } else {
            "draining"
        }
        .to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        cni_version: Version::CURRENT.to_string(),
        networks: snap.networks.len() as u64,
        config_errors: snap.errors.len() as u64,
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
    body: &[u8],
) -> Result<Resp, ApiError> {
    let loaded = engine.networks.get(&network);
    let version = loaded
        .as_ref()
        .map_or(Version::CURRENT, |n| n.list.version());
    let need = || {
        loaded
            .as_ref()
            .map(|n| n.list.clone())
            .ok_or_else(|| ApiError::unknown_network(&network))
    };
    let decoded =
        decode_request(verb, &network, body).map_err(|e| ApiError::from(e).in_version(version))?;
    let (work, timeout_ms) = match decoded {
        DecodedRequest::Attachment { rt, timeout_ms } => {
            netns_exists(&rt, verb).map_err(|e| e.in_version(version))?;
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
    })?;
    let coalesced = waiter.coalesced();
    let outcome = waiter.wait().await;
    let mut resp = match outcome.as_ref() {
        Ok(r) => match &r.body {
            Some(b) => json_response(r.status, b.clone()),
            None => empty(r.status),
        },
        Err(e) => error_response(e),
    };
    if coalesced {
        resp.headers_mut()
            .insert(api::COALESCED_HEADER, HeaderValue::from_static("true"));
    }
    Ok(resp)
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
            assert_eq!((e.status, e.error.code), (StatusCode::BAD_REQUEST, 4));
            assert!(
                e.error.msg.contains("not a network namespace"),
                "{}",
                e.error.msg
            );
        }
        assert!(netns_exists(&rt("/nonexistent/netns"), Command::Del).is_ok());
        assert!(netns_exists(&rt(""), Command::Del).is_ok());
    }
}
