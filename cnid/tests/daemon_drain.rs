//! Shutdown waits for operations, not for connections: one that is idle,
//! or still sending its request, is closed at once on SIGTERM, while an
//! operation in progress still finishes and gets its answer.
//!
//! Regression test (before: one connection with a
//! partial body made SIGTERM wait the whole `--shutdown-timeout` and exit 1,
//! "operations still running", though none ran).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, eventually, post};
use serde_json::json;

const NET: &str = "drain";
const ADD: &str = "/v1/networks/drain/add";

fn setup(gate: &std::path::Path) -> Dirs {
    let dirs = Dirs::new();
    dirs.plugin(
        "gated",
        &format!(
            "cat > /dev/null\nwhile [ ! -e {gate} ]; do sleep 0.02; done\n\
             [ \"$CNI_COMMAND\" = ADD ] && printf '{{\"cniVersion\":\"1.0.0\"}}'\nexit 0",
            gate = gate.display()
        ),
    );
    dirs.conf(
        "10-drain.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "gated"}]}),
    );
    dirs
}

/// Connections that hold no operation: half a body, a head and nothing
/// more, half a head, and an idle keep-alive connection after a request.
fn idle_and_stalled(socket: &std::path::Path) -> Vec<UnixStream> {
    let mut half_body = UnixStream::connect(socket).unwrap();
    half_body
        .write_all(
            format!("POST {ADD} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"contain")
                .as_bytes(),
        )
        .unwrap();
    let mut head_only = UnixStream::connect(socket).unwrap();
    head_only
        .write_all(
            format!("POST {ADD} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n").as_bytes(),
        )
        .unwrap();
    let mut half_head = UnixStream::connect(socket).unwrap();
    half_head.write_all(b"GET /v1/hea").unwrap();
    let mut keep_alive = UnixStream::connect(socket).unwrap();
    keep_alive
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = keep_alive.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    vec![half_body, head_only, half_head, keep_alive]
}

/// Reads until EOF (the daemon closed it); false if it stays open for 5 s.
fn closed_by_daemon(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            // A read with a timeout is not restarted after a signal.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[test]
fn a_half_sent_request_does_not_hold_shutdown() {
    let dirs = setup(&std::env::temp_dir().join("cnid-drain-never"));
    let mut daemon = Daemon::start(&dirs, &["--shutdown-timeout", "60s"]);
    let _conns = idle_and_stalled(&daemon.socket);
    let t = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait(Duration::from_secs(10));
    let took = t.elapsed();
    let log = daemon.log();
    println!(
        "drain: SIGTERM with 4 idle or stalled connections (no operation): exited {status:?} in {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
    let status = status.unwrap_or_else(|| panic!("still running 10 s after SIGTERM:\n{log}"));
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(!log.contains("still running"), "{log}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn shutdown_closes_idle_and_stalled_connections_and_still_answers_the_running_add() {
    let gate_dir = tempfile::tempdir().unwrap();
    let gate = gate_dir.path().join("gate");
    let dirs = setup(&gate);
    let mut daemon = Daemon::start(&dirs, &["--shutdown-timeout", "60s"]);
    let socket = daemon.socket.clone();
    let add = std::thread::spawn(move || {
        post(
            &socket,
            ADD,
            &json!({"containerId": "d1", "netns": "/proc/self/ns/net"}).to_string(),
        )
    });
    eventually(Duration::from_secs(10), "the ADD running", || {
        dirs.intents().len() == 1
    });
    let mut conns = idle_and_stalled(&daemon.socket);
    daemon.signal(libc::SIGTERM);
    // Every connection without an operation is closed while the ADD runs.
    let t = Instant::now();
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(
            closed_by_daemon(c),
            "connection {i} kept open by the shutdown"
        );
    }
    let closed_in = t.elapsed();
    assert!(
        daemon.wait(Duration::from_millis(300)).is_none(),
        "exited before the ADD finished"
    );
    std::fs::write(&gate, b"").unwrap();
    let r = add.join().unwrap();
    assert_eq!(
        r.status,
        200,
        "the running ADD's answer: {}",
        String::from_utf8_lossy(&r.body)
    );
    let status = daemon
        .wait(Duration::from_secs(10))
        .expect("exits after the ADD");
    assert!(status.success(), "exit status {status}:\n{}", daemon.log());
    assert_eq!(dirs.cached().len(), 1, "the ADD completed and was cached");
    println!(
        "drain: idle and stalled connections closed {:.0} ms after SIGTERM while an ADD ran; \
         the ADD answered 200; exit 0",
        closed_in.as_secs_f64() * 1000.0
    );
}
