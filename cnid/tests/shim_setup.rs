//! Putting cnid-shim on a node: `cnid-shim install` waits for cnid, copies
//! itself into the runtime's plugin dir and writes the runtime's list
//! (capabilities copied) atomically; `--stay` follows changes of cnid's
//! network; `uninstall` takes it away; `health` probes. And the Kubernetes
//! manifests in `contrib/kubernetes`: parsed, the required fields and host
//! paths checked, and the DaemonSet's own commands (cnid, the probes, the
//! install step) run on a node laid out in a temp dir, where a runtime's
//! ADD then goes through the installed shim.

use crate::support;
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::daemon::{CNID, Daemon, Dirs, eventually};
use crate::support::shim::{Call, NOOP, SHIM};
use cnid::shim::conf::DEFAULT_SOCKET;
use cnid::shim::setup::{DEFAULT_FILE, Opts};
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

fn shim(args: &[&str]) -> std::process::Output {
    Command::new(&*SHIM)
        .args(args)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .expect("run cnid-shim")
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn install_waits_for_cnid_then_writes_the_list_and_uninstall_removes_it() {
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    fs::create_dir_all(&records).unwrap();
    let caps = json!({"portMappings": true, "bandwidth": true});
    let conf = dirs.conf(
        "10-podnet.conflist",
        &json!({"cniVersion": "1.1.0", "name": "podnet", "plugins": [
            {"type": "cni-noop", "capabilities": caps}
        ]}),
    );
    std::os::unix::fs::symlink(NOOP, dirs.bin.join("cni-noop")).unwrap();
    let (rt_conf, rt_bin) = (dirs.root().join("rt/net.d"), dirs.root().join("rt/bin"));
    fs::create_dir_all(&rt_conf).unwrap();
    fs::create_dir_all(&rt_bin).unwrap();
    let socket = dirs.socket.display().to_string();

    // Before cnid runs: install waits, and writes nothing.
    let mut install = Command::new(&*SHIM)
        .args([
            "install",
            "--socket",
            &socket,
            "--wait",
            "60s",
            "--stay",
            "--refresh",
            "1s",
        ])
        .arg("--conf-dir")
        .arg(&rt_conf)
        .arg("--plugin-dir")
        .arg(&rt_bin)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(install.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("waiting for cnid:"), "{first}");
    assert!(files(&rt_conf).is_empty() && files(&rt_bin).is_empty());
    let health = shim(&["health", "--socket", &socket]);
    assert_eq!(health.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&health.stderr).contains(&socket),
        "{health:?}"
    );

    let _daemon = Daemon::start(&dirs, &[]);
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(
        next(),
        format!("installed {}", rt_bin.join("cnid-shim").display())
    );
    assert!(next().starts_with(&format!("wrote {}", rt_conf.join(DEFAULT_FILE).display())));
    let list: Value =
        serde_json::from_slice(&fs::read(rt_conf.join(DEFAULT_FILE)).unwrap()).unwrap();
    assert_eq!(
        list,
        json!({"cniVersion": "1.0.0", "cniVersions": ["1.0.0", "1.1.0"], "name": "podnet",
               "plugins": [{"type": "cnid-shim", "socket": socket, "network": "podnet", "capabilities": caps}]})
    );
    // Only the two files: no temp file left behind.
    assert_eq!(files(&rt_conf), [DEFAULT_FILE]);
    assert_eq!(files(&rt_bin), ["cnid-shim"]);
    let copy = rt_bin.join("cnid-shim");
    assert_eq!(
        fs::metadata(&copy).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(fs::read(&copy).unwrap(), fs::read(&*SHIM).unwrap());
    assert!(shim(&["health", "--socket", &socket]).status.success());

    // The installed copy works as the runtime's plugin.
    // A link to the daemon's own network namespace (the fake plugins never
    // enter it; cnid wants a network namespace).
    let ns = dirs.data.join("netns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &ns).unwrap();
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = json!("podnet");
    plugin["cniVersion"] = json!("1.0.0");
    let out = Call::new("ADD", "c1", &ns.display().to_string(), &plugin).run_of(&copy);
    assert_eq!(out.result()["cniVersion"], "1.0.0");
    Call::new("DEL", "c1", "", &plugin).run().ok();

    // --stay: cnid's network changes (a capability less), the list follows.
    let mut changed: Value = serde_json::from_slice(&fs::read(&conf).unwrap()).unwrap();
    changed["plugins"][0]["capabilities"] = json!({"portMappings": true});
    fs::write(
        dirs.conf.join(".tmp"),
        serde_json::to_vec(&changed).unwrap(),
    )
    .unwrap();
    fs::rename(dirs.conf.join(".tmp"), &conf).unwrap();
    assert!(next().starts_with("rewrote"));
    let list: Value =
        serde_json::from_slice(&fs::read(rt_conf.join(DEFAULT_FILE)).unwrap()).unwrap();
    assert_eq!(
        list["plugins"][0]["capabilities"],
        json!({"portMappings": true})
    );
    install.kill().unwrap();
    install.wait().unwrap();

    // uninstall removes both, and is idempotent; it leaves others' files.
    let rt = |s: &'static str| {
        [
            s,
            "--conf-dir",
            rt_conf.to_str().unwrap(),
            "--plugin-dir",
            rt_bin.to_str().unwrap(),
        ]
    };
    let out = shim(&rt("uninstall"));
    assert!(out.status.success(), "{out:?}");
    assert!(files(&rt_conf).is_empty() && files(&rt_bin).is_empty());
    assert!(shim(&rt("uninstall")).status.success());
    fs::write(
        rt_conf.join(DEFAULT_FILE),
        br#"{"name":"other","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let out = shim(&rt("uninstall"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("left alone"),
        "{out:?}"
    );
    assert_eq!(files(&rt_conf), [DEFAULT_FILE]);

    // Bad flags are named.
    let out = shim(&["install", "--plugin-dir", "/x"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--conf-dir is required"),
        "{out:?}"
    );
    let out = shim(&["config", "--cni-version", "7"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cni-version"),
        "{out:?}"
    );
}

/// An install killed between its temp file and the rename (a `kill -9`, a
/// node losing power) left the temp file in the runtime's plugin dir (a
/// whole copy of the shim) and conf dir, and no later install removed it:
/// each crash leaked one. An install now removes those of writers that are
/// gone, once they are old enough (a writer in another pid namespace shows
/// a pid that may name no process here); a live writer's, a young one and
/// other tools' files stay.
#[test]
fn install_removes_the_temp_files_of_killed_installs() {
    let dirs = Dirs::new();
    dirs.conf(
        "10-podnet.conflist",
        &json!({"cniVersion": "1.1.0", "name": "podnet", "plugins": [{"type": "cni-noop"}]}),
    );
    std::os::unix::fs::symlink(NOOP, dirs.bin.join("cni-noop")).unwrap();
    let (rt_conf, rt_bin) = (dirs.root().join("rt/net.d"), dirs.root().join("rt/bin"));
    fs::create_dir_all(&rt_conf).unwrap();
    fs::create_dir_all(&rt_bin).unwrap();
    let dead = cni_test_support::process::unused_pid();
    let me = std::process::id();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let put = |dir: &Path, name: String, aged: bool| {
        let p = dir.join(&name);
        fs::write(&p, b"half").unwrap();
        if aged {
            fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        name
    };
    put(&rt_bin, format!(".cnid-shim.tmp-{dead}-1"), true);
    put(&rt_conf, format!(".{DEFAULT_FILE}.tmp-{dead}-2"), true);
    let young = put(&rt_conf, format!(".{DEFAULT_FILE}.tmp-{dead}-3"), false);
    let live = put(&rt_bin, format!(".cnid-shim.tmp-{me}-4"), true);
    let other = put(&rt_bin, ".other-tool.tmp".to_owned(), true);

    let _daemon = Daemon::start(&dirs, &[]);
    let socket = dirs.socket.display().to_string();
    let out = shim(&[
        "install",
        "--socket",
        &socket,
        "--wait",
        "60s",
        "--conf-dir",
        rt_conf.to_str().unwrap(),
        "--plugin-dir",
        rt_bin.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(files(&rt_bin), [live, other, "cnid-shim".to_owned()]);
    assert_eq!(files(&rt_conf), [young, DEFAULT_FILE.to_owned()]);
}

fn yaml_to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(a) => Value::Array(a.iter().map(yaml_to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = k
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("{k:?}"));
                    (key, yaml_to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unsupported YAML node {other:?}"),
    }
}

fn manifests() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/kubernetes/cnid.yaml");
    let text = fs::read_to_string(&path).unwrap();
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
        .iter()
        .map(yaml_to_json)
        .collect()
}

/// `--flag=value` arguments as a map (a flag without value maps to "").
fn flags(args: &[Value]) -> BTreeMap<String, String> {
    args.iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            assert!(a.starts_with("--"), "argument {a:?} is not --flag[=value]");
            match a.split_once('=') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (a.to_owned(), String::new()),
            }
        })
        .collect()
}

/// A container of the pod template by name.
fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// Maps a path inside `c` to the host path its volume mounts (hostPath
/// volumes of `pod`).
fn host_path(pod: &Value, c: &Value, path: &str) -> Option<String> {
    let volumes = pod["volumes"].as_array().unwrap();
    c["volumeMounts"].as_array()?.iter().find_map(|m| {
        let mount = m["mountPath"].as_str()?;
        let rest = path
            .strip_prefix(mount)
            .filter(|r| r.is_empty() || r.starts_with('/'))?;
        let vol = volumes.iter().find(|v| v["name"] == m["name"])?;
        Some(format!("{}{rest}", vol["hostPath"]["path"].as_str()?))
    })
}

#[test]
fn kubernetes_manifests_are_complete_and_consistent_and_run_on_a_node_in_a_temp_dir() {
    let docs = manifests();
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    assert_eq!(ds["apiVersion"], "apps/v1");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["operator"] == "Exists")
    );
    for v in pod["volumes"].as_array().unwrap() {
        assert!(
            v["hostPath"]["path"].is_string(),
            "volume {v} is not a hostPath"
        );
    }
    let cnid = container(pod, "cnid");
    let install = container(pod, "install-shim");
    assert_eq!(cnid["securityContext"]["privileged"], true);
    assert_eq!(cnid["image"], install["image"]);

    // cnid: every flag exists; the socket is the shim's default; its conf
    // and cache dirs are not the runtime's.
    let cmd = cnid["command"].as_array().unwrap();
    assert_eq!(cmd[0], "/usr/local/bin/cnid");
    let cnid_flags = flags(&cmd[1..]);
    let help =
        String::from_utf8(Command::new(CNID).arg("--help").output().unwrap().stdout).unwrap();
    for f in cnid_flags.keys() {
        assert!(help.contains(&format!("{f} ")), "cnid has no flag {f}");
    }
    assert_eq!(cnid_flags["--socket"], DEFAULT_SOCKET);
    assert_ne!(
        cnid_flags["--conf-dir"], "/etc/cni/net.d",
        "cnid must not read the runtime's conf dir"
    );
    assert!(
        !cnid_flags["--cache-dir"].starts_with("/var/lib/cni/"),
        "libcni's cache dir"
    );
    assert_ne!(
        cnid_flags["--cache-dir"], "/var/lib/cni",
        "libcni's cache dir"
    );
    // Every host path a node needs is mounted where the host has it.
    for (path, propagation) in [
        ("/run/cnid", None),
        ("/var/lib/cni", None),
        ("/var/lib/cnid", None),
        ("/run/netns", Some("HostToContainer")),
        ("/opt/cni/bin", None),
        (cnid_flags["--conf-dir"].as_str(), None),
    ] {
        assert_eq!(
            host_path(pod, cnid, path).as_deref(),
            Some(path),
            "cnid's {path}"
        );
        if let Some(p) = propagation {
            let m = cnid["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["mountPath"] == path)
                .unwrap();
            assert_eq!(m["mountPropagation"], p, "{path}");
        }
    }
    for dir in [
        "--socket",
        "--conf-dir",
        "--plugin-dir",
        "--cache-dir",
        "--state-dir",
    ] {
        assert!(
            host_path(pod, cnid, &cnid_flags[dir]).is_some(),
            "{dir} is not on a host path"
        );
    }
    // The probes: cnid-shim health on cnid's socket.
    for probe in ["readinessProbe", "livenessProbe"] {
        let c = cnid[probe]["exec"]["command"]
            .as_array()
            .unwrap_or_else(|| panic!("no {probe}"));
        assert_eq!(
            (c[0].as_str(), c[1].as_str()),
            (Some("/usr/local/bin/cnid-shim"), Some("health"))
        );
        let args: Vec<String> = c[2..]
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let o = Opts::parse(&args).unwrap_or_else(|e| panic!("{probe}: {e}"));
        assert_eq!(o.socket.to_str(), Some(DEFAULT_SOCKET));
        assert!(
            cnid[probe]["timeoutSeconds"].as_u64().unwrap() > o.probe_timeout.as_secs(),
            "{probe}"
        );
    }
    // install-shim: the runtime's dirs, cnid's socket at the same path.
    let ic = install["command"].as_array().unwrap();
    assert_eq!(
        (ic[0].as_str(), ic[1].as_str()),
        (Some("/usr/local/bin/cnid-shim"), Some("install"))
    );
    let iargs: Vec<String> = ic[2..]
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let io = Opts::parse(&iargs).unwrap();
    assert!(
        io.stay,
        "install-shim must keep running (a DaemonSet container)"
    );
    assert_eq!(io.socket.to_str(), Some(DEFAULT_SOCKET));
    assert_eq!(
        host_path(pod, install, DEFAULT_SOCKET),
        host_path(pod, cnid, DEFAULT_SOCKET)
    );
    assert_eq!(
        host_path(pod, install, DEFAULT_SOCKET).as_deref(),
        Some(DEFAULT_SOCKET)
    );
    let io_conf = io.conf_dir.as_ref().unwrap().to_str().unwrap();
    assert_eq!(
        host_path(pod, install, io_conf).as_deref(),
        Some("/etc/cni/net.d")
    );
    let io_bin = io.plugin_dir.as_ref().unwrap().to_str().unwrap();
    assert_eq!(
        host_path(pod, install, io_bin).as_deref(),
        Some("/opt/cni/bin")
    );
    assert!(
        io.file.as_str() < "10-",
        "the shim's list must sort before the usual 10-* files"
    );

    // The image has the binaries where the manifests run them.
    let cf = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/kubernetes/Containerfile"),
    )
    .unwrap();
    assert!(
        cf.contains("COPY --from=build /out/ /usr/local/bin/"),
        "{cf}"
    );
    for bin in ["target/release/cnid ", "release/cnid-shim", "make shim"] {
        assert!(cf.contains(bin), "the Containerfile lacks {bin:?}");
    }

    // The DaemonSet's commands on a node laid out under a temp dir: every
    // host path P is <root>P.
    let node = tempfile::Builder::new()
        .prefix("cnid-node-")
        .tempdir()
        .unwrap();
    let root = node.path();
    let on_node = |c: &Value, arg: &str| -> String {
        match arg.split_once('=') {
            Some((k, v)) if v.starts_with('/') => {
                let host =
                    host_path(pod, c, v).unwrap_or_else(|| panic!("{arg} is not on a host path"));
                format!("{k}={}{host}", root.display())
            }
            _ => arg.to_owned(),
        }
    };
    for v in pod["volumes"].as_array().unwrap() {
        fs::create_dir_all(format!(
            "{}{}",
            root.display(),
            v["hostPath"]["path"].as_str().unwrap()
        ))
        .unwrap();
    }
    let cnid_conf = PathBuf::from(format!("{}{}", root.display(), cnid_flags["--conf-dir"]));
    let plugin_dir = PathBuf::from(format!("{}/opt/cni/bin", root.display()));
    std::os::unix::fs::symlink(NOOP, plugin_dir.join("cni-noop")).unwrap();
    fs::write(
        cnid_conf.join("10-podnet.conflist"),
        serde_json::to_vec(&json!({"cniVersion": "1.0.0", "name": "podnet",
            "plugins": [{"type": "cni-noop", "capabilities": {"portMappings": true}}]}))
        .unwrap(),
    )
    .unwrap();
    let log = fs::File::create(root.join("cnid.log")).unwrap();
    let mut daemon = Command::new(CNID)
        .args(cmd[1..].iter().map(|a| on_node(cnid, a.as_str().unwrap())))
        .args(support::daemon::allow_self())
        .env("RUST_LOG", "info")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut daemon);
    let probe: Vec<String> = cnid["readinessProbe"]["exec"]["command"]
        .as_array()
        .unwrap()[1..]
        .iter()
        .map(|a| on_node(cnid, a.as_str().unwrap()))
        .collect();
    let probe_refs: Vec<&str> = probe.iter().map(String::as_str).collect();
    eventually(
        Duration::from_secs(15),
        "cnid ready by its readiness probe",
        || shim(&probe_refs).status.success(),
    );
    let args: Vec<String> = iargs
        .iter()
        .filter(|a| a.as_str() != "--stay")
        .map(|a| on_node(install, a))
        .collect();
    let out = Command::new(&*SHIM)
        .arg("install")
        .args(&args)
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list_path = PathBuf::from(format!("{}/etc/cni/net.d/{DEFAULT_FILE}", root.display()));
    let list: Value = serde_json::from_slice(&fs::read(&list_path).unwrap()).unwrap();
    assert_eq!(
        list["plugins"][0]["capabilities"],
        json!({"portMappings": true})
    );
    assert_eq!(list["plugins"][0]["timeout"], "60s");
    // A runtime's ADD and DEL through the installed shim.
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    let ns = root.join("netns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &ns).unwrap();
    let installed = plugin_dir.join("cnid-shim");
    let r = Call::new("ADD", "pod1", ns.to_str().unwrap(), &plugin)
        .run_of(&installed)
        .result();
    assert_eq!(r["cniVersion"], "1.0.0");
    Call::new("DEL", "pod1", ns.to_str().unwrap(), &plugin)
        .run_of(&installed)
        .ok();
}
