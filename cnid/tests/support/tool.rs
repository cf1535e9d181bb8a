//! Running the built `cnitool` binary in a sandbox of temp dirs.
//!
//! [`Sandbox`] owns a temp dir with `net.d/` (`NETCONFPATH`), `cache/`
//! (`CNI_CACHE_DIR`) and a [`PluginDir`] (`CNI_PATH`). [`Sandbox::cnitool`]
//! builds the command with the cnitool variables of the test process
//! removed and these set, so tests do not depend on the caller's
//! environment.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fake::PluginDir;

/// The built `cnitool` (package `cnitool`, `cnid/cnitool`), in this
/// target dir next to cnid's binaries: `cargo test --workspace` builds it
/// before any test runs; for one test target of cnid, `cargo build -p
/// cnitool` first. Cargo only passes a package's own binaries to its tests,
/// hence the lookup; [`built_binary`] refuses a missing or stale one.
pub static CNITOOL: LazyLock<PathBuf> = LazyLock::new(|| built_binary("cnitool", "cnitool"));

/// The binary `name` of the package in `cnid/<dir>` (cnitool, cnid-shim),
/// found next to `cnid`, and checked to be newer than its sources.
pub fn built_binary(dir: &str, name: &str) -> PathBuf {
    let package = format!("{dir}/Cargo.toml");
    let bin = Path::new(env!("CARGO_BIN_EXE_cnid")).with_file_name(name);
    let built = fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: build it with `cargo build --manifest-path cnid/{package}`",
                bin.display()
            )
        });
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut dirs = vec![sources.join("src")];
    let mut newest = fs::metadata(sources.join("Cargo.toml"))
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("cnid/{package}: {e}"));
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let entry = entry.expect("source dir entry");
            let meta = entry.metadata().expect("source dir entry");
            if meta.is_dir() {
                dirs.push(entry.path());
            } else {
                newest = newest.max(meta.modified().expect("mtime"));
            }
        }
    }
    assert!(
        built >= newest,
        "{} is older than its sources: rebuild it with `cargo build --manifest-path cnid/{package}`",
        bin.display()
    );
    bin
}

/// Every variable cnitool reads; removed from the test process's
/// environment before each run.
pub const CNITOOL_VARS: &[&str] = &[
    "NETCONFPATH",
    "CNI_PATH",
    "CNI_ARGS",
    "CAP_ARGS",
    "CNI_IFNAME",
    "CNI_CACHE_DIR",
    "CNI_TIMEOUT",
    "CNITOOL_JSON_ERRORS",
    "CNID_SOCKET",
    "RUST_LOG",
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
];

