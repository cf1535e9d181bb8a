//! The wire types of cnid's HTTP API (version 1), shared by the daemon,
//! `cnid-client`, `cnid-shim` and cnitool; [`decode`], the daemon's pure
//! request decoding and validation (fuzzed in `cnid/api/fuzz`); and
//! [`retry`], when the clients send a request again while cnid restarts.
//! `cnid/API.md` documents every endpoint.
//!
//! Requests are JSON objects with camel-case keys; unknown keys are refused
//! (HTTP 400), so a typo such as `"containerID"` in an ADD body never goes
//! unnoticed. Errors are the CNI error object ([`cni_core::ErrorObject`]:
//! `cniVersion`, `code`, `msg`, `details`) with an HTTP status; [`code`]
//! lists the codes cnid adds for conditions the spec has no code for.
#![warn(missing_docs)]

pub mod decode;
pub mod retry;

use cni_core::stdin::GcAttachment;
use cni_core::{CapabilityArgs, CniArgs, RuntimeConf};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The path prefix of the versioned API.
pub const PREFIX: &str = "/v1";

/// The request header carrying a caller-chosen request ID (echoed in the
/// response, logged, and listed by `GET /v1/operations`).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The request header carrying the caller's W3C trace context (with
/// [`TRACESTATE_HEADER`] and [`BAGGAGE_HEADER`]): every plugin of the
/// operation gets it as `TRACEPARENT` (`TRACESTATE`, `BAGGAGE`), and
/// cnid's log lines of the operation name its trace id (`trace_id`).
/// Malformed values are dropped.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The W3C `tracestate` request header (kept only with a valid
/// [`TRACEPARENT_HEADER`]).
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The W3C `baggage` request header.
pub const BAGGAGE_HEADER: &str = "baggage";

/// The response header that is `true` when a DEL shared the execution of an
/// identical DEL queued before it.
pub const COALESCED_HEADER: &str = "cnid-coalesced";

/// The response header naming the plugin (its `type`) whose failure an
/// error answer reports (`cnid-shim`, the typed client and `cnitool
/// --socket` put it in the message; the error object stays the plugin's
/// own). Absent when the error is not a plugin's.
pub const PLUGIN_HEADER: &str = "cnid-plugin";

/// With [`PLUGIN_HEADER`]: the verb the plugin ran (`ADD`, `DEL`, `CHECK`,
/// `STATUS`, `GC`), which for a failed ADD may be the DEL of its rollback.
pub const PLUGIN_COMMAND_HEADER: &str = "cnid-plugin-command";

/// The longest request ID kept; longer (or non-printable) ones are replaced.
pub const REQUEST_ID_MAX: usize = 128;

/// The default interface name when a request leaves `ifname` out (as cnitool).
pub const DEFAULT_IFNAME: &str = "eth0";

/// Error codes cnid uses for conditions the CNI spec has no code for: 900
/// plus the HTTP status minus 400. Everything else uses the spec's codes
/// (see `API.md` for the table).
pub mod code {
    /// The peer's uid/gid is not allowed (HTTP 403).
    pub const FORBIDDEN: u32 = 903;
    /// No such endpoint (HTTP 404; an unknown network is CNI code 7).
    pub const NO_SUCH_ENDPOINT: u32 = 904;
    /// The endpoint exists but not with this method (HTTP 405).
    pub const METHOD_NOT_ALLOWED: u32 = 905;
    /// HTTP 409: ADD of an attachment that exists (DEL it first), or an
    /// ADD, CHECK or DEL whose netns and ifname belong to another attached
    /// container (unless the request sets `force`).
    pub const ALREADY_ATTACHED: u32 = 909;
    /// The request body is larger than the daemon accepts (HTTP 413).
    pub const BODY_TOO_LARGE: u32 = 913;
}

/// Percent-encodes a path segment or query value (everything but ASCII
/// letters, digits and `-_.~`), as the daemon decodes them.
///
/// ```
/// assert_eq!(cnid_api::encode("../x y"), "..%2Fx%20y");
/// ```
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn default_ifname() -> String {
    DEFAULT_IFNAME.to_owned()
}

