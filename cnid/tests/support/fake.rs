//! Fake plugins: real `#!/bin/sh` executables written into a test temp dir
//! (the ideas of `cni-async/tests/support/fake.rs`, trimmed to what the
//! cnitool tests need).
//!
//! A recording fake leaves, per invocation, its name, the exact stdin bytes
//! and its exact environment (`/proc/$$/environ`) under `records/N/`.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A dir of fake plugins (`bin/`) and their records (`records/`).
#[derive(Debug)]
pub struct PluginDir {
    bin: PathBuf,
    records: PathBuf,
    outputs: PathBuf,
    counter: AtomicUsize,
}

impl PluginDir {
    /// `bin/`, `records/` and `outputs/` under `root` (created).
    pub fn new(root: &Path) -> Self {
        let dir = PluginDir {
            bin: root.join("bin"),
            records: root.join("records"),
            outputs: root.join("outputs"),
            counter: AtomicUsize::new(0),
        };
        for d in [&dir.bin, &dir.records, &dir.outputs] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        dir
    }

    /// The plugin dir.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Writes an executable shell script `bin/<name>`: `#!/bin/sh` then `body`.
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        write_file(
            &self.bin.join(name),
            format!("#!/bin/sh\n{body}\n").as_bytes(),
            0o755,
        )
    }

    /// Writes a recording fake plugin `bin/<name>`.
    pub fn fake(&self, name: &str, fake: &Fake) -> PathBuf {
        let mut body = format!(
            "REC={rec}\n\
             i=0\n\
             while ! mkdir \"$REC/$i\" 2>/dev/null; do i=$((i+1)); done\n\
             printf '%s' {name} > \"$REC/$i/plugin\"\n\
             cat /proc/$$/environ > \"$REC/$i/env\"\n\
             cat > \"$REC/$i/stdin\"\n\
             case \"$CNI_COMMAND\" in\n",
            rec = sh_quote(&self.records.to_string_lossy()),
            name = sh_quote(name),
        );
        for (command, response) in &fake.on {
            body.push_str(&format!("{})\n", sh_quote(command)));
            body.push_str(&self.response_lines(response));
            body.push_str(";;\n");
        }
        body.push_str("*)\n");
        body.push_str(&self.response_lines(&fake.default));
        body.push_str(";;\nesac\n");
        self.script(name, &body)
    }

    fn response_lines(&self, r: &Response) -> String {
        let mut s = format!("{}\n", r.shell);
        for (bytes, redirect) in [(&r.stdout, ""), (&r.stderr, " >&2")] {
            if bytes.is_empty() {
                continue;
            }
            let n = self.counter.fetch_add(1, Ordering::Relaxed);
            let path = write_file(&self.outputs.join(n.to_string()), bytes, 0o644);
            s.push_str(&format!(
                "cat {}{redirect}\n",
                sh_quote(&path.to_string_lossy())
            ));
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
}

impl Fake {
    /// A fake that answers every command with `default`.
    pub fn new(default: Response) -> Self {
        Fake {
            default,
            on: Vec::new(),
        }
    }

    /// A well-behaved plugin of `version`: ADD prints a result with one
    /// interface and `ip`, VERSION lists the usual versions, the rest succeed
    /// silently.
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

/// One answer of a fake: shell lines first, then stdout, stderr, exit status.
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
}

/// Single-quotes `s` for the shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Writes `path` with exactly `contents` and `mode`.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> PathBuf {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(contents).expect("write file");
    drop(f);
    // The mode given to open is masked by the umask; set it exactly.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod file");
    path.to_owned()
}
