//! Who may talk to cnid, and how much: the socket's mode and owner, peers
//! refused on every endpoint, request bodies and headers over their caps.
//!
//! Complements `daemon_bad_input.rs` (the socket group, an allowed uid, the
//! oversized ADD body).

use crate::support;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::support::daemon::{Daemon, Dirs, RawAnswer, get, raw_bytes, runs};
use serde_json::{Value, json};

const NOBODY: u32 = 65534;

fn setup() -> (Dirs, std::path::PathBuf) {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-sec.conflist", "sec", "1.1.0");
    (dirs, records)
}

/// `curl` as another user: (exit status, HTTP status, body).
fn curl_as(uid: u32, gid: u32, socket: &Path, method: &str, path: &str) -> (i32, u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
        .arg("--unix-socket")
        .arg(socket)
        .arg(format!("http://cnid{path}"));
    if method == "POST" {
        cmd.args(["-d", r#"{"containerId":"p1","netns":"/proc/self/ns/net"}"#]);
    }
    let out = cmd
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
fn the_socket_is_0660_root_owned_and_closed_to_other_users() {
    support::require_root!();
    let (dirs, records) = setup();
    std::fs::set_permissions(dirs.root(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    let meta = std::fs::symlink_metadata(&daemon.socket).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    assert_eq!(meta.permissions().mode() & 0o7777, 0o660, "socket mode");
    assert_eq!((meta.uid(), meta.gid()), (0, 0), "socket owner");
    // Its directory, made by the daemon, is not writable by others (no one
    // can swap the socket for theirs).
    let dir = std::fs::metadata(daemon.socket.parent().unwrap()).unwrap();
    assert_eq!(dir.permissions().mode() & 0o022, 0, "socket dir mode");
    assert_eq!(dir.uid(), 0);
    // Another user cannot even connect: curl's "couldn't connect" (7).
    let (exit, _, _) = curl_as(NOBODY, NOBODY, &daemon.socket, "GET", "/v1/health");
    assert_eq!(exit, 7, "nobody connected to a 0660 root:root socket");
    assert!(runs(&records).is_empty());
    drop(daemon);

    // --socket-mode is honoured exactly (no umask, no window).
    let daemon = Daemon::start(&dirs, &["--socket-mode", "0600"]);
    let meta = std::fs::symlink_metadata(&daemon.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    println!("socket: mode 0660 root:root by default, 0600 when asked; others cannot connect");
}

#[test]
fn a_refused_peer_gets_403_on_every_endpoint_and_nothing_runs() {
    support::require_root!();
    let (dirs, records) = setup();
    std::fs::set_permissions(dirs.root(), std::fs::Permissions::from_mode(0o711)).unwrap();
    // nobody may open the socket (its group) but is not an allowed peer.
    let daemon = Daemon::start(&dirs, &["--socket-group", &NOBODY.to_string()]);
    let endpoints = [
        ("GET", "/v1/health"),
        ("GET", "/v1/networks"),
        ("GET", "/v1/networks/sec"),
        ("GET", "/v1/attachments"),
        ("GET", "/v1/operations"),
        ("GET", "/metrics"),
        ("GET", "/v1/nonexistent"),
        ("POST", "/v1/networks/sec/add"),
        ("POST", "/v1/networks/sec/check"),
        ("POST", "/v1/networks/sec/del"),
        ("POST", "/v1/networks/sec/status"),
        ("POST", "/v1/networks/sec/gc"),
    ];
    for (method, path) in endpoints {
        let (exit, status, body) = curl_as(NOBODY, NOBODY, &daemon.socket, method, path);
        assert_eq!((exit, status), (0, 403), "{method} {path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("403 body is JSON");
        assert_eq!(v["code"], 903, "{v}");
        assert!(v["msg"].as_str().unwrap().contains("uid 65534"), "{v}");
    }
    assert!(runs(&records).is_empty(), "a refused peer ran a plugin");
    assert!(dirs.cached().is_empty() && dirs.intents().is_empty());
    let m = String::from_utf8_lossy(&get(&daemon.socket, "/metrics").body).into_owned();
    assert!(
        m.contains(&format!(
            "cnid_connections_refused_total {}",
            endpoints.len()
        )),
        "{m}"
    );
    println!(
        "socket: a peer that may connect but is not allowed got 403 on all {} endpoints; nothing ran",
        endpoints.len()
    );
}

fn expect(what: &str, r: &RawAnswer, status: u16, code: u64) {
    assert_eq!(
        r.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.cni_error(), code, "{what}");
}

#[test]
fn bodies_and_headers_over_their_caps_are_refused_on_every_endpoint() {
    let (dirs, records) = setup();
    const LIMIT: usize = 4096;
    let daemon = Daemon::start(&dirs, &["--body-limit", "4K"]);
    let s = &daemon.socket;
    for verb in ["add", "del", "check", "status", "gc"] {
        let path = format!("/v1/networks/sec/{verb}");
        // Declared too large: refused before it is read.
        let big = vec![b' '; LIMIT + 1];
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .into_bytes();
        req.extend_from_slice(&big);
        expect(
            &format!("{verb}: declared"),
            &raw_bytes(s, &req).unwrap(),
            413,
            913,
        );
        // Streamed without a length: cut off at the cap.
        let mut req =
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                .into_bytes();
        for _ in 0..3 {
            req.extend_from_slice(format!("{:x}\r\n", 2048).as_bytes());
            req.extend_from_slice(&[b' '; 2048]);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"0\r\n\r\n");
        expect(
            &format!("{verb}: chunked"),
            &raw_bytes(s, &req).unwrap(),
            413,
            913,
        );
        // Exactly at the cap: read and judged on its content (a valid DEL).
        if verb == "del" {
            let body = json!({"containerId": "c1", "netns": "/proc/self/ns/net"}).to_string();
            let padded = format!("{body}{}", " ".repeat(LIMIT - body.len()));
            assert_eq!(padded.len(), LIMIT);
            let req = format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT}\r\nConnection: close\r\n\r\n{padded}"
            );
            let r = raw_bytes(s, req.as_bytes()).unwrap();
            assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
        }
    }
    // Only the DEL at the cap ran.
    let ran = runs(&records);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0].command, "DEL");

    // A header block far over hyper's buffer: refused or dropped, never
    // served, and the daemon goes on.
    let req = format!(
        "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(256 * 1024)
    );
    if let Ok(r) = raw_bytes(s, req.as_bytes()) {
        assert!(r.status >= 400, "a 256 KiB header was served: {}", r.status);
    }
    // Many headers.
    let mut req = String::from("GET /v1/health HTTP/1.1\r\nHost: x\r\n");
    for i in 0..2000 {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    req.push_str("\r\n");
    if let Ok(r) = raw_bytes(s, req.as_bytes()) {
        assert!(r.status >= 400, "2000 headers were served: {}", r.status);
    }
    assert_eq!(get(s, "/v1/health").status, 200, "the daemon still serves");
    println!(
        "socket: bodies over {LIMIT} bytes refused with 413 on 5 endpoints (declared and chunked); \
         oversized header blocks refused; a body at the cap served"
    );
}
