//! The daemon's request decoding and validation, without I/O: the network
//! name in the URL path, the `containerId` query parameter and the JSON
//! bodies of ADD, DEL, CHECK, STATUS and GC.
//!
//! The daemon runs every request through these functions before it looks
//! up the network or queues anything; the fuzz target `daemon_request`
//! (`cnid/api/fuzz`) runs them on arbitrary input. A refusal is a
//! [`RequestError`]: the HTTP status and the CNI error object of the answer.
//!
//! What the daemon adds on top, because it needs the file system: ADD and
//! CHECK are refused (400, code 4) when `netns` is not a network namespace
//! (`cni_async::check_netns`, the library's rule).
//!
//! ```
//! use cni_core::Command;
//! use cnid_api::decode::{DecodedRequest, decode_network_name, decode_request};
//!
//! assert_eq!(decode_network_name("my%2Dnet").unwrap(), "my-net");
//! let body = br#"{"containerId":"c1","netns":"/run/netns/c1"}"#;
//! let Ok(DecodedRequest::Attachment { rt, timeout_ms, .. }) =
//!     decode_request(Command::Add, "my-net", body)
//! else {
//!     panic!("refused");
//! };
//! assert_eq!((rt.ifname.as_str(), timeout_ms), ("eth0", None));
//!
//! let e = decode_request(Command::Add, "my-net", br#"{"containerId":"../x"}"#).unwrap_err();
//! assert_eq!((e.status, e.error.code), (400, 4));
//! ```

use cni_core::error::code as cni_code;
use cni_core::stdin::GcAttachment;
use cni_core::{Command, ErrorObject, RuntimeConf, Version, validate};
use serde::de::DeserializeOwned;

use crate::{
    ATTACHMENTS_PAGE_DEFAULT, ATTACHMENTS_PAGE_MAX, AttachmentRequest, GcRequest, StatusRequest,
    code,
};

/// The longest `<network>-<containerID>-<ifname>` accepted: the cache's
/// temp file for it, `.<that>.tmp-<pid>-<nanos>`, must fit in a file name
/// (255 bytes). Longer names are valid CNI names, but every ADD of them
/// would fail on a file system error (after running the chain, between 223
/// and 250 bytes) and every DEL would run its plugins without a lock.
pub const MAX_ATTACHMENT_NAME: usize = 222;

/// A refused request: the HTTP status and the CNI error object the daemon
/// answers with.
///
/// The error object's `cniVersion` is [`Version::CURRENT`]; the daemon
/// rewrites it to the network's version when the network is loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HTTP {status}: {}", error.msg)]
#[non_exhaustive]
pub struct RequestError {
    /// The HTTP status (400, or 404 for a verb without an endpoint).
    pub status: u16,
    /// The CNI error object (code, msg, details).
    pub error: ErrorObject,
}

impl RequestError {
    fn new(status: u16, code: u32, msg: impl Into<String>) -> Self {
        RequestError {
            status,
            error: ErrorObject::new(Version::CURRENT.to_string(), code, msg, ""),
        }
    }

    /// 400 with this CNI code.
    fn bad_request(code: u32, msg: impl Into<String>) -> Self {
        RequestError::new(400, code, msg)
    }

    /// 400, code 6 (decoding failure).
    pub(crate) fn bad_body(msg: impl Into<String>) -> Self {
        RequestError::bad_request(cni_code::DECODING_FAILURE, msg)
    }

    /// A validator's refusal, with its code and the value in `details`.
    fn core(e: &cni_core::Error) -> Self {
        RequestError {
            status: core_status(e),
            error: e.to_error_object(&Version::CURRENT.to_string()),
        }
    }
}

/// The HTTP status of an error of `cni-core`: 400 for invalid request
/// values, 404 for a missing network, 502 for a plugin's result that does
/// not decode, 500 otherwise.
pub fn core_status(e: &cni_core::Error) -> u16 {
    use cni_core::Error as E;
    match e {
        E::InvalidParameter { .. } | E::InvalidCniArgs { .. } | E::InvalidCapabilityArgs { .. } => {
            400
        }
        E::NetworkNotFound { .. } | E::NoConfigs { .. } => 404,
        // A plugin's result that does not decode or convert.
        E::InvalidResult { .. } | E::Conversion { .. } => 502,
        _ => 500,
    }
}

