//! cnid's request decoding (`cnid_api::decode`): the JSON bodies of
//! ADD/DEL/CHECK, STATUS and GC, the sandbox bodies (add/del/check/status),
//! the network name in the URL path and the query parameters (`containerId`
//! of `/v1/operations`; `containerId`, `limit`, `after` of
//! `/v1/attachments`).
//!
//! The input is used twice: whole, as a body for every verb and every
//! sandbox verb; and split at the first newline into a URL part (`<network
//! segment>[?<query>]`) and a body.
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
//! - ADD and CHECK accept the same bodies; DEL accepts those too, decoded
//!   the same, and otherwise only bodies with an empty netns;
//! - an accepted network name or container filter is a safe file name
//!   component, and percent-encoding it decodes back to it;
//! - an accepted sandbox names each network once per interface: interface
//!   names differ (and are not `lo` when the loopback goes first), every
//!   network's attachment is accepted as one attachment would be, with the
//!   sandbox's container ID and netns; add, check and del accept the same
//!   bodies, decoded the same, del and status also those without netns;
//! - an accepted attachments query has a limit within the page bounds, a
//!   safe `containerId` and `after`, and re-encoding it decodes back to it;
//!   the `containerId` filter accepts only queries the attachments query
//!   accepts too, with the same container;
//! - every refusal is HTTP 400 with a nonzero CNI code and an error object
//!   that round-trips through its JSON.
//!
//! The functions are the daemon's own (`cnid_api::decode`, which cnid's
//! `http/routes.rs` calls before the engine checks that the netns exists,
//! the one check with I/O). The crate `cnid-api` is pure: no tokio, hyper or clap.
#![no_main]

use cni_core::{Command, RuntimeConf, cache};
use cni_core_fuzz::{assert_safe_component, text};
use cnid_api::decode::{
    DecodedRequest, DecodedSandbox, RequestError, decode_attachments_query,
    decode_container_filter, decode_network_name, decode_request, decode_sandbox_request,
};
use cnid_api::{
    ATTACHMENTS_PAGE_MAX, AttachmentRequest, GcRequest, SandboxRequest, StatusRequest,
};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

const NETWORK: &str = "fuzznet";

