//! `cnid-shim` run as a runtime runs a plugin (environment, stdin, exit
//! status, stdout), against a cnid started by the test: every verb
//! forwarded, results in the shim's version, errors kept, and the faults:
//! cnid down (code 11 naming the socket), malformed answers (999), a bad
//! shim config, the shim's deadline reaching cnid, cnid restarted mid-ADD
//! and the shim SIGKILLed mid-ADD on the real bridge (nothing leaked; a
//! later DEL succeeds; a retried ADD gets the attachment's result).

use crate::support;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, eventually, get, kill_group};
use crate::support::netns::{
    LinkGuard, SubnetLease, TempNetns, host_local_ips, ip_ok, link_exists,
};
use crate::support::require_root;
use crate::support::shim::{
    Call, NOOP, bridge_ports, capture_plugin, captured_args, captured_runs, captured_stdin,
    ipv4_of, plugin_conf,
};
use cni_core::Version;
use cni_core::result::CniResult;
use serde_json::json;

/// A path that stands for a netns for fake plugins: a link to the
/// daemon's own network namespace (cnid wants a network namespace; the
/// fake plugins never enter it).
fn fake_netns(dirs: &Dirs) -> String {
    let p = dirs.data.join("netns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &p).unwrap();
    p.display().to_string()
}

#[test]
fn cnid_down_is_code_11_naming_the_socket_and_50_for_status() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    // No socket file at all, then a stale one nobody listens on.
    let stale = dirs.root().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    // A short deadline: a refused connection is tried again until then
    // (a restarting cnid), a missing socket for at most a second.
    for socket in [dirs.socket.clone(), stale] {
        let conf = plugin_conf("down", "1.1.0", &socket, json!({"timeout": 0.2}));
        for verb in ["ADD", "CHECK", "DEL"] {
            let e = Call::new(verb, "c1", &ns, &conf).run().error();
            assert_eq!(e["code"], 11, "{verb}: {e}");
            let msg = e["msg"].as_str().unwrap();
            assert!(
                msg.contains("cnid is not reachable")
                    && msg.contains(&socket.display().to_string()),
                "{verb}: {e}"
            );
            assert_eq!(e["cniVersion"], "1.1.0");
        }
        let gc = plugin_conf(
            "down",
            "1.1.0",
            &socket,
            json!({"cni.dev/valid-attachments": [], "timeout": 0.2}),
        );
        assert_eq!(Call::new("GC", "", "", &gc).run().error()["code"], 11);
        // STATUS: "not available", the spec's code for it.
        let e = Call::new("STATUS", "", "", &conf).run().error();
        assert_eq!(e["code"], 50, "{e}");
    }
}

/// A fake cnid: answers every connection with the next canned bytes.
fn fake_cnid(socket: &Path, answers: Vec<Vec<u8>>) -> std::thread::JoinHandle<()> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        for answer in answers {
            let (mut s, _) = listener.accept().unwrap();
            // Read the request head (and whatever body came with it).
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = s.write_all(&answer);
        }
    })
}

