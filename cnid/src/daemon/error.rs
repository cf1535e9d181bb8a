//! Errors as the API returns them: an HTTP status and the CNI error object.
//!
//! | condition | HTTP | CNI code |
//! |---|---|---|
//! | malformed JSON, unknown field, missing field | 400 | 6 |
//! | invalid name or ID (container ID, network, ifname, `CNI_ARGS`, netns) | 400 | 3, 4 or 7 (the validator's) |
//! | CHECK on a network below 0.4.0 | 400 | 1 |
//! | peer uid/gid not allowed | 403 | 903 |
//! | unknown network | 404 | 7 |
//! | CHECK of an attachment that is not attached | 404 | 3 |
//! | no such endpoint / wrong method | 404 / 405 | 904 / 905 |
//! | ADD of an attachment that exists (or whose earlier ADD is unresolved) | 409 | 909 |
//! | ADD, CHECK or DEL on the netns and ifname of another attached container (without `force`) | 409 | 909 |
//! | request body too large | 413 | 913 |
//! | plugin failed, printed garbage, could not be executed | 502 | the plugin's code (or 5, 6, 999) |
//! | STATUS: plugin not ready | 503 | 50 or 51 |
//! | attachment locked by another process (cnitool), shutting down | 503 | 11 |
//! | plugin timed out, deadline expired while queued | 504 | 11 |
//! | daemon-side failure (cache or state dir I/O, plugin not installed, bad network config) | 500 | 5, 7 or 999 |

use cni_core::error::code as cni_code;
use cni_core::{ErrorObject, Version};
use hyper::StatusCode;

use crate::api::code;
use crate::decode::{self, RequestError};

/// An error response.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) error: ErrorObject,
    /// The plugin that failed and the verb it ran, when the error is a
    /// plugin's (answered in the `Cnid-Plugin` header, logged with the
    /// operation); the error object stays the plugin's own.
    pub(crate) plugin: Option<(String, cni_core::Command)>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: u32, msg: impl Into<String>) -> Self {
        ApiError {
            status,
            error: ErrorObject::new(Version::CURRENT.to_string(), code, msg, ""),
            plugin: None,
        }
    }

    pub(crate) fn with_details(mut self, details: impl Into<String>) -> Self {
        self.error.details = details.into();
        self
    }

    /// Writes the error object in this version (the network's).
    pub(crate) fn in_version(mut self, version: Version) -> Self {
        self.error.cni_version = version.to_string();
        self
    }

    pub(crate) fn bad_request(code: u32, msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, msg)
    }

    pub(crate) fn bad_body(msg: impl Into<String>) -> Self {
        ApiError::bad_request(cni_code::DECODING_FAILURE, msg)
    }

    pub(crate) fn forbidden(uid: u32, gid: u32) -> Self {
        ApiError::new(
            StatusCode::FORBIDDEN,
            code::FORBIDDEN,
            format!("peer uid {uid} gid {gid} is not allowed to use this socket"),
        )
    }

    pub(crate) fn no_endpoint(path: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            code::NO_SUCH_ENDPOINT,
            format!("no endpoint {path:?}"),
        )
    }

    pub(crate) fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            code::METHOD_NOT_ALLOWED,
            format!("method {method} not allowed on {path:?}"),
        )
    }

    pub(crate) fn unknown_network(name: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            cni_code::INVALID_NETWORK_CONFIG,
            format!("no network configuration with name {name:?}"),
        )
    }

    pub(crate) fn too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            code::BODY_TOO_LARGE,
            format!("request body larger than {limit} bytes"),
        )
    }

    pub(crate) fn already_attached(
        network: &str,
        container_id: &str,
        ifname: &str,
        why: &str,
    ) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            code::ALREADY_ATTACHED,
            format!(
                "container {container_id:?} interface {ifname:?} is already attached to network {network:?}: DEL it first"
            ),
        )
        .with_details(why)
    }

    /// An ADD, CHECK or DEL of `rt` on `network` whose netns and ifname
    /// are `owner`'s attachment.
    pub(crate) fn owned_by_other(
        verb: cni_core::Command,
        network: &str,
        rt: &cni_core::RuntimeConf,
        owner: &super::owners::Owner,
    ) -> Self {
        ApiError::new(
            StatusCode::CONFLICT,
            code::ALREADY_ATTACHED,
            format!(
                "{verb} of container {:?} on network {network:?} refused: netns {:?} interface {:?} belongs to container {:?} on network {:?}; set \"force\": true if this is meant",
                rt.container_id, rt.netns, rt.ifname, owner.container_id, owner.network
            ),
        )
        .with_details(format!(
            "owner: containerId={} network={} ifname={}",
            owner.container_id, owner.network, owner.ifname
        ))
    }

    pub(crate) fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            cni_code::TRY_AGAIN_LATER,
            "cnid is shutting down",
        )
    }

    pub(crate) fn too_many_connections(cap: usize) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            cni_code::TRY_AGAIN_LATER,
            format!(
                "too many connections: all {cap} (--max-connections) have an operation in progress; retry"
            ),
        )
    }

    pub(crate) fn queued_too_long(waited_ms: u128) -> Self {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            cni_code::TRY_AGAIN_LATER,
            format!("deadline expired after {waited_ms}ms while queued; no plugin was run"),
        )
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, cni_code::INTERNAL, msg)
    }

    /// The response for an error of the operations layer.
    pub(crate) fn from_cni(e: &cni_async::Error, version: Version) -> Self {
        ApiError {
            status: status_of(e),
            error: e.to_error_object(&version.to_string()),
            plugin: e.failed_plugin().map(|(p, c)| (p.to_owned(), c)),
        }
    }

    /// `plugin bridge CHECK` for a plugin's error, for logs.
    pub(crate) fn plugin_label(&self) -> Option<String> {
        self.plugin.as_ref().map(|(p, c)| format!("{p} {c}"))
    }
}

