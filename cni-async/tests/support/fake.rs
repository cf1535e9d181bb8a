//! Fake plugins: real executables written into a test temp dir.
//!
//! [`PluginDir`] is a temp dir with a `bin/` to put plugins in and a
//! `records/` where recording fakes leave, per invocation, the plugin name,
//! the exact stdin bytes and the exact environment (`/proc/$$/environ`).
//!
//! ```ignore
//! let dir = PluginDir::new();
//! dir.fake("bridge", &Fake::new(Response::ok(r#"{"cniVersion":"1.1.0"}"#))
//!     .on("VERSION", Response::ok(r#"{"cniVersion":"1.1.0","supportedVersions":["1.1.0"]}"#)));
//! dir.script("hang", "sleep 1000");
//! // ... run them ...
//! let calls = dir.invocations();
//! assert_eq!(calls[0].var("CNI_COMMAND"), Some("ADD"));
//! ```
//!
//! Also here: helpers to check that processes are gone (`/proc` based; a
//! zombie counts as gone, since a re-parented zombie is init's to reap).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A temp dir holding fake plugins (`bin/`) and their records (`records/`).
#[derive(Debug)]
pub struct PluginDir {
    tmp: tempfile::TempDir,
    bin: PathBuf,
    records: PathBuf,
    counter: AtomicUsize,
}

impl Default for PluginDir {
    fn default() -> Self {
        Self::new()
    }
}

impl PluginDir {
    /// A fresh temp dir with empty `bin/` and `records/`.
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("cni-fake-")
            .tempdir()
            .expect("create temp dir");
        let bin = tmp.path().join("bin");
        let records = tmp.path().join("records");
        fs::create_dir(&bin).expect("create bin dir");
        fs::create_dir(&records).expect("create records dir");
        PluginDir {
            tmp,
            bin,
            records,
            counter: AtomicUsize::new(0),
        }
    }

    /// The temp dir itself (for scratch files: pid files, markers).
    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// A path in the temp dir (not created).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// The plugin dir.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The plugin search path: just [`PluginDir::bin`].
    pub fn dirs(&self) -> Vec<PathBuf> {
        vec![self.bin.clone()]
    }

    /// Where recording fakes leave their invocations.
    pub fn records(&self) -> &Path {
        &self.records
    }

    /// Writes `bin/<name>` with exactly `contents` and `mode`.
    pub fn file(&self, name: &str, contents: &[u8], mode: u32) -> PathBuf {
        write_file(&self.bin.join(name), contents, mode)
    }

    /// Writes an executable shell script `bin/<name>`: `#!/bin/sh` then `body`.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        let text = format!("#!/bin/sh\n{body}\n");
        self.file(name, text.as_bytes(), 0o755)
    }

    /// Writes an executable fake plugin `bin/<name>` with the given behaviour.
    pub fn fake(&self, name: &str, fake: &Fake) -> PathBuf {
        let mut body = String::new();
        if fake.record {
            body.push_str(&format!(
                "REC={rec}\n\
                 i=0\n\
                 while ! mkdir \"$REC/$i\" 2>/dev/null; do i=$((i+1)); done\n\
                 printf '%s' {name} > \"$REC/$i/plugin\"\n\
                 cat /proc/$$/environ > \"$REC/$i/env\"\n\
                 cat > \"$REC/$i/stdin\"\n",
                rec = sh_quote(&self.records.to_string_lossy()),
                name = sh_quote(name),
            ));
        }
        body.push_str("case \"$CNI_COMMAND\" in\n");
        for (command, response) in &fake.on {
            body.push_str(&format!("{})\n", sh_quote(command)));
            body.push_str(&self.response_lines(name, response));
            body.push_str(";;\n");
        }
        body.push_str("*)\n");
        body.push_str(&self.response_lines(name, &fake.default));
        body.push_str(";;\nesac\n");
        self.script(name, &body)
    }

    fn response_lines(&self, name: &str, r: &Response) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut s = String::new();
        s.push_str(&r.shell);
        s.push('\n');
        if !r.stdout.is_empty() {
            let path = write_file(
                &self.tmp.path().join(format!(".{name}.{n}.stdout")),
                &r.stdout,
                0o644,
            );
            s.push_str(&format!("cat {}\n", sh_quote(&path.to_string_lossy())));
        }
        if !r.stderr.is_empty() {
            let path = write_file(
                &self.tmp.path().join(format!(".{name}.{n}.stderr")),
                &r.stderr,
                0o644,
            );
            s.push_str(&format!("cat {} >&2\n", sh_quote(&path.to_string_lossy())));
        }
        s.push_str(&format!("exit {}\n", r.exit));
        s
    }

    /// Every recorded invocation, in the order they started.
    pub fn invocations(&self) -> Vec<Invocation> {
        let mut seqs: Vec<usize> = fs::read_dir(&self.records)
            .expect("read records dir")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        seqs.sort_unstable();
        seqs.into_iter()
            .map(|seq| {
                let dir = self.records.join(seq.to_string());
                let read = |f: &str| fs::read(dir.join(f)).unwrap_or_default();
                let env = read("env")
                    .split(|b| *b == 0)
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let kv = String::from_utf8_lossy(kv);
                        match kv.split_once('=') {
                            Some((k, v)) => (k.to_owned(), v.to_owned()),
                            None => (kv.into_owned(), String::new()),
                        }
                    })
                    .collect();
                Invocation {
                    seq,
                    plugin: String::from_utf8_lossy(&read("plugin")).into_owned(),
                    stdin: read("stdin"),
                    env,
                }
            })
            .collect()
    }
}