/// An HTTP answer with a Content-Length.
fn answer(status: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn malformed_answers_are_code_999_saying_what_was_wrong_and_errors_keep_their_plugin() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    let socket = dirs.root().join("fake.sock");
    let cases: Vec<(Vec<u8>, u64, &str)> = vec![
        (
            b"garbage\r\n\r\n".to_vec(),
            999,
            "not an HTTP/1.x status line",
        ),
        (
            answer("200 OK", "", "not json"),
            999,
            "the ADD result is not JSON",
        ),
        (
            answer("200 OK", "", r#"{"cniVersion":"1.0.0","ips":"x"}"#),
            999,
            "the ADD result does not decode",
        ),
        (
            answer("502 Bad Gateway", "", "oops!"),
            999,
            "not a CNI error object",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{".to_vec(),
            999,
            "body ends after 1 of 50 bytes",
        ),
        (
            b"HTTP/1.1 200 OK\r\n".to_vec(),
            11,
            "closed the connection before answering ADD",
        ),
        (
            answer(
                "502 Bad Gateway",
                "Cnid-Plugin: bridge\r\n",
                r#"{"cniVersion":"1.0.0","code":117,"msg":"boom","details":"the why"}"#,
            ),
            117,
            "plugin type=\"bridge\" failed (add): boom",
        ),
    ];
    let server = fake_cnid(&socket, cases.iter().map(|c| c.0.clone()).collect());
    let conf = plugin_conf("fake", "0.4.0", &socket, json!({}));
    for (bytes, code, want) in &cases {
        let e = Call::new("ADD", "c1", &ns, &conf).run().error();
        assert_eq!(e["code"], *code, "{}: {e}", String::from_utf8_lossy(bytes));
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        assert_eq!(e["cniVersion"], "0.4.0", "{e}");
        if *code != 117 {
            assert!(msg.contains(&socket.display().to_string()), "{msg}");
        } else {
            assert_eq!(e["details"], "the why");
        }
    }
    server.join().unwrap();
}

/// Regression: a 200 with an error object made the shim
/// exit 0 and print `{"cniVersion":"1.0.0"}`, and a 200 with `{}` was a
/// result. As for plugins (D18): an error object is an error whatever the
/// status, on every verb; an ADD answer without a result's keys is
/// malformed (999).
#[test]
fn a_2xx_with_an_error_object_is_an_error_and_an_add_answer_must_be_a_result() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    let socket = dirs.root().join("fake.sock");
    let error = r#"{"cniVersion":"1.0.0","code":7,"msg":"no such thing","details":"why"}"#;
    let cases: Vec<(&str, Vec<u8>, u64, &str)> = vec![
        ("ADD", answer("200 OK", "", error), 7, "no such thing"),
        ("DEL", answer("200 OK", "", error), 7, "no such thing"),
        ("CHECK", answer("200 OK", "", error), 7, "no such thing"),
        (
            "ADD",
            answer("200 OK", "", "{}"),
            999,
            "is not a CNI result",
        ),
        (
            "ADD",
            answer("200 OK", "", r#"{"foo":1}"#),
            999,
            "is not a CNI result",
        ),
    ];
    let server = fake_cnid(&socket, cases.iter().map(|c| c.1.clone()).collect());
    let conf = plugin_conf("fake", "1.0.0", &socket, json!({}));
    for (verb, bytes, code, want) in &cases {
        let out = Call::new(verb, "c1", &ns, &conf).run();
        let e = out.error();
        assert_eq!(
            e["code"],
            *code,
            "{verb} {}: {e}",
            String::from_utf8_lossy(bytes)
        );
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        assert!(msg.contains(&socket.display().to_string()), "{msg}");
        if *code == 7 {
            assert_eq!(e["details"], "why", "{e}");
        }
    }
    server.join().unwrap();
}

#[test]
fn a_bad_shim_config_is_a_clear_error() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    for (conf, code, want) in [
        (json!("not an object"), 6, "not a JSON object"),
        (
            json!({"cniVersion": "1.0.0", "type": "cnid-shim"}),
            7,
            "\"name\"",
        ),
        (
            json!({"cniVersion": "1.0.0", "name": "n", "socket": "cnid.sock"}),
            7,
            "\"socket\"",
        ),
        (
            json!({"cniVersion": "1.0.0", "name": "n", "timeout": "soon"}),
            7,
            "\"timeout\"",
        ),
        (
            json!({"cniVersion": "2.0.0", "name": "n"}),
            1,
            "unsupported CNI version",
        ),
    ] {
        let e = Call::new("ADD", "c1", &ns, &conf).run().error();
        assert_eq!(e["code"], code, "{conf}: {e}");
        assert!(e["msg"].as_str().unwrap().contains(want), "{conf}: {e}");
    }
    let mut call = Call::new(
        "ADD",
        "c1",
        &ns,
        &json!({"cniVersion": "1.0.0", "name": "n"}),
    );
    call.ifname = String::new();
    let e = call.run().error();
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str()),
        (Some(4), Some("cnid-shim: CNI_IFNAME is not set"))
    );
}

/// A plugin result with everything the versions differ in.
const RICH_RESULT: &str = r#"{"cniVersion":"1.0.0",
 "interfaces":[{"name":"eth0","mac":"02:00:00:00:00:01","sandbox":"/x"}],
 "ips":[{"address":"10.1.2.3/24","gateway":"10.1.2.1","interface":0},{"address":"fd00::3/64","interface":0}],
 "routes":[{"dst":"10.9.0.0/16","gw":"10.1.2.1"}],
 "dns":{"nameservers":["10.1.2.1"]}}"#;

