//! Runs the example programs as a user would (`CARGO_BIN_EXE_*`) and checks
//! what they print and that they leave nothing behind.
//!
//! # Each on a host of its own
//!
//! `in-process`, `harness`, `daemon-client` and `demo` use the bundled
//! network `cnirs-bridge`: bridge `cnirs-br0`, subnet 10.253.10.0/24,
//! host-local's dir `/var/lib/cni/networks/cnirs-bridge`, namespaces in
//! `/run/netns`. Those names are the host's: a developer running
//! `make demo`, a second copy of the suite or these tests themselves would
//! share the bridge and the addresses, and one run's tidy-up (deleting the
//! bridge it created) would pull them from under the other. So every test
//! that runs one of them runs it in a network and mount namespace of its
//! own, with fresh `/run` and `/var/lib`
//! ([`cni_test_support::isolated::on_own_host`]): nothing on the host
//! changes its outcome, and it changes nothing on the host. They run in
//! parallel with each other.
//!
//! These tests need root (namespaces, a bridge); `show-stdin` does not.
//!
//! `daemon-client` and `demo` need the `cnid` binary, which cargo does not
//! build for this package's tests: [`cnid_binary`] takes the one next to the
//! examples in the target dir (where `cargo test --workspace` and
//! `make demo` put it) and builds it with cargo when it is missing or older
//! than the sources (before the test enters its own host: cargo needs the
//! host's files).

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead as _, BufReader, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cni_async::netns::Netns;
use cni_test_support::isolated::on_own_host;
use cni_test_support::require_root;
use ipnet::IpNet;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const SHOW_STDIN: &str = env!("CARGO_BIN_EXE_show-stdin");
const IN_PROCESS: &str = env!("CARGO_BIN_EXE_in-process");
const HARNESS: &str = env!("CARGO_BIN_EXE_harness");
const DAEMON_CLIENT: &str = env!("CARGO_BIN_EXE_daemon-client");
const DEMO: &str = env!("CARGO_BIN_EXE_demo");

const NET_D: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/net.d");
/// The bundled bridge network's bridge, subnet and host-local dir.
const BRIDGE: &str = "cnirs-br0";
const SUBNET: &str = "10.253.10.0/24";
const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks/cnirs-bridge";

/// A namespace prefix unique to this test process and `tag`.
fn prefix(tag: &str) -> String {
    format!("cnirs-t{}{tag}-", std::process::id())
}

fn bridge_exists() -> bool {
    Command::new("ip")
        .args(["link", "show", "dev", BRIDGE])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn namespaces_with(prefix: &str) -> Vec<String> {
    Netns::list_named()
        .expect("list /run/netns")
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// host-local's reservations for the bundled network: address -> the
/// container ID it is reserved for (first line of the file).
fn reservations() -> Vec<(IpAddr, String)> {
    let Ok(entries) = fs::read_dir(HOST_LOCAL_DIR) else {
        return Vec::new();
    };
    let mut out: Vec<(IpAddr, String)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let ip: IpAddr = e.file_name().to_str()?.parse().ok()?;
            let owner = fs::read_to_string(e.path()).unwrap_or_default();
            Some((ip, owner.lines().next().unwrap_or("").to_owned()))
        })
        .collect();
    out.sort();
    out
}

/// The regular files under `dir` (recursively), relative paths.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap_or(&path).to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// What the host looked like before a run, and a safety net that removes
/// what a failed run left (namespaces with the prefix, the bridge when it
/// was not there before, host-local files of the prefix) when dropped.
struct Before {
    prefix: String,
    bridge_existed: bool,
    reservations: Vec<(IpAddr, String)>,
}

impl Before {
    fn take(prefix: &str) -> Before {
        Before {
            prefix: prefix.to_owned(),
            bridge_existed: bridge_exists(),
            reservations: reservations(),
        }
    }

    /// Nothing of the run is left: no namespace with its prefix, no bridge
    /// unless one existed before, no host-local reservation that was not
    /// there before (and none for its containers).
    fn assert_nothing_left(&self, output: &str) {
        assert_eq!(
            namespaces_with(&self.prefix),
            Vec::<String>::new(),
            "namespaces left behind\n{output}"
        );
        if !self.bridge_existed {
            assert!(!bridge_exists(), "bridge {BRIDGE} left behind\n{output}");
        }
        let now = reservations();
        let new: Vec<_> = now
            .iter()
            .filter(|r| !self.reservations.contains(r) || r.1.starts_with(&self.prefix))
            .collect();
        assert!(
            new.is_empty(),
            "host-local reservations left in {HOST_LOCAL_DIR}: {new:?}\n{output}"
        );
    }
}