/// What a fake plugin does: a default [`Response`], and others per `CNI_COMMAND`.
#[derive(Debug, Clone)]
pub struct Fake {
    default: Response,
    on: Vec<(String, Response)>,
    record: bool,
}

impl Fake {
    /// A recording fake that answers every command with `default`.
    pub fn new(default: Response) -> Self {
        Fake {
            default,
            on: Vec::new(),
            record: true,
        }
    }

    /// Answers `command` (`ADD`, `VERSION`, ...) with `response`.
    pub fn on(mut self, command: &str, response: Response) -> Self {
        self.on.push((command.to_owned(), response));
        self
    }

    /// Does not record (and so does not read stdin).
    pub fn without_recording(mut self) -> Self {
        self.record = false;
        self
    }
}

/// One answer of a fake: shell lines to run first, then stdout, stderr, exit status.
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// Shell lines run before the output is written.
    pub shell: String,
    /// Bytes written to stdout.
    pub stdout: Vec<u8>,
    /// Bytes written to stderr.
    pub stderr: Vec<u8>,
    /// Exit status.
    pub exit: i32,
}

impl Response {
    /// Exit 0 with `stdout`.
    pub fn ok(stdout: &str) -> Self {
        Response {
            stdout: stdout.as_bytes().to_vec(),
            ..Response::default()
        }
    }

    /// Exit `exit` with `stdout` and `stderr`.
    pub fn fail(exit: i32, stdout: &str, stderr: &str) -> Self {
        Response {
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            exit,
            ..Response::default()
        }
    }

    /// Exit 1 with a CNI error object on stdout.
    pub fn cni_error(code: u32, msg: &str, details: &str) -> Self {
        let obj = serde_json::json!({"cniVersion": "1.1.0", "code": code, "msg": msg, "details": details});
        Response::fail(1, &obj.to_string(), "")
    }

    /// Runs `shell` first.
    pub fn with_shell(mut self, shell: &str) -> Self {
        self.shell = shell.to_owned();
        self
    }
}

/// One recorded run of a fake plugin.
#[derive(Debug, Clone)]
pub struct Invocation {
    /// Order of start (0 first).
    pub seq: usize,
    /// The fake's name.
    pub plugin: String,
    /// The exact stdin it got.
    pub stdin: Vec<u8>,
    /// Its exact environment, in `environ` order.
    pub env: Vec<(String, String)>,
}

impl Invocation {
    /// The value of variable `key`, if set.
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The environment as a map.
    pub fn env_map(&self) -> BTreeMap<String, String> {
        self.env.iter().cloned().collect()
    }

