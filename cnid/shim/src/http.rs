//! A minimal blocking HTTP/1.1 client for cnid's Unix socket: one request
//! per connection (`Connection: close`), a `Content-Length` body out, and a
//! `Content-Length`, chunked or close-delimited body in.
//!
//! This is what `cnid-shim` uses instead of `cnid::client::Client`: a
//! plugin process makes one or two requests and exits, so an async runtime,
//! a connection pool and hyper would only add start-up time and memory (see
//! `BENCHMARKS.md`, "cnid-shim").
//!
//! # Restarts
//! A restart of cnid is not an error: [`request`] sends a request again
//! within its deadline by the rules of `cnid_api::retry`, the same as
//! `cnid-client`'s.
//!
//! # Caveats
//! - The deadline bounds each blocking read and write, not their sum: a
//!   peer trickling one byte per read could stretch it. cnid answers in one
//!   or two writes.
//! - Answers larger than [`MAX_ANSWER`] are refused: a CNI result is a few
//!   KiB, and the shim must stay small.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The largest answer (head and body) read.
pub const MAX_ANSWER: usize = 4 * 1024 * 1024;
use cnid_api::retry::{Failure, Retries};

/// An answer: status, headers (names lower-cased) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The headers in order, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body (chunked encoding removed).
    pub body: Vec<u8>,
}

impl Answer {
    /// The first header of this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a request got no usable answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// Nothing listens on the socket (missing file, refused, not a socket).
    #[error("cannot connect to {}: {source}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// What `connect` said.
        source: io::Error,
    },
    /// The connection failed or closed before the answer was complete (the
    /// daemon stopped or restarted).
    #[error("the connection to {} ended before a complete answer: {what}", socket.display())]
    Closed {
        /// The socket.
        socket: PathBuf,
        /// What happened (end of stream, reset, ...).
        what: String,
    },
    /// No complete answer within the deadline.
    #[error("no answer on {} within {}ms", socket.display(), after.as_millis())]
    Timeout {
        /// The socket.
        socket: PathBuf,
        /// The deadline.
        after: Duration,
    },
    /// Bytes that are not an HTTP/1.1 answer.
    #[error("malformed answer on {}: {what}", socket.display())]
    Malformed {
        /// The socket.
        socket: PathBuf,
        /// What is wrong.
        what: String,
    },
}

/// Sends `method path` with an optional JSON body and extra headers on a
/// new connection to `socket`, and reads the whole answer, whatever its
/// status; sent again while cnid restarts (module docs) for up to
/// `retry_for` (the request's deadline). `timeout` bounds it all: the
/// retries, and connecting, each write and each read of the last attempt.
pub fn request(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    (timeout, retry_for): (Duration, Duration),
) -> Result<Answer, HttpError> {
    let started = Instant::now();
    let mut retries = Retries::new(timeout.min(retry_for));
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let (e, failure) = match attempt(socket, method, path, headers, body, left) {
            Ok(answer) => return Ok(answer),
            // The whole deadline, not what was left of it.
            Err((HttpError::Timeout { socket, .. }, _)) => {
                return Err(HttpError::Timeout {
                    socket,
                    after: timeout,
                });
            }
            Err(failed) => failed,
        };
        match retries.next(failure) {
            Some(pause) => std::thread::sleep(pause),
            None => return Err(e),
        }
    }
}