#[test]
fn results_come_back_in_the_shims_version_and_errors_keep_code_msg_details() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    std::fs::write(dirs.data.join("result.json"), RICH_RESULT).unwrap();
    dirs.plugin(
        "rich",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) cat {r};;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            r = dirs.data.join("result.json").display()
        ),
    );
    dirs.plugin(
        "failing",
        r#"cat > /dev/null
[ "$CNI_COMMAND" = ADD ] || exit 0
echo '{"cniVersion":"1.0.0","code":142,"msg":"no more leases","details":"pool 10.1.2.0/24 exhausted"}'
exit 1"#,
    );
    dirs.conf(
        "10-rich.conflist",
        &json!({"cniVersion": "1.0.0", "name": "rich", "plugins": [{"type": "rich"}]}),
    );
    dirs.conf(
        "20-failing.conflist",
        &json!({"cniVersion": "1.0.0", "name": "failing", "plugins": [{"type": "failing"}]}),
    );
    dirs.plugin(
        "crashy",
        r#"cat > /dev/null
[ "$CNI_COMMAND" = ADD ] || exit 0
echo "cannot open /dev/xyz" >&2
exit 3"#,
    );
    dirs.conf(
        "30-crashy.conflist",
        &json!({"cniVersion": "1.0.0", "name": "crashy", "plugins": [{"type": "crashy"}]}),
    );
    let _daemon = Daemon::start(&dirs, &[]);
    let plugin_result = CniResult::parse(RICH_RESULT.as_bytes(), Version::V1_0_0).unwrap();
    for v in ["0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = plugin_conf("rich", v, &dirs.socket, json!({}));
        let cid = format!("v{}", v.replace('.', ""));
        let got = Call::new("ADD", &cid, &ns, &conf).run().result();
        let want = plugin_result
            .convert(v.parse().unwrap())
            .unwrap()
            .to_value();
        pretty_assertions::assert_eq!(got, want, "version {v}");
        assert_eq!(got["cniVersion"], v);
        Call::new("DEL", &cid, &ns, &conf).run().ok();

        // An error, in the shim's version, with the plugin's code, msg and
        // details, and the plugin that failed (cnid's Cnid-Plugin header).
        let conf = plugin_conf("failing", v, &dirs.socket, json!({}));
        let e = Call::new("ADD", &cid, &ns, &conf).run().error();
        assert_eq!(
            e,
            json!({"cniVersion": v, "code": 142,
                   "msg": "plugin type=\"failing\" failed (add): no more leases",
                   "details": "pool 10.1.2.0/24 exhausted"})
        );
    }
    // The spot checks of the shapes.
    let conf = plugin_conf("rich", "0.3.1", &dirs.socket, json!({}));
    let r = Call::new("ADD", "shape", &ns, &conf).run().result();
    assert_eq!(r["ips"][0]["version"], "4");
    assert_eq!(r["ips"][1]["version"], "6");
    Call::new("DEL", "shape", &ns, &conf).run().ok();
    // A plugin that fails without an error object: cnid's message names it,
    // its stderr is the details.
    let conf = plugin_conf("crashy", "0.4.0", &dirs.socket, json!({}));
    let e = Call::new("ADD", "crash", &ns, &conf).run().error();
    assert!(e["msg"].as_str().unwrap().contains("crashy"), "{e}");
    assert_eq!(e["details"], "cannot open /dev/xyz");
    assert_eq!(e["cniVersion"], "0.4.0");
    // A network cnid does not have: cnid's own error, code 7.
    let conf = plugin_conf("nope", "1.0.0", &dirs.socket, json!({}));
    let e = Call::new("ADD", "c1", &ns, &conf).run().error();
    assert_eq!(e["code"], 7);
    assert!(e["msg"].as_str().unwrap().contains("\"nope\""), "{e}");
    assert!(dirs.cached().is_empty() && dirs.intents().is_empty());
}