impl Drop for Before {
    fn drop(&mut self) {
        for name in namespaces_with(&self.prefix) {
            let _ = Netns::delete_named(&name);
        }
        if !self.bridge_existed && bridge_exists() {
            let _ = Command::new("ip")
                .args(["link", "del", "dev", BRIDGE])
                .status();
        }
        for (ip, owner) in reservations() {
            if owner.starts_with(&self.prefix) {
                let _ = fs::remove_file(Path::new(HOST_LOCAL_DIR).join(ip.to_string()));
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

/// A running example: its output arrives line by line.
struct Running {
    child: Child,
    lines: Receiver<(Stream, String)>,
    seen: Vec<(Stream, String)>,
    readers: Vec<JoinHandle<()>>,
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn all(&self) -> String {
        format!(
            "status: {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl Running {
    fn start(program: &str, args: &[&str]) -> Running {
        let mut child = Command::new(program)
            .args(args)
            // The examples' defaults, whatever the environment says.
            .env_remove("CNI_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        let (tx, lines) = mpsc::channel();
        let mut readers = Vec::new();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        for (stream, pipe) in [
            (Stream::Out, Box::new(out) as Box<dyn Read + Send>),
            (Stream::Err, Box::new(err)),
        ] {
            let tx = tx.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((stream, line)).is_err() {
                        break;
                    }
                }
            }));
        }
        Running {
            child,
            lines,
            seen: Vec::new(),
            readers,
        }
    }

    /// Waits until a line of `stream` satisfies `pred`; false on timeout
    /// or when the program's output ends first.
    fn wait_for(&mut self, stream: Stream, pred: impl Fn(&str) -> bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((s, line)) => {
                    let hit = s == stream && pred(&line);
                    self.seen.push((s, line));
                    if hit {
                        return true;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid fits in i32");
        kill(Pid::from_raw(pid), signal).expect("send the signal");
    }

    /// Waits for the exit (killing the program after `timeout`) and collects
    /// all of its output.
    fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for the example") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.seen.extend(self.lines.try_iter());
        let join = |which: Stream| {
            self.seen
                .iter()
                .filter(|(s, _)| *s == which)
                .map(|(_, l)| format!("{l}\n"))
                .collect::<String>()
        };
        let (stdout, stderr) = (join(Stream::Out), join(Stream::Err));
        let Some(status) = status else {
            panic!(
                "the example ran longer than {timeout:?}\n--- stdout\n{stdout}--- stderr\n{stderr}"
            );
        };
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

/// Starts `program`, sends it SIGINT once a line of `stream` satisfies
/// `at` (`what` names that point in the failure message), and returns its
/// output after checking it got there and exited 130.
fn interrupted(
    program: &str,
    args: &[&str],
    stream: Stream,
    at: impl Fn(&str) -> bool,
    what: &str,
) -> Finished {
    let mut running = Running::start(program, args);
    let reached = running.wait_for(stream, at, Duration::from_secs(60));
    running.signal(Signal::SIGINT);
    let out = running.finish(Duration::from_secs(120));
    let all = out.all();
    assert!(reached, "never got to {what} before the signal\n{all}");
    assert_eq!(out.status.code(), Some(130), "{all}");
    out
}

fn run(program: &str, args: &[&str]) -> Finished {
    Running::start(program, args).finish(Duration::from_secs(120))
}

/// The addresses (with prefix length) printed in `text` that lie in the
/// bundled subnet.
fn addresses_in_subnet(text: &str) -> BTreeSet<IpNet> {
    let subnet: IpNet = SUBNET.parse().expect("valid subnet");
    text.split(|c: char| c.is_whitespace() || c == '[' || c == ']' || c == ',')
        .filter_map(|w| w.parse::<IpNet>().ok())
        .filter(|n| subnet.contains(&n.addr()))
        .collect()
}

#[test]
fn show_stdin_prints_the_stdin_of_every_bundled_plugin() {
    let out = run(SHOW_STDIN, &[NET_D]);
    assert!(out.status.success(), "{}", out.all());

    // What the conf files list, in order.
    let mut expected: Vec<(String, String)> = Vec::new();
    let mut files: Vec<PathBuf> = fs::read_dir(NET_D)
        .expect("list net.d")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "conflist"))
        .collect();
    files.sort();
    for f in &files {
        let v: Value = serde_json::from_slice(&fs::read(f).expect("read conflist"))
            .expect("bundled conflist is JSON");
        let name = v["name"].as_str().expect("network name").to_owned();
        for p in v["plugins"].as_array().expect("plugins") {
            let t = p["type"].as_str().expect("plugin type").to_owned();
            expected.push((name.clone(), t));
        }
    }
    assert!(expected.len() >= 5, "bundled networks: {expected:?}");

    // Every line that looks like JSON is JSON: the stdin of one plugin, in
    // the order of the files. Only portmap, which declares the capability,
    // gets the example's port mappings.
    let mut printed: Vec<(String, String)> = Vec::new();
    for line in out.stdout.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{}", out.all()));
        let name = v["name"].as_str().unwrap_or_default().to_owned();
        let t = v["type"].as_str().unwrap_or_default().to_owned();
        let mappings = &v["runtimeConfig"]["portMappings"];
        assert_eq!(
            mappings.is_array(),
            t == "portmap",
            "runtimeConfig of {t}: {line}\n{}",
            out.all()
        );
        printed.push((name, t));
    }
    assert_eq!(printed, expected, "{}", out.all());
}

#[test]
fn in_process_sets_up_checks_pings_and_tears_down() {
    require_root!("the examples create network namespaces and a bridge");
    on_own_host(|| {
        let prefix = prefix("ip");
        let before = Before::take(&prefix);

        let out = run(IN_PROCESS, &["--prefix", &prefix]);
        let all = out.all();
        assert!(out.status.success(), "{all}");

        // Two different addresses in the bundled subnet, CHECKs, pings both ways.
        let addrs = addresses_in_subnet(&out.stdout);
        assert_eq!(addrs.len(), 2, "expected two addresses in {SUBNET}\n{all}");
        for label in ["a", "b"] {
            assert!(
                out.stdout.contains(&format!("CHECK sandbox {label}: ok")),
                "{all}"
            );
        }
        for (from, to) in [("a", "b"), ("b", "a")] {
            let line = out
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("ping {from} -> {to} ")))
                .unwrap_or_else(|| panic!("no ping {from} -> {to}\n{all}"));
            assert!(line.contains(": ok, time "), "{line}\n{all}");
            let target = addrs
                .iter()
                .find(|n| line.contains(&format!("({})", n.addr())));
            assert!(
                target.is_some(),
                "ping to an unknown address: {line}\n{all}"
            );
        }
        assert!(out.stdout.contains("teardown: done"), "{all}");

        // The default result cache was a temp dir, and it is gone; nothing in
        // /var/lib/cni/results for our containers.
        let cache = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("result cache: "))
            .unwrap_or_else(|| panic!("no cache dir printed\n{all}"));
        assert!(
            cache.starts_with(std::env::temp_dir().to_str().expect("utf-8 temp dir")),
            "{all}"
        );
        assert!(!Path::new(cache).exists(), "{cache} left behind\n{all}");
        let global = files_under(Path::new("/var/lib/cni/results"));
        assert!(
            !global.iter().any(|f| f.to_string_lossy().contains(&prefix)),
            "written to /var/lib/cni/results: {global:?}\n{all}"
        );
        before.assert_nothing_left(&all);
    });
}