/// The body of ADD, DEL and CHECK (`POST /v1/networks/{network}/add|del|check`).
///
/// ```
/// use cnid_api::AttachmentRequest;
///
/// let req: AttachmentRequest = serde_json::from_str(
///     r#"{"containerId":"c1","netns":"/run/netns/c1","cniArgs":"K8S_POD_NAME=web"}"#,
/// ).unwrap();
/// assert_eq!(req.ifname, "eth0");
/// let rt = req.runtime_conf().unwrap();
/// assert_eq!(rt.args.get("K8S_POD_NAME"), Some("web"));
/// assert!(serde_json::from_str::<AttachmentRequest>(r#"{"containerId":"c1","bogus":1}"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachmentRequest {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: an absolute path; required for ADD and CHECK, may be
    /// empty for DEL.
    #[serde(default)]
    pub netns: String,
    /// `CNI_IFNAME` (default `eth0`).
    #[serde(default = "default_ifname")]
    pub ifname: String,
    /// `CNI_ARGS` as `K=V;K=V` (the reference cnitool's syntax).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cni_args: String,
    /// Capability arguments (`portMappings`, `bandwidth`, ...), passed in
    /// `runtimeConfig` to the plugins that declare them.
    #[serde(default, skip_serializing_if = "CapabilityArgs::is_empty")]
    pub capability_args: CapabilityArgs,
    /// The request's deadline in milliseconds, queueing included (default
    /// per verb; capped by the daemon's maximum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Run although `netns` and the interface belong to another container
    /// cnid has attached (by default such a request is refused with 409,
    /// naming the owner, before any plugin runs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

impl AttachmentRequest {
    /// Whether attachment `a` was made with this request's parameters: the
    /// same netns, the same `CNI_ARGS` pairs in any order (go-cni builds
    /// them from a map), the same capability arguments. What a client
    /// checks before it takes a 409 "already attached" to an ADD sent
    /// again (a retry, or after cnid restarted) for that ADD's answer.
    pub fn made(&self, a: &AttachmentInfo) -> bool {
        let pairs = |s: &str| {
            CniArgs::parse(s).map(|a| {
                let mut p = a.0;
                p.sort();
                p
            })
        };
        let args_same = match (pairs(&a.cni_args), pairs(&self.cni_args)) {
            (Ok(x), Ok(y)) => x == y,
            _ => a.cni_args == self.cni_args,
        };
        a.netns == self.netns && args_same && a.capability_args == self.capability_args
    }

    /// A request for this container, netns and interface.
    pub fn new(
        container_id: impl Into<String>,
        netns: impl Into<String>,
        ifname: impl Into<String>,
    ) -> Self {
        AttachmentRequest {
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            cni_args: String::new(),
            capability_args: CapabilityArgs::new(),
            timeout_ms: None,
            force: false,
        }
    }

    /// The request for an attachment described by a [`RuntimeConf`].
    pub fn from_runtime_conf(rt: &RuntimeConf) -> Self {
        AttachmentRequest {
            container_id: rt.container_id.clone(),
            netns: rt.netns.clone(),
            ifname: rt.ifname.clone(),
            cni_args: rt.args.to_string(),
            capability_args: rt.capability_args.clone(),
            timeout_ms: None,
            force: false,
        }
    }

    /// The [`RuntimeConf`] of this request (`cniArgs` parsed, nothing else
    /// checked; the daemon validates every field).
    pub fn runtime_conf(&self) -> Result<RuntimeConf, cni_core::Error> {
        Ok(RuntimeConf {
            container_id: self.container_id.clone(),
            netns: self.netns.clone(),
            ifname: self.ifname.clone(),
            args: CniArgs::parse(&self.cni_args)?,
            capability_args: self.capability_args.clone(),
        })
    }
}