/// One attempt of [`request`], with whether it may be made again.
fn attempt(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Answer, (HttpError, Failure)> {
    let started = Instant::now();
    let no = |e: HttpError| (e, Failure::Final);
    let closed = |what: String| HttpError::Closed {
        socket: socket.to_owned(),
        what,
    };
    let malformed = |what: String| HttpError::Malformed {
        socket: socket.to_owned(),
        what,
    };
    let timed_out = || HttpError::Timeout {
        socket: socket.to_owned(),
        after: timeout,
    };
    let mut stream = UnixStream::connect(socket).map_err(|source| {
        let failure = Failure::of_connect(source.kind());
        (
            HttpError::Connect {
                socket: socket.to_owned(),
                source,
            },
            failure,
        )
    })?;
    // Reset or a broken pipe before any answer byte: not read.
    let unread = |e: &io::Error| Failure::of_exchange(e.kind());
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: cnid\r\nConnection: close\r\n");
    for (k, v) in headers {
        head += &format!("{k}: {v}\r\n");
    }
    if let Some(b) = body {
        head += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        );
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    if let Some(b) = body {
        out.extend_from_slice(b);
    }
    let remaining = |started: Instant| {
        timeout
            .checked_sub(started.elapsed())
            .filter(|d| !d.is_zero())
    };
    let io_err = |e: io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            timed_out()
        } else {
            closed(e.to_string())
        }
    };
    stream
        .set_write_timeout(Some(remaining(started).ok_or_else(timed_out).map_err(no)?))
        .map_err(|e| no(io_err(e)))?;
    stream.write_all(&out).map_err(|e| {
        let retry = unread(&e);
        (io_err(e), retry)
    })?;

    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut chunk = [0u8; 8 * 1024];
    loop {
        if let Some(answer) = parse(&buf, false).map_err(|w| no(malformed(w)))? {
            return Ok(answer);
        }
        if buf.len() > MAX_ANSWER {
            let what = format!("answer larger than {MAX_ANSWER} bytes");
            return Err(no(malformed(what)));
        }
        let left = remaining(started).ok_or_else(timed_out).map_err(no)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| no(io_err(e)))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if buf.is_empty() => {
                let retry = unread(&e);
                return Err((io_err(e), retry));
            }
            Err(e) => return Err(no(io_err(e))),
        };
        if n == 0 {
            // End of stream: complete only if the body is close-delimited.
            return match parse(&buf, true) {
                Ok(Some(answer)) => Ok(answer),
                Ok(None) if buf.is_empty() => Err((
                    closed("closed without answering".into()),
                    Failure::Unanswered,
                )),
                Ok(None) => Err(no(closed(format!(
                    "closed after {} bytes of an incomplete answer",
                    buf.len()
                )))),
                Err(what) => Err(no(malformed(what))),
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Parses a complete answer from `buf`: `Ok(None)` while more bytes are
/// needed; at end of stream (`eof`) a body without length ends there.
fn parse(buf: &[u8], eof: bool) -> Result<Option<Answer>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err("no end of headers in the first 64 KiB".into());
        }
        if !buf.is_empty() && !b"HTTP/".starts_with(&buf[..buf.len().min(5)]) {
            return Err(format!("not an HTTP answer: {}", preview(buf)));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| format!("headers are not UTF-8: {}", preview(&buf[..end])))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (proto, code) = (parts.next().unwrap_or_default(), parts.next());
    if !proto.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let status: u16 = code
        .and_then(|c| c.parse().ok())
        .filter(|c| (100..600).contains(c))
        .ok_or_else(|| format!("no status code in {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| format!("header line without ':': {line:?}"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let body = &buf[end + 4..];
    let get = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let chunked = get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if status == 204 || status == 304 || (100..200).contains(&status) {
        Vec::new()
    } else if chunked {
        match dechunk(body)? {
            Some(b) => b,
            None if eof => return Err("chunked body ends early".into()),
            None => return Ok(None),
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("invalid Content-Length {len:?}"))?;
        if body.len() < len {
            if eof {
                return Err(format!(
                    "body ends after {} of {len} bytes (Content-Length)",
                    body.len()
                ));
            }
            return Ok(None);
        }
        body[..len].to_vec()
    } else if eof {
        body.to_vec()
    } else {
        return Ok(None);
    };
    Ok(Some(Answer {
        status,
        headers,
        body,
    }))
}

/// Decodes a chunked body: `Ok(None)` while incomplete.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&rest[..eol]).map_err(|_| "chunk size is not UTF-8")?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("invalid chunk size {size_text:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            return Ok(rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .map(|_| std::mem::take(&mut out)));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&rest[..size]);
        if &rest[size..size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        rest = &rest[size + 2..];
    }
}

/// The first bytes of `b`, for messages.
pub(crate) fn preview(b: &[u8]) -> String {
    const MAX: usize = 200;
    let s = String::from_utf8_lossy(&b[..b.len().min(MAX)]);
    if b.len() > MAX {
        format!("{s:?}... ({} bytes)", b.len())
    } else {
        format!("{s:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(s: &str) -> Answer {
        parse(s.as_bytes(), false).unwrap().unwrap()
    }

    #[test]
    fn content_length_chunked_and_close_delimited() {
        let a = done("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nCnid-Plugin: bridge\r\n\r\n{}");
        assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]));
        assert_eq!(a.header("CNID-PLUGIN"), Some("bridge"));
        let a = done("HTTP/1.1 204 No Content\r\n\r\n");
        assert!(a.body.is_empty());
        let a = done(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{\"\r\n3\r\na\":\r\n1\r\n1\r\n0\r\n\r\n",
        );
        assert_eq!(a.body, b"{\"a\":1");
        // Incomplete: more bytes needed.
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab", false),
            Ok(None)
        );
        assert_eq!(parse(b"HTTP/1.1 200 OK\r\n\r\nab", false), Ok(None));
        assert_eq!(parse(b"HTTP/1.1 200", false), Ok(None));
        // Close-delimited.
        let a = parse(b"HTTP/1.1 200 OK\r\n\r\nab", true).unwrap().unwrap();
        assert_eq!(a.body, b"ab");
    }

    #[test]
    fn a_silent_peer_is_a_timeout_and_a_missing_socket_a_connect_error() {
        let dir = std::env::temp_dir().join(format!("cnid-shim-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("silent.sock");
        let _ = std::fs::remove_file(&socket);
        // Accepts (the kernel does, from the backlog) and never answers.
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let start = Instant::now();
        let e = request(
            &socket,
            "GET",
            "/v1/health",
            &[],
            None,
            (Duration::from_millis(200), Duration::from_millis(200)),
        )
        .unwrap_err();
        assert!(matches!(e, HttpError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10));
        assert!(e.to_string().contains("within 200ms"), "{e}");
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        let e = request(
            &socket,
            "GET",
            "/",
            &[],
            None,
            (Duration::from_secs(1), Duration::ZERO),
        )
        .unwrap_err();
        assert!(matches!(e, HttpError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("silent.sock"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_is_refused_with_what_was_wrong() {
        for (bytes, eof, want) in [
            (
                &b"garbage\r\n\r\n"[..],
                false,
                "not an HTTP/1.x status line",
            ),
            (b"nonsense", false, "not an HTTP answer"),
            (b"HTTP/1.1 abc OK\r\n\r\n", false, "no status code"),
            (
                b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
                false,
                "without ':'",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
                false,
                "Content-Length",
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nab",
                true,
                "ends after 2 of 9",
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                false,
                "chunk size",
            ),
        ] {
            let e = parse(bytes, eof).unwrap_err();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
    }
}
