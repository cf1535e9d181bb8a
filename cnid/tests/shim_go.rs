//! Real runtimes' code through `cnid-shim`: Go's libcni (a cnitool on it)
//! and containerd's go-cni (the calls of containerd's CRI plugin), built
//! from Debian's sources, drive the shim, which hands every call to a cnid
//! started by the test, which runs the real bridge chain in real network
//! namespaces. The runtime's list is written by `cnid-shim config` from
//! cnid's network (capabilities copied). Addresses are checked, the
//! sandboxes ping each other, and DEL leaves nothing: no IP, no veth, no
//! eth0, empty caches (cnid's and libcni's) and no intents.

use crate::support;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::daemon::{Daemon, Dirs, get};
use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, host_local_ips, ip_ok, link_exists,
};
use crate::support::require_root;
use crate::support::shim::{
    Runtime, SHIM, bridge_ports, capture_plugin, captured_args, captured_runs, captured_stdin,
    go_tool,
};
use serde_json::{Value, json};

const NET: &str = "goreal";

/// cnid on the real chain bridge + capture (which declares portMappings
/// and bandwidth), and a runtime whose list `cnid-shim config` wrote.
struct Setup {
    dirs: Dirs,
    bridge: LinkGuard,
    _subnet: SubnetLease,
    data_dir: PathBuf,
    records: PathBuf,
    rt: Runtime,
    daemon: Daemon,
}