#[test]
fn in_process_waits_and_tears_down_on_sigterm() {
    require_root!("the examples create network namespaces and a bridge");
    on_own_host(|| {
        let prefix = prefix("iw");
        let before = Before::take(&prefix);
        let cache = tempfile::tempdir().expect("temp dir");
        let cache_dir = cache.path().to_str().expect("utf-8 temp dir").to_owned();

        let mut running = Running::start(
            IN_PROCESS,
            &["--prefix", &prefix, "--cache-dir", &cache_dir, "--wait"],
        );
        let up = running.wait_for(
            Stream::Out,
            |l| l.contains("press Ctrl-C"),
            Duration::from_secs(60),
        );
        // While it waits: both namespaces exist, both results are in our cache.
        let namespaces = namespaces_with(&prefix);
        let cached = files_under(&cache.path().join("results"));
        running.signal(Signal::SIGTERM);
        let out = running.finish(Duration::from_secs(60));
        let all = out.all();
        assert!(up, "never got to waiting\n{all}");
        assert_eq!(
            namespaces,
            vec![format!("{prefix}a"), format!("{prefix}b")],
            "{all}"
        );
        assert_eq!(cached.len(), 2, "cache entries while up: {cached:?}\n{all}");

        // A SIGTERM while waiting is the planned end: exit 0 after the teardown.
        assert!(out.status.success(), "{all}");
        assert!(out.stdout.contains("SIGTERM: tearing down"), "{all}");
        assert!(out.stdout.contains("teardown: done"), "{all}");
        let cached = files_under(&cache.path().join("results"));
        assert!(
            cached.is_empty(),
            "cache entries after DEL: {cached:?}\n{all}"
        );
        before.assert_nothing_left(&all);
    });
}

