//! HTTP/1.1 on the Unix socket: connections, peer checks, routing,
//! request parsing and validation, responses.
//!
//! Routing is by hand (a dozen fixed paths): no framework, small buffers,
//! nothing allocated per request beyond the body and the answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cni_core::error::code as cni_code;
use cni_core::{Command, RuntimeConf, Version, validate};
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
use crate::api::{
    self, AttachmentRequest, GcRequest, HealthResponse, OperationsResponse, StatusRequest,
};

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

/// Percent-decodes one path segment or query value.
fn decode(s: &str) -> Result<String, ApiError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad_body(format!("invalid percent-encoding in {s:?}"))
                    })?;
                out.push(hex);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::bad_body(format!("{s:?} is not UTF-8")))
}

/// The `containerId` query parameter (the only one any endpoint takes).
fn container_filter(query: Option<&str>) -> Result<Option<String>, ApiError> {
    let mut cid = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "containerId" => {
                let v = decode(&v.replace('+', " "))?;
                validate::container_id(&v)
                    .map_err(|e| ApiError::from_cni(&e.into(), Version::CURRENT))?;
                cid = Some(v);
            }
            other => {
                return Err(ApiError::bad_request(
                    cni_code::INVALID_ENVIRONMENT_VARIABLES,
                    format!("unknown query parameter {other:?} (known: containerId)"),
                ));
            }
        }
    }
    Ok(cid)
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

