//! Fake plugins: real executables written into a test temp dir.
//!
//! [`PluginDir`] is a temp dir with a `bin/` to put plugins in and a
//! `records/` where recording fakes leave, per invocation, the plugin name,
//! the exact stdin bytes and the exact environment (`/proc/$$/environ`).
//!
//! ```text
//! let dir = PluginDir::new();
//! dir.fake("bridge", &Fake::new(Response::ok(r#"{"cniVersion":"1.1.0"}"#))
//!     .on("VERSION", Response::ok(r#"{"cniVersion":"1.1.0","supportedVersions":["1.1.0"]}"#)));
//! dir.script("hang", "sleep 1000");
//! // ... run them ...
//! let calls = dir.invocations();
//! assert_eq!(calls[0].var("CNI_COMMAND"), Some("ADD"));
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::executable::write_executable;

/// A dir holding fake plugins (`bin/`) and their records (`records/`):
/// a temp dir of its own ([`PluginDir::new`]) or a test's dir
/// ([`PluginDir::in_dir`]).
#[derive(Debug)]
pub struct PluginDir {
    /// The temp dir, when this value owns it.
    tmp: Option<tempfile::TempDir>,
    root: PathBuf,
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
    /// A fresh temp dir with empty `bin/` and `records/`, removed on drop.
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("cni-fake-")
            .tempdir()
            .expect("create temp dir");
        let mut dir = PluginDir::in_dir(tmp.path());
        dir.tmp = Some(tmp);
        dir
    }

    /// `bin/` and `records/` under `root` (created), which the caller owns
    /// and removes.
    pub fn in_dir(root: &Path) -> Self {
        let dir = PluginDir {
            tmp: None,
            root: root.to_owned(),
            bin: root.join("bin"),
            records: root.join("records"),
            counter: AtomicUsize::new(0),
        };
        for d in [&dir.bin, &dir.records] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        dir
    }

    /// The dir itself (for scratch files: pid files, markers).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A path in the dir (not created).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.root.join(name)
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

    /// Writes `bin/<name>` with exactly `contents` and `mode`, through
    /// [`write_executable`]: a plugin that runs it never sees "text file
    /// busy".
    pub fn file(&self, name: &str, contents: &[u8], mode: u32) -> PathBuf {
        write_executable(&self.bin.join(name), contents, mode)
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
                &self.root.join(format!(".{name}.{n}.stdout")),
                &r.stdout,
                0o644,
            );
            s.push_str(&format!("cat {}\n", sh_quote(&path.to_string_lossy())));
        }
        if !r.stderr.is_empty() {
            let path = write_file(
                &self.root.join(format!(".{name}.{n}.stderr")),
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

    /// The invocations of one command (`ADD`, `DEL`, ...), in order.
    pub fn invocations_of(&self, command: &str) -> Vec<Invocation> {
        self.invocations()
            .into_iter()
            .filter(|i| i.var("CNI_COMMAND") == Some(command))
            .collect()
    }

    /// Forgets the invocations recorded so far.
    pub fn clear_records(&self) {
        fs::remove_dir_all(&self.records).expect("remove records");
        fs::create_dir_all(&self.records).expect("create records");
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

    /// A well-behaved plugin of `version`: ADD prints a result with one
    /// interface and `ip` ([`result_json`]), VERSION lists the usual
    /// versions ([`version_json`]), the rest succeed silently.
    pub fn plugin(version: &str, ip: &str) -> Self {
        Fake::new(Response::ok(""))
            .on("ADD", Response::ok(&result_json(version, ip)))
            .on("VERSION", Response::ok(&version_json(version)))
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

/// A result of `version` with interface `eth0` and address `ip`.
pub fn result_json(version: &str, ip: &str) -> String {
    serde_json::json!({
        "cniVersion": version,
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:01:02:03", "sandbox": "/run/netns/x"}],
        "ips": [{"interface": 0, "address": ip, "gateway": "10.1.2.1"}]
    })
    .to_string()
}

/// A VERSION reply of a plugin that supports 0.3.1 to `version`.
pub fn version_json(version: &str) -> String {
    serde_json::json!({
        "cniVersion": version,
        "supportedVersions": ["0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    })
    .to_string()
}

/// A VERSION reply supporting `versions`.
pub fn version_reply(versions: &[&str]) -> Response {
    Response::ok(
        &serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": versions}).to_string(),
    )
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
        serde_json::from_slice(&self.stdin).unwrap_or_else(|e| {
            panic!(
                "stdin of {} is not JSON ({e}): {}",
                self.plugin,
                String::from_utf8_lossy(&self.stdin)
            )
        })
    }

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

/// Writes the data file `path` with exactly `contents` and `mode` (not
/// masked by the umask). Never for a file that is executed: that is
/// [`write_executable`]'s.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> PathBuf {
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