/// One network of a sandbox request ([`SandboxRequest`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxNetwork {
    /// The network name (one of cnid's networks).
    pub name: String,
    /// The interface name; absent: the next of `eth0`, `eth1`, ... that no
    /// other network of the request names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// `CNI_ARGS` for this network only (`K=V;K=V`), after the sandbox's
    /// (a key set in both takes this value).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cni_args: String,
    /// Capability arguments for this network only, over the sandbox's (a
    /// capability set in both takes this value): static `ips`, `mac`, ...
    #[serde(default, skip_serializing_if = "CapabilityArgs::is_empty")]
    pub capability_args: CapabilityArgs,
}

impl SandboxNetwork {
    /// The network `name` with a generated interface name and no options.
    pub fn new(name: impl Into<String>) -> Self {
        SandboxNetwork {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// The body of `POST /v1/sandboxes/add|del|check|status`: one container on
/// several networks in one call (go-cni's `Setup`, `Remove`, `Check`,
/// `Status`).
///
/// ```
/// use cnid_api::SandboxRequest;
///
/// let req: SandboxRequest = serde_json::from_str(
///     r#"{"containerId":"pod1","netns":"/run/netns/pod1",
///        "networks":[{"name":"pods"},{"name":"storage","ifname":"net1"}]}"#,
/// ).unwrap();
/// assert_eq!(req.networks.len(), 2);
/// assert!(!req.loopback);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxRequest {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`: an absolute path; required for add and check, may be
    /// empty for del.
    #[serde(default)]
    pub netns: String,
    /// The networks, in setup order; empty: the default network (the first
    /// of the conf dir) as `eth0`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<SandboxNetwork>,
    /// Set up the loopback interface `lo` first (network `cni-loopback`,
    /// the `loopback` plugin), as go-cni's `WithLoNetwork`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loopback: bool,
    /// `CNI_ARGS` of every network (`K=V;K=V`), e.g. the pod's labels.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cni_args: String,
    /// Capability arguments of every network (each plugin gets those it
    /// declares).
    #[serde(default, skip_serializing_if = "CapabilityArgs::is_empty")]
    pub capability_args: CapabilityArgs,
    /// The deadline of the whole request in milliseconds, queueing included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Run although `netns` and an interface of the request belong to
    /// another container cnid has attached (by default refused with 409,
    /// naming the owner, before any plugin runs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// An address of an interface in a [`SandboxResult`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxIp {
    /// The address with its prefix length.
    pub address: String,
    /// The gateway the plugin reported for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// One interface in a [`SandboxResult`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInterface {
    /// Its addresses.
    #[serde(default)]
    pub ips: Vec<SandboxIp>,
    /// Its hardware address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The netns it is in; absent for host-side interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// One network's own result in a [`SandboxResult`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNetworkResult {
    /// The network name.
    pub network: String,
    /// Its interface name.
    pub ifname: String,
    /// The CNI result of its chain, in the network's version.
    pub result: Value,
}

/// The merged result of `POST /v1/sandboxes/add` (go-cni's `Result`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResult {
    /// Every interface the results name, by name: the sandbox's (`lo`,
    /// `eth0`, ...) and host-side ones (bridges, veth peers).
    pub interfaces: std::collections::BTreeMap<String, SandboxInterface>,
    /// The routes of all results, in network order.
    #[serde(default)]
    pub routes: Vec<Value>,
    /// The non-empty DNS settings of the results, in network order.
    #[serde(default)]
    pub dns: Vec<Value>,
    /// Each network's result, in setup order.
    pub networks: Vec<SandboxNetworkResult>,
}

/// The optional body of STATUS (`POST /v1/networks/{network}/status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusRequest {
    /// The request's deadline in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The body of GC (`POST /v1/networks/{network}/gc`).
///
/// `validAttachments` is required: an empty list means "no attachment of
/// this network is valid" and deletes every cached one, which should never
/// happen because a key was forgotten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GcRequest {
    /// The attachments that are still in use (`containerID`, `ifname`), as the
    /// spec's `cni.dev/valid-attachments`.
    pub valid_attachments: Vec<GcAttachment>,
    /// The request's deadline in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// What GC did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcResponse {
    /// Stale attachments that were deleted (cached ones, and half-done ADDs
    /// the daemon had recorded).
    pub deleted: Vec<GcAttachment>,
    /// Stale attachments that were not deleted (their DEL failed, or the
    /// request's deadline left no time for it), each with why. They stay
    /// recorded: the next GC or a DEL tries again.
    #[serde(default)]
    pub failed: Vec<GcFailed>,
    /// Whether GC was sent to the plugins (1.1.0 lists only).
    pub plugins_called: bool,
    /// True when the list has `disableGC` and nothing was done.
    pub disabled: bool,
}