#[test]
fn harness_sets_up_pings_and_tears_down_ten_namespaces() {
    require_root!("the examples create network namespaces and a bridge");
    on_own_host(|| {
        let prefix = prefix("h");
        let before = Before::take(&prefix);

        let out = run(
            HARNESS,
            &["--count", "10", "--concurrency", "4", "--prefix", &prefix],
        );
        let all = out.all();
        assert!(out.status.success(), "{all}");
        for expected in [
            "setup: 10 attached, 0 failed in ",
            "pings: 9/9 answered from ",
            "teardown: 10 deleted, 0 failed in ",
            "left behind: nothing",
            "total: ",
        ] {
            assert!(out.stdout.contains(expected), "no {expected:?}\n{all}");
        }
        // Progress lines (stderr is not a terminal here: a line per tenth).
        assert!(out.stderr.contains("setup: 10/10"), "{all}");
        assert!(out.stderr.contains("teardown: 10/10"), "{all}");
        before.assert_nothing_left(&all);
    });
}

#[test]
fn harness_interrupted_during_setup_leaves_nothing_behind() {
    require_root!("the examples create network namespaces and a bridge");
    on_own_host(|| {
        let prefix = prefix("hi");
        let before = Before::take(&prefix);

        // Slow enough (one at a time) to be interrupted half-way.
        let out = interrupted(
            HARNESS,
            &["--count", "40", "--concurrency", "1", "--prefix", &prefix],
            Stream::Err,
            |l| l.starts_with("setup: 4/40"),
            "setup progress",
        );
        let all = out.all();
        assert!(
            out.stdout.contains("SIGINT: setup stopped"),
            "not interrupted during setup\n{all}"
        );
        assert!(out.stdout.contains("left behind: nothing"), "{all}");
        before.assert_nothing_left(&all);
    });
}

/// The crates whose sources make up the `cnid` binary.
const CNID_SOURCES: &[&str] = &[
    "cni-core",
    "cni-async",
    "cnid",
    "cnid/api",
    "cnid/cli",
    "cnid/client",
    "cnid/shim",
];

/// The newest modification time of the files under `dir`.
fn newest_under(dir: &Path) -> Option<std::time::SystemTime> {
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if let Ok(m) = meta.modified() {
                newest = newest.max(Some(m));
            }
        }
    }
    newest
}

/// The `cnid` binary next to the examples, built with cargo first when it
/// is missing or older than a source file of the crates it is made of.
fn cnid_binary() -> PathBuf {
    static BUILT: Mutex<()> = Mutex::new(());
    let _once = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    let path = Path::new(DEMO).with_file_name("cnid");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples are in the workspace");
    let built = fs::metadata(&path).and_then(|m| m.modified()).ok();
    let sources = CNID_SOURCES
        .iter()
        .flat_map(|c| {
            [
                newest_under(&workspace.join(c).join("src")),
                fs::metadata(workspace.join(c).join("Cargo.toml"))
                    .and_then(|m| m.modified())
                    .ok(),
            ]
        })
        .flatten()
        .max();
    if built.is_none() || sources > built {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-q", "-p", "cnid", "--bin", "cnid"])
            .current_dir(workspace)
            .status()
            .expect("run cargo build -p cnid --bin cnid");
        assert!(status.success(), "cargo build -p cnid --bin cnid: {status}");
    }
    assert!(path.is_file(), "{} missing after the build", path.display());
    path
}

