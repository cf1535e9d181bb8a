//! A typed async client for cnid's API, on hyper 1 over a Unix socket,
//! and the wire types it speaks ([`api`], the package `cnid-api`,
//! re-exported): what an embedder or a command line (cnitool's
//! `--socket`) needs to talk to a running cnid, without the daemon's code.
//!
//! Every endpoint has a method; an error answer of the daemon comes back as
//! [`ClientError::Api`] with the HTTP status and the CNI error object
//! (`cniVersion`, `code`, `msg`, `details`), so a CLI can print the same JSON
//! a plugin or cnitool would.
//!
//! Connections are kept alive and reused (one request at a time each, as
//! HTTP/1.1 has it); idle ones are dropped after 20 s, before the daemon's
//! default 60 s idle limit. One the daemon closed before a request went
//! out on it (at its connection cap, say) is replaced by a new connection
//! for that request.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cnid_client::ClientError> {
//! use cnid_client::Client;
//! use cnid_client::api::AttachmentRequest;
//!
//! let client = Client::connect("/run/cnid/cnid.sock").await?;
//! let req = AttachmentRequest::new("c1", "/run/netns/c1", "eth0");
//! let result = client.add("mynet", &req).await?;
//! println!("{result}");
//! client.check("mynet", &req).await?;
//! client.del("mynet", &req).await?;
//! # Ok(()) }
//! ```
//!
//! # Restarts
//! A restart of cnid (`kill -9` and a new start, a crash, an upgrade) is
//! not an error: a request cnid cannot have acted on is sent again until
//! its deadline (the request's `timeoutMs`, else cnid's default for the
//! verb; [`DEFAULT_RETRY_WINDOW`] for connecting and the reads), by the
//! rules of [`crate::api::retry`], which says why they are safe for every
//! verb.
//!
//! # Caveats
//! Dropping a call's future closes its connection; the daemon then cancels
//! the operation if it is still queued, but one already running plugins is
//! finished (or rolled back) regardless. A request sent again gets a new
//! deadline at the restarted cnid: the whole call may take its retries
//! plus the request's deadline.
#![warn(missing_docs)]

pub use cnid_api as api;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cni_async::Timeouts;
use cni_core::ErrorObject;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::{
    AttachmentInfo, AttachmentRequest, AttachmentsResponse, GcRequest, GcResponse, HealthResponse,
    NetworkInfo, NetworksResponse, OperationInfo, OperationsResponse, SandboxRequest,
    SandboxResult, StatusRequest, encode,
};

/// How long an idle connection is kept for reuse.
const IDLE_KEEP: Duration = Duration::from_secs(20);
/// Idle connections kept at most.
const IDLE_MAX: usize = 16;
/// The largest answer read.
const RESPONSE_MAX: usize = 64 * 1024 * 1024;
use crate::api::retry::{Failure, Retries};

pub use crate::api::retry::{MAX_UNANSWERED, MISSING_SOCKET_GRACE};

/// How long connecting and the reads (health, listings, metrics) try
/// again while cnid restarts.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// What a failed attempt says about sending it again
/// ([`crate::api::retry`]).
fn failure(e: &ClientError) -> Failure {
    match e {
        ClientError::Connect { source, .. } => Failure::of_connect(source.kind()),
        ClientError::Http { source, .. } => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
            while let Some(c) = cause {
                if let Some(io) = c.downcast_ref::<std::io::Error>() {
                    return Failure::of_exchange(io.kind());
                }
                cause = c.source();
            }
            if source.is_incomplete_message() || source.is_canceled() || source.is_closed() {
                Failure::Unanswered
            } else {
                Failure::Final
            }
        }
        _ => Failure::Final,
    }
}

/// Pauses before the next attempt after `e`, or gives `e` back when there
/// is none.
async fn again(retries: &mut Retries, e: ClientError) -> Result<(), ClientError> {
    let Some(pause) = retries.next(failure(&e)) else {
        return Err(e);
    };
    tracing::debug!(error = %cni_core::error::Chain(&e), pause_ms = pause.as_millis() as u64,
        "cnid unreachable or restarting; trying again");
    tokio::time::sleep(pause).await;
    Ok(())
}