/// A stale attachment GC could not delete (`failed` in [`GcResponse`]); the
/// keys are those of `deleted` (the spec's `containerID`, `ifname`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcFailed {
    /// The container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// The interface name.
    pub ifname: String,
    /// Why its DEL failed, as a CNI error object (a plugin's own object as
    /// it wrote it; code 11 when the deadline expired).
    pub error: cni_core::ErrorObject,
}

/// One loaded network (`GET /v1/networks`, `GET /v1/networks/{name}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInfo {
    /// The network name.
    pub name: String,
    /// The file it was loaded from.
    pub file: String,
    /// The version it runs at (highest supported of `cniVersion`/`cniVersions`).
    pub cni_version: String,
    /// The plugin types in ADD order.
    pub plugins: Vec<String>,
    /// Capabilities some plugin enables.
    pub capabilities: Vec<String>,
    /// `disableCheck`.
    pub disable_check: bool,
    /// `disableGC`.
    #[serde(rename = "disableGC")]
    pub disable_gc: bool,
    /// Other files defining the same name, which are ignored (lookup by
    /// name picks as libcni: a `.conflist` first, then by file name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shadowed: Vec<String>,
    /// The configuration list as loaded (only in `GET /v1/networks/{name}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Why the network cannot work now (a plugin binary missing, or not
    /// answering VERSION with the network's version); absent when usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unusable: Option<String>,
}

impl NetworkInfo {
    /// The view of `list`, loaded from `file`, with the files it shadows;
    /// with its configuration when `with_config`.
    pub fn new(
        list: &cni_core::NetworkConfigList,
        file: &std::path::Path,
        shadowed: &[std::path::PathBuf],
        with_config: bool,
    ) -> Self {
        NetworkInfo {
            name: list.name().to_owned(),
            file: file.display().to_string(),
            cni_version: list.version().to_string(),
            plugins: list
                .plugins()
                .iter()
                .map(|p| p.plugin_type().to_owned())
                .collect(),
            capabilities: list.capabilities(),
            disable_check: list.disable_check(),
            disable_gc: list.disable_gc(),
            shadowed: shadowed.iter().map(|p| p.display().to_string()).collect(),
            config: with_config
                .then(|| serde_json::from_slice(&list.cache_bytes()).unwrap_or(Value::Null)),
            unusable: None,
        }
    }
}

/// A configuration file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigError {
    /// The file (or the conf dir itself).
    pub file: String,
    /// Why.
    pub reason: String,
}

/// `GET /v1/networks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworksResponse {
    /// The conf dir.
    pub conf_dir: String,
    /// Increases by one on every reload.
    pub generation: u64,
    /// When the networks were last loaded (milliseconds since the Unix epoch).
    pub loaded_at_ms: u64,
    /// The usable networks in conf-dir file order (all extensions sorted
    /// together; the first is the default network), one per name.
    pub networks: Vec<NetworkInfo>,
    /// Files that could not be used (they do not stop the others).
    pub errors: Vec<ConfigError>,
    /// The conf dir does not exist (absent when it does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conf_dir_missing: bool,
}