/// `GET path` on cnid's socket (HTTP/1.1, `Connection: close`): the status
/// and the body.
fn cnid_get(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Write as _;
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: cnid\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// A cnid started by a test on a socket in a temp dir, with the bundled
/// networks and a temp cache and state dir; SIGKILLed when dropped.
struct TestCnid {
    child: Option<Child>,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl TestCnid {
    fn start(cnid: &Path) -> TestCnid {
        let dir = tempfile::Builder::new()
            .prefix("cnirs-test-cnid-")
            .tempdir()
            .expect("temp dir");
        let socket = dir.path().join("cnid.sock");
        let log = fs::File::create(dir.path().join("cnid.log")).expect("create the log");
        let child = Command::new(cnid)
            .arg("--socket")
            .arg(&socket)
            .arg("--conf-dir")
            .arg(NET_D)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args([
                "--plugin-dir",
                "/opt/cni/bin",
                "--plugin-dir",
                "/usr/lib/cni",
            ])
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log"))
            .stderr(log)
            .spawn()
            .expect("start cnid");
        let mut cnid = TestCnid {
            child: Some(child),
            dir,
            socket,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if cnid_get(&cnid.socket, "/v1/health").is_ok_and(|(status, _)| status == 200) {
                return cnid;
            }
            let exited = cnid
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "cnid not ready ({exited:?}); log:\n{}",
                cnid.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("cnid.log")).unwrap_or_default()
    }

    /// The cached results in its cache dir.
    fn cached(&self) -> Vec<PathBuf> {
        files_under(&self.dir.path().join("cache/results"))
    }

    /// SIGTERM; its exit status.
    fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("cnid runs");
        let pid = i32::try_from(child.id()).expect("pid fits in i32");
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM cnid");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait for cnid") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("cnid did not exit on SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestCnid {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The two sandbox addresses in the output, the pings both ways to them,
/// and the daemon's view listing both with those addresses.
fn assert_attached_pinged_listed(out: &Finished, prefix: &str) {
    let all = out.all();
    let addrs = addresses_in_subnet(&out.stdout);
    assert_eq!(addrs.len(), 2, "expected two addresses in {SUBNET}\n{all}");
    for (from, to) in [("a", "b"), ("b", "a")] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("ping {from} -> {to} ")))
            .unwrap_or_else(|| panic!("no ping {from} -> {to}\n{all}"));
        assert!(line.contains(": ok, time "), "{line}\n{all}");
        assert!(
            addrs
                .iter()
                .any(|n| line.contains(&format!("({})", n.addr()))),
            "ping to an unknown address: {line}\n{all}"
        );
    }
    for label in ["a", "b"] {
        assert!(
            out.stdout.contains(&format!("CHECK sandbox {label}: ok")),
            "{all}"
        );
        // The address ADD printed is the one the daemon lists.
        let added = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("sandbox {label}: eth0 ")))
            .unwrap_or_else(|| panic!("no address of sandbox {label}\n{all}"));
        let listed = out
            .stdout
            .lines()
            .find(|l| {
                l.trim_start()
                    .starts_with(&format!("attachment cnirs-bridge {prefix}{label} eth0: "))
            })
            .unwrap_or_else(|| panic!("cnid does not list sandbox {label}\n{all}"));
        assert_eq!(
            addresses_in_subnet(added),
            addresses_in_subnet(listed),
            "{all}"
        );
        assert!(
            listed.contains(&format!("netns /run/netns/{prefix}{label}")),
            "{listed}\n{all}"
        );
    }
    assert!(
        out.stdout
            .contains("GET /v1/attachments: none of ours left"),
        "{all}"
    );
    assert!(out.stdout.contains("teardown: done"), "{all}");
}

#[test]
fn daemon_client_attaches_pings_lists_and_detaches_through_cnid() {
    require_root!("the examples create network namespaces and a bridge");
    let cnid = cnid_binary();
    on_own_host(|| {
        let prefix = prefix("dc");
        let before = Before::take(&prefix);
        let mut cnid = TestCnid::start(&cnid);
        let socket = cnid.socket.to_str().expect("utf-8 temp dir").to_owned();

        let out = run(DAEMON_CLIENT, &["--socket", &socket, "--prefix", &prefix]);
        let all = format!("{}\n--- cnid log\n{}", out.all(), cnid.log());
        assert!(out.status.success(), "{all}");
        assert_attached_pinged_listed(&out, &prefix);

        // The daemon agrees: nothing attached, nothing cached.
        let (status, body) =
            cnid_get(&cnid.socket, "/v1/attachments").expect("GET /v1/attachments");
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("attachments JSON");
        assert_eq!(v["attachments"], serde_json::json!([]), "{all}");
        assert_eq!(cnid.cached(), Vec::<PathBuf>::new(), "{all}");
        assert!(cnid.stop().success(), "{all}");
        before.assert_nothing_left(&all);
    });
}