/// What can go wrong talking to cnid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot connect to cnid at {}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (connection closed, protocol error).
    #[error("HTTP exchange with cnid at {} failed", path.display())]
    Http {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: hyper::Error,
    },
    /// The daemon answered with an error.
    #[error("cnid answered {status}: {}{error}", plugin.as_deref().map(|p| format!("plugin {p} failed: ")).unwrap_or_default())]
    Api {
        /// The HTTP status.
        status: u16,
        /// The CNI error object it sent.
        error: ErrorObject,
        /// The plugin that failed and its verb (`bridge CHECK`), when the
        /// error is a plugin's (the daemon's `Cnid-Plugin` headers).
        plugin: Option<String>,
    },
    /// The answer could not be decoded.
    #[error("cannot decode cnid's answer to {what}: {reason}")]
    Decode {
        /// The request.
        what: String,
        /// What is wrong.
        reason: String,
    },
}

impl ClientError {
    /// The CNI error object: the daemon's for [`ClientError::Api`], one made
    /// up (code 5, I/O failure; 6 for undecodable answers) for the others.
    pub fn error_object(&self, cni_version: &str) -> ErrorObject {
        match self {
            ClientError::Api { error, .. } => error.clone(),
            ClientError::Decode { .. } => ErrorObject::new(
                cni_version,
                cni_core::error::code::DECODING_FAILURE,
                self.to_string(),
                "",
            ),
            _ => ErrorObject::new(
                cni_version,
                cni_core::error::code::IO_FAILURE,
                self.to_string(),
                "",
            ),
        }
    }

    /// The HTTP status of an [`ClientError::Api`] answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A raw answer: status, the headers cnid sets, body.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// The HTTP status.
    pub status: u16,
    /// `X-Request-Id` as echoed.
    pub request_id: Option<String>,
    /// Whether a DEL was coalesced with an identical queued one.
    pub coalesced: bool,
    /// For an error answer about a plugin: the plugin and its verb
    /// (`bridge CHECK`).
    pub plugin: Option<String>,
    /// The body.
    pub body: Bytes,
    /// Whether the request was sent again after a connection that ended
    /// before any answer (cnid restarted; the first one may have run).
    pub resent: bool,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    idle: Mutex<Vec<(SendRequest<Full<Bytes>>, Instant)>>,
}