/// One cached attachment (`GET /v1/attachments`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentInfo {
    /// The network name.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_NETNS` at ADD.
    pub netns: String,
    /// What cnid's stale-attachment reaper found: `gone` when its
    /// namespace is gone and the reap waits for `--stale-after`, `stale`
    /// when it is to be deleted (queued, running, waiting for a retry, or
    /// refused: then `reapError` says why); `drifted` when its namespace
    /// is there but its last periodic CHECK (`cnid --check-every`) failed
    /// (`checkError`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// With `state`: when the reaper first saw the namespace gone
    /// (milliseconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gone_since_ms: Option<u64>,
    /// With `state` `stale`: the error of the last reap that failed (a
    /// refusal, retried only when the record changes or cnid restarts; or
    /// "try again later", retried after a backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_error: Option<String>,
    /// With `state` `drifted` (`cnid --check-every`): the error of the
    /// periodic CHECK that fails. Nothing is repaired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_error: Option<String>,
    /// `CNI_ARGS` at ADD (`K=V;K=V`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cni_args: String,
    /// Capability arguments at ADD.
    #[serde(default, skip_serializing_if = "CapabilityArgs::is_empty")]
    pub capability_args: CapabilityArgs,
    /// The cached ADD result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// The page size of `GET /v1/attachments` without `limit`.
pub const ATTACHMENTS_PAGE_DEFAULT: usize = 100;
/// The largest `limit` of `GET /v1/attachments`.
pub const ATTACHMENTS_PAGE_MAX: usize = 1000;
/// A page of `GET /v1/attachments` ends once its cache records add up to
/// this many bytes (a page always has at least one attachment, whatever its
/// size).
pub const ATTACHMENTS_PAGE_BYTES: u64 = 1024 * 1024;

/// `GET /v1/attachments`: one page.
///
/// Pages follow the cache file names (`<network>-<containerID>-<ifname>`)
/// in byte order. When `next` is present, more may follow: ask again with
/// `after=<next>`. An attachment that exists throughout the paging is
/// listed exactly once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttachmentsResponse {
    /// The cached attachments, sorted by cache file name.
    pub attachments: Vec<AttachmentInfo>,
    /// Where the next page starts (`after=<next>`); absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One queued or running operation (`GET /v1/operations`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationInfo {
    /// The daemon's sequence number (arrival order).
    pub id: u64,
    /// The request ID (from `X-Request-Id` or generated).
    pub request_id: String,
    /// `ADD`, `DEL`, `CHECK`, `STATUS` or `GC`.
    pub verb: String,
    /// The network.
    pub network: String,
    /// The container (attachment operations only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The interface (attachment operations only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// `queued` or `running`.
    pub state: String,
    /// Requests waiting for it (more than 1 for coalesced DELs).
    pub waiters: u32,
    /// Milliseconds since it arrived.
    pub age_ms: u64,
}

/// `GET /v1/operations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationsResponse {
    /// In arrival order.
    pub operations: Vec<OperationInfo>,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthResponse {
    /// `ok`, or `draining` during shutdown.
    pub status: String,
    /// Whether the daemon is ready for ADDs: at least `--min-networks`
    /// networks loaded whose plugins answer VERSION. Only in
    /// `GET /v1/health/ready` (finding out runs the plugins' VERSION);
    /// absent in `GET /v1/health`, which is liveness only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Why it is not ready; when ready, which loaded networks cannot
    /// work now (a plugin binary missing or not supporting the network's
    /// version) and why, the default network named as such (absent when
    /// ready and every network is usable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Only in `GET /v1/health/ready`, and only when the stale-attachment
    /// reaper works with less than it needs: cnid does not see the host's
    /// mounts and processes, so it reaps only attachments of an earlier
    /// boot (by boot id). Readiness is not affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_reaper: Option<String>,
    /// The daemon's version.
    pub version: String,
    /// The newest CNI spec version the daemon speaks.
    pub cni_version: String,
    /// Networks loaded.
    pub networks: u64,
    /// Configuration files that could not be used.
    pub config_errors: u64,
    /// Operations running plugins now.
    pub in_flight: u64,
    /// Operations waiting for their turn.
    pub queued: u64,
    /// Seconds since start.
    pub uptime_seconds: u64,
}
