//! Running the built `cnid` binary as a real process on a temp socket, with
//! temp conf, cache and state dirs, and talking to it (typed client, raw
//! HTTP, curl).
//!
//! [`Dirs`] owns the temp dir, so a daemon can be killed and restarted on
//! the same state. [`Daemon`] kills its process with SIGKILL on drop (also
//! when the test panics) and then prints the daemon's log tail if the test
//! is failing.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cni_test_support::executable::write_executable;
use cnid::client::Client;
use serde_json::Value;

/// The built daemon.
pub const CNID: &str = env!("CARGO_BIN_EXE_cnid");

/// A test's dirs: `root/{cnid.sock, net.d, bin, cache, state, data, log}`.
#[derive(Debug)]
pub struct Dirs {
    root: tempfile::TempDir,
    pub socket: PathBuf,
    pub conf: PathBuf,
    pub bin: PathBuf,
    pub cache: PathBuf,
    pub state: PathBuf,
    /// For plugins' own files (host-local's dataDir, records).
    pub data: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let root = tempfile::Builder::new()
            .prefix("cnid-test-")
            .tempdir()
            .expect("temp dir");
        let p = root.path().to_owned();
        let d = Dirs {
            socket: p.join("run/cnid.sock"),
            conf: p.join("net.d"),
            bin: p.join("bin"),
            cache: p.join("cache"),
            state: p.join("state"),
            data: p.join("data"),
            root,
        };
        for dir in [&d.conf, &d.bin, &d.data] {
            fs::create_dir_all(dir).expect("create test dir");
        }
        d
    }

    /// A netns path of its own for container `name`: a link to the test's
    /// (and the daemon's) network namespace. The daemon checks that an
    /// ADD's netns is a network namespace, and refuses a request on the
    /// netns and ifname of another attached container, comparing paths: so
    /// containers whose fake plugins never enter the namespace each get
    /// one of these instead of sharing `/proc/self/ns/net`.
    pub fn netns(&self, name: &str) -> String {
        let dir = self.data.join("netns");
        fs::create_dir_all(&dir).expect("create netns dir");
        let path = dir.join(name);
        if fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink("/proc/self/ns/net", &path).expect("create netns link");
        }
        path.to_str().expect("utf-8 temp dir").to_owned()
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Writes an executable `#!/bin/sh` plugin into `bin/`.
    pub fn plugin(&self, name: &str, body: &str) -> PathBuf {
        write_executable(
            &self.bin.join(name),
            format!("#!/bin/sh\n{body}\n").as_bytes(),
            0o755,
        )
    }

    /// A network `name` (CNI `version`) of one plugin `rec` that records
    /// each call (see [`recording_plugin`], [`runs`]) in conf file `file`;
    /// returns the records dir.
    pub fn recording_network(&self, file: &str, name: &str, version: &str) -> PathBuf {
        let records = self.data.join("records");
        std::fs::create_dir_all(&records).unwrap();
        self.plugin("rec", &recording_plugin(&records, ""));
        self.conf(
            file,
            &serde_json::json!({"cniVersion": version, "name": name, "plugins": [{"type": "rec"}]}),
        );
        records
    }

    /// Writes `net.d/<file>`.
    pub fn conf(&self, file: &str, json: &Value) -> PathBuf {
        let path = self.conf.join(file);
        fs::write(&path, serde_json::to_vec_pretty(json).unwrap()).expect("write conf");
        path
    }

    /// The ADD intents recorded in the state dir, as intent file names
    /// (`<network>:<containerID>:<ifname>.json`): the intent files, and
    /// the ADDs the journal holds open (a `begin` record without its `end`),
    /// which the next start turns into such files.
    pub fn intents(&self) -> Vec<String> {
        let dir = self.state.join("intents");
        let mut v: Vec<String> = fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        let journal = fs::read(dir.join("journal")).unwrap_or_default();
        let records: Vec<Value> = journal
            .split(|b| *b == b'\n')
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let ended: Vec<u64> = records.iter().filter_map(|r| r["end"].as_u64()).collect();
        for r in &records {
            if r["seq"].as_u64().is_some_and(|s| !ended.contains(&s)) {
                let name = format!(
                    "{}:{}:{}.json",
                    r["networkName"].as_str().unwrap_or_default(),
                    r["containerId"].as_str().unwrap_or_default(),
                    r["ifName"].as_str().unwrap_or_default()
                );
                if !v.contains(&name) {
                    v.push(name);
                }
            }
        }
        v.sort();
        v
    }

    /// The cache result files.
    pub fn cached(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.cache.join("results"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// A running `cnid` process.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    log: PathBuf,
}

/// Flags that let the test process talk to the cnid it starts: none as
/// root; as another user (whose root-only tests skip), `--allow-uid` with
/// its own UID, since cnid serves root alone by default.
pub fn allow_self() -> Vec<String> {
    if cni_test_support::is_root() {
        Vec::new()
    } else {
        vec!["--allow-uid".into(), cni_test_support::euid().to_string()]
    }
}

impl Daemon {
    /// Starts cnid on `dirs` with the standard flags plus `extra`, and waits
    /// until it answers `GET /v1/health`.
    pub fn start(dirs: &Dirs, extra: &[&str]) -> Daemon {
        Daemon::start_with(dirs, extra, |_| {})
    }

    /// Like [`Daemon::start`], with a hook to adjust the command.
    pub fn start_with(dirs: &Dirs, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        let mut d = Daemon::spawn_with(dirs, extra, adjust);
        d.wait_ready(Duration::from_secs(15));
        d
    }

    /// Starts cnid as [`Daemon::start_with`] does, without waiting until
    /// it is ready (then [`Daemon::wait_ready`]).
    pub fn spawn_with(dirs: &Dirs, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dirs.root().join(format!("cnid-{n}.log"));
        let log_file = fs::File::create(&log).expect("create log");
        let mut cmd = Command::new(CNID);
        cmd.arg("--socket")
            .arg(&dirs.socket)
            .arg("--conf-dir")
            .arg(&dirs.conf)
            .arg("--plugin-dir")
            .arg(&dirs.bin)
            .arg("--plugin-dir")
            .arg("/usr/lib/cni")
            .arg("--cache-dir")
            .arg(&dirs.cache)
            .arg("--state-dir")
            .arg(&dirs.state);
        cmd.args(allow_self())
            .args(extra)
            .env_remove("NETCONFPATH")
            .env_remove("CNI_PATH")
            .env_remove("CNI_CACHE_DIR")
            .env_remove("CNID_SOCKET")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env(
                "RUST_LOG",
                std::env::var("CNID_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("dup log"))
            .stderr(log_file);
        adjust(&mut cmd);
        let child = cmd.spawn().expect("spawn cnid");
        Daemon {
            child: Some(child),
            socket: dirs.socket.clone(),
            log,
        }
    }

    /// Wraps a cnid process started some other way (socket activation
    /// through a shell, say) whose log goes to `log`.
    pub fn from_child(child: Child, socket: &Path, log: &Path) -> Daemon {
        let mut d = Daemon {
            child: Some(child),
            socket: socket.to_owned(),
            log: log.to_owned(),
        };
        d.wait_ready(Duration::from_secs(15));
        d
    }

    /// Waits up to `limit` until it answers `GET /v1/health`; fails the
    /// test when it exits first.
    pub fn wait_ready(&mut self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok(r) = raw(&self.socket, "GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
                && r.status == 200
            {
                return;
            }
            if let Some(st) = self.try_status() {
                panic!("cnid exited at start ({st}); log:\n{}", self.log());
            }
            assert!(
                start.elapsed() < limit,
                "cnid not ready after {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// A typed client.
    pub async fn client(&self) -> Client {
        Client::connect(&self.socket).await.expect("connect")
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory preconditions.
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.pid());
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        self.signal(libc::SIGKILL);
        self.wait(Duration::from_secs(10))
            .expect("SIGKILLed cnid reaped")
    }

    /// Waits up to `limit` until its log contains `needle`; fails the test
    /// when it exits first.
    pub fn wait_log(&mut self, needle: &str, limit: Duration) {
        let end = Instant::now() + limit;
        while !self.log().contains(needle) {
            if let Some(st) = self.try_status() {
                panic!(
                    "cnid exited ({st}) before logging {needle:?}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < end,
                "cnid did not log {needle:?} within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its exit status, if it exited (reaped then).
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_status() {
                self.child = None;
                return Some(st);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- cnid log tail ({}) ---", self.log.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

/// A raw HTTP answer.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawAnswer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts the body is a CNI error object and returns its code.
    #[track_caller]
    pub fn cni_error(&self) -> u64 {
        let v = self.json();
        let obj = v.as_object().expect("error is a JSON object");
        assert!(
            obj.get("cniVersion").and_then(Value::as_str).is_some(),
            "no cniVersion: {v}"
        );
        assert!(
            obj.get("msg")
                .and_then(Value::as_str)
                .is_some_and(|m| !m.is_empty()),
            "no msg: {v}"
        );
        obj.get("code")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("no code: {v}"))
    }
}

/// Sends `request` (whole, as bytes) on a fresh connection, with
/// `Connection: close` semantics expected from the request, and reads the
/// answer (Content-Length or close-delimited).
pub fn raw(socket: &Path, request: &str) -> std::io::Result<RawAnswer> {
    raw_bytes(socket, request.as_bytes())
}

/// [`raw`] for arbitrary bytes.
pub fn raw_bytes(socket: &Path, request: &[u8]) -> std::io::Result<RawAnswer> {
    // A signal (SIGCHLD of a daemon or plugin another test of this binary
    // started) may interrupt a call: retried, as std's own loops do.
    let mut s = loop {
        match UnixStream::connect(socket) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    // The peer may answer (413) and close before it read everything.
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(ans) = parse_complete(&buf) {
            return Ok(ans);
        }
    }
    parse_complete(&buf).ok_or_else(|| {
        std::io::Error::other(format!(
            "incomplete answer: {}",
            String::from_utf8_lossy(&buf)
        ))
    })
}

fn parse_complete(buf: &[u8]) -> Option<RawAnswer> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let body = &buf[end + 4..];
    if body.len() < len {
        return None;
    }
    Some(RawAnswer {
        status,
        headers,
        body: body[..len].to_vec(),
    })
}

/// POSTs `body` to `/v1/networks/{net}/{verb}`: the status and the JSON
/// answer (`null` when empty).
pub fn call(socket: &Path, net: &str, verb: &str, body: &Value) -> (u16, Value) {
    let raw = post(
        socket,
        &format!("/v1/networks/{net}/{verb}"),
        &body.to_string(),
    );
    let v = if raw.body.is_empty() {
        Value::Null
    } else {
        raw.json()
    };
    (raw.status, v)
}

/// `POST path` with a JSON body.
pub fn post(socket: &Path, path: &str, body: &str) -> RawAnswer {
    raw(
        socket,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// `GET path`.
/// `GET /v1/health/ready`: the status and the body.
pub fn ready(daemon: &Daemon) -> (u16, Value) {
    let r = get(&daemon.socket, "/v1/health/ready");
    (r.status, r.json())
}

pub fn get(socket: &Path, path: &str) -> RawAnswer {
    raw(
        socket,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    )
    .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub fn eventually(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The async version of [`eventually`].
pub async fn eventually_async<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until bridge `bridge` has no port left, after namespaces holding
/// the other ends of its veths were deleted. The host end of a veth goes
/// with its peer, but the kernel tears a deleted namespace down
/// asynchronously (its cleanup work runs after `ip netns del` returned,
/// later on a busy machine), so a port may outlive the namespace a moment.
pub async fn bridge_emptied(bridge: &str) {
    eventually_async(
        Duration::from_secs(60),
        &format!("no port left on {bridge} once the namespaces are torn down"),
        || async { cni_test_support::netns::bridge_ports(bridge).is_empty() },
    )
    .await;
}

/// Raises this process's open-file limit (tests with many connections).
pub fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Kills a process group (for plugins a SIGKILLed daemon left behind).
pub fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: kill has no memory preconditions.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// A second before this boot, less an hour: what a record written in an
/// earlier boot is dated (`btime` of `/proc/stat`).
pub fn before_this_boot() -> std::time::SystemTime {
    let stat = fs::read_to_string("/proc/stat").expect("read /proc/stat");
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .expect("btime in /proc/stat")
        .trim()
        .parse()
        .expect("btime is a number");
    std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(btime - 3600)
}

/// Dates every cache record of `dirs` before this boot and gives its
/// identity another boot id (a simulated reboot, as far as the cache shows
/// it); returns that time.
pub fn date_records_before_boot(dirs: &Dirs) -> std::time::SystemTime {
    let before = before_this_boot();
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    for name in dirs.cached() {
        let path = dirs.cache.join("results").join(&name);
        // A record written in an earlier boot carries that boot's id.
        let text = fs::read_to_string(&path).expect("read cache record");
        fs::write(&path, text.replace(boot.trim(), "an-earlier-boot")).expect("write cache record");
        let f = fs::File::options()
            .write(true)
            .open(&path)
            .expect("open cache record");
        f.set_modified(before).expect("date cache record");
    }
    before
}

/// Makes the ADD journal of `dirs` another boot's, as a reboot leaves it:
/// each commit line's boot id, and the one inside the cache record it
/// carries (base64), are "an-earlier-boot".
pub fn journal_of_an_earlier_boot(dirs: &Dirs) {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    journal_boot(dirs, boot.trim(), "an-earlier-boot", None);
}

/// Gives container `cid`'s cache record and journal lines this boot's id
/// again (after [`date_records_before_boot`] and
/// [`journal_of_an_earlier_boot`]): its record is dated before the boot
/// but was written in this one (a clock stepped forward).
pub fn this_boot_again(dirs: &Dirs, cid: &str) {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    let boot = boot.trim();
    for name in dirs.cached() {
        let path = dirs.cache.join("results").join(&name);
        let text = fs::read_to_string(&path).expect("read cache record");
        let v: Value = serde_json::from_str(&text).expect("cache record is JSON");
        if v["containerId"] == cid {
            let mtime = fs::metadata(&path).and_then(|m| m.modified()).unwrap();
            fs::write(&path, text.replace("an-earlier-boot", boot)).expect("write cache record");
            let f = fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(mtime).unwrap();
        }
    }
    journal_boot(dirs, "an-earlier-boot", boot, Some(cid));
}

/// Replaces boot id `from` by `to` in the journal's commit lines (of
/// container `only`, or all) and in the records they carry.
fn journal_boot(dirs: &Dirs, from: &str, to: &str, only: Option<&str>) {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let journal = dirs.state.join("intents/journal");
    let Ok(text) = fs::read_to_string(&journal) else {
        return;
    };
    let mtime = fs::metadata(&journal).and_then(|m| m.modified()).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => {
                out.push_str(line);
                out.push('\n');
                continue;
            }
        };
        if let Some(rec) = v.get("record").and_then(Value::as_str) {
            let bytes = STANDARD.decode(rec).expect("journal record is base64");
            let text = String::from_utf8(bytes).expect("journal record is UTF-8");
            let rec: Value = serde_json::from_str(&text).expect("journal record is JSON");
            if only.is_none_or(|cid| rec["containerId"] == cid) {
                v["record"] = STANDARD.encode(text.replace(from, to)).into();
                if v.get("boot").and_then(Value::as_str) == Some(from) {
                    v["boot"] = to.into();
                }
            }
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    fs::write(&journal, out).expect("write journal");
    let f = fs::File::options().write(true).open(&journal).unwrap();
    f.set_modified(mtime).unwrap();
}

/// Installs `name`, a recording plugin ([`recording_plugin`]) whose DEL
/// waits at `gate` (a DEL the test holds, or lets run out of time);
/// returns its records dir (`<data>/records`, for [`runs`]).
pub fn del_gated_plugin(dirs: &Dirs, name: &str, gate: &crate::support::gate::Gate) -> PathBuf {
    let records = dirs.data.join("records");
    fs::create_dir_all(&records).expect("create records dir");
    dirs.plugin(
        name,
        &recording_plugin(
            &records,
            &format!(
                "if [ \"$CNI_COMMAND\" = DEL ]; then\n{}\nfi",
                gate.shell_wait()
            ),
        ),
    );
    records
}

/// Installs network `name` (conf file `file`, CNI 1.1.0) of one recording
/// plugin `plugin` ([`recording_plugin`]) whose runs for which the shell
/// test `when` holds wait at `gate`; returns its records dir
/// (`<data>/records`, for [`runs`]).
pub fn gated_network(
    dirs: &Dirs,
    (file, name, plugin): (&str, &str, &str),
    when: &str,
    gate: &crate::support::gate::Gate,
) -> PathBuf {
    let records = dirs.data.join("records");
    fs::create_dir_all(&records).expect("create records dir");
    dirs.plugin(
        plugin,
        &recording_plugin(
            &records,
            &format!("if {when}; then\n{}\nfi", gate.shell_wait()),
        ),
    );
    dirs.conf(
        file,
        &serde_json::json!({"cniVersion": "1.1.0", "name": name, "plugins": [{"type": plugin}]}),
    );
    records
}

/// A recording fake plugin's script: every invocation writes one line
/// `COMMAND CONTAINER IFNAME SEQ START_NS END_NS` into its own file under
/// `records` (no locks, no shared file), `SEQ` from `CNI_ARGS`
/// (`SEQ=n`). ADD prints a 1.0.0 result. `extra` runs between start and
/// end (a gate's `shell_wait()`, say).
pub fn recording_plugin(records: &Path, extra: &str) -> String {
    format!(
        r#"s=$(date +%s%N)
cat > /dev/null
seq=-
case ";$CNI_ARGS;" in *";SEQ="*) seq=${{CNI_ARGS#*SEQ=}}; seq=${{seq%%;*}};; esac
{extra}
if [ "$CNI_COMMAND" = ADD ]; then printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.99.0.2/24"}}]}}'; fi
if [ "$CNI_COMMAND" = VERSION ]; then printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}'; exit 0; fi
e=$(date +%s%N)
echo "$CNI_COMMAND ${{CNI_CONTAINERID:--}} ${{CNI_IFNAME:--}} $seq $s $e" > "{dir}/$$.$s"
"#,
        dir = records.display()
    )
}

/// One recorded plugin run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub command: String,
    pub container: String,
    pub ifname: String,
    pub seq: Option<u64>,
    pub start: u128,
    pub end: u128,
}

/// Every run recorded in `records`, by start time.
pub fn runs(records: &Path) -> Vec<Run> {
    let mut out = Vec::new();
    for e in fs::read_dir(records).expect("records dir").flatten() {
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() != 6 {
            continue;
        }
        out.push(Run {
            command: f[0].to_owned(),
            container: f[1].to_owned(),
            ifname: f[2].to_owned(),
            seq: f[3].parse().ok(),
            start: f[4].parse().expect("start ns"),
            end: f[5].parse().expect("end ns"),
        });
    }
    out.sort_by_key(|r| (r.start, r.end));
    out
}
