//! Errors of the daemon's operations: what kind of failure it was, the CNI
//! error object and, for a plugin's failure, which plugin ran which verb.
//! Nothing here is HTTP: `http/responses.rs` maps each [`ErrorKind`] to a
//! status (`responses::status_of`, the one table of that mapping).
//!
//! | condition | kind | CNI code |
//! |---|---|---|
//! | malformed JSON, unknown field, missing field | `InvalidRequest` | 6 |
//! | invalid name or ID (container ID, network, ifname, `CNI_ARGS`, netns) | `InvalidRequest` | 3, 4 or 7 (the validator's) |
//! | CHECK on a network below 0.4.0 | `InvalidRequest` | 1 |
//! | peer uid/gid not allowed | `Forbidden` | 903 |
//! | unknown network | `NotFound` | 7 |
//! | CHECK of an attachment that is not attached | `NotFound` | 3 |
//! | no such endpoint / wrong method | `NotFound` / `MethodNotAllowed` | 904 / 905 |
//! | ADD of an attachment that exists (or whose earlier ADD is unresolved) | `Conflict` | 909 |
//! | ADD, CHECK or DEL on the netns and ifname of another attached container (without `force`) | `Conflict` | 909 |
//! | request body too large | `TooLarge` | 913 |
//! | plugin failed, printed garbage, could not be executed | `PluginFailed` | the plugin's code (or 5, 6, 999) |
//! | STATUS: plugin not ready, or not installed | `NotReady` | 50 or 51 |
//! | attachment locked by another process (cnitool), all connections busy | `Busy` | 11 |
//! | shutting down | `ShuttingDown` | 11 |
//! | plugin timed out, deadline expired while queued | `DeadlineExpired` | 11 |
//! | cache or state dir I/O | `Io` | 5 |
//! | other daemon-side failure (plugin not installed, bad network config) | `Internal` | 7 or 999 |

use cni_core::error::code as cni_code;
use cni_core::{ErrorObject, Version};

use crate::api::code;
use crate::decode::{self, RequestError};

/// What kind of failure an operation or a request ended with: what a
/// caller branches on (the module's table lists what each covers).
/// Declared in the order of their severity (the answer's status:
/// `responses::status_of` keeps that order), so the most severe of several
/// failures is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ErrorKind {
    InvalidRequest,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    TooLarge,
    Internal,
    Io,
    PluginFailed,
    NotReady,
    Busy,
    ShuttingDown,
    DeadlineExpired,
}

/// An operation's (or a request's) failure: its kind, the CNI error object
/// answered, and the plugin's evidence.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", error.msg)]
pub(crate) struct ApiError {
    pub(crate) kind: ErrorKind,
    pub(crate) error: ErrorObject,
    /// The plugin that failed and the verb it ran, when the error is a
    /// plugin's (answered in the `Cnid-Plugin` header, logged with the
    /// operation); the error object stays the plugin's own.
    pub(crate) plugin: Option<(String, cni_core::Command)>,
}

