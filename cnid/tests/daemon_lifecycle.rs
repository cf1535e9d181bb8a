//! The daemon's lifecycle and deadlines: graceful shutdown on SIGTERM,
//! client disconnects, deadlines while queued and while running, systemd
//! socket activation and readiness notification.

use crate::support;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::daemon::{
    CNID, Daemon, Dirs, eventually, eventually_async, recording_plugin, runs,
};
use crate::support::gate::{Gate, LOAD_MARGIN};
use cni_async::RawExec;
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use serde_json::json;

const NET: &str = "life";
const NETNS: &str = "/proc/self/ns/net";

fn setup(extra: &str) -> (Dirs, std::path::PathBuf) {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin("rec", &recording_plugin(&records, extra));
    dirs.conf(
        "10-life.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    (dirs, records)
}

/// How long a test waits for a state it caused (generous: a busy machine).
const WAIT: Duration = Duration::from_secs(30);

/// Shell lines: ADD of a container in `cids` waits at `gate`.
fn add_gated(gate: &Gate, cids: &str) -> String {
    format!(
        "if [ \"$CNI_COMMAND\" = ADD ]; then case \"$CNI_CONTAINERID\" in {cids})\n{}\n;; esac; fi",
        gate.shell_wait()
    )
}

async fn wait_op(client: &Client, cid: &str, verb: &str, state: &str) {
    eventually_async(WAIT, &format!("{verb} of {cid} {state}"), || async {
        client
            .operations(Some(cid))
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == verb && o.state == state)
    })
    .await;
}