#[test]
fn every_verb_is_forwarded_with_its_parameters() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin("capture", &capture_plugin(&records));
    dirs.conf(
        "10-all.conflist",
        &json!({"cniVersion": "1.1.0", "name": "all", "plugins": [
            {"type": "cni-noop"},
            {"type": "capture", "capabilities": {"portMappings": true, "bandwidth": true}}
        ]}),
    );
    std::os::unix::fs::symlink(NOOP, dirs.bin.join("cni-noop")).unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    let caps = json!({
        "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
        "bandwidth": {"ingressRate": 1000, "ingressBurst": 100},
        "dns": {"servers": ["10.0.0.10"]}
    });
    // The runtime's name differs from cnid's network: `network` says which.
    let conf = plugin_conf(
        "k8s-pod-network",
        "1.1.0",
        &dirs.socket,
        json!({"network": "all", "runtimeConfig": caps}),
    );

    let add = Call::new("ADD", "c1", &ns, &conf)
        .args("K8S_POD_NAME=web;IgnoreUnknown=1")
        .run();
    let result = add.result();
    assert_eq!(result["cniVersion"], "1.1.0");
    assert_eq!(
        captured_args(&records, "c1"),
        "K8S_POD_NAME=web;IgnoreUnknown=1"
    );
    let stdin = captured_stdin(&records, "c1", "ADD");
    // Only the capabilities the plugin declares reach it.
    assert_eq!(
        stdin["runtimeConfig"],
        json!({"portMappings": caps["portMappings"], "bandwidth": caps["bandwidth"]})
    );
    assert_eq!(stdin["name"], "all");
    Call::new("ADD", "c2", &ns, &conf)
        .ifname("net1")
        .run()
        .result();

    Call::new("CHECK", "c1", &ns, &conf)
        .args("K8S_POD_NAME=web;IgnoreUnknown=1")
        .run()
        .ok();
    assert_eq!(
        captured_stdin(&records, "c1", "CHECK")["prevResult"],
        result
    );
    Call::new("STATUS", "", "", &conf).run().ok();

    // GC: c1 stays valid, c2/net1 is stale.
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = json!([{"containerID": "c1", "ifname": "eth0"}]);
    Call::new("GC", "", "", &gc_conf).run().ok();
    let cmds = |c: &str| {
        captured_runs(&records, c)
            .into_iter()
            .map(|r| r.0)
            .collect::<Vec<_>>()
    };
    assert_eq!(cmds("c2"), ["ADD", "DEL"]);
    assert_eq!(cmds("c1"), ["ADD", "CHECK"]);

    // DEL without a netns (it is gone), then again: both succeed.
    Call::new("DEL", "c1", "", &conf).run().ok();
    Call::new("DEL", "c1", "", &conf).run().ok();
    assert_eq!(cmds("c1"), ["ADD", "CHECK", "DEL", "DEL"]);
    let v = Call::new("VERSION", "", "", &json!({"cniVersion": "1.0.0"})).run();
    assert!(
        v.success && v.stdout.contains("\"0.3.1\"") && v.stdout.contains("\"1.1.0\""),
        "{v:?}"
    );
    let att = get(&daemon.socket, "/v1/attachments").json();
    assert_eq!(att["attachments"], json!([]));
    assert!(dirs.cached().is_empty() && dirs.intents().is_empty());
}

#[test]
fn the_shims_timeout_is_cnids_deadline() {
    let dirs = Dirs::new();
    let ns = fake_netns(&dirs);
    // Hangs on ADD until killed; DEL (the rollback) returns at once.
    dirs.plugin(
        "hang",
        r#"cat > /dev/null
[ "$CNI_COMMAND" = ADD ] && exec sleep 600
exit 0"#,
    );
    dirs.conf(
        "10-hang.conflist",
        &json!({"cniVersion": "1.0.0", "name": "hang", "plugins": [{"type": "hang"}]}),
    );
    let _daemon = Daemon::start(&dirs, &[]);
    let conf = plugin_conf("hang", "1.0.0", &dirs.socket, json!({"timeout": "1s"}));
    let start = Instant::now();
    let e = Call::new("ADD", "c1", &ns, &conf).run().error();
    let took = start.elapsed();
    // cnid's own answer to an expired deadline: 504, code 11, the plugin named.
    assert_eq!(e["code"], 11, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("hang"), "{e}");
    // Without the deadline cnid would have waited 60 s (its default).
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(dirs.cached().is_empty() && dirs.intents().is_empty());
}

/// A real bridge chain whose last plugin (`gate`) holds every ADD until
/// the test creates the gate file, recording its pid per container first.
struct GatedBridge {
    dirs: Dirs,
    bridge: LinkGuard,
    _subnet: SubnetLease,
    data_dir: PathBuf,
    gate: PathBuf,
}

const GATED: &str = "gated";