#[test]
fn daemon_client_without_a_daemon_fails_clearly() {
    require_root!("the examples create network namespaces and a bridge");
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("none.sock");
    let out = run(
        DAEMON_CLIENT,
        &["--socket", socket.to_str().expect("utf-8 temp dir")],
    );
    let all = out.all();
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(out.stderr.contains("is cnid running?"), "{all}");
    assert!(
        out.stderr
            .contains(&format!("cannot connect to cnid at {}", socket.display())),
        "{all}"
    );
}

/// The pid the demo printed for cnid.
fn demo_cnid_pid(stdout: &str) -> Option<i32> {
    let rest = stdout.split("(pid ").nth(1)?;
    rest.split(',').next()?.parse().ok()
}

fn process_exists(pid: i32) -> bool {
    // Signal 0: only checks that the process exists.
    kill(Pid::from_raw(pid), None).is_ok()
}

#[test]
fn demo_runs_end_to_end_and_leaves_nothing_behind() {
    require_root!("the examples create network namespaces and a bridge");
    let cnid = cnid_binary();
    on_own_host(|| {
        let prefix = prefix("dm");
        let before = Before::take(&prefix);

        let out = run(
            DEMO,
            &[
                "--cnid",
                cnid.to_str().expect("utf-8 path"),
                "--prefix",
                &prefix,
            ],
        );
        let all = out.all();
        assert!(out.status.success(), "{all}");
        assert_attached_pinged_listed(&out, &prefix);
        // A fresh daemon: our two attachments are all it has.
        assert!(
            out.stdout
                .contains("GET /v1/attachments: 2 attachments, 2 of them ours"),
            "{all}"
        );
        assert!(
            out.stdout.contains("cnid: exited (exit status: 0)"),
            "{all}"
        );
        assert!(out.stdout.contains("left behind: nothing"), "{all}");
        assert_eq!(
            out.stdout.lines().last(),
            Some("demo: done, everything torn down"),
            "{all}"
        );
        // Its temp dir (socket, state, cache, log) is gone, and so is cnid.
        let tmp = out
            .stdout
            .lines()
            .find_map(|l| {
                l.strip_prefix("removed ")
                    .filter(|p| p.contains("cnid-demo-"))
            })
            .unwrap_or_else(|| panic!("no temp dir removed\n{all}"));
        assert!(!Path::new(tmp).exists(), "{tmp} left behind\n{all}");
        let pid = demo_cnid_pid(&out.stdout).unwrap_or_else(|| panic!("no cnid pid\n{all}"));
        assert!(!process_exists(pid), "cnid (pid {pid}) still runs\n{all}");
        before.assert_nothing_left(&all);
    });
}

#[test]
fn demo_interrupted_during_add_tears_down_and_stops_cnid() {
    require_root!("the examples create network namespaces and a bridge");
    let cnid = cnid_binary();
    on_own_host(|| {
        let prefix = prefix("di");
        let before = Before::take(&prefix);

        // Interrupted once both namespaces exist and the ADDs are sent.
        let out = interrupted(
            DEMO,
            &[
                "--cnid",
                cnid.to_str().expect("utf-8 path"),
                "--prefix",
                &prefix,
            ],
            Stream::Out,
            |l| l.contains(". ADD both namespaces"),
            "the ADDs",
        );
        let all = out.all();
        assert!(
            out.stdout.contains("SIGINT: stopping, tearing down"),
            "{all}"
        );
        assert!(out.stdout.contains("teardown: done"), "{all}");
        assert!(out.stdout.contains("left behind: nothing"), "{all}");
        assert_eq!(
            out.stdout.lines().last(),
            Some("demo: interrupted by SIGINT, everything torn down"),
            "{all}"
        );
        let pid = demo_cnid_pid(&out.stdout).unwrap_or_else(|| panic!("no cnid pid\n{all}"));
        assert!(!process_exists(pid), "cnid (pid {pid}) still runs\n{all}");
        before.assert_nothing_left(&all);
    });
}
