//! `cnid-shim` as a runtime runs it, the runtime's side of the two-dir
//! layout, and the Go clients (libcni's cnitool, containerd's go-cni)
//! built from Debian's sources.
//!
//! [`Runtime`] is a runtime's conf dir (the shim's list), plugin dir (the
//! shim) and libcni cache dir, under the test's [`Dirs`] root; cnid keeps
//! its own conf, cache and state dirs. [`go_tool`] builds a Go program of
//! `cnid/tests/go/` once per test process into the target's temp dir.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{LazyLock, Mutex, OnceLock};

use serde_json::{Value, json};

use super::daemon::Dirs;

/// The built shim (package `cnid-shim`, `cnid/shim`): found next to
/// cnid's binaries, as cnitool is (`cargo build -p cnid-shim` first when
/// running one test target of cnid).
pub static SHIM: LazyLock<String> = LazyLock::new(|| {
    super::tool::built_binary("shim", "cnid-shim")
        .to_str()
        .expect("target dir path is UTF-8")
        .to_owned()
});
/// The built noop plugin.
pub use super::noop::NOOP;

/// Where Debian puts Go sources (`golang-github-appc-cni-dev`,
/// `golang-github-containerd-go-cni-dev`).
pub const GOPATH: &str = "/usr/share/gocode";

/// A runtime's dirs: `rt/net.d` (conf), `rt/bin` (plugins: the shim),
/// `rt/cache` (libcni's cache).
#[derive(Debug)]
pub struct Runtime {
    pub conf: PathBuf,
    pub bin: PathBuf,
    pub cache: PathBuf,
}

impl Runtime {
    /// Creates the dirs under `dirs.root()/rt` and links the shim into the
    /// plugin dir.
    pub fn new(dirs: &Dirs) -> Runtime {
        let root = dirs.root().join("rt");
        let rt = Runtime {
            conf: root.join("net.d"),
            bin: root.join("bin"),
            cache: root.join("cache"),
        };
        for d in [&rt.conf, &rt.bin, &rt.cache] {
            fs::create_dir_all(d).expect("create runtime dir");
        }
        std::os::unix::fs::symlink(&*SHIM, rt.bin.join("cnid-shim")).expect("link the shim");
        rt
    }

    /// `CNI_PATH` for a runtime that also runs the loopback plugin itself.
    pub fn plugin_path(&self) -> String {
        format!("{}:/usr/lib/cni", self.bin.display())
    }

    /// Writes the shim's list `00-cnid.conflist`.
    pub fn list(&self, list: &Value) -> PathBuf {
        let path = self.conf.join("00-cnid.conflist");
        fs::write(&path, serde_json::to_vec_pretty(list).unwrap()).expect("write the shim list");
        path
    }