    /// The stdin parsed as JSON.
    pub fn stdin_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdin).expect("recorded stdin is JSON")
    }
}

/// `(key, value)` pairs as the owned env of an exec request.
pub fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Single-quotes `s` for the shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> PathBuf {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(contents).expect("write fake file");
    drop(f);
    // The mode given to open is masked by the umask; set it exactly.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod fake file");
    path.to_owned()
}

// ---- processes ----

/// State, parent and process group of `pid` from `/proc`, if it exists.
pub fn proc_stat(pid: u32) -> Option<(char, u32, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Whether `pid` is a running (not zombie) process.
pub fn alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((s, _, _)) if s != 'Z' && s != 'X')
}

/// Whether `pid` is a zombie child of this test process (one we failed to reap).
pub fn our_zombie(pid: u32) -> bool {
    matches!(proc_stat(pid), Some(('Z', ppid, _)) if ppid == std::process::id())
}

/// Live (not zombie) processes of group `pgid`.
pub fn live_in_group(pgid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(
            |pid| matches!(proc_stat(*pid), Some((s, _, g)) if g == pgid && s != 'Z' && s != 'X'),
        )
        .collect()
}

/// The pids written (whitespace-separated) to `path`; empty if it is missing.
pub fn read_pids(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits until `path` lists at least `n` pids (a fake writes them as it starts).
pub async fn wait_for_pids(path: &Path, n: usize, within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let pids = read_pids(path);
        if pids.len() >= n || Instant::now() >= end {
            return pids;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until no pid of `pids` is alive (and none is our zombie); returns
/// the ones still there after `within`.
pub async fn wait_gone(pids: &[u32], within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| alive(*p) || our_zombie(*p))
            .collect();
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until group `pgid` has no live process; returns the ones still
/// there after `within`.
pub async fn wait_group_gone(pgid: u32, within: Duration) -> Vec<u32> {
    let end = Instant::now() + within;
    loop {
        let left = live_in_group(pgid);
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SIGKILLs the group `pgid` (test cleanup on failure); never our own group.
pub fn kill_group(pgid: u32) {
    let ours = nix::unistd::getpgrp().as_raw();
    if let Ok(raw) = i32::try_from(pgid)
        && raw > 1
        && raw != ours
    {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// On drop, SIGKILLs the groups of the pids in a pid file, so a failing
/// test leaves nothing behind.
#[derive(Debug)]
pub struct GroupReaper(pub PathBuf);

impl Drop for GroupReaper {
    fn drop(&mut self) {
        for pid in read_pids(&self.0) {
            if let Some((_, _, pgid)) = proc_stat(pid) {
                kill_group(pgid);
            }
        }
    }
}

// ---- the operations layer ----

/// A [`PluginDir`] plus a cache dir inside it (`<root>/cache`, not created),
/// and [`cni_async::Cni`]s over both. Dropping it removes everything.
#[derive(Debug)]
pub struct Rig {
    /// The fake plugins.
    pub dir: PluginDir,
    /// The cache dir (`<root>/cache`).
    pub cache_dir: PathBuf,
}

impl Default for Rig {
    fn default() -> Self {
        Self::new()
    }
}

/// Kill grace used by the rigs' executors: short, so timeouts stay fast.
pub const RIG_KILL_GRACE: Duration = Duration::from_millis(300);

impl Rig {
    /// A fresh plugin dir with its cache dir path.
    pub fn new() -> Self {
        let dir = PluginDir::new();
        let cache_dir = dir.scratch("cache");
        Rig { dir, cache_dir }
    }

    /// A `Cni` over the plugin dir and cache dir: 10 s deadlines for every
    /// verb, a [`RIG_KILL_GRACE`] kill grace.
    pub fn cni(&self) -> cni_async::Cni {
        self.cni_with(cni_async::Timeouts::uniform(Duration::from_secs(10)))
    }

    /// Like [`Rig::cni`] with other default deadlines.
    pub fn cni_with(&self, timeouts: cni_async::Timeouts) -> cni_async::Cni {
        cni_async::Cni::builder()
            .plugin_dirs(self.dir.dirs())
            .cache_dir(&self.cache_dir)
            .exec(std::sync::Arc::new(
                cni_async::RawExec::new().with_kill_grace(RIG_KILL_GRACE),
            ))
            .timeouts(timeouts)
            .build()
    }

    /// Writes a fake plugin (see [`PluginDir::fake`]).
    pub fn fake(&self, name: &str, fake: &Fake) -> PathBuf {
        self.dir.fake(name, fake)
    }

    /// `<cache>/results/<network>-<cid>-<ifname>`.
    pub fn cache_file(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.cache_dir
            .join("results")
            .join(format!("{network}-{container_id}-{ifname}"))
    }

    /// `<cache>/locks/<network>-<cid>-<ifname>.lock`.
    pub fn lock_file(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.cache_dir
            .join("locks")
            .join(format!("{network}-{container_id}-{ifname}.lock"))
    }

    /// The cache file of an attachment parsed as JSON (`None` if absent).
    pub fn cache_json(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<serde_json::Value> {
        let bytes = fs::read(self.cache_file(network, container_id, ifname)).ok()?;
        Some(serde_json::from_slice(&bytes).expect("cache file is JSON"))
    }

    /// The names in `<cache>/corrupt/` (empty if it does not exist).
    pub fn corrupt_files(&self) -> Vec<String> {
        dir_names(&self.cache_dir.join("corrupt"))
    }

    /// The names in `<cache>/results/` (empty if it does not exist).
    pub fn result_files(&self) -> Vec<String> {
        dir_names(&self.cache_dir.join("results"))
    }
}

/// The sorted names in `dir` (empty if it does not exist).
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// A network configuration list from a JSON value.
pub fn conflist(value: serde_json::Value) -> cni_core::NetworkConfigList {
    cni_core::NetworkConfigList::from_value(&value).expect("test conflist parses")
}

/// Runtime parameters: netns `/run/netns/<cid>`, no args.
pub fn runtime(container_id: &str, ifname: &str) -> cni_core::RuntimeConf {
    cni_core::RuntimeConf::new(container_id, format!("/run/netns/{container_id}"), ifname)
}

/// A VERSION reply supporting `versions`.
pub fn version_reply(versions: &[&str]) -> Response {
    Response::ok(
        &serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": versions}).to_string(),
    )
}

impl Invocation {
    /// The `CNI_*` variables it got.
    pub fn cni_env(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .filter(|(k, _)| k.starts_with("CNI_"))
            .cloned()
            .collect()
    }

    /// Its variables other than `CNI_*` (what it inherited).
    pub fn inherited_env(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .filter(|(k, _)| !k.starts_with("CNI_"))
            .cloned()
            .collect()
    }

    /// `CNI_COMMAND`.
    pub fn command(&self) -> &str {
        self.var("CNI_COMMAND").unwrap_or_default()
    }
}

/// The six `CNI_*` variables as a map.
pub fn cni_vars(
    command: &str,
    container_id: &str,
    netns: &str,
    ifname: &str,
    args: &str,
    path: &str,
) -> BTreeMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container_id),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", ifname),
        ("CNI_ARGS", args),
        ("CNI_PATH", path),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Our own environment without `CNI_*`: what every plugin should inherit.
pub fn our_env_without_cni() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| !k.starts_with("CNI_"))
        .collect()
}

/// `value` with the keys of every object sorted (for order-free diffs).
pub fn sorted_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_json(&m[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted_json).collect()),
        other => other.clone(),
    }
}

/// Asserts two JSON values are equal (key order aside), showing a line diff
/// of both, pretty-printed with sorted keys, when they are not.
#[track_caller]
pub fn assert_json_eq(actual: &serde_json::Value, expected: &serde_json::Value, what: &str) {
    if actual != expected {
        let pretty = |v: &serde_json::Value| {
            serde_json::to_string_pretty(&sorted_json(v)).expect("JSON value serializes")
        };
        pretty_assertions::assert_eq!(pretty(actual), pretty(expected), "{what}");
        // Same text but unequal values cannot happen; fail anyway.
        panic!("{what}: {actual} != {expected}");
    }
}
