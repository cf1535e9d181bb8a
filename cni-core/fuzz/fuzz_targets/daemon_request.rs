//! cnid's request decoding: the JSON bodies of ADD/DEL/CHECK, STATUS and GC
//! (`cnid::api`), the network name in the URL path and the `containerId`
//! query parameter.
//!
//! The input is used twice: whole, as a body for every verb; and split at
//! the first newline into a URL part (`<network segment>[?<query>]`) and a
//! body.
//!
//! Properties, for any input:
//! - decoding never panics;
//! - every decoded request round-trips through its JSON;
//! - an attachment request whose `cniArgs` parse gives a `RuntimeConf` that
//!   converts back to the same request;
//! - an accepted attachment has a valid container ID and interface name (so
//!   a cache file name without `/`, short enough for the cache's temp file
//!   name), a netns that is absolute, or empty for DEL only; accepted GC
//!   attachments have valid IDs and names;
//! - an accepted network name or container filter is a safe file name
//!   component, and percent-encoding it decodes back to it.
//!
//! The daemon's own validation (`server.rs`: `network_name`, `parse`,
//! `attachment`, `fits_file_names`, `container_filter`) is private to cnid
//! today; the functions in `stand_in` reproduce it without the netns
//! existence check (file I/O) until cnid exposes it (see `stand_in`'s docs).
#![no_main]

use cni_core::stdin::GcAttachment;
use cni_core::{Command, RuntimeConf, cache, validate};
use cni_core_fuzz::{assert_safe_component, text};
use cnid::api::{AttachmentRequest, GcRequest, StatusRequest};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

const NETWORK: &str = "fuzznet";

fuzz_target!(|data: &[u8]| {
    check_body(NETWORK, data);
    if let Some(nl) = data.iter().position(|b| *b == b'\n') {
        let (url, body) = (&data[..nl], &data[nl + 1..]);
        let url = text(url);
        let (segment, query) = match url.split_once('?') {
            Some((s, q)) => (s, Some(q)),
            None => (&*url, None),
        };
        let network = check_network_segment(segment);
        check_body(network.as_deref().unwrap_or(NETWORK), body);
        check_query(query);
    }
});

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
    let json = serde_json::to_vec(v).expect("a request serializes");
    let back: T = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("{v:?} does not decode from its own JSON: {e}"));
    assert_eq!(&back, v);
}