    /// The entries in libcni's result cache.
    pub fn cached(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.cache.join("results"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// The shim's list for `network` on `socket`, in `version`.
pub fn shim_list(name: &str, version: &str, socket: &Path, extra: Value) -> Value {
    let mut plugin = json!({"type": "cnid-shim", "socket": socket});
    for (k, v) in extra.as_object().expect("extra is an object") {
        plugin[k] = v.clone();
    }
    json!({"cniVersion": version, "name": name, "plugins": [plugin]})
}

/// One call of the shim, as a runtime makes it.
#[derive(Debug, Clone)]
pub struct Call {
    pub command: String,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub config: Value,
}

impl Call {
    pub fn new(command: &str, container_id: &str, netns: &str, config: &Value) -> Call {
        Call {
            command: command.into(),
            container_id: container_id.into(),
            netns: netns.into(),
            ifname: "eth0".into(),
            args: String::new(),
            config: config.clone(),
        }
    }

    pub fn args(mut self, args: &str) -> Call {
        self.args = args.into();
        self
    }

    pub fn ifname(mut self, ifname: &str) -> Call {
        self.ifname = ifname.into();
        self
    }

    /// The shim's command with a runtime's environment (the test's own CNI
    /// variables removed).
    pub fn command(&self) -> Command {
        self.command_of(Path::new(&*SHIM))
    }

    /// [`Call::command`] for another copy of the shim.
    pub fn command_of(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        for v in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_ARGS",
            "CNI_PATH",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("CNI_COMMAND", &self.command)
            .env("CNI_CONTAINERID", &self.container_id)
            .env("CNI_NETNS", &self.netns)
            .env("CNI_IFNAME", &self.ifname)
            .env("CNI_ARGS", &self.args)
            .env("CNI_PATH", "/nonexistent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Starts the shim and writes its stdin.
    pub fn spawn(&self) -> Child {
        self.spawn_of(Path::new(&*SHIM))
    }

    /// [`Call::spawn`] for another copy of the shim.
    pub fn spawn_of(&self, program: &Path) -> Child {
        let mut child = self.command_of(program).spawn().expect("spawn cnid-shim");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(&serde_json::to_vec(&self.config).unwrap())
            .expect("write the shim's stdin");
        drop(stdin);
        child
    }

    /// Runs the shim to the end.
    pub fn run(&self) -> ShimOutput {
        self.run_of(Path::new(&*SHIM))
    }

    /// [`Call::run`] for another copy of the shim.
    pub fn run_of(&self, program: &Path) -> ShimOutput {
        ShimOutput::from(
            self.spawn_of(program)
                .wait_with_output()
                .expect("wait for cnid-shim"),
        )
    }
}

/// What the shim printed.
#[derive(Debug, Clone)]
pub struct ShimOutput {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for ShimOutput {
    fn from(o: Output) -> Self {
        ShimOutput {
            success: o.status.success(),
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl ShimOutput {
    /// The result of a successful ADD.
    #[track_caller]
    pub fn result(&self) -> Value {
        assert!(self.success, "the shim failed: {self:?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("the shim's result is not JSON ({e}): {self:?}"))
    }

    /// Success with nothing on stdout.
    #[track_caller]
    pub fn ok(&self) {
        assert!(
            self.success && self.stdout.is_empty(),
            "the shim failed: {self:?}"
        );
    }

    /// The CNI error object of a failed call (exit status 1).
    #[track_caller]
    pub fn error(&self) -> Value {
        assert_eq!(self.code, Some(1), "expected a failure: {self:?}");
        let v: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("the shim's error is not JSON ({e}): {self:?}"));
        assert!(
            v["code"].is_u64() && v["msg"].is_string(),
            "not a CNI error: {v}"
        );
        v
    }
}

/// The first IPv4 address (`a.b.c.d/len`) of a result.
#[track_caller]
pub fn ipv4_of(result: &Value) -> String {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .find(|a| !a.contains(':'))
        .unwrap_or_else(|| panic!("no IPv4 address in {result}"))
        .to_owned()
}

/// The ports of a bridge.
pub use cni_test_support::netns::bridge_ports;

/// A plugin script for cnid's chains: records its stdin and `CNI_ARGS`
/// under `records` (`<container>.<start ns>.{stdin,args}`, and a `.run`
/// line `COMMAND CONTAINER START END` when it ends), then behaves as
/// cni-noop (ADD passes `prevResult` on byte for byte).
pub fn capture_plugin(records: &Path) -> String {
    format!(
        r#"R={r}
s=$(date +%s%N)
f="$R/${{CNI_CONTAINERID:-none}}.$s.$$"
printf '%s' "$CNI_ARGS" > "$f.args"
tee "$f.stdin" | {noop}
rc=$?
[ "$CNI_COMMAND" = VERSION ] || echo "$CNI_COMMAND ${{CNI_CONTAINERID:--}} $s $(date +%s%N)" > "$f.run"
exit $rc"#,
        r = records.display(),
        noop = NOOP
    )
}

/// What a capture plugin recorded for one container: (command, start, end)
/// in start order.
pub fn captured_runs(records: &Path, container: &str) -> Vec<(String, u128, u128)> {
    let mut runs: Vec<(String, u128, u128)> = fs::read_dir(records)
        .expect("records dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".run"))
        .filter_map(|e| {
            let text = fs::read_to_string(e.path()).ok()?;
            let f: Vec<&str> = text.split_whitespace().collect();
            (f.len() == 4 && f[1] == container).then(|| {
                (
                    f[0].to_owned(),
                    f[2].parse().ok().unwrap_or(0),
                    f[3].parse().ok().unwrap_or(0),
                )
            })
        })
        .collect();
    runs.sort_by_key(|r| r.1);
    runs
}

/// The stdin a capture plugin got for `command` of `container` (the last).
pub fn captured_stdin(records: &Path, container: &str, command: &str) -> Value {
    let mut found: Vec<(u128, Value)> = Vec::new();
    for e in fs::read_dir(records).expect("records dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".stdin") else {
            continue;
        };
        let parts: Vec<&str> = stem.rsplitn(3, '.').collect();
        if parts.len() != 3 || parts[2] != container {
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&fs::read(e.path()).unwrap_or_default()) else {
            continue;
        };
        let run = records.join(format!("{stem}.run"));
        let cmd = fs::read_to_string(&run).unwrap_or_default();
        if cmd.split_whitespace().next() == Some(command) {
            found.push((parts[1].parse().unwrap_or(0), v));
        }
    }
    found.sort_by_key(|f| f.0);
    found
        .pop()
        .unwrap_or_else(|| {
            panic!(
                "no {command} of {container} recorded in {}",
                records.display()
            )
        })
        .1
}

/// The `CNI_ARGS` a capture plugin got for the first run of `container`.
pub fn captured_args(records: &Path, container: &str) -> String {
    let mut found: Vec<PathBuf> = fs::read_dir(records)
        .expect("records dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(&format!("{container}.")) && n.ends_with(".args")
        })
        .collect();
    found.sort();
    fs::read_to_string(found.first().expect("an args record")).unwrap_or_default()
}

/// Why a Go program cannot be built here, if it cannot.
fn go_missing() -> Option<String> {
    let go = Command::new("go").arg("version").output();
    if !go.is_ok_and(|o| o.status.success()) {
        return Some("`go` is not installed (Debian: golang-go)".into());
    }
    for (pkg, dir) in [
        (
            "golang-github-appc-cni-dev",
            "github.com/containernetworking/cni/libcni",
        ),
        (
            "golang-github-containerd-go-cni-dev",
            "github.com/containerd/go-cni",
        ),
    ] {
        if !Path::new(GOPATH).join("src").join(dir).is_dir() {
            return Some(format!("{GOPATH}/src/{dir} is missing (Debian: {pkg})"));
        }
    }
    None
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Builds `cnid/tests/go/<name>` (GOPATH mode on Debian's sources, no
/// module downloads) into the target's temp dir, once per test process.
/// `None` (the test then skips, saying why) only when Go or the sources are
/// missing and we are not root; as root their absence fails the test:
/// `make setup` installs them.
pub fn go_tool(name: &str) -> Option<PathBuf> {
    static BUILT: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(Vec::new()));
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
        return Some(p.clone());
    }
    if let Some(why) = go_missing() {
        assert!(
            !is_root(),
            "cannot build the Go client {name}: {why}; run `make setup` (as root it installs golang-go, golang-github-appc-cni-dev and golang-github-containerd-go-cni-dev)"
        );
        eprintln!(
            "SKIPPED: the Go client {name} cannot be built: {why}, and only root may install it (make setup)"
        );
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/go")
        .join(name);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let out_dir = tmp.join("go-bin");
    fs::create_dir_all(&out_dir).expect("create go-bin");
    let out = out_dir.join(name);
    // Several test binaries may build at once: each to its own name, then
    // renamed into place.
    let part = out_dir.join(format!(".{name}.{}", std::process::id()));
    let o = Command::new("go")
        .args(["build", "-o"])
        .arg(&part)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", tmp.join("go-cache"))
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .stdin(Stdio::null())
        .output()
        .expect("run go build");
    assert!(
        o.status.success(),
        "go build of {} failed: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    fs::set_permissions(&part, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::rename(&part, &out).expect("rename the Go binary into place");
    built.push((name.to_owned(), out.clone()));
    Some(out)
}

/// The shim's plugin configuration as a runtime builds it from the list
/// (its stdin): `name`, `cniVersion`, `type`, `socket`, plus `extra`.
pub fn plugin_conf(name: &str, version: &str, socket: &Path, extra: Value) -> Value {
    let mut conf =
        json!({"cniVersion": version, "name": name, "type": "cnid-shim", "socket": socket});
    for (k, v) in extra.as_object().expect("extra is an object") {
        conf[k] = v.clone();
    }
    conf
}
