//! A unary gRPC client over containerd's Unix socket: one HTTP/2
//! connection (as the kubelet keeps one), a call is a POST of one
//! length-prefixed message to `/SERVICE/METHOD`, answered with one message
//! and the `grpc-status` trailer (or, for an early error, a response of
//! headers only that carries it).
//!
//! # Caveats
//!
//! - No compression, no retries, no keep-alive pings: the calls are short
//!   and the server is local.
//! - The deadline is sent as `grpc-timeout` and also enforced here, so a
//!   server that never answers fails the call instead of hanging the run.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Buf, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderMap, Request};
use tokio::net::UnixStream;

/// A connection to a gRPC server; cheap to clone, calls run concurrently
/// as HTTP/2 streams.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    send: SendRequest<Bytes>,
}

/// A call answered with a gRPC status other than OK.
#[derive(Debug)]
pub(crate) struct Status {
    pub(crate) code: u32,
    pub(crate) message: String,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "grpc status {}: {}", self.code, self.message)
    }
}

impl std::error::Error for Status {}

/// gRPC's `UNIMPLEMENTED`: the server has no such service or method.
pub(crate) const UNIMPLEMENTED: u32 = 12;

impl Client {
    /// Connects to the socket at `path` and runs the connection's task.
    pub(crate) async fn connect(path: &Path) -> anyhow::Result<Client> {
        let io = UnixStream::connect(path)
            .await
            .with_context(|| format!("connect to {}", path.display()))?;
        let (send, conn) = h2::client::handshake(io)
            .await
            .with_context(|| format!("HTTP/2 handshake on {}", path.display()))?;
        tokio::spawn(async move {
            // Ends when the server goes away; each call reports its own error.
            let _ = conn.await;
        });
        Ok(Client { send })
    }

    /// Calls `path` (`/package.Service/Method`) with the encoded request
    /// `msg`; returns the encoded response.
    pub(crate) async fn call(
        &self,
        path: &str,
        msg: &[u8],
        deadline: Duration,
    ) -> anyhow::Result<Vec<u8>> {
        tokio::time::timeout(deadline, self.call_inner(path, msg, deadline))
            .await
            .map_err(|_| anyhow::anyhow!("{path}: no answer within {deadline:?}"))?
            .with_context(|| path.to_owned())
    }

    async fn call_inner(
        &self,
        path: &str,
        msg: &[u8],
        deadline: Duration,
    ) -> anyhow::Result<Vec<u8>> {
        let req = Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", format!("{}m", deadline.as_millis()))
            .body(())?;
        let mut send = self.send.clone().ready().await?;
        let (resp, mut body) = send.send_request(req, false)?;
        let mut framed = BytesMut::with_capacity(5 + msg.len());
        framed.extend_from_slice(&[0]);
        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        framed.extend_from_slice(msg);
        body.send_data(framed.freeze(), true)?;
        let resp = resp.await?;
        if resp.status() != http::StatusCode::OK {
            bail!("HTTP status {}", resp.status());
        }
        // Trailers-only: an error before any message.
        check_status(resp.headers(), false)?;
        let mut recv = resp.into_body();
        let mut data = BytesMut::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk?;
            recv.flow_control().release_capacity(chunk.len())?;
            data.extend_from_slice(&chunk);
        }
        let trailers = recv.trailers().await?.unwrap_or_default();
        check_status(&trailers, true)?;
        if data.len() < 5 {
            bail!("answer of {} bytes: no gRPC message", data.len());
        }
        if data[0] != 0 {
            bail!("compressed answer (flag {}): not asked for", data[0]);
        }
        let mut head = &data[1..5];
        let n = head.get_u32() as usize;
        let body = data
            .get(5..5 + n)
            .with_context(|| format!("message of {n} bytes cut short at {}", data.len() - 5))?;
        Ok(body.to_vec())
    }
}

/// The `grpc-status` in `h`: OK passes; missing passes unless `required`.
fn check_status(h: &HeaderMap, required: bool) -> anyhow::Result<()> {
    let Some(code) = h.get("grpc-status") else {
        if required {
            bail!("no grpc-status in the trailers");
        }
        return Ok(());
    };
    let code: u32 = code
        .to_str()
        .ok()
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("grpc-status {code:?}: not a number"))?;
    if code == 0 {
        return Ok(());
    }
    let message = h
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Err(Status { code, message }.into())
}

/// `grpc-message` is percent-encoded.
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(v) = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