fn parse<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_body(format!(
            "the request body is empty; expected {what}"
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("invalid request body (expected {what}): {e}")))
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
            let name = network_name(name)?;
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
            let name = network_name(name)?;
            let body = read_body(req, settings.body_limit).await?;
            operation(engine, rid, verb, name, &body).await
        }
        ["attachments"] => {
            want(Method::GET)?;
            let cid = container_filter(query.as_deref())?;
            Ok(to_json(
                StatusCode::OK,
                &engine.attachments(cid.as_deref()).await?,
            ))
        }
        ["operations"] => {
            want(Method::GET)?;
            let cid = container_filter(query.as_deref())?;
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

fn network_name(raw: &str) -> Result<String, ApiError> {
    let name = decode(raw)?;
    validate::network_name(&name).map_err(|e| ApiError::from_cni(&e.into(), Version::CURRENT))?;
    Ok(name)
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

/// Checks an attachment request: IDs, names, `CNI_ARGS`, netns.
fn attachment(req: &AttachmentRequest, verb: Command) -> Result<RuntimeConf, ApiError> {
    let core = |e: cni_core::Error| ApiError::from_cni(&e.into(), Version::CURRENT);
    let rt = req.runtime_conf().map_err(core)?;
    rt.validate().map_err(core)?;
    let netns_bad = |reason: &str| {
        ApiError::bad_request(
            cni_code::INVALID_ENVIRONMENT_VARIABLES,
            format!("invalid netns {:?}: {reason}", rt.netns),
        )
    };
    if rt.netns.is_empty() {
        if verb != Command::Del {
            return Err(netns_bad("required for ADD and CHECK"));
        }
    } else {
        if !rt.netns.starts_with('/') {
            return Err(netns_bad("must be an absolute path"));
        }
        if verb != Command::Del && std::fs::symlink_metadata(&rt.netns).is_err() {
            return Err(netns_bad("no such file"));
        }
    }
    Ok(rt)
}

/// The longest `<network>-<containerID>-<ifname>` accepted: the cache's
/// temp file for it, `.<that>.tmp-<pid>-<nanos>`, must fit in a file name
/// (255 bytes). Longer names are valid CNI names, but every ADD of them
/// would fail on a file system error (after running the chain, between 223
/// and 250 bytes) and every DEL would run its plugins without a lock.
pub(crate) const MAX_ATTACHMENT_NAME: usize = 222;

/// Refuses names too long for the cache and intent file names.
fn fits_file_names(network: &str, rt: &RuntimeConf) -> Result<(), ApiError> {
    let len = network.len() + rt.container_id.len() + rt.ifname.len() + 2;
    if len > MAX_ATTACHMENT_NAME {
        return Err(ApiError::bad_request(
            cni_code::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "network name, container ID and interface name are too long together: \
                 {len} bytes with separators (at most {MAX_ATTACHMENT_NAME}, to fit the cache file names)"
            ),
        ));
    }
    Ok(())
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
    let (work, timeout_ms) = match verb {
        Command::Add | Command::Del | Command::Check => {
            let req: AttachmentRequest = parse(body, "an attachment object")?;
            let rt = attachment(&req, verb).map_err(|e| e.in_version(version))?;
            fits_file_names(&network, &rt).map_err(|e| e.in_version(version))?;
            let work = match verb {
                Command::Add => Work::Add { list: need()?, rt },
                Command::Check => Work::Check { list: need()?, rt },
                _ => Work::Del {
                    list: loaded.as_ref().map(|n| n.list.clone()),
                    rt,
                },
            };
            (work, req.timeout_ms)
        }
        Command::Status => {
            let req: StatusRequest = if body.iter().all(u8::is_ascii_whitespace) {
                StatusRequest::default()
            } else {
                parse(body, "a status object")?
            };
            (Work::Status { list: need()? }, req.timeout_ms)
        }
        _ => {
            let req: GcRequest = parse(body, "a GC object with validAttachments")?;
            for a in &req.valid_attachments {
                validate::container_id(&a.container_id)
                    .and_then(|()| validate::interface_name(&a.ifname))
                    .map_err(|e| ApiError::from_cni(&e.into(), version))?;
            }
            (
                Work::Gc {
                    list: need()?,
                    valid: req.valid_attachments,
                },
                req.timeout_ms,
            )
        }
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
    fn percent_decoding() {
        assert_eq!(decode("a%2Fb").unwrap(), "a/b");
        assert_eq!(decode("..%2fx").unwrap(), "../x");
        assert!(decode("%zz").is_err());
        assert!(decode("%ff").is_err());
        assert!(network_name("..%2Fx").is_err());
        assert_eq!(network_name("net-1").unwrap(), "net-1");
    }

    #[test]
    fn query() {
        assert_eq!(container_filter(None).unwrap(), None);
        assert_eq!(
            container_filter(Some("containerId=c1")).unwrap().as_deref(),
            Some("c1")
        );
        assert_eq!(
            container_filter(Some("containerId=..%2Fx"))
                .unwrap_err()
                .status,
            StatusCode::BAD_REQUEST
        );
        assert!(container_filter(Some("x=1")).is_err());
    }

    #[test]
    fn names_must_fit_the_cache_file_names() {
        let rt = |cid: &str| RuntimeConf::new(cid, "/x", "eth0");
        let fits = "c".repeat(MAX_ATTACHMENT_NAME - 2 - 3 - 4);
        assert!(fits_file_names("net", &rt(&fits)).is_ok());
        let e = fits_file_names("net", &rt(&format!("{fits}c"))).unwrap_err();
        assert_eq!((e.status, e.error.code), (StatusCode::BAD_REQUEST, 4));
        assert!(e.error.msg.contains("at most 222"), "{}", e.error.msg);
    }

    #[test]
    fn attachment_checks() {
        let mut r = AttachmentRequest::new("c1", "", "eth0");
        assert!(attachment(&r, Command::Del).is_ok());
        assert_eq!(
            attachment(&r, Command::Add).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        r.netns = "relative".into();
        assert!(attachment(&r, Command::Del).is_err());
        r.netns = "/proc/self/ns/net".into();
        assert!(attachment(&r, Command::Add).is_ok());
        r.cni_args = "novalue".into();
        assert_eq!(attachment(&r, Command::Add).unwrap_err().error.code, 4);
        r.cni_args.clear();
        r.ifname = "../x".into();
        assert!(attachment(&r, Command::Add).is_err());
    }
}