/// A request body that decoded and passed every check.
///
/// Exhaustive on purpose: the daemon matches every variant, so a new verb
/// cannot go unhandled behind a wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedRequest {
    /// ADD, DEL or CHECK: the attachment (`cniArgs` parsed; IDs, names and
    /// netns checked, except that the netns exists).
    Attachment {
        /// The attachment.
        rt: RuntimeConf,
        /// `timeoutMs`.
        timeout_ms: Option<u64>,
        /// `force`: run although netns and ifname belong to another
        /// container.
        force: bool,
    },
    /// STATUS.
    Status {
        /// `timeoutMs`.
        timeout_ms: Option<u64>,
    },
    /// GC.
    Gc {
        /// `validAttachments`, each with a valid container ID and ifname.
        valid_attachments: Vec<GcAttachment>,
        /// `timeoutMs`.
        timeout_ms: Option<u64>,
    },
}

/// Percent-decodes one path segment or query value (400, code 6 on a bad
/// escape or a result that is not UTF-8).
fn percent_decode(s: &str) -> Result<String, RequestError> {
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
                        RequestError::bad_body(format!("invalid percent-encoding in {s:?}"))
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
    String::from_utf8(out).map_err(|_| RequestError::bad_body(format!("{s:?} is not UTF-8")))
}

/// The network name of a `/v1/networks/{network}[/verb]` path segment:
/// percent-decoded, then validated (400, code 7 when invalid).
pub fn decode_network_name(segment: &str) -> Result<String, RequestError> {
    let name = percent_decode(segment)?;
    validate::network_name(&name).map_err(|e| RequestError::core(&e))?;
    Ok(name)
}

/// The `containerId` query parameter of `GET /v1/attachments` and
/// `GET /v1/operations` (the only parameter any endpoint takes): `None`
/// without one; the last one wins when repeated. `+` is a space.
pub fn decode_container_filter(query: Option<&str>) -> Result<Option<String>, RequestError> {
    Ok(decode_query(query, &["containerId"])?.container_id)
}

/// The query of `GET /v1/attachments`: `containerId`, `limit` (1 to
/// [`ATTACHMENTS_PAGE_MAX`], default [`ATTACHMENTS_PAGE_DEFAULT`]) and
/// `after` (the `next` of the previous page).
///
/// ```
/// use cnid_api::decode::decode_attachments_query;
///
/// let q = decode_attachments_query(Some("limit=10&after=net-c1-eth0")).unwrap();
/// assert_eq!((q.limit, q.after.as_deref()), (10, Some("net-c1-eth0")));
/// assert_eq!(decode_attachments_query(None).unwrap().limit, 100);
/// assert!(decode_attachments_query(Some("limit=0")).is_err());
/// ```
pub fn decode_attachments_query(query: Option<&str>) -> Result<AttachmentsQuery, RequestError> {
    decode_query(query, &["containerId", "limit", "after"])
}

/// A decoded [`decode_attachments_query`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttachmentsQuery {
    /// Only this container's attachments.
    pub container_id: Option<String>,
    /// The page size.
    pub limit: usize,
    /// Start after this cache file name.
    pub after: Option<String>,
}

/// The longest `after` accepted (a file name).
const AFTER_MAX: usize = 255;

fn decode_query(query: Option<&str>, known: &[&str]) -> Result<AttachmentsQuery, RequestError> {
    let bad = |msg: String| RequestError::bad_request(cni_code::INVALID_ENVIRONMENT_VARIABLES, msg);
    let mut q = AttachmentsQuery {
        container_id: None,
        limit: ATTACHMENTS_PAGE_DEFAULT,
        after: None,
    };
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&k) {
            return Err(bad(format!(
                "unknown query parameter {k:?} (known: {})",
                known.join(", ")
            )));
        }
        let v = percent_decode(&v.replace('+', " "))?;
        match k {
            "containerId" => {
                validate::container_id(&v).map_err(|e| RequestError::core(&e))?;
                q.container_id = Some(v);
            }
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=ATTACHMENTS_PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "invalid limit {v:?}: a number from 1 to {ATTACHMENTS_PAGE_MAX}"
                        ))
                    })?;
            }
            _ => {
                // Only ever compared with file names, never used in a path.
                if v.is_empty() || v.len() > AFTER_MAX || v.contains(['/', '\0']) {
                    return Err(bad(format!(
                        "invalid after {v:?}: the next of a previous page (a cache file name)"
                    )));
                }
                q.after = Some(v);
            }
        }
    }
    Ok(q)
}

fn parse<T: DeserializeOwned>(body: &[u8], what: &str) -> Result<T, RequestError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(RequestError::bad_body(format!(
            "the request body is empty; expected {what}"
        )));
    }
    serde_json::from_slice(body)
        .map_err(|e| RequestError::bad_body(format!("invalid request body (expected {what}): {e}")))
}