/// A client of one cnid socket. Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
    request_id: Option<HeaderValue>,
    /// W3C trace context headers sent with every request.
    trace: Arc<Vec<(&'static str, HeaderValue)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Client {
    /// Connects to the socket at `path` (one connection, kept for reuse).
    /// While cnid restarts (refused, reset, the socket file being
    /// replaced), it tries again for up to [`DEFAULT_RETRY_WINDOW`].
    pub async fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let client = Client {
            inner: Arc::new(Inner {
                path: path.as_ref().to_owned(),
                idle: Mutex::new(Vec::new()),
            }),
            request_id: None,
            trace: Arc::default(),
        };
        let mut retries = Retries::new(DEFAULT_RETRY_WINDOW);
        let sender = loop {
            match client.open().await {
                Ok(s) => break s,
                Err(e) => again(&mut retries, e).await?,
            }
        };
        client.put_back(sender);
        Ok(client)
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A client sending `X-Request-Id: id` with every request (logged by
    /// the daemon and listed by [`Client::operations`]).
    pub fn with_request_id(&self, id: &str) -> Client {
        Client {
            inner: self.inner.clone(),
            request_id: HeaderValue::from_str(id).ok(),
            trace: self.trace.clone(),
        }
    }

    /// A client sending `trace`'s `traceparent`, `tracestate` and
    /// `baggage` headers with every request: the plugins of its
    /// operations get them (cnitool sends its own environment's).
    pub fn with_trace(&self, trace: &cni_core::trace::TraceContext) -> Client {
        let headers = trace
            .headers()
            .filter_map(|(k, v)| HeaderValue::from_str(v).ok().map(|v| (k, v)))
            .collect();
        Client {
            trace: Arc::new(headers),
            ..self.clone()
        }
    }

    async fn open(&self) -> Result<SendRequest<Full<Bytes>>, ClientError> {
        let stream = tokio::net::UnixStream::connect(&self.inner.path)
            .await
            .map_err(|source| ClientError::Connect {
                path: self.inner.path.clone(),
                source,
            })?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| self.http(source))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "cnid connection ended");
            }
        });
        Ok(sender)
    }

    fn http(&self, source: hyper::Error) -> ClientError {
        ClientError::Http {
            path: self.inner.path.clone(),
            source,
        }
    }

    /// A connection to send on, and whether it was kept from before.
    async fn sender(&self) -> Result<(SendRequest<Full<Bytes>>, bool), ClientError> {
        loop {
            let pooled = lock(&self.inner.idle).pop();
            match pooled {
                Some((mut s, since)) if since.elapsed() < IDLE_KEEP && !s.is_closed() => {
                    if s.ready().await.is_ok() {
                        return Ok((s, true));
                    }
                }
                Some(_) => {}
                None => return Ok((self.open().await?, false)),
            }
        }
    }

    fn put_back(&self, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.inner.idle);
        if idle.len() < IDLE_MAX {
            idle.push((sender, Instant::now()));
        }
    }

    /// Sends one request and reads the whole answer, whatever its status.
    /// A request cnid cannot have acted on is sent again while it
    /// restarts, for up to [`DEFAULT_RETRY_WINDOW`] (see the module docs).
    pub async fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<RawResponse, ClientError> {
        self.request_within(method, path_and_query, body, DEFAULT_RETRY_WINDOW)
            .await
    }

    /// [`Client::request`], sent again for up to `window` while cnid
    /// restarts.
    async fn request_within(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
        window: Duration,
    ) -> Result<RawResponse, ClientError> {
        let mut retries = Retries::new(window);
        loop {
            match self
                .request_once(method.clone(), path_and_query, body.clone())
                .await
            {
                Ok(r) => {
                    return Ok(RawResponse {
                        resent: retries.resent(),
                        ..r
                    });
                }
                Err(e) => again(&mut retries, e).await?,
            }
        }
    }

    /// One attempt of [`Client::request`].
    async fn request_once(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<RawResponse, ClientError> {
        let (mut sender, pooled) = self.sender().await?;
        let build = || {
            let mut builder = Request::builder()
                .method(method.clone())
                .uri(path_and_query)
                .header(header::HOST, "cnid");
            if let Some(id) = &self.request_id {
                builder = builder.header(api::REQUEST_ID_HEADER, id.clone());
            }
            for (k, v) in self.trace.iter() {
                builder = builder.header(*k, v.clone());
            }
            if body.is_some() {
                builder = builder.header(header::CONTENT_TYPE, "application/json");
            }
            builder
                .body(Full::new(body.clone().unwrap_or_default()))
                .map_err(|e| ClientError::Decode {
                    what: path_and_query.to_owned(),
                    reason: format!("cannot build the request: {e}"),
                })
        };
        let resp = match sender.try_send_request(build()?).await {
            Ok(resp) => resp,
            // The daemon closed the kept connection (its idle timeout, or
            // room made at its connection cap) before the request went
            // out: nothing of it was read. Send it again on a new
            // connection.
            Err(mut e) if pooled && e.message().is_some() => {
                let req = e.take_message().expect("checked");
                sender = self.open().await?;
                sender.send_request(req).await.map_err(|e| self.http(e))?
            }
            Err(e) => return Err(self.http(e.into_error())),
        };
        let status = resp.status().as_u16();
        let header_text = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let request_id = header_text(api::REQUEST_ID_HEADER);
        let coalesced = header_text(api::COALESCED_HEADER).as_deref() == Some("true");
        let plugin = header_text(api::PLUGIN_HEADER).map(|p| {
            match header_text(api::PLUGIN_COMMAND_HEADER) {
                Some(c) => format!("{p} {c}"),
                None => p,
            }
        });
        let body = Limited::new(resp.into_body(), RESPONSE_MAX)
            .collect()
            .await
            .map_err(|e| ClientError::Decode {
                what: path_and_query.to_owned(),
                reason: format!("cannot read the body: {e}"),
            })?
            .to_bytes();
        self.put_back(sender);
        Ok(RawResponse {
            status,
            request_id,
            coalesced,
            plugin,
            body,
            resent: false,
        })
    }

    /// Sends a request; an error status becomes [`ClientError::Api`].
    /// Sent again while cnid restarts for up to `window` (the request's
    /// deadline).
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        window: Duration,
    ) -> Result<RawResponse, ClientError> {
        let r = self.request_within(method, path, body, window).await?;
        Self::answered(r)
    }

    /// A 2xx answer, or its error as [`ClientError::Api`].
    fn answered(r: RawResponse) -> Result<RawResponse, ClientError> {
        if (200..300).contains(&r.status) {
            return Ok(r);
        }
        let mut error = ErrorObject::decode(&r.body).unwrap_or_else(|| {
            ErrorObject::new(
                cni_core::Version::CURRENT.to_string(),
                cni_core::error::code::INTERNAL,
                format!(
                    "HTTP {} {}",
                    r.status,
                    StatusCode::from_u16(r.status)
                        .ok()
                        .and_then(|s| s.canonical_reason())
                        .unwrap_or("")
                ),
                String::from_utf8_lossy(&r.body).into_owned(),
            )
        });
        if r.resent && error.code == api::code::ALREADY_ATTACHED {
            error.details = format!(
                "{}{}the request was sent again after cnid closed the connection without answering \
                 (restarted?): the first one may have attached it",
                error.details,
                if error.details.is_empty() { "" } else { "; " }
            );
        }
        Err(ClientError::Api {
            status: r.status,
            error,
            plugin: r.plugin,
        })
    }

    fn decode<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, ClientError> {
        serde_json::from_slice(body).map_err(|e| ClientError::Decode {
            what: what.to_owned(),
            reason: e.to_string(),
        })
    }

    /// `POST path` with `req` as its body, sent again while
    /// cnid restarts until the request's deadline (`timeout_ms`, else
    /// cnid's `default` for the verb).
    async fn post_within<T: Serialize>(
        &self,
        path: &str,
        req: &T,
        timeout_ms: Option<u64>,
        default: Duration,
    ) -> Result<RawResponse, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| ClientError::Decode {
            what: "request".into(),
            reason: format!("cannot encode: {e}"),
        })?;
        let within = timeout_ms.map_or(default, Duration::from_millis);
        self.request_within(Method::POST, path, Some(body.into()), within)
            .await
    }

    /// [`Client::post_within`], an error status as [`ClientError::Api`].
    async fn post<T: Serialize>(
        &self,
        path: &str,
        req: &T,
        timeout_ms: Option<u64>,
    ) -> Result<RawResponse, ClientError> {
        Self::answered(
            self.post_within(path, req, timeout_ms, Timeouts::DEFAULT_LONG)
                .await?,
        )
    }

    fn network_path(network: &str, verb: &str) -> String {
        format!("{}/networks/{}/{verb}", api::PREFIX, encode(network))
    }

    fn sandbox_path(verb: &str) -> String {
        format!("{}/sandboxes/{verb}", api::PREFIX)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let r = self
            .call(Method::GET, path, None, DEFAULT_RETRY_WINDOW)
            .await?;
        Self::decode(path, &r.body)
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<HealthResponse, ClientError> {
        self.get(&format!("{}/health", api::PREFIX)).await
    }

    /// `GET /v1/networks`.
    pub async fn networks(&self) -> Result<NetworksResponse, ClientError> {
        self.get(&format!("{}/networks", api::PREFIX)).await
    }

    /// `GET /v1/networks/{name}` (with the configuration).
    pub async fn network(&self, name: &str) -> Result<NetworkInfo, ClientError> {
        self.get(&format!("{}/networks/{}", api::PREFIX, encode(name)))
            .await
    }

    /// ADD: the CNI result, exactly as the daemon sent it.
    pub async fn add(&self, network: &str, req: &AttachmentRequest) -> Result<Value, ClientError> {
        let path = Self::network_path(network, "add");
        let r = self
            .post_within(&path, req, req.timeout_ms, Timeouts::DEFAULT_LONG)
            .await?;
        // Sent again after cnid closed the connection without answering
        // (restarted?) and refused as attached: the first one was done
        // before the kill. Its answer is the attachment's result, when it
        // was made with this request's parameters.
        if r.resent
            && r.status == 409
            && let Some(result) = self.attached_as(network, req).await?
        {
            return Ok(result);
        }
        Self::decode(&path, &Self::answered(r)?.body)
    }

    /// The result of `req`'s attachment on `network`, if it exists and was
    /// made with `req`'s parameters.
    async fn attached_as(
        &self,
        network: &str,
        req: &AttachmentRequest,
    ) -> Result<Option<Value>, ClientError> {
        Ok(self
            .attachments(Some(&req.container_id))
            .await?
            .into_iter()
            .find(|a| a.network == network && a.ifname == req.ifname && req.made(a))
            .and_then(|a| a.result))
    }

    /// DEL. Succeeds when the attachment does not exist.
    pub async fn del(&self, network: &str, req: &AttachmentRequest) -> Result<(), ClientError> {
        self.del_raw(network, req).await.map(|_| ())
    }

    /// DEL, with the raw answer (to see whether it was coalesced).
    pub async fn del_raw(
        &self,
        network: &str,
        req: &AttachmentRequest,
    ) -> Result<RawResponse, ClientError> {
        let path = Self::network_path(network, "del");
        self.post(&path, req, req.timeout_ms).await
    }

    /// CHECK.
    pub async fn check(&self, network: &str, req: &AttachmentRequest) -> Result<(), ClientError> {
        let path = Self::network_path(network, "check");
        self.post(&path, req, req.timeout_ms).await.map(|_| ())
    }

    /// STATUS.
    pub async fn status(
        &self,
        network: &str,
        timeout: Option<Duration>,
    ) -> Result<(), ClientError> {
        let req = StatusRequest {
            timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        };
        let path = Self::network_path(network, "status");
        let r = self
            .post_within(&path, &req, req.timeout_ms, Timeouts::DEFAULT_SHORT)
            .await?;
        Self::answered(r).map(|_| ())
    }

    /// GC with the attachments that are still valid.
    pub async fn gc(&self, network: &str, req: &GcRequest) -> Result<GcResponse, ClientError> {
        let path = Self::network_path(network, "gc");
        let r = self.post(&path, req, req.timeout_ms).await?;
        Self::decode(&path, &r.body)
    }

    /// Sets up a sandbox on its networks (`POST /v1/sandboxes/add`): the
    /// merged result; on failure nothing of it is left (the networks set up
    /// before the failing one are deleted again).
    pub async fn sandbox_add(&self, req: &SandboxRequest) -> Result<SandboxResult, ClientError> {
        let r = self
            .post(&Self::sandbox_path("add"), req, req.timeout_ms)
            .await?;
        Self::decode(&Self::sandbox_path("add"), &r.body)
    }

    /// Tears a sandbox down (`POST /v1/sandboxes/del`), every network even
    /// when one fails.
    pub async fn sandbox_del(&self, req: &SandboxRequest) -> Result<(), ClientError> {
        self.post(&Self::sandbox_path("del"), req, req.timeout_ms)
            .await
            .map(|_| ())
    }

    /// CHECK of a sandbox's networks (`POST /v1/sandboxes/check`).
    pub async fn sandbox_check(&self, req: &SandboxRequest) -> Result<(), ClientError> {
        self.post(&Self::sandbox_path("check"), req, req.timeout_ms)
            .await
            .map(|_| ())
    }

    /// STATUS of a sandbox's networks (`POST /v1/sandboxes/status`): ready
    /// iff all are.
    pub async fn sandbox_status(&self, req: &SandboxRequest) -> Result<(), ClientError> {
        let path = Self::sandbox_path("status");
        let r = self
            .post_within(&path, req, req.timeout_ms, Timeouts::DEFAULT_SHORT)
            .await?;
        Self::answered(r).map(|_| ())
    }

    fn filtered(what: &str, container_id: Option<&str>) -> String {
        match container_id {
            Some(c) => format!("{}/{what}?containerId={}", api::PREFIX, encode(c)),
            None => format!("{}/{what}", api::PREFIX),
        }
    }

    /// `GET /v1/attachments`: every cached attachment, all or one
    /// container's, fetched page by page ([`Client::attachments_page`]).
    /// An attachment that exists throughout is listed exactly once; one
    /// added or removed meanwhile may or may not be.
    pub async fn attachments(
        &self,
        container_id: Option<&str>,
    ) -> Result<Vec<AttachmentInfo>, ClientError> {
        // The first request has no paging parameters, so that a daemon
        // from before paging (which refuses them and answers everything at
        // once) is understood too; a daemon that pages says so with `next`.
        let mut page = self.attachments_page(container_id, None, None).await?;
        let mut all = std::mem::take(&mut page.attachments);
        while let Some(next) = page.next.take() {
            page = self
                .attachments_page(container_id, Some(&next), Some(api::ATTACHMENTS_PAGE_MAX))
                .await?;
            if page.next.as_deref().is_some_and(|n| n <= next.as_str()) {
                return Err(ClientError::Decode {
                    what: "GET /v1/attachments".into(),
                    reason: format!("the page after {next:?} did not move forward"),
                });
            }
            all.append(&mut page.attachments);
        }
        Ok(all)
    }

    /// One page of `GET /v1/attachments`: at most `limit` attachments
    /// (the daemon's default without one) whose cache file names sort
    /// after `after` (the `next` of the previous page).
    pub async fn attachments_page(
        &self,
        container_id: Option<&str>,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<AttachmentsResponse, ClientError> {
        let mut query = Vec::new();
        if let Some(c) = container_id {
            query.push(format!("containerId={}", encode(c)));
        }
        if let Some(l) = limit {
            query.push(format!("limit={l}"));
        }
        if let Some(a) = after {
            query.push(format!("after={}", encode(a)));
        }
        let mut path = format!("{}/attachments", api::PREFIX);
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        self.get(&path).await
    }

    /// `GET /v1/operations`: queued and running operations.
    pub async fn operations(
        &self,
        container_id: Option<&str>,
    ) -> Result<Vec<OperationInfo>, ClientError> {
        let r: OperationsResponse = self
            .get(&Self::filtered("operations", container_id))
            .await?;
        Ok(r.operations)
    }

    /// `GET /metrics` (Prometheus text).
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let r = self
            .call(Method::GET, "/metrics", None, DEFAULT_RETRY_WINDOW)
            .await?;
        Ok(String::from_utf8_lossy(&r.body).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_are_judged_by_their_kind_and_answers_never_again() {
        let connect = |kind| ClientError::Connect {
            path: "/x".into(),
            source: std::io::Error::from(kind),
        };
        use std::io::ErrorKind::*;
        assert_eq!(failure(&connect(ConnectionRefused)), Failure::NotRead);
        assert_eq!(failure(&connect(NotFound)), Failure::Missing);
        assert_eq!(failure(&connect(PermissionDenied)), Failure::Final);
        let api = ClientError::Api {
            status: 500,
            error: ErrorObject::new("1.0.0", 11, "x", ""),
            plugin: None,
        };
        assert_eq!(failure(&api), Failure::Final);
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("net-1"), "net-1");
        assert_eq!(encode("../x"), "..%2Fx");
        assert_eq!(
            Client::filtered("attachments", Some("a b")),
            "/v1/attachments?containerId=a%20b"
        );
    }
}