fn body(cid: &str, netns: &str) -> String {
    json!({"containerId": cid, "netns": netns}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_running_add_refuses_queued_and_removes_the_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = Gate::new(tmp.path());
    let (dirs, records) = setup(&add_gated(&gate, "*"));
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = AttachmentRequest::new("t1", NETNS, "eth0");
    let add = {
        let (c, r) = (client.clone(), req.clone());
        tokio::spawn(async move { c.add(NET, &r).await })
    };
    gate.wait_started(1).await;
    let check = {
        let (c, r) = (client.clone(), req.clone());
        tokio::spawn(async move { c.check(NET, &r).await })
    };
    wait_op(&client, "t1", "CHECK", "queued").await;

    daemon.signal(libc::SIGTERM);
    // The queued CHECK is refused at once (nothing of it ran)...
    let e = check.await.unwrap().expect_err("CHECK refused");
    assert_eq!(e.status(), Some(503));
    assert_eq!(e.error_object("1.0.0").code, 11);
    // ...no new connection is accepted while the ADD still runs (held at
    // the gate)...
    eventually(WAIT, "socket closed", || {
        UnixStream::connect(&dirs.socket).is_err()
    });
    assert!(!add.is_finished(), "the ADD should still be running");
    // ...and the ADD completes.
    gate.release();
    let result = add.await.unwrap().expect("ADD completed during shutdown");
    assert_eq!(result["cniVersion"], "1.0.0");
    let status = daemon
        .wait(Duration::from_secs(10))
        .expect("cnid exits after the drain");
    assert!(status.success(), "exit status {status}");
    assert!(!dirs.socket.exists(), "socket file left behind");
    let cmds: Vec<String> = runs(&records).into_iter().map(|r| r.command).collect();
    assert_eq!(cmds, ["ADD"]);
    assert_eq!(dirs.cached(), ["life-t1-eth0"]);
    assert!(dirs.intents().is_empty());
    assert!(daemon.log().contains("all operations finished"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_queued_request_but_not_a_running_one() {
    let tmp = tempfile::tempdir().unwrap();
    let (d1_gate, d2_gate) = (Gate::new(tmp.path()), Gate::new(tmp.path()));
    let (dirs, records) = setup(&format!(
        "{}\n{}",
        add_gated(&d1_gate, "d1"),
        add_gated(&d2_gate, "d2")
    ));
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let add = {
        let c = client.clone();
        tokio::spawn(async move {
            c.add(NET, &AttachmentRequest::new("d1", NETNS, "eth0"))
                .await
        })
    };
    d1_gate.wait_started(1).await;
    // A DEL queued behind it, from a client that then hangs up.
    let b = body("d1", NETNS);
    let mut s = UnixStream::connect(&dirs.socket).unwrap();
    write!(
        s,
        "POST /v1/networks/{NET}/del HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    wait_op(&client, "d1", "DEL", "queued").await;
    drop(s);
    eventually_async(WAIT, "DEL cancelled", || async {
        !client
            .operations(Some("d1"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == "DEL")
    })
    .await;
    d1_gate.release();
    add.await.unwrap().expect("ADD");
    // A CHECK queued now runs after anything that arrived before it: had
    // the DEL stayed, it would have run (and detached d1) first.
    client
        .check(NET, &AttachmentRequest::new("d1", NETNS, "eth0"))
        .await
        .expect("CHECK after the cancelled DEL");
    assert!(
        !runs(&records).iter().any(|r| r.command == "DEL"),
        "the cancelled DEL ran"
    );
    assert_eq!(dirs.cached(), ["life-d1-eth0"]);

    // An ADD whose client hangs up while it runs is finished anyway.
    // d1 is attached on NETNS as eth0: d2 gets a netns path of its own.
    let b = body("d2", &dirs.netns("d2"));
    let mut s = UnixStream::connect(&dirs.socket).unwrap();
    write!(
        s,
        "POST /v1/networks/{NET}/add HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    d2_gate.wait_started(1).await;
    drop(s);
    d2_gate.release();
    eventually(WAIT, "ADD of d2 cached", || {
        dirs.cached().contains(&"life-d2-eth0".to_owned())
    });
    eventually(WAIT, "no intent left", || dirs.intents().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_while_queued_and_while_running() {
    // q1's ADD holds at a gate until the test releases it; slow1's ADD
    // hangs (at a gate never released) until it is killed.
    let tmp = tempfile::tempdir().unwrap();
    let (q1_gate, hang) = (Gate::new(tmp.path()), Gate::new(tmp.path()));
    let (dirs, records) = setup(&format!(
        "{}\n{}",
        add_gated(&q1_gate, "q1"),
        add_gated(&hang, "slow*")
    ));
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let add = {
        let c = client.clone();
        tokio::spawn(async move {
            c.add(NET, &AttachmentRequest::new("q1", NETNS, "eth0"))
                .await
        })
    };
    q1_gate.wait_started(1).await;
    // Queued behind it with a 200 ms deadline: 504 at its deadline (the
    // ADD ahead of it never ends on its own), and it never runs.
    let mut check = AttachmentRequest::new("q1", NETNS, "eth0");
    check.timeout_ms = Some(200);
    let t = Instant::now();
    let e = client.check(NET, &check).await.expect_err("deadline");
    let elapsed = t.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(200) + LOAD_MARGIN,
        "{elapsed:?}"
    );
    assert_eq!(e.status(), Some(504));
    assert_eq!(e.error_object("").code, 11);
    q1_gate.release();
    add.await.unwrap().expect("ADD");
    assert!(!runs(&records).iter().any(|r| r.command == "CHECK"));

    // A plugin past the deadline: killed, the ADD rolled back, 504.
    let deadline = Duration::from_secs(1);
    let mut slow = AttachmentRequest::new("slow1", dirs.netns("slow1"), "eth0");
    slow.timeout_ms = Some(u64::try_from(deadline.as_millis()).unwrap());
    let t = Instant::now();
    let e = client.add(NET, &slow).await.expect_err("timeout");
    let elapsed = t.elapsed();
    assert_eq!(e.status(), Some(504), "{e}");
    assert_eq!(e.error_object("").code, 11);
    assert_eq!(hang.started(), 1);
    // The deadline, the kill (within the grace), the rollback; not the
    // plugin's forever.
    assert!(elapsed >= deadline, "{elapsed:?}");
    assert!(
        elapsed < deadline + RawExec::DEFAULT_KILL_GRACE + LOAD_MARGIN,
        "{elapsed:?}"
    );
    assert!(
        runs(&records)
            .iter()
            .any(|r| r.command == "DEL" && r.container == "slow1"),
        "no rollback DEL"
    );
    assert!(!dirs.cached().iter().any(|c| c.contains("slow1")));
    assert!(dirs.intents().is_empty(), "{:?}", dirs.intents());
    // timeoutMs 0 is refused.
    slow.timeout_ms = Some(0);
    assert_eq!(
        client.add(NET, &slow).await.unwrap_err().status(),
        Some(400)
    );
}

#[test]
fn socket_activation_and_sd_notify() {
    let (dirs, _records) = setup("env > \"$(dirname \"$0\")/../data/env.$CNI_COMMAND\"");
    let sock = dirs.root().join("activated.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let notify_path = dirs.root().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    // Pass the listener as fd 3 with LISTEN_PID = the daemon's pid, as
    // systemd does: through bash, which keeps its pid when it execs.
    let fd = listener.as_raw_fd();
    // SAFETY: fcntl on an fd we own; clearing FD_CLOEXEC so bash inherits it.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let log = dirs.root().join("activated.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let script = if fd == 3 {
        "export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" \"$@\"".to_owned()
    } else {
        format!("exec 3<&{fd} {fd}<&-; export LISTEN_PID=$$ LISTEN_FDS=1; exec \"$0\" \"$@\"")
    };
    // systemd's path wins over --socket: the log names the one in use.
    let configured = dirs.root().join("configured.sock");
    let child = Command::new("/bin/bash")
        .arg("-c")
        .arg(script)
        .arg(CNID)
        .arg("--socket")
        .arg(&configured)
        .arg("--conf-dir")
        .arg(&dirs.conf)
        .arg("--plugin-dir")
        .arg(&dirs.bin)
        .arg("--cache-dir")
        .arg(&dirs.cache)
        .arg("--state-dir")
        .arg(&dirs.state)
        .args(support::daemon::allow_self())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    // SAFETY: as above; the child has its copy now.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut daemon = Daemon::from_child(child, &sock, &log);
    drop(listener);
    let mut buf = [0u8; 64];
    let n = notify.recv(&mut buf).expect("READY=1 from cnid");
    assert_eq!(&buf[..n], b"READY=1");
    assert!(daemon.log().contains("using the socket passed by systemd"));
    let log = daemon.log();
    let ready = log
        .lines()
        .find(|l| l.contains("cnid ready"))
        .unwrap_or_else(|| panic!("no ready line: {log}"));
    assert!(
        ready.contains(&format!("socket={}", sock.display())),
        "{ready}"
    );
    assert!(!log.contains("configured.sock"), "{log}");
    assert!(!configured.exists(), "cnid bound --socket too");

    // Plugins do not inherit the systemd variables.
    let r = support::daemon::post(&sock, "/v1/networks/life/add", &body("a1", NETNS));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let env = std::fs::read_to_string(dirs.data.join("env.ADD")).unwrap();
    for var in ["LISTEN_PID", "LISTEN_FDS", "NOTIFY_SOCKET"] {
        assert!(
            !env.lines().any(|l| l.starts_with(&format!("{var}="))),
            "{var} leaked to the plugin"
        );
    }

    daemon.signal(libc::SIGTERM);
    let n = notify.recv(&mut buf).expect("STOPPING=1 from cnid");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = daemon.wait(Duration::from_secs(10)).expect("exit");
    assert!(status.success());
    // systemd owns the socket: it stays.
    assert!(sock.exists(), "the activated socket was removed");
}