/// Checks an attachment request: IDs, names, `CNI_ARGS`, and that netns is
/// absolute (or empty, for DEL only).
fn attachment(req: &AttachmentRequest, verb: Command) -> Result<RuntimeConf, RequestError> {
    let rt = req.runtime_conf().map_err(|e| RequestError::core(&e))?;
    rt.validate().map_err(|e| RequestError::core(&e))?;
    let netns_bad = |reason: &str| {
        RequestError::bad_request(
            cni_code::INVALID_ENVIRONMENT_VARIABLES,
            format!("invalid netns {:?}: {reason}", rt.netns),
        )
    };
    if rt.netns.is_empty() {
        if verb != Command::Del {
            return Err(netns_bad("required for ADD and CHECK"));
        }
    } else if !rt.netns.starts_with('/') {
        return Err(netns_bad("must be an absolute path"));
    }
    Ok(rt)
}

/// Refuses names too long for the cache and intent file names.
fn fits_file_names(network: &str, rt: &RuntimeConf) -> Result<(), RequestError> {
    let len = network.len() + rt.container_id.len() + rt.ifname.len() + 2;
    if len > MAX_ATTACHMENT_NAME {
        return Err(RequestError::bad_request(
            cni_code::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "network name, container ID and interface name are too long together: \
                 {len} bytes with separators (at most {MAX_ATTACHMENT_NAME}, to fit the cache file names)"
            ),
        ));
    }
    Ok(())
}

/// Decodes and checks the body of `POST /v1/networks/{network}/{verb}`.
///
/// - ADD, DEL, CHECK: an [`AttachmentRequest`]; valid container ID, ifname
///   and `cniArgs`; `netns` absolute, or empty for DEL; network name,
///   container ID and ifname together at most [`MAX_ATTACHMENT_NAME`] bytes
///   with separators.
/// - STATUS: a [`StatusRequest`], or an empty (all-whitespace) body.
/// - GC: a [`GcRequest`] whose `validAttachments` have valid container IDs
///   and ifnames.
/// - VERSION has no endpoint (404, code 904).
///
/// `network` is the already decoded name ([`decode_network_name`]).
pub fn decode_request(
    verb: Command,
    network: &str,
    body: &[u8],
) -> Result<DecodedRequest, RequestError> {
    match verb {
        Command::Add | Command::Del | Command::Check => {
            let req: AttachmentRequest = parse(body, "an attachment object")?;
            let rt = attachment(&req, verb)?;
            fits_file_names(network, &rt)?;
            Ok(DecodedRequest::Attachment {
                rt,
                timeout_ms: req.timeout_ms,
                force: req.force,
            })
        }
        Command::Status => {
            let req: StatusRequest = if body.iter().all(u8::is_ascii_whitespace) {
                StatusRequest::default()
            } else {
                parse(body, "a status object")?
            };
            Ok(DecodedRequest::Status {
                timeout_ms: req.timeout_ms,
            })
        }
        Command::Gc => {
            let req: GcRequest = parse(body, "a GC object with validAttachments")?;
            for a in &req.valid_attachments {
                validate::container_id(&a.container_id)
                    .and_then(|()| validate::interface_name(&a.ifname))
                    .map_err(|e| RequestError::core(&e))?;
            }
            Ok(DecodedRequest::Gc {
                valid_attachments: req.valid_attachments,
                timeout_ms: req.timeout_ms,
            })
        }
        other => Err(RequestError::new(
            404,
            code::NO_SUCH_ENDPOINT,
            format!("no endpoint for {other}"),
        )),
    }
}

/// A checked sandbox request ([`decode_sandbox_request`]): each network
/// with its runtime configuration, interface names assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedSandbox {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// Whether `lo` goes first (network `cni-loopback`).
    pub loopback: bool,
    /// The named networks in order with their runtime configuration; empty
    /// when the request named none (the daemon then uses its default
    /// network as `eth0`: [`DecodedSandbox::default_rt`]).
    pub networks: Vec<(String, RuntimeConf)>,
    /// The runtime configuration of the default network (`eth0`) and of
    /// the loopback network (with `lo`): the sandbox-wide args.
    pub base: RuntimeConf,
    /// The request's deadline.
    pub timeout_ms: Option<u64>,
    /// `force`: run although netns and an ifname belong to another
    /// container.
    pub force: bool,
}

impl DecodedSandbox {
    /// The sandbox-wide runtime configuration with interface `ifname`.
    pub fn default_rt(&self, ifname: &str) -> RuntimeConf {
        RuntimeConf {
            ifname: ifname.to_owned(),
            ..self.base.clone()
        }
    }
}