impl Setup {
    fn new() -> Setup {
        cni_test_support::assert_root("the Go clients run on a real bridge");
        crate::support::require_plugins(&["bridge", "host-local", "loopback"]);
        let dirs = Dirs::new();
        let bridge = LinkGuard::new();
        let subnet = SubnetLease::new();
        let br = bridge.name().to_owned();
        ip_ok(&["link", "add", "name", &br, "type", "bridge"]);
        // A fixed MAC: otherwise it changes as ports join, and the bridge
        // plugin's CHECK fails.
        ip_ok(&["link", "set", &br, "address", "02:cd:00:00:00:03"]);
        ip_ok(&["link", "set", &br, "up"]);
        let data_dir = dirs.data.join("host-local");
        let records = dirs.data.join("records");
        std::fs::create_dir_all(&records).unwrap();
        dirs.plugin("capture", &capture_plugin(&records));
        dirs.conf(
            "10-goreal.conflist",
            &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1).to_string()}]]}},
                {"type": "capture", "capabilities": {"portMappings": true, "bandwidth": true}}
            ]}),
        );
        let daemon = Daemon::start(&dirs, &["--max-parallel", "16"]);
        let rt = Runtime::new(&dirs);
        let out = Command::new(&*SHIM)
            .args(["config", "--socket"])
            .arg(&dirs.socket)
            .args(["--network", NET, "--timeout", "30s"])
            .env_remove("CNI_COMMAND")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cnid-shim config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            list["plugins"][0]["capabilities"],
            json!({"portMappings": true, "bandwidth": true}),
            "{list}"
        );
        rt.list(&list);
        Setup {
            dirs,
            bridge,
            _subnet: subnet,
            data_dir,
            records,
            rt,
            daemon,
        }
    }

    fn cnitool(&self, tool: &Path, verb: &str, ns: &TempNetns) -> std::process::Output {
        Command::new(tool)
            .args([verb, NET, &ns.path()])
            .env("NETCONFPATH", &self.rt.conf)
            .env("CNI_PATH", &self.rt.bin)
            .env("CNI_CACHE_DIR", &self.rt.cache)
            .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web")
            .env(
                "CAP_ARGS",
                r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#,
            )
            .env_remove("CNI_IFNAME")
            .stdin(Stdio::null())
            .output()
            .expect("run the libcni cnitool")
    }

    fn gocni(
        &self,
        tool: &Path,
        phase: &str,
        parallel: usize,
        sandboxes: &[(String, &TempNetns)],
    ) -> Value {
        let out = Command::new(tool)
            .arg("-conf-dir")
            .arg(&self.rt.conf)
            .args(["-plugin-dir", &self.rt.plugin_path()])
            .arg("-cache-dir")
            .arg(&self.rt.cache)
            .args(["-phase", phase, "-parallel", &parallel.to_string()])
            .args(
                sandboxes
                    .iter()
                    .map(|(id, ns)| format!("{id}={}", ns.path())),
            )
            .stdin(Stdio::null())
            .output()
            .expect("run the go-cni driver");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "go-cni driver output is not JSON ({e}): {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            out.status.success() && report["failed"] == 0,
            "go-cni {phase} failed: {report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        report
    }

    /// Nothing left of any attachment.
    fn assert_nothing_left(&self, veths: &[String], namespaces: &[&TempNetns]) {
        assert_eq!(
            host_local_ips(&self.data_dir, NET),
            Vec::<String>::new(),
            "IPs left"
        );
        assert_eq!(
            bridge_ports(self.bridge.name()),
            Vec::<String>::new(),
            "bridge ports left"
        );
        for v in veths {
            assert!(!link_exists(v), "veth {v} left");
        }
        for ns in namespaces {
            assert!(
                !ns.exec("ip", &["link", "show", "eth0"]).status.success(),
                "eth0 left in {}",
                ns.name()
            );
        }
        assert_eq!(
            get(&self.daemon.socket, "/v1/attachments").json()["attachments"],
            json!([])
        );
        assert_eq!(self.dirs.cached(), Vec::<String>::new(), "cnid's cache");
        assert_eq!(self.dirs.intents(), Vec::<String>::new(), "cnid's intents");
        assert_eq!(self.rt.cached(), Vec::<String>::new(), "libcni's cache");
    }

    /// The container ID cnid knows for a netns.
    fn container_of(&self, ns: &TempNetns) -> String {
        let att = get(&self.daemon.socket, "/v1/attachments").json();
        att["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["netns"] == ns.path())
            .unwrap_or_else(|| panic!("no attachment for {}: {att}", ns.path()))["containerId"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

fn addr(cidr: &str) -> std::net::Ipv4Addr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

#[test]
fn libcni_cnitool_through_the_shim_on_the_real_bridge() {
    require_root!();
    let Some(tool) = go_tool("cnitool") else {
        return;
    };
    let s = Setup::new();
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let mut ips = Vec::new();
    for ns in [&ns_a, &ns_b] {
        let out = s.cnitool(&tool, "add", ns);
        assert!(
            out.status.success(),
            "cnitool add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["cniVersion"], "1.0.0");
        let ip = support::shim::ipv4_of(&result);
        assert_eq!(ns.ipv4_addrs("eth0"), std::slice::from_ref(&ip));
        ips.push(ip);
    }
    assert!(ns_a.ping(addr(&ips[1]), 3), "a cannot ping b");
    assert!(ns_b.ping(addr(&ips[0]), 3), "b cannot ping a");
    for ns in [&ns_a, &ns_b] {
        let out = s.cnitool(&tool, "check", ns);
        assert!(
            out.status.success(),
            "cnitool check: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // libcni cached the shim's result; cnid cached the chain's.
    assert_eq!(s.rt.cached().len(), 2);
    assert_eq!(s.dirs.cached().len(), 2);
    let cid = s.container_of(&ns_a);
    assert!(cid.starts_with("cnitool-"), "{cid}");
    assert_eq!(
        captured_args(&s.records, &cid),
        "IgnoreUnknown=1;K8S_POD_NAME=web"
    );
    assert_eq!(
        captured_stdin(&s.records, &cid, "ADD")["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
    );
    let veths = bridge_ports(s.bridge.name());
    assert_eq!(veths.len(), 2);
    for ns in [&ns_a, &ns_b] {
        let out = s.cnitool(&tool, "del", ns);
        assert!(
            out.status.success(),
            "cnitool del: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    s.assert_nothing_left(&veths, &[&ns_a, &ns_b]);
}

#[test]
fn go_cni_through_the_shim_on_the_real_bridge() {
    require_root!();
    let Some(tool) = go_tool("gocni") else { return };
    let s = Setup::new();
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let sandboxes = [("pod-a".to_owned(), &ns_a), ("pod-b".to_owned(), &ns_b)];
    let rep = s.gocni(&tool, "setup", 2, &sandboxes);
    let ips: Vec<String> = rep["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sb| sb["ips"][0].as_str().expect("an eth0 address").to_owned())
        .collect();
    for (ip, ns) in ips.iter().zip([&ns_a, &ns_b]) {
        let have = ns.ipv4_addrs("eth0");
        assert_eq!(have.len(), 1);
        assert_eq!(addr(&have[0]).to_string(), *ip);
        // go-cni ran the loopback itself, outside cnid.
        let lo = ns.exec("ip", &["-o", "link", "show", "lo"]);
        assert!(
            String::from_utf8_lossy(&lo.stdout).contains("UP"),
            "lo is down"
        );
    }
    assert!(ns_a.ping(ips[1].parse().unwrap(), 3), "a cannot ping b");
    assert!(ns_b.ping(ips[0].parse().unwrap(), 3), "b cannot ping a");

    // What containerd's CRI plugin passes reached the chain: the pod's
    // labels as CNI_ARGS, and the capabilities the list declares (the pod
    // annotations are not declared, so libcni drops them). go-cni's types
    // have no JSON tags: the keys are Go's field names, which the Go
    // plugins read case-insensitively; they arrive as go-cni wrote them.
    let stdin = captured_stdin(&s.records, "pod-a", "ADD");
    assert_eq!(
        stdin["runtimeConfig"],
        json!({
            "portMappings": [{"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": "127.0.0.1"}],
            "bandwidth": {"IngressRate": 1000000, "IngressBurst": 100000, "EgressRate": 2000000, "EgressBurst": 200000}
        })
    );
    let mut args: Vec<String> = captured_args(&s.records, "pod-a")
        .split(';')
        .map(str::to_owned)
        .collect();
    args.sort();
    assert_eq!(
        args,
        [
            "IgnoreUnknown=1",
            "K8S_POD_INFRA_CONTAINER_ID=pod-a",
            "K8S_POD_NAME=pod-pod-a",
            "K8S_POD_NAMESPACE=default",
            "K8S_POD_UID=uid-pod-a"
        ]
    );
    s.gocni(&tool, "check", 2, &sandboxes);
    let veths = bridge_ports(s.bridge.name());
    assert_eq!(veths.len(), 2);
    s.gocni(&tool, "remove", 2, &sandboxes);
    s.assert_nothing_left(&veths, &[&ns_a, &ns_b]);
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[test]
fn go_cni_50_sandboxes_at_parallelism_8_through_the_shim() {
    require_root!();
    const SANDBOXES: usize = 50;
    let Some(tool) = go_tool("gocni") else { return };
    let s = Setup::new();
    let namespaces: Vec<TempNetns> = (0..SANDBOXES).map(|_| TempNetns::new()).collect();
    let sandboxes: Vec<(String, &TempNetns)> = namespaces
        .iter()
        .enumerate()
        .map(|(i, ns)| (format!("sb-{i:02}"), ns))
        .collect();
    // Setup, Check, Remove of each sandbox in turn, 8 sandboxes at once.
    let rep = s.gocni(&tool, "cycle", 8, &sandboxes);
    let ms = |phase: &str| -> Vec<f64> {
        rep["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|sb| {
                sb["ms"][phase]
                    .as_f64()
                    .unwrap_or_else(|| panic!("no {phase} time: {sb}"))
            })
            .collect()
    };
    let mut line = format!(
        "go-cni through cnid-shim: {SANDBOXES} sandboxes at parallelism 8, wall {:.0} ms;",
        rep["wallMs"].as_f64().unwrap()
    );
    for phase in ["setup", "check", "remove"] {
        let v = ms(phase);
        line += &format!(
            " {phase} p50 {:.1} ms p99 {:.1} ms;",
            percentile(v.clone(), 0.5),
            percentile(v, 0.99)
        );
    }
    println!("{line}");
    // Every sandbox got an address, and cnid ran each one's operations in
    // the order go-cni made them, one after the other.
    let mut seen = std::collections::HashSet::new();
    for (sb, (id, _)) in rep["sandboxes"].as_array().unwrap().iter().zip(&sandboxes) {
        assert_eq!(sb["id"], id.as_str());
        let ip = sb["ips"][0]
            .as_str()
            .unwrap_or_else(|| panic!("no address: {sb}"));
        assert!(seen.insert(ip.to_owned()), "address {ip} given twice");
        let runs = captured_runs(&s.records, id);
        let cmds: Vec<&str> = runs.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(cmds, ["ADD", "CHECK", "DEL"], "{id}");
        for w in runs.windows(2) {
            assert!(w[0].2 <= w[1].1, "{id}: {} overlaps {}", w[0].0, w[1].0);
        }
    }
    let ns_refs: Vec<&TempNetns> = namespaces.iter().collect();
    s.assert_nothing_left(&[], &ns_refs);
}