impl ApiError {
    pub(crate) fn new(kind: ErrorKind, code: u32, msg: impl Into<String>) -> Self {
        ApiError {
            kind,
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
        ApiError::new(ErrorKind::InvalidRequest, code, msg)
    }

    pub(crate) fn bad_body(msg: impl Into<String>) -> Self {
        ApiError::bad_request(cni_code::DECODING_FAILURE, msg)
    }

    pub(crate) fn forbidden(uid: u32, gid: u32) -> Self {
        ApiError::new(
            ErrorKind::Forbidden,
            code::FORBIDDEN,
            format!("peer uid {uid} gid {gid} is not allowed to use this socket"),
        )
    }

    pub(crate) fn no_endpoint(path: &str) -> Self {
        ApiError::new(
            ErrorKind::NotFound,
            code::NO_SUCH_ENDPOINT,
            format!("no endpoint {path:?}"),
        )
    }

    pub(crate) fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            ErrorKind::MethodNotAllowed,
            code::METHOD_NOT_ALLOWED,
            format!("method {method} not allowed on {path:?}"),
        )
    }

    pub(crate) fn unknown_network(name: &str) -> Self {
        ApiError::new(
            ErrorKind::NotFound,
            cni_code::INVALID_NETWORK_CONFIG,
            format!("no network configuration with name {name:?}"),
        )
    }

    pub(crate) fn too_large(limit: usize) -> Self {
        ApiError::new(
            ErrorKind::TooLarge,
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
            ErrorKind::Conflict,
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
        let whose = if owner.in_progress {
            "is in use by an operation in progress of"
        } else {
            "belongs to"
        };
        ApiError::new(
            ErrorKind::Conflict,
            code::ALREADY_ATTACHED,
            format!(
                "{verb} of container {:?} on network {network:?} refused: netns {:?} interface {:?} {whose} container {:?} on network {:?}; set \"force\": true if this is meant",
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
            ErrorKind::ShuttingDown,
            cni_code::TRY_AGAIN_LATER,
            "cnid is shutting down",
        )
    }

    pub(crate) fn too_many_connections(cap: usize) -> Self {
        ApiError::new(
            ErrorKind::Busy,
            cni_code::TRY_AGAIN_LATER,
            format!(
                "too many connections: all {cap} (--max-connections) have an operation in progress; retry"
            ),
        )
    }

    pub(crate) fn queued_too_long(waited_ms: u128) -> Self {
        ApiError::new(
            ErrorKind::DeadlineExpired,
            cni_code::TRY_AGAIN_LATER,
            format!("deadline expired after {waited_ms}ms while queued; no plugin was run"),
        )
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Internal, cni_code::INTERNAL, msg)
    }

    /// The response for an error of the operations layer. cnid's own
    /// refusals in it (a sandbox step's, [`cni_async::Error::hook`]) come
    /// back as they went.
    pub(crate) fn from_cni(e: &cni_async::Error, version: Version) -> Self {
        if let Some(own) = e.hook_error::<ApiError>() {
            return own.clone().in_version(version);
        }
        ApiError {
            kind: kind_of(e),
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
            kind: kind_of_status(e.status),
            error: e.error,
            plugin: None,
        }
    }
}

/// cnid's refusals in a sandbox's steps (`engine`'s `SandboxSteps`): the
/// library carries them untouched ([`cni_async::Error::hook`]) and writes
/// the error objects of its wrappers from theirs.
impl cni_async::multi::HookError for ApiError {
    fn to_error_object(&self, cni_version: &str) -> ErrorObject {
        let mut error = self.error.clone();
        cni_version.clone_into(&mut error.cni_version);
        error
    }

    fn failed_plugin(&self) -> Option<(&str, cni_core::Command)> {
        self.plugin.as_ref().map(|(p, c)| (p.as_str(), *c))
    }
}

fn kind_of(e: &cni_async::Error) -> ErrorKind {
    use cni_async::Error as E;
    match e {
        E::Hook(_) => e
            .hook_error::<ApiError>()
            .map_or(ErrorKind::Internal, |own| own.kind),
        E::Core(c) => kind_of_status(decode::core_status(c)),
        E::Plugin { .. }
        | E::PluginOutput { .. }
        | E::Spawn { .. }
        | E::OutputTooLarge { .. }
        | E::Io { .. } => ErrorKind::PluginFailed,
        E::Timeout { .. } => ErrorKind::DeadlineExpired,
        // The node is not set up for the network (its readiness says the
        // same): not a failure of cnid's.
        E::PluginNotFound { .. } => ErrorKind::NotReady,
        E::Cache { .. } => ErrorKind::Io,
        E::CacheLocked { .. } => ErrorKind::Busy,
        E::NotReady { .. } | E::NotReadyLimitedConnectivity { .. } => ErrorKind::NotReady,
        E::NotAttached { .. } => ErrorKind::NotFound,
        E::Unsupported { .. } => ErrorKind::InvalidRequest,
        E::RollbackFailed { error, .. } => kind_of(error),
        E::Context { source, .. } | E::Operation { source, .. } => kind_of(source),
        E::Multiple { errors, .. } => errors
            .iter()
            .map(kind_of)
            .max()
            .unwrap_or(ErrorKind::Internal),
        // The exclusive ADD's check under the attachment's lock: recorded
        // meanwhile (by cnitool on the same cache, say), a corrupt record,
        // or a colliding name. A refusal as cnid's own check gives (409).
        E::AlreadyAttached { .. } | E::AttachmentCollision { .. } => ErrorKind::Conflict,
        _ => ErrorKind::Internal,
    }
}