/// Decodes and checks the body of `POST /v1/sandboxes/{verb}` (add, del,
/// check, status): a [`crate::SandboxRequest`]. The container ID,
/// `cniArgs` and netns are checked as for one attachment (netns absolute,
/// may be empty for DEL and STATUS); every network name, interface name
/// and per-network `cniArgs` too; interface names are assigned (`eth0`,
/// `eth1`, ... skipping those named explicitly, `lo` for the loopback) and
/// must differ; each network's file names must fit.
pub fn decode_sandbox_request(verb: Command, body: &[u8]) -> Result<DecodedSandbox, RequestError> {
    let req: crate::SandboxRequest = parse(body, "a sandbox object")?;
    let base_req = AttachmentRequest {
        container_id: req.container_id.clone(),
        netns: req.netns.clone(),
        ifname: crate::DEFAULT_IFNAME.to_owned(),
        cni_args: req.cni_args.clone(),
        capability_args: req.capability_args.clone(),
        timeout_ms: req.timeout_ms,
        force: req.force,
    };
    // STATUS runs no attachment: its netns may be empty, as DEL's.
    let netns_verb = if verb == Command::Status {
        Command::Del
    } else {
        verb
    };
    let base = attachment(&base_req, netns_verb)?;
    if req.loopback {
        let lo = RuntimeConf {
            ifname: "lo".to_owned(),
            ..base.clone()
        };
        fits_file_names("cni-loopback", &lo)?;
    }
    let explicit: Vec<&str> = req
        .networks
        .iter()
        .filter_map(|n| n.ifname.as_deref())
        .chain(req.loopback.then_some("lo"))
        .collect();
    let mut generated = 0usize;
    let mut next_ifname = || loop {
        let name = format!("eth{generated}");
        generated += 1;
        if !explicit.contains(&name.as_str()) {
            return name;
        }
    };
    let mut networks: Vec<(String, RuntimeConf)> = Vec::with_capacity(req.networks.len());
    let mut used: Vec<String> = if req.loopback {
        vec!["lo".to_owned()]
    } else {
        Vec::new()
    };
    for n in &req.networks {
        validate::network_name(&n.name).map_err(|e| RequestError::core(&e))?;
        let ifname = n.ifname.clone().unwrap_or_else(&mut next_ifname);
        let mut rt = RuntimeConf {
            ifname: ifname.clone(),
            ..base.clone()
        };
        let extra = cni_core::CniArgs::parse(&n.cni_args).map_err(|e| RequestError::core(&e))?;
        for (k, v) in extra.0 {
            match rt.args.0.iter_mut().find(|(key, _)| *key == k) {
                Some(pair) => pair.1 = v,
                None => rt.args.0.push((k, v)),
            }
        }
        for (k, v) in &n.capability_args.0 {
            rt.capability_args.insert(k.clone(), v.clone());
        }
        rt.validate().map_err(|e| RequestError::core(&e))?;
        fits_file_names(&n.name, &rt)?;
        if used.contains(&ifname) {
            return Err(RequestError::bad_request(
                cni_code::INVALID_ENVIRONMENT_VARIABLES,
                format!(
                    "interface name {ifname:?} is used by more than one network of the sandbox"
                ),
            ));
        }
        used.push(ifname);
        networks.push((n.name.clone(), rt));
    }
    Ok(DecodedSandbox {
        container_id: req.container_id,
        loopback: req.loopback,
        networks,
        base,
        timeout_ms: req.timeout_ms,
        force: req.force,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(body: &str) -> Result<DecodedRequest, RequestError> {
        decode_request(Command::Add, "net", body.as_bytes())
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb").unwrap(), "a/b");
        assert_eq!(percent_decode("..%2fx").unwrap(), "../x");
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%2").is_err());
        let e = percent_decode("%ff").unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 6));
        let e = decode_network_name("..%2Fx").unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 7));
        assert_eq!(decode_network_name("net-1").unwrap(), "net-1");
        assert_eq!(decode_network_name("n%65t").unwrap(), "net");
    }

    #[test]
    fn query() {
        assert_eq!(decode_container_filter(None).unwrap(), None);
        assert_eq!(decode_container_filter(Some("")).unwrap(), None);
        assert_eq!(
            decode_container_filter(Some("containerId=c1"))
                .unwrap()
                .as_deref(),
            Some("c1")
        );
        assert_eq!(
            decode_container_filter(Some("containerId=c1&containerId=c2"))
                .unwrap()
                .as_deref(),
            Some("c2")
        );
        let e = decode_container_filter(Some("containerId=..%2Fx")).unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 4));
        assert_eq!(e.error.details, "../x");
        // `+` is a space, which no container ID has.
        assert!(decode_container_filter(Some("containerId=a+b")).is_err());
        let e = decode_container_filter(Some("x=1")).unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 4));
    }

    #[test]
    fn names_must_fit_the_cache_file_names() {
        let rt = |cid: &str| RuntimeConf::new(cid, "/x", "eth0");
        let fits = "c".repeat(MAX_ATTACHMENT_NAME - 2 - 3 - 4);
        assert!(fits_file_names("net", &rt(&fits)).is_ok());
        let e = fits_file_names("net", &rt(&format!("{fits}c"))).unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 4));
        assert!(e.error.msg.contains("at most 222"), "{}", e.error.msg);
        // The same through decode_request.
        let body = format!(r#"{{"containerId":"{fits}c","netns":"/x"}}"#);
        assert!(add(&body).unwrap_err().error.msg.contains("too long"));
    }

    #[test]
    fn attachment_checks() {
        let mut r = AttachmentRequest::new("c1", "", "eth0");
        assert!(attachment(&r, Command::Del).is_ok());
        assert_eq!(attachment(&r, Command::Add).unwrap_err().status, 400);
        r.netns = "relative".into();
        assert!(attachment(&r, Command::Del).is_err());
        // Existence is the daemon's check, not this one.
        r.netns = "/nonexistent/netns".into();
        assert!(attachment(&r, Command::Add).is_ok());
        r.cni_args = "novalue".into();
        assert_eq!(attachment(&r, Command::Add).unwrap_err().error.code, 4);
        r.cni_args.clear();
        r.ifname = "../x".into();
        assert!(attachment(&r, Command::Add).is_err());
    }

    #[test]
    fn bodies() {
        let ok = add(r#"{"containerId":"c1","netns":"/x","timeoutMs":5}"#).unwrap();
        let DecodedRequest::Attachment { rt, timeout_ms, .. } = ok else {
            panic!("{ok:?}");
        };
        assert_eq!((rt.container_id.as_str(), timeout_ms), ("c1", Some(5)));
        for (body, code) in [
            ("", 6),
            (" \n", 6),
            ("{", 6),
            (r#"{"containerId":"c1","netns":"/x","bogus":1}"#, 6),
            (r#"{"netns":"/x"}"#, 6),
            (r#"{"containerId":"","netns":"/x"}"#, 3),
            (r#"{"containerId":"c1","netns":"/x","ifname":"a/b"}"#, 4),
        ] {
            let e = add(body).unwrap_err();
            assert_eq!((e.status, e.error.code), (400, code), "{body:?}: {e}");
            assert_eq!(e.error.cni_version, Version::CURRENT.to_string());
        }
        assert_eq!(
            decode_request(Command::Status, "net", b" ").unwrap(),
            DecodedRequest::Status { timeout_ms: None }
        );
        assert_eq!(
            decode_request(Command::Status, "net", br#"{"timeoutMs":1}"#).unwrap(),
            DecodedRequest::Status {
                timeout_ms: Some(1)
            }
        );
        assert!(decode_request(Command::Status, "net", b"{\"x\":1}").is_err());
        let gc = |b: &str| decode_request(Command::Gc, "net", b.as_bytes());
        assert_eq!(gc("").unwrap_err().error.code, 6);
        assert_eq!(gc("{}").unwrap_err().error.code, 6);
        assert!(gc(r#"{"validAttachments":[]}"#).is_ok());
        let e = gc(r#"{"validAttachments":[{"containerID":"c1","ifname":"a:b"}]}"#).unwrap_err();
        assert_eq!((e.status, e.error.code), (400, 4));
        let e = decode_request(Command::Version, "net", b"{}").unwrap_err();
        assert_eq!((e.status, e.error.code), (404, 904));
    }

    #[test]
    fn gc_takes_the_apis_container_id_spelling_and_the_specs() {
        for key in ["containerId", "containerID"] {
            let body = format!(r#"{{"validAttachments":[{{"{key}":"c1","ifname":"eth0"}}]}}"#);
            match decode_request(Command::Gc, "net", body.as_bytes()) {
                Ok(DecodedRequest::Gc {
                    valid_attachments, ..
                }) => assert_eq!(valid_attachments[0].container_id, "c1", "{key}"),
                other => panic!("{key}: {other:?}"),
            }
        }
    }
}