fuzz_target!(|data: &[u8]| {
    check_body(NETWORK, data);
    check_sandbox(data);
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
                    force: false,
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
    if let Ok(req) = serde_json::from_slice::<SandboxRequest>(body) {
        round_trip(&req);
    }

    let [add, del, check] = [Command::Add, Command::Del, Command::Check].map(|verb| {
        match decode_request(verb, network, body) {
            Ok(DecodedRequest::Attachment { rt, .. }) => {
                check_attachment(verb, network, &rt);
                Some(rt)
            }
            Ok(other) => panic!("{verb} decoded as {other:?}"),
            Err(e) => {
                check_error(&e);
                None
            }
        }
    });
    // ADD and CHECK take the same bodies; DEL takes the same ones, decoded
    // the same, and those without netns.
    assert_eq!(add, check, "ADD and CHECK disagree");
    match (&add, &del) {
        (Some(_), _) => assert_eq!(add, del, "DEL refuses or changes what ADD accepts"),
        (None, Some(rt)) => assert!(rt.netns.is_empty(), "DEL alone accepts {rt:?}"),
        (None, None) => {}
    }
    match decode_request(Command::Status, network, body) {
        Ok(DecodedRequest::Status { .. }) => {}
        Ok(other) => panic!("STATUS decoded as {other:?}"),
        Err(e) => check_error(&e),
    }
    match decode_request(Command::Gc, network, body) {
        Ok(DecodedRequest::Gc {
            valid_attachments, ..
        }) => {
            for a in &valid_attachments {
                assert_safe_component("GC containerID", &a.container_id);
                assert_safe_component("GC ifname", &a.ifname);
            }
        }
        Ok(other) => panic!("GC decoded as {other:?}"),
        Err(e) => check_error(&e),
    }
}

/// What an accepted ADD, DEL or CHECK guarantees the cache and the intents.
fn check_attachment(verb: Command, network: &str, rt: &RuntimeConf) {
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
    check_names(verb, rt);
}

/// An accepted attachment's container ID and ifname are safe file name
/// components; its netns is absolute, or empty for DEL only.
fn check_names(verb: Command, rt: &RuntimeConf) {
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

fn check_sandbox(body: &[u8]) {
    let [add, del, check, status] = [Command::Add, Command::Del, Command::Check, Command::Status]
        .map(|verb| match decode_sandbox_request(verb, body) {
            Ok(sb) => {
                check_sandbox_networks(verb, &sb);
                Some(sb)
            }
            Err(e) => {
                check_error(&e);
                None
            }
        });
    assert_eq!(add, check, "sandbox add and check disagree");
    match (&add, &del) {
        (Some(_), _) => assert_eq!(add, del, "sandbox del refuses or changes what add accepts"),
        (None, Some(sb)) => assert!(sb.base.netns.is_empty(), "sandbox del alone accepts {sb:?}"),
        (None, None) => {}
    }
    assert_eq!(del, status, "sandbox del and status disagree");
}

/// What an accepted sandbox guarantees: each network an attachment as
/// ADD/DEL would accept it, of the sandbox's container and netns, on its
/// own interface.
fn check_sandbox_networks(verb: Command, sb: &DecodedSandbox) {
    let attach_verb = if verb == Command::Status {
        Command::Del
    } else {
        verb
    };
    // The default network is only known to the daemon: no file name check.
    check_names(attach_verb, &sb.base);
    if sb.loopback {
        check_attachment(attach_verb, "cni-loopback", &sb.default_rt("lo"));
    }
    let mut ifnames: Vec<&str> = sb.loopback.then_some("lo").into_iter().collect();
    for (network, rt) in &sb.networks {
        assert_safe_component("sandbox network name", network);
        check_attachment(attach_verb, network, rt);
        assert_eq!(rt.container_id, sb.container_id);
        assert_eq!(rt.netns, sb.base.netns);
        assert!(
            !ifnames.contains(&rt.ifname.as_str()),
            "interface {:?} twice in {sb:?}",
            rt.ifname
        );
        ifnames.push(&rt.ifname);
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fn check_network_segment(segment: &str) -> Option<String> {
    let name = decode_network_name(segment)
        .map_err(|e| check_error(&e))
        .ok()?;
    assert_safe_component("network name", &name);
    let again = decode_network_name(&percent_encode(&name));
    assert_eq!(again.ok().as_ref(), Some(&name));
    Some(name)
}

fn check_query(query: Option<&str>) {
    match decode_container_filter(query) {
        Ok(Some(cid)) => {
            assert_safe_component("containerId filter", &cid);
            let q = format!("containerId={}", percent_encode(&cid));
            assert_eq!(decode_container_filter(Some(&q)).ok(), Some(Some(cid)));
        }
        Ok(None) => {}
        Err(e) => check_error(&e),
    }
    match decode_attachments_query(query) {
        Ok(q) => {
            assert!((1..=ATTACHMENTS_PAGE_MAX).contains(&q.limit), "{q:?}");
            let mut parts = vec![format!("limit={}", q.limit)];
            if let Some(cid) = &q.container_id {
                assert_safe_component("attachments containerId", cid);
                parts.push(format!("containerId={}", percent_encode(cid)));
            }
            if let Some(after) = &q.after {
                assert!(
                    !after.is_empty() && !after.contains(['/', '\0']),
                    "after {after:?} accepted"
                );
                parts.push(format!("after={}", percent_encode(after)));
            }
            let again = decode_attachments_query(Some(&parts.join("&")));
            assert_eq!(again.as_ref().ok(), Some(&q));
            if let Ok(filter) = decode_container_filter(query) {
                assert_eq!(filter, q.container_id);
            }
        }
        Err(e) => {
            check_error(&e);
            assert!(
                decode_container_filter(query).is_err(),
                "the containerId filter accepts {query:?}, the attachments query does not"
            );
        }
    }
}

/// A refusal is a client error (400) with a CNI error object that
/// serializes (the daemon's answer body).
fn check_error(e: &RequestError) {
    assert_eq!(e.status, 400, "{e}");
    assert!(e.error.code != 0, "{e}: code 0");
    let json = e.error.to_json();
    let back: cni_core::ErrorObject =
        serde_json::from_str(&json).unwrap_or_else(|err| panic!("{json}: {err}"));
    assert_eq!(&back, &e.error);
}