/// A temp dir with a conf dir, a cache dir and fake plugins.
#[derive(Debug)]
pub struct Sandbox {
    tmp: tempfile::TempDir,
    /// The fake plugins.
    pub plugins: PluginDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// A fresh sandbox.
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("cnitool-test-")
            .tempdir()
            .expect("create temp dir");
        let plugins = PluginDir::in_dir(tmp.path());
        fs::create_dir(tmp.path().join("net.d")).expect("create net.d");
        Sandbox { tmp, plugins }
    }

    /// The temp dir.
    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// A netns path that exists: `<root>/netns/<name>`, an empty file
    /// (cnitool refuses ADD and CHECK on a path that does not exist; fake
    /// plugins never enter it).
    pub fn netns(&self, name: &str) -> String {
        let dir = self.root().join("netns");
        fs::create_dir_all(&dir).expect("create netns dir");
        let path = dir.join(name);
        fs::write(&path, b"").expect("create netns file");
        path.to_str().expect("temp paths are UTF-8").to_owned()
    }

    /// `NETCONFPATH`.
    pub fn net_dir(&self) -> PathBuf {
        self.root().join("net.d")
    }

    /// `CNI_CACHE_DIR`.
    pub fn cache_dir(&self) -> PathBuf {
        self.root().join("cache")
    }

    /// Writes `net.d/<file>` with `config` (pretty JSON); returns its path.
    pub fn conf(&self, file: &str, config: &Value) -> PathBuf {
        let path = self.net_dir().join(file);
        fs::write(
            &path,
            serde_json::to_vec_pretty(config).expect("encode config"),
        )
        .expect("write config");
        path
    }

    /// Writes `net.d/<name>.conflist`: a list of `version` named `name` with
    /// these plugin objects.
    pub fn conflist(&self, name: &str, version: &str, plugins: &[Value]) -> PathBuf {
        self.conf(
            &format!("{name}.conflist"),
            &serde_json::json!({"cniVersion": version, "name": name, "plugins": plugins}),
        )
    }

    /// The names of the files in `cache/results/` (sorted; empty if none).
    pub fn cache_entries(&self) -> Vec<String> {
        let mut names: Vec<String> = match fs::read_dir(self.cache_dir().join("results")) {
            Ok(entries) => entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    /// The cache record of an attachment, parsed, if there is one.
    pub fn cache_record(&self, network: &str, container_id: &str, ifname: &str) -> Option<Value> {
        let path = self
            .cache_dir()
            .join("results")
            .join(format!("{network}-{container_id}-{ifname}"));
        let bytes = fs::read(path).ok()?;
        Some(serde_json::from_slice(&bytes).expect("cache record is JSON"))
    }

    /// `cnitool ARGS` with `NETCONFPATH`, `CNI_PATH` and `CNI_CACHE_DIR` set
    /// to the sandbox, the rest of cnitool's variables unset, and the temp
    /// dir as working directory (`PWD` removed).
    pub fn cnitool(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&*CNITOOL);
        for var in CNITOOL_VARS {
            cmd.env_remove(var);
        }
        cmd.env_remove("PWD")
            .env("NETCONFPATH", self.net_dir())
            .env("CNI_PATH", self.plugins.bin())
            .env("CNI_CACHE_DIR", self.cache_dir())
            .current_dir(self.root())
            .stdin(Stdio::null())
            .args(args);
        cmd
    }

    /// Runs `cnitool ARGS` with extra environment variables.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.cnitool(args);
        cmd.envs(env.iter().copied());
        Run::of(cmd)
    }

    /// Runs `cnitool ARGS`.
    pub fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }
}

/// What one run of cnitool did.
#[derive(Debug)]
pub struct Run {
    /// The command line (for messages).
    pub line: String,
    /// Its exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
}

impl Run {
    /// Runs `cmd` to completion.
    pub fn of(mut cmd: Command) -> Run {
        let line = format!("{cmd:?}");
        let start = Instant::now();
        let Output {
            status,
            stdout,
            stderr,
        } = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {line}: {e}"));
        Run {
            line,
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            elapsed: start.elapsed(),
        }
    }

    /// Panics unless it exited 0; returns itself.
    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code,
            Some(0),
            "{} failed\nstdout: {}\nstderr: {}",
            self.line,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless it exited 1 with empty stdout and something on stderr;
    /// returns the stderr.
    #[track_caller]
    pub fn fails(self) -> String {
        assert_eq!(
            self.code,
            Some(1),
            "{} should have failed with status 1\nstdout: {}\nstderr: {}",
            self.line,
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stdout, "", "a failure prints nothing on stdout");
        assert!(
            !self.stderr.trim().is_empty(),
            "a failure explains itself on stderr"
        );
        self.stderr
    }

    /// Panics unless it exited 1 with a CNI error object on stderr; returns it.
    #[track_caller]
    pub fn fails_json(self) -> Value {
        let stderr = self.fails();
        let v: Value = serde_json::from_str(&stderr)
            .unwrap_or_else(|e| panic!("stderr is not one JSON value ({e}): {stderr}"));
        assert!(v["code"].is_u64(), "no numeric code: {v}");
        assert!(v["msg"].is_string(), "no msg: {v}");
        v
    }

    /// stdout parsed as JSON.
    #[track_caller]
    pub fn stdout_json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// The container ID cnitool must derive for the absolute netns path `abs`,
/// computed independently of cnitool's code: `cnitool-` + the first 20 hex
/// digits of `sha512sum` (coreutils) of the path.
pub fn expected_container_id(abs: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", "printf '%s' \"$1\" | sha512sum", "sh", abs])
        .output()
        .expect("run sha512sum");
    assert!(out.status.success(), "sha512sum failed");
    let hex = String::from_utf8(out.stdout).expect("hex");
    format!("cnitool-{}", &hex[..20])
}
