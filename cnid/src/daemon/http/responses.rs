//! Answers: the HTTP status of each kind of failure, the JSON bodies and
//! headers of answers, and the answers written by hand to connections that
//! are not served.

use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::api;
use crate::daemon::error::{ApiError, ErrorKind};
use crate::daemon::operation::{Done, Outcome};

pub(super) type Resp = Response<Full<Bytes>>;

/// A request ID for an answer to a request that was not read.
pub(super) fn fresh_request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("cnid-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub(super) fn json_response(status: StatusCode, body: Bytes) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn to_json<T: Serialize>(status: StatusCode, v: &T) -> Resp {
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
pub(super) fn error_response(e: &ApiError) -> Resp {
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

pub(super) fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

/// The answer to an operation's outcome: 200 with the JSON of what it
/// produced, 204 when it has nothing to say, or the failure's answer.
pub(super) fn outcome_response(outcome: &Outcome) -> Resp {
    match outcome {
        Ok(Done::Result(v)) => to_json(StatusCode::OK, v),
        Ok(Done::Gc(gc)) => to_json(StatusCode::OK, gc),
        Ok(Done::Sandbox(merged)) => to_json(StatusCode::OK, merged),
        Ok(Done::Nothing) => empty(StatusCode::NO_CONTENT),
        Err(e) => error_response(e),
    }
}

/// An HTTP/1.1 answer written by hand, for connections that are not served:
/// status, JSON body, `Connection: close`.
pub(super) fn raw_answer(
    status: hyper::StatusCode,
    request_id: &str,
    body: &[u8],
    retry_after: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{}: {request_id}\r\n{}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        crate::api::REQUEST_ID_HEADER,
        if retry_after { "retry-after: 1\r\n" } else { "" },
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use cni_core::Command;

    use super::*;

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

    #[test]
    fn raw_answers_are_complete_http() {
        let a = raw_answer(hyper::StatusCode::FORBIDDEN, "cnid-1", b"{}", false);
        let s = String::from_utf8(a).unwrap();
        assert!(s.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{s}");
        assert!(
            s.contains("content-length: 2\r\n") && s.ends_with("\r\n\r\n{}"),
            "{s}"
        );
        let a = raw_answer(hyper::StatusCode::SERVICE_UNAVAILABLE, "x", b"", true);
        assert!(String::from_utf8(a).unwrap().contains("retry-after: 1\r\n"));
    }
}