fn check_body(network: &str, body: &[u8]) {
    if let Ok(req) = serde_json::from_slice::<AttachmentRequest>(body) {
        round_trip(&req);
        if let Ok(rt) = req.runtime_conf() {
            let again = AttachmentRequest::from_runtime_conf(&rt);
            assert_eq!(
                again,
                AttachmentRequest {
                    timeout_ms: None,
                    ..req.clone()
                }
            );
        }
    }
    if let Ok(req) = serde_json::from_slice::<StatusRequest>(body) {
        round_trip(&req);
    }
    if let Ok(req) = serde_json::from_slice::<GcRequest>(body) {
        round_trip(&req);
    }

    for verb in [Command::Add, Command::Del, Command::Check] {
        if let Ok(stand_in::Decoded::Attachment { rt, .. }) =
            stand_in::decode_request(verb, network, body)
        {
            let name = cache::file_name(network, &rt.container_id, &rt.ifname)
                .expect("an accepted attachment has a cache file name");
            assert_safe_component("cache file name", &name);
            // The temp files of the cache record (`.<name>.tmp-<pid>-<nanos>`)
            // and of the daemon's intent (`.<net>:<id>:<ifname>.json.tmp-<ms>`)
            // fit in a file name, with the longest pid Linux gives (2^22) and
            // times since the epoch up to the year 2286.
            let temp = format!(".{name}.tmp-{}-{}", 4_194_304, 9_999_999_999_999_999_999u64);
            assert!(temp.len() <= 255, "{} bytes: {temp:?}", temp.len());
            let intent = format!(
                ".{network}:{}:{}.json.tmp-{}",
                rt.container_id, rt.ifname, 9_999_999_999_999u64
            );
            assert!(intent.len() <= 255, "{} bytes: {intent:?}", intent.len());
            assert_safe_component("container ID", &rt.container_id);
            assert_safe_component("ifname", &rt.ifname);
            if rt.netns.is_empty() {
                assert_eq!(verb, Command::Del, "{verb} accepted without netns");
            } else {
                assert!(
                    rt.netns.starts_with('/'),
                    "relative netns {:?} accepted",
                    rt.netns
                );
            }
        }
    }
    let _ = stand_in::decode_request(Command::Status, network, body);
    if let Ok(stand_in::Decoded::Gc {
        valid_attachments, ..
    }) = stand_in::decode_request(Command::Gc, network, body)
    {
        for a in &valid_attachments {
            assert_safe_component("GC containerID", &a.container_id);
            assert_safe_component("GC ifname", &a.ifname);
        }
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fn check_network_segment(segment: &str) -> Option<String> {
    let name = stand_in::network_name(segment).ok()?;
    assert_safe_component("network name", &name);
    let again = stand_in::network_name(&percent_encode(&name));
    assert_eq!(again.ok().as_ref(), Some(&name));
    Some(name)
}

fn check_query(query: Option<&str>) {
    if let Ok(Some(cid)) = stand_in::container_filter(query) {
        assert_safe_component("containerId filter", &cid);
        let q = format!("containerId={}", percent_encode(&cid));
        assert_eq!(stand_in::container_filter(Some(&q)).ok(), Some(Some(cid)));
    }
}

/// Stand-ins for cnid's private request validation (`cnid/src/daemon/server.rs`,
/// functions `decode`, `network_name`, `container_filter`, `parse` and
/// `attachment`, `fits_file_names`), reproduced here minus the netns
/// existence check.
///
/// To be replaced by public, I/O-free functions of cnid once they exist:
/// `cnid::daemon::decode_request(verb, network, body)`,
/// `cnid::daemon::decode_network_name(segment)` and
/// `cnid::daemon::decode_container_filter(query)`.
mod stand_in {
    use super::*;

    /// A decoded and checked request body.
    #[allow(dead_code)]
    pub enum Decoded {
        Attachment {
            rt: RuntimeConf,
            timeout_ms: Option<u64>,
        },
        Status {
            timeout_ms: Option<u64>,
        },
        Gc {
            valid_attachments: Vec<GcAttachment>,
            timeout_ms: Option<u64>,
        },
    }

    /// server.rs `decode`: percent-decoding of a path segment or query value.
    pub fn percent_decode(s: &str) -> Result<String, String> {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid percent-encoding in {s:?}"))?;
                out.push(hex);
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
    }

    /// server.rs `network_name`.
    pub fn network_name(raw: &str) -> Result<String, String> {
        let name = percent_decode(raw)?;
        validate::network_name(&name).map_err(|e| e.to_string())?;
        Ok(name)
    }

    /// server.rs `container_filter`.
    pub fn container_filter(query: Option<&str>) -> Result<Option<String>, String> {
        let mut cid = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if k != "containerId" {
                return Err(format!("unknown query parameter {k:?}"));
            }
            let v = percent_decode(&v.replace('+', " "))?;
            validate::container_id(&v).map_err(|e| e.to_string())?;
            cid = Some(v);
        }
        Ok(cid)
    }

    /// server.rs `parse`.
    fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err("the request body is empty".into());
        }
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }

    /// server.rs `operation` (the decoding part) and `attachment`.
    /// server.rs `MAX_ATTACHMENT_NAME`.
    const MAX_ATTACHMENT_NAME: usize = 222;

    /// server.rs `operation` (the decoding part), `attachment`, `fits_file_names`.
    pub fn decode_request(verb: Command, network: &str, body: &[u8]) -> Result<Decoded, String> {
        match verb {
            Command::Add | Command::Del | Command::Check => {
                let req: AttachmentRequest = parse(body)?;
                let rt = req.runtime_conf().map_err(|e| e.to_string())?;
                rt.validate().map_err(|e| e.to_string())?;
                if rt.netns.is_empty() {
                    if verb != Command::Del {
                        return Err("netns required for ADD and CHECK".into());
                    }
                } else if !rt.netns.starts_with('/') {
                    return Err("netns must be an absolute path".into());
                }
                let len = network.len() + rt.container_id.len() + rt.ifname.len() + 2;
                if len > MAX_ATTACHMENT_NAME {
                    return Err(format!("names too long together: {len} bytes"));
                }
                Ok(Decoded::Attachment {
                    rt,
                    timeout_ms: req.timeout_ms,
                })
            }
            Command::Status => {
                let req: StatusRequest = if body.iter().all(u8::is_ascii_whitespace) {
                    StatusRequest::default()
                } else {
                    parse(body)?
                };
                Ok(Decoded::Status {
                    timeout_ms: req.timeout_ms,
                })
            }
            _ => {
                let req: GcRequest = parse(body)?;
                for a in &req.valid_attachments {
                    validate::container_id(&a.container_id)
                        .and_then(|()| validate::interface_name(&a.ifname))
                        .map_err(|e| e.to_string())?;
                }
                Ok(Decoded::Gc {
                    valid_attachments: req.valid_attachments,
                    timeout_ms: req.timeout_ms,
                })
            }
        }
    }
}