impl From<RequestError> for ApiError {
    /// A request refused by [`crate::decode`].
    fn from(e: RequestError) -> Self {
        ApiError {
            status: StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            error: e.error,
            plugin: None,
        }
    }
}

fn status_of(e: &cni_async::Error) -> StatusCode {
    use cni_async::Error as E;
    match e {
        E::Core(c) => core_status(c),
        E::Plugin { .. }
        | E::PluginOutput { .. }
        | E::Spawn { .. }
        | E::OutputTooLarge { .. }
        | E::Io { .. } => StatusCode::BAD_GATEWAY,
        E::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        E::PluginNotFound { .. } | E::Cache { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        E::CacheLocked { .. } | E::NotReady { .. } | E::NotReadyLimitedConnectivity { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        E::NotAttached { .. } => StatusCode::NOT_FOUND,
        E::Unsupported { .. } => StatusCode::BAD_REQUEST,
        E::RollbackFailed { error, .. } => status_of(error),
        E::Context { source, .. } => status_of(source),
        E::Multiple { errors, .. } => errors
            .iter()
            .map(status_of)
            .max_by_key(|s| s.as_u16())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn core_status(e: &cni_core::Error) -> StatusCode {
    StatusCode::from_u16(decode::core_status(e)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_core::Command;
    use std::time::Duration;

    #[test]
    fn statuses() {
        let v = Version::V1_0_0;
        let e: cni_async::Error = cni_core::validate::container_id("../x").unwrap_err().into();
        let api = ApiError::from_cni(&e, v);
        assert_eq!(api.status, StatusCode::BAD_REQUEST);
        assert_eq!(api.error.code, 4);
        assert_eq!(api.error.cni_version, "1.0.0");

        let t = cni_async::Error::Timeout {
            plugin_type: "slow".into(),
            command: Command::Add,
            elapsed: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            stderr_so_far: String::new(),
        };
        assert_eq!(
            ApiError::from_cni(&t, v).status,
            StatusCode::GATEWAY_TIMEOUT
        );
        let rb = cni_async::Error::RollbackFailed {
            error: Box::new(t),
            rollback: Box::new(cni_async::Error::NotAttached {
                network: "n".into(),
                container_id: "c".into(),
                ifname: "eth0".into(),
            }),
        };
        assert_eq!(
            ApiError::from_cni(&rb, v).status,
            StatusCode::GATEWAY_TIMEOUT
        );
        let na = cni_async::Error::NotAttached {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let api = ApiError::from_cni(&na, v);
        assert_eq!((api.status, api.error.code), (StatusCode::NOT_FOUND, 3));
    }
}