/// The kind of a failure [`crate::decode`] answers with a wire status
/// (`RequestError::status`, `decode::core_status`): 400, 404, 500 or 502.
pub(crate) fn kind_of_status(status: u16) -> ErrorKind {
    match status {
        400 => ErrorKind::InvalidRequest,
        404 => ErrorKind::NotFound,
        502 => ErrorKind::PluginFailed,
        _ => ErrorKind::Internal,
    }
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
        assert_eq!(api.kind, ErrorKind::InvalidRequest);
        assert_eq!(api.error.code, 4);
        assert_eq!(api.error.cni_version, "1.0.0");

        let t = cni_async::Error::Timeout {
            plugin_type: "slow".into(),
            command: Command::Add,
            elapsed: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            stderr_so_far: String::new(),
        };
        assert_eq!(ApiError::from_cni(&t, v).kind, ErrorKind::DeadlineExpired);
        let rb = cni_async::Error::RollbackFailed {
            error: Box::new(t),
            rollback: Box::new(cni_async::Error::NotAttached {
                network: "n".into(),
                container_id: "c".into(),
                ifname: "eth0".into(),
            }),
        };
        assert_eq!(ApiError::from_cni(&rb, v).kind, ErrorKind::DeadlineExpired);
        let na = cni_async::Error::NotAttached {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let api = ApiError::from_cni(&na, v);
        assert_eq!((api.kind, api.error.code), (ErrorKind::NotFound, 3));
    }

    /// cnid's refusals come back from the library as they went: kind
    /// (every one), error object (in the version asked for) and plugin;
    /// merged with others, the most severe kind answers.
    #[test]
    fn refusals_come_back_as_they_went() {
        use ErrorKind as K;
        let all = [
            K::InvalidRequest,
            K::Forbidden,
            K::NotFound,
            K::MethodNotAllowed,
            K::Conflict,
            K::TooLarge,
            K::Internal,
            K::Io,
            K::PluginFailed,
            K::NotReady,
            K::Busy,
            K::ShuttingDown,
            K::DeadlineExpired,
        ];
        for kind in all {
            let mut sent = ApiError::new(kind, 11, format!("refused as {kind:?}"));
            sent.plugin = Some(("bridge".into(), Command::Add));
            let lib = cni_async::Error::hook(sent.clone());
            let back = ApiError::from_cni(&lib, Version::V1_0_0);
            assert_eq!(back.kind, kind);
            assert_eq!(back.error, sent.clone().in_version(Version::V1_0_0).error);
            assert_eq!(back.plugin, Some(("bridge".into(), Command::Add)));
            // Wrapped as the orchestration wraps a step's error: the
            // wrapper's object is the library's, the kind and plugin cnid's.
            let wrapped = cni_async::Error::Context {
                context: "network \"n\" (ifname eth0) ADD".into(),
                source: Box::new(cni_async::Error::hook(sent.clone())),
            };
            let back = ApiError::from_cni(&wrapped, Version::V1_0_0);
            assert_eq!((back.kind, back.error.code), (kind, 11), "{kind:?}");
            assert_eq!(
                back.error.msg,
                format!("network \"n\" (ifname eth0) ADD: refused as {kind:?}")
            );
            assert_eq!(back.plugin, Some(("bridge".into(), Command::Add)));
            // Merged with others, as a sandbox's STATUS merges its networks'.
            let mut merged = cni_async::Errors::new("status");
            merged.push(cni_async::Error::hook(ApiError::new(
                K::NotFound,
                7,
                "other",
            )));
            merged.push(cni_async::Error::hook(ApiError::new(kind, 11, "this")));
            let merged = ApiError::from_cni(&merged.into_result().unwrap_err(), Version::V1_0_0);
            assert_eq!(merged.kind, kind.max(K::NotFound), "{kind:?} merged");
        }
    }
}