impl GatedBridge {
    fn new() -> GatedBridge {
        cni_test_support::assert_root("a GatedBridge creates namespaces and a bridge");
        crate::support::require_plugins(&["bridge"]);
        let dirs = Dirs::new();
        let bridge = LinkGuard::new();
        let subnet = SubnetLease::new();
        let br = bridge.name().to_owned();
        ip_ok(&["link", "add", "name", &br, "type", "bridge"]);
        // A fixed MAC: otherwise it changes as ports come and go, and the
        // bridge plugin's CHECK fails.
        ip_ok(&["link", "set", &br, "address", "02:cd:00:00:00:02"]);
        ip_ok(&["link", "set", &br, "up"]);
        let data_dir = dirs.data.join("host-local");
        let gate = dirs.data.join("gate.open");
        dirs.plugin(
            "gate",
            &format!(
                r#"if [ "$CNI_COMMAND" = ADD ]; then
  echo $$ > {d}/gate.$CNI_CONTAINERID.pid
  while [ ! -e {gate} ]; do sleep 0.05; done
fi
exec {noop}"#,
                d = dirs.data.display(),
                gate = gate.display(),
                noop = NOOP
            ),
        );
        dirs.conf(
            "10-gated.conflist",
            &json!({"cniVersion": "1.0.0", "name": GATED, "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr()}]]}},
                {"type": "gate"}
            ]}),
        );
        GatedBridge {
            dirs,
            bridge,
            _subnet: subnet,
            data_dir,
            gate,
        }
    }

    fn pid_file(&self, container: &str) -> PathBuf {
        self.dirs.data.join(format!("gate.{container}.pid"))
    }

    /// Waits until the gate plugin holds `container`'s ADD (the bridge
    /// plugin has run: veth and IP exist).
    fn wait_held(&self, container: &str) {
        let pid = self.pid_file(container);
        eventually(
            Duration::from_secs(30),
            &format!("ADD of {container} held at the gate"),
            || pid.exists(),
        );
    }

    fn open(&self) {
        std::fs::write(&self.gate, b"").unwrap();
    }

    /// Nothing of any attachment left: no IP, no bridge port, the veths
    /// gone, no eth0 in the namespaces, cnid's cache and intents empty.
    fn assert_nothing_left(&self, veths: &[String], namespaces: &[&TempNetns]) {
        assert_eq!(
            host_local_ips(&self.data_dir, GATED),
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
        assert_eq!(self.dirs.cached(), Vec::<String>::new(), "cnid's cache");
        assert_eq!(self.dirs.intents(), Vec::<String>::new(), "cnid's intents");
    }
}

/// Kills the gate plugins a killed cnid left behind, also when the test
/// fails (a restarted cnid stops them itself).
struct Orphans(Vec<PathBuf>);

impl Drop for Orphans {
    fn drop(&mut self) {
        for f in &self.0 {
            if let Some(pid) = std::fs::read_to_string(f)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                kill_group(pid);
            }
        }
    }
}

