//! Bad input through the real daemon: every malformed, oversized, unsafe or
//! unauthorized request gets a 4xx with the CNI error JSON, runs no plugin,
//! touches no file, and the daemon keeps serving.

use crate::support;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::support::daemon::{Daemon, Dirs, RawAnswer, get, post, raw, raw_bytes, runs};
use serde_json::{Value, json};

const NETNS: &str = "/proc/self/ns/net";

fn setup() -> (Dirs, std::path::PathBuf) {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-bad.conflist", "bad", "1.1.0");
    (dirs, records)
}

#[track_caller]
fn expect(what: &str, r: &RawAnswer, status: u16, code: Option<u64>) {
    assert_eq!(
        r.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let got = r.cni_error();
    if let Some(code) = code {
        assert_eq!(got, code, "{what}: {}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(r.header("content-type"), Some("application/json"), "{what}");
}

#[test]
fn malformed_unsafe_and_unknown_requests_are_refused_and_the_daemon_keeps_serving() {
    let (dirs, records) = setup();
    let daemon = Daemon::start(&dirs, &["--body-limit", "64K"]);
    let s = &daemon.socket;
    let ok = json!({"containerId": "c1", "netns": NETNS});
    let with = |k: &str, v: Value| {
        let mut o = ok.clone();
        o[k] = v;
        o.to_string()
    };
    // (what, path, body, status, CNI code)
    let posts: Vec<(&str, String, String, u16, Option<u64>)> = vec![
        (
            "malformed JSON",
            "/v1/networks/bad/add".into(),
            r#"{"containerId":"#.into(),
            400,
            Some(6),
        ),
        (
            "not an object",
            "/v1/networks/bad/add".into(),
            "[1,2]".into(),
            400,
            Some(6),
        ),
        (
            "empty body",
            "/v1/networks/bad/add".into(),
            String::new(),
            400,
            Some(6),
        ),
        (
            "unknown field",
            "/v1/networks/bad/add".into(),
            with("containerID", json!("c1")),
            400,
            Some(6),
        ),
        (
            "wrong type",
            "/v1/networks/bad/add".into(),
            with("containerId", json!(7)),
            400,
            Some(6),
        ),
        (
            "missing containerId",
            "/v1/networks/bad/del".into(),
            json!({"netns": NETNS}).to_string(),
            400,
            Some(6),
        ),
        (
            "capabilityArgs not an object",
            "/v1/networks/bad/add".into(),
            with("capabilityArgs", json!([1])),
            400,
            Some(6),
        ),
        (
            "timeoutMs 0",
            "/v1/networks/bad/add".into(),
            with("timeoutMs", json!(0)),
            400,
            Some(4),
        ),
        (
            "timeoutMs not a number",
            "/v1/networks/bad/add".into(),
            with("timeoutMs", json!("5s")),
            400,
            Some(6),
        ),
        (
            "containerId ../x (ADD)",
            "/v1/networks/bad/add".into(),
            with("containerId", json!("../x")),
            400,
            Some(4),
        ),
        (
            "containerId ../x (DEL)",
            "/v1/networks/bad/del".into(),
            with("containerId", json!("../x")),
            400,
            Some(4),
        ),
        (
            "containerId ../x (CHECK)",
            "/v1/networks/bad/check".into(),
            with("containerId", json!("../x")),
            400,
            Some(4),
        ),
        (
            "containerId with a slash",
            "/v1/networks/bad/add".into(),
            with("containerId", json!("a/b")),
            400,
            Some(4),
        ),
        (
            "empty containerId",
            "/v1/networks/bad/add".into(),
            with("containerId", json!("")),
            400,
            Some(3),
        ),
        (
            "ifname ../x",
            "/v1/networks/bad/add".into(),
            with("ifname", json!("../x")),
            400,
            Some(4),
        ),
        (
            "ifname ..",
            "/v1/networks/bad/del".into(),
            with("ifname", json!("..")),
            400,
            Some(4),
        ),
        (
            "ifname too long",
            "/v1/networks/bad/add".into(),
            with("ifname", json!("a-very-long-ifname")),
            400,
            Some(4),
        ),
        (
            "network ../x",
            "/v1/networks/..%2Fx/add".into(),
            ok.to_string(),
            400,
            Some(7),
        ),
        (
            "network ..",
            "/v1/networks/%2e%2e/del".into(),
            ok.to_string(),
            400,
            Some(7),
        ),
        (
            "network with a slash (GC)",
            "/v1/networks/a%2Fb/gc".into(),
            json!({"validAttachments": []}).to_string(),
            400,
            Some(7),
        ),
        (
            "bad percent-encoding",
            "/v1/networks/%zz/add".into(),
            ok.to_string(),
            400,
            Some(6),
        ),
        (
            "relative netns",
            "/v1/networks/bad/add".into(),
            with("netns", json!("../x")),
            400,
            Some(4),
        ),
        (
            "relative netns (DEL)",
            "/v1/networks/bad/del".into(),
            with("netns", json!("x")),
            400,
            Some(4),
        ),
        (
            "missing netns file",
            "/v1/networks/bad/add".into(),
            with("netns", json!("/nonexistent/netns")),
            400,
            Some(4),
        ),
        (
            "no netns for ADD",
            "/v1/networks/bad/add".into(),
            json!({"containerId": "c1"}).to_string(),
            400,
            Some(4),
        ),
        (
            "bad CNI_ARGS",
            "/v1/networks/bad/add".into(),
            with("cniArgs", json!("a=b=c")),
            400,
            Some(4),
        ),
        (
            "GC containerID ../x",
            "/v1/networks/bad/gc".into(),
            json!({"validAttachments": [{"containerID": "../x", "ifname": "eth0"}]}).to_string(),
            400,
            Some(4),
        ),
        (
            "GC ifname ../x",
            "/v1/networks/bad/gc".into(),
            json!({"validAttachments": [{"containerID": "c1", "ifname": "../x"}]}).to_string(),
            400,
            Some(4),
        ),
        (
            "GC unknown field",
            "/v1/networks/bad/gc".into(),
            json!({"validAttachments": [], "all": true}).to_string(),
            400,
            Some(6),
        ),
        (
            "unknown network (ADD)",
            "/v1/networks/nope/add".into(),
            ok.to_string(),
            404,
            Some(7),
        ),
        (
            "unknown network (CHECK)",
            "/v1/networks/nope/check".into(),
            ok.to_string(),
            404,
            Some(7),
        ),
        (
            "unknown network (STATUS)",
            "/v1/networks/nope/status".into(),
            String::new(),
            404,
            Some(7),
        ),
        (
            "unknown network (GC)",
            "/v1/networks/nope/gc".into(),
            json!({"validAttachments": []}).to_string(),
            404,
            Some(7),
        ),
        (
            "CHECK before ADD",
            "/v1/networks/bad/check".into(),
            ok.to_string(),
            404,
            Some(3),
        ),
        (
            "unknown verb",
            "/v1/networks/bad/frobnicate".into(),
            ok.to_string(),
            404,
            Some(904),
        ),
        (
            "POST on a GET endpoint",
            "/v1/health".into(),
            String::new(),
            405,
            Some(905),
        ),
    ];
    for (what, path, body, status, code) in &posts {
        expect(what, &post(s, path, body), *status, *code);
    }
    let gets: Vec<(&str, &str, u16, Option<u64>)> = vec![
        (
            "attachments of ../x",
            "/v1/attachments?containerId=../x",
            400,
            Some(4),
        ),
        (
            "operations of ..%2Fx",
            "/v1/operations?containerId=..%2Fx",
            400,
            Some(4),
        ),
        (
            "unknown query parameter",
            "/v1/attachments?network=bad",
            400,
            Some(4),
        ),
        ("unknown network", "/v1/networks/nope", 404, Some(7)),
        ("network ../x", "/v1/networks/..%2Fx", 400, Some(7)),
        ("unknown endpoint", "/v1/nope", 404, Some(904)),
        ("unversioned path", "/health", 404, Some(904)),
        ("other version", "/v2/health", 404, Some(904)),
        (
            "GET on a POST endpoint",
            "/v1/networks/bad/add",
            405,
            Some(905),
        ),
    ];
    for (what, path, status, code) in &gets {
        expect(what, &get(s, path), *status, *code);
    }

    // Oversized bodies: declared, and streamed without a length.
    let big = vec![b' '; 200 * 1024];
    let mut req = format!(
        "POST /v1/networks/bad/add HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    expect(
        "declared oversized body",
        &raw_bytes(s, &req).unwrap(),
        413,
        Some(913),
    );
    let mut req =
        b"POST /v1/networks/bad/add HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..20 {
        req.extend_from_slice(format!("{:x}\r\n", 16 * 1024).as_bytes());
        req.extend_from_slice(&[b' '; 16 * 1024]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    expect(
        "chunked oversized body",
        &raw_bytes(s, &req).unwrap(),
        413,
        Some(913),
    );
    // Not HTTP at all: the connection is dropped, the daemon goes on.
    let _ = raw(s, "\x16\x03\x01 definitely not http\r\n\r\n");

    // Nothing ran, nothing was written.
    assert!(runs(&records).is_empty(), "{:?}", runs(&records));
    assert!(dirs.cached().is_empty());
    assert!(dirs.intents().is_empty());
    assert!(!dirs.root().join("x").exists() && !dirs.cache.join("x").exists());

    // And it still serves.
    let h = get(s, "/v1/health");
    assert_eq!(h.status, 200);
    assert_eq!(h.json()["status"], "ok");
    let r = post(s, "/v1/networks/bad/add", &ok.to_string());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        post(s, "/v1/networks/bad/check", &ok.to_string()).status,
        204
    );
    // A second ADD of the attachment: 409 (DEL first).
    expect(
        "second ADD",
        &post(s, "/v1/networks/bad/add", &ok.to_string()),
        409,
        Some(909),
    );
    assert_eq!(post(s, "/v1/networks/bad/del", &ok.to_string()).status, 204);
    // DEL of what does not exist succeeds, also on a network that is gone.
    assert_eq!(post(s, "/v1/networks/bad/del", &ok.to_string()).status, 204);
    assert_eq!(
        post(s, "/v1/networks/gone/del", &ok.to_string()).status,
        204
    );
    let m = get(s, "/metrics");
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains("cnid_http_responses_total{status=\"400\"}"),
        "{text}"
    );
}

/// The verb routes answer in one order: an unknown verb is 404 before
/// the method or the network's name is looked at (a sandbox has no GC,
/// verbs are lower-case, VERSION is no endpoint), a known verb with the
/// wrong method is 405 before the name is read, and a bad name is 400.
#[test]
fn verb_routes_answer_unknown_verb_then_method_then_name() {
    let (dirs, records) = setup();
    let daemon = Daemon::start(&dirs, &[]);
    let s = &daemon.socket;
    let body = json!({"containerId": "c1", "netns": NETNS}).to_string();
    for (what, path) in [
        ("sandbox GC", "/v1/sandboxes/gc"),
        ("sandbox VERSION", "/v1/sandboxes/version"),
        ("sandbox upper-case ADD", "/v1/sandboxes/ADD"),
        ("network upper-case ADD", "/v1/networks/bad/ADD"),
        ("network VERSION", "/v1/networks/bad/version"),
        (
            "unknown verb of a bad name",
            "/v1/networks/..%2Fx/frobnicate",
        ),
    ] {
        expect(what, &post(s, path, &body), 404, Some(904));
        expect(what, &get(s, path), 404, Some(904));
    }
    for (what, path) in [
        ("GET sandbox ADD", "/v1/sandboxes/add"),
        ("GET sandbox STATUS", "/v1/sandboxes/status"),
        ("GET network GC", "/v1/networks/bad/gc"),
        ("GET ADD of a bad name", "/v1/networks/..%2Fx/add"),
    ] {
        expect(what, &get(s, path), 405, Some(905));
    }
    expect(
        "ADD of a bad name",
        &post(s, "/v1/networks/..%2Fx/add", &body),
        400,
        Some(7),
    );
    assert!(runs(&records).is_empty(), "{:?}", runs(&records));
    assert!(dirs.cached().is_empty());
    assert!(dirs.intents().is_empty());
}

fn curl_as(uid: u32, gid: u32, socket: &Path, method: &str, path: &str) -> (i32, u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
        .arg("--unix-socket")
        .arg(socket)
        .arg(format!("http://cnid{path}"))
        .args(if method == "POST" {
            vec!["-d", r#"{"containerId":"p1","netns":"/proc/self/ns/net"}"#]
        } else {
            vec![]
        })
        .uid(uid)
        .gid(gid)
        .output()
        .expect("curl runs (apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    (
        out.status.code().unwrap_or(-1),
        code.trim().parse().unwrap_or(0),
        body.to_owned(),
    )
}

#[test]
fn peers_whose_uid_is_not_allowed_get_403() {
    support::require_root!();
    let (dirs, records) = setup();
    // Let other users reach the socket's dir; the socket itself is 0660
    // root:65534.
    std::fs::set_permissions(dirs.root(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let daemon = Daemon::start(&dirs, &["--socket-group", "65534", "--allow-uid", "65533"]);
    let meta = std::fs::metadata(&daemon.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), 65534);

    // nobody (65534) can open the socket (group) but is not allowed.
    for (method, path) in [("GET", "/v1/health"), ("POST", "/v1/networks/bad/add")] {
        let (exit, status, body) = curl_as(65534, 65534, &daemon.socket, method, path);
        assert_eq!((exit, status), (0, 403), "{method} {path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("403 body is JSON");
        assert_eq!(v["code"], 903, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("uid 65534"), "{v}");
    }
    // An allowed uid gets through.
    let (exit, status, body) = curl_as(65533, 65534, &daemon.socket, "GET", "/v1/health");
    assert_eq!((exit, status), (0, 200), "{body}");
    // Another user cannot even connect (mode 0660): curl's exit 7.
    let (exit, _, _) = curl_as(65532, 65532, &daemon.socket, "GET", "/v1/health");
    assert_eq!(exit, 7);
    // Root still can; nothing ran for the refused ADD.
    assert_eq!(get(&daemon.socket, "/v1/health").status, 200);
    assert!(runs(&records).is_empty());
    let m = String::from_utf8_lossy(&get(&daemon.socket, "/metrics").body).into_owned();
    assert!(m.contains("cnid_connections_refused_total 2"), "{m}");
}