/// The verbs and states of a container's operations in cnid.
fn operations(socket: &Path, container: &str) -> Vec<(String, String)> {
    let v = get(socket, &format!("/v1/operations?containerId={container}")).json();
    v["operations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["verb"].as_str().unwrap_or("").to_owned(),
                o["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// cnid killed while the shim's ADD runs (its plugin held at the gate):
/// the shim does not fail, it sends the ADD again to the restarted cnid.
/// The restart lets the orphaned plugin finish, rolls the cut ADD back
/// ahead of any request on its container (what the orphan made is
/// freed), then runs the ADD sent again: the runtime gets a working
/// attachment, and its DEL leaves nothing.
///
/// Before, the shim failed with code 11 "closed the connection before
/// answering ADD" (and "connection refused" while cnid was down).
#[test]
fn cnid_restarted_mid_add_rolls_it_back_and_answers_the_add_sent_again() {
    require_root!();
    let g = GatedBridge::new();
    let _orphans = Orphans(vec![g.pid_file("restart")]);
    let mut daemon = Daemon::start(&g.dirs, &[]);
    let ns = TempNetns::new();
    let conf = plugin_conf(GATED, "1.0.0", &g.dirs.socket, json!({}));
    let add = Call::new("ADD", "restart", &ns.path(), &conf).spawn();
    g.wait_held("restart");
    let veths = bridge_ports(g.bridge.name());
    assert_eq!(veths.len(), 1);
    assert_eq!(host_local_ips(&g.data_dir, GATED).len(), 1);

    daemon.kill9();
    // The restarted cnid finds the orphaned gate plugin and holds its
    // container; opened, the orphan finishes, the rollback runs, then the
    // ADD the shim sent again.
    let mut restarted = Daemon::spawn_with(&g.dirs, &[], |_| {});
    restarted.wait_ready(Duration::from_secs(30));
    g.open();
    let out = support::shim::ShimOutput::from(add.wait_with_output().unwrap());
    let r = out.result();
    eventually(
        Duration::from_secs(30),
        "the rollback of the unfinished ADD",
        || restarted.log().contains("unfinished ADD rolled back"),
    );
    assert!(g.dirs.intents().is_empty(), "{:?}", g.dirs.intents());
    assert_eq!(ns.ipv4_addrs("eth0"), [ipv4_of(&r)]);
    assert_eq!(
        host_local_ips(&g.data_dir, GATED).len(),
        1,
        "the orphan's address was freed by the rollback; one is held, the answered ADD's"
    );
    let veths_now = bridge_ports(g.bridge.name());
    assert_eq!(veths_now.len(), 1, "{veths_now:?}");
    Call::new("DEL", "restart", &ns.path(), &conf).run().ok();
    g.assert_nothing_left(&veths_now, &[&ns]);
    g.assert_nothing_left(&veths, &[&ns]);
}

#[test]
fn shim_killed_mid_add_then_del_or_a_retried_add_leaves_nothing_broken() {
    require_root!();
    let g = GatedBridge::new();
    let daemon = Daemon::start(&g.dirs, &[]);
    let (ns_a, ns_b) = (TempNetns::new(), TempNetns::new());
    let conf = plugin_conf(GATED, "1.0.0", &g.dirs.socket, json!({}));
    // go-cni passes the labels from a map: the retry's CNI_ARGS order differs.
    let add_a = Call::new("ADD", "kill-a", &ns_a.path(), &conf);
    let add_b =
        Call::new("ADD", "kill-b", &ns_b.path(), &conf).args("K8S_POD_NAME=b;IgnoreUnknown=1");
    let mut shim_a = add_a.spawn();
    let mut shim_b = add_b.spawn();
    g.wait_held("kill-a");
    g.wait_held("kill-b");
    // The runtime's deadline passes: it kills the shims.
    for s in [&mut shim_a, &mut shim_b] {
        s.kill().unwrap();
        s.wait().unwrap();
    }
    let veths = bridge_ports(g.bridge.name());
    assert_eq!(veths.len(), 2);

    // A: the runtime DELs after the failed ADD (containerd, CRI-O). B: it
    // retries the ADD. Both queue behind the running ADDs in cnid.
    let del_a = Call::new("DEL", "kill-a", &ns_a.path(), &conf).spawn();
    let retry_b = Call::new("ADD", "kill-b", &ns_b.path(), &conf)
        .args("IgnoreUnknown=1;K8S_POD_NAME=b")
        .spawn();
    eventually(
        Duration::from_secs(30),
        "the DEL and the retried ADD queued",
        || {
            operations(&daemon.socket, "kill-a")
                == [
                    ("ADD".into(), "running".into()),
                    ("DEL".into(), "queued".into()),
                ]
                && operations(&daemon.socket, "kill-b")
                    == [
                        ("ADD".into(), "running".into()),
                        ("ADD".into(), "queued".into()),
                    ]
        },
    );
    g.open();

    support::shim::ShimOutput::from(del_a.wait_with_output().unwrap()).ok();
    let retried = support::shim::ShimOutput::from(retry_b.wait_with_output().unwrap());
    let r = retried.result();
    assert!(retried.stderr.contains("retried ADD"), "{retried:?}");
    // The retry got the attachment that exists, exactly once.
    assert_eq!(ns_b.ipv4_addrs("eth0"), [ipv4_of(&r)]);
    assert_eq!(
        host_local_ips(&g.data_dir, GATED).len(),
        1,
        "only b's IP is held"
    );
    assert!(
        !ns_a.exec("ip", &["link", "show", "eth0"]).status.success(),
        "a was deleted"
    );
    // A retry with other parameters is refused: DEL first.
    let e = Call::new("ADD", "kill-b", &ns_a.path(), &conf)
        .run()
        .error();
    assert_eq!(e["code"], cnid::api::code::ALREADY_ATTACHED, "{e}");
    Call::new("CHECK", "kill-b", &ns_b.path(), &conf)
        .args("K8S_POD_NAME=b;IgnoreUnknown=1")
        .run()
        .ok();
    Call::new("DEL", "kill-b", &ns_b.path(), &conf).run().ok();
    g.assert_nothing_left(&veths, &[&ns_a, &ns_b]);
}
