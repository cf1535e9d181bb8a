//! `cnitool --socket PATH` and `CNID_SOCKET`: add, check, del, gc and status
//! run in a cnid daemon (started on a temp socket with fake plugins), with
//! the same output and the same failure contract as when cnitool runs the
//! plugins itself; version and validate stay local.
//!
//! cnitool's own environment points at an empty conf dir and plugin dir,
//! so whatever ran, ran in the daemon.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, get};
use crate::support::fake::{Fake, PluginDir, Response, result_json, version_json};
use crate::support::gate::{Gate, LOAD_MARGIN};
use crate::support::tool::{Sandbox, expected_container_id};
use cni_async::RawExec;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

const NET: &str = "socknet";

/// Fake plugins `a` and `b` of `version` and network `socknet` (a, b) in
/// `dir`'s conf dir.
fn network(dir: &Path, plugins: &PluginDir, version: &str) {
    plugins.fake("a", &Fake::plugin(version, "10.1.2.3/24"));
    plugins.fake("b", &Fake::plugin(version, "10.1.2.4/24"));
    let conf = json!({"cniVersion": version, "name": NET,
                      "plugins": [{"type": "a"}, {"type": "b"}]});
    std::fs::write(
        dir.join(format!("{NET}.conflist")),
        serde_json::to_vec_pretty(&conf).expect("encode conf"),
    )
    .expect("write conf");
}

/// A daemon with the network; its fake plugins record what they run.
fn daemon(version: &str) -> (Dirs, PluginDir, Daemon) {
    let dirs = Dirs::new();
    let plugins = PluginDir::in_dir(dirs.root());
    network(&dirs.conf, &plugins, version);
    let daemon = Daemon::start(&dirs, &[]);
    (dirs, plugins, daemon)
}

/// A path standing for a network namespace: a link to the daemon's own
/// (the daemon checks that the path is one; fake plugins do not enter it),
/// one per name, so that each has its own container ID.
fn netns(dirs: &Dirs, name: &str) -> String {
    let path = dirs.data.join(name);
    std::os::unix::fs::symlink("/proc/self/ns/net", &path).expect("create netns stand-in");
    path.to_str().expect("utf-8 temp dir").to_owned()
}

fn socket(daemon: &Daemon) -> &str {
    daemon.socket.to_str().expect("utf-8 temp dir")
}

fn attachments(daemon: &Daemon) -> Vec<Value> {
    let r = get(&daemon.socket, "/v1/attachments");
    assert_eq!(r.status, 200);
    r.json()["attachments"]
        .as_array()
        .expect("attachments array")
        .clone()
}

fn commands(plugins: &PluginDir) -> Vec<String> {
    plugins
        .invocations()
        .iter()
        .map(|i| format!("{} {}", i.plugin, i.var("CNI_COMMAND").unwrap_or("?")))
        .collect()
}

#[test]
fn add_check_del_run_in_the_daemon_with_the_same_output() {
    let (dirs, plugins, daemon) = daemon("1.0.0");
    let sb = Sandbox::new();
    let ns = netns(&dirs, "ns1");
    let id = expected_container_id(&ns);
    let env = [("CNI_ARGS", "IgnoreUnknown=1;POD=web")];

    let add = sb
        .run_env(
            &["--socket", socket(&daemon), "-i", "net1", "add", NET, &ns],
            &env,
        )
        .ok();
    // The same bytes as a local run of the same network prints.
    let local = Sandbox::new();
    network(&local.net_dir(), &local.plugins, "1.0.0");
    let local_add = local.run_env(&["-i", "net1", "add", NET, &ns], &env).ok();
    assert_eq!(add.stdout, local_add.stdout);
    let want: Value = serde_json::from_str(&result_json("1.0.0", "10.1.2.4/24")).unwrap();
    assert_eq!(add.stdout_json(), want);
    assert_eq!(add.stderr, "");

    // The daemon ran the plugins, with what cnitool derived.
    assert!(sb.plugins.invocations().is_empty(), "a plugin ran locally");
    assert_eq!(commands(&plugins), ["a ADD", "b ADD"]);
    for inv in plugins.invocations() {
        assert_eq!(inv.var("CNI_CONTAINERID"), Some(id.as_str()));
        assert_eq!(inv.var("CNI_IFNAME"), Some("net1"));
        assert_eq!(inv.var("CNI_NETNS"), Some(ns.as_str()));
        assert_eq!(inv.var("CNI_ARGS"), Some("IgnoreUnknown=1;POD=web"));
    }
    let listed = attachments(&daemon);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["containerId"], id.as_str());
    assert_eq!(listed[0]["ifname"], "net1");
    assert_eq!(listed[0]["result"], want);

    plugins.clear_records();
    let check = sb
        .run(&["--socket", socket(&daemon), "-i", "net1", "check", NET, &ns])
        .ok();
    assert_eq!((check.stdout.as_str(), check.stderr.as_str()), ("", ""));
    assert_eq!(commands(&plugins), ["a CHECK", "b CHECK"]);

    plugins.clear_records();
    let del = sb
        .run(&["--socket", socket(&daemon), "-i", "net1", "del", NET, &ns])
        .ok();
    assert_eq!((del.stdout.as_str(), del.stderr.as_str()), ("", ""));
    assert_eq!(commands(&plugins), ["b DEL", "a DEL"]);
    assert_eq!(attachments(&daemon), Vec::<Value>::new());
    assert_eq!(dirs.cached(), Vec::<String>::new());
    assert!(sb.plugins.invocations().is_empty(), "a plugin ran locally");
}

#[test]
fn cnid_socket_from_the_environment_gc_and_status() {
    let (dirs, plugins, daemon) = daemon("1.1.0");
    let sb = Sandbox::new();
    let env = [("CNID_SOCKET", socket(&daemon))];
    let (ns1, ns2) = (netns(&dirs, "ns1"), netns(&dirs, "ns2"));
    for ns in [&ns1, &ns2] {
        sb.run_env(&["add", NET, ns], &env).ok();
    }
    assert_eq!(attachments(&daemon).len(), 2);

    // GC as the reference's: no attachment is valid, so both are deleted,
    // then each plugin gets GC with an empty valid list.
    plugins.clear_records();
    let gc = sb.run_env(&["gc", NET, &ns1], &env).ok();
    assert_eq!(gc.stderr, "");
    // What was deleted is printed, as cnid answered it.
    let mut printed: Vec<String> = gc.stdout_json()["deleted"]
        .as_array()
        .expect("deleted")
        .iter()
        .map(|a| a["containerID"].as_str().unwrap().to_owned())
        .collect();
    printed.sort();
    assert_eq!(attachments(&daemon), Vec::<Value>::new());
    let dels = plugins.invocations_of("DEL");
    assert_eq!(dels.len(), 4, "{:?}", commands(&plugins));
    let mut deleted: Vec<&str> = dels
        .iter()
        .filter_map(|i| i.var("CNI_CONTAINERID"))
        .collect();
    deleted.sort_unstable();
    deleted.dedup();
    let mut ids = vec![expected_container_id(&ns1), expected_container_id(&ns2)];
    ids.sort();
    assert_eq!(deleted, ids);
    assert_eq!(printed, ids);
    let gcs = plugins.invocations_of("GC");
    assert_eq!(gcs.len(), 2, "{:?}", commands(&plugins));
    for inv in &gcs {
        assert_eq!(inv.stdin_json()["cni.dev/valid-attachments"], json!([]));
    }

    plugins.clear_records();
    let status = sb.run_env(&["status", NET, &ns1], &env).ok();
    assert_eq!(
        (status.stdout.as_str(), status.stderr.as_str()),
        ("network socknet: ready\n", "")
    );
    assert_eq!(commands(&plugins), ["a STATUS", "b STATUS"]);
    assert!(sb.plugins.invocations().is_empty(), "a plugin ran locally");
}

/// Plugin `down` (STATUS: not ready, code 50) and network `down` in `conf`.
fn not_ready(conf: &Path, plugins: &PluginDir) {
    plugins.fake(
        "down",
        &Fake::plugin("1.1.0", "10.1.2.3/24").on(
            "STATUS",
            Response::cni_error(50, "plugin not ready", "no leases left"),
        ),
    );
    let conf_json = json!({"cniVersion": "1.1.0", "name": "down", "plugins": [{"type": "down"}]});
    std::fs::write(
        conf.join("down.conflist"),
        serde_json::to_vec_pretty(&conf_json).expect("encode conf"),
    )
    .expect("write conf");
}

#[test]
fn a_plugin_error_comes_back_as_a_local_run_reports_it() {
    let dirs = Dirs::new();
    let plugins = PluginDir::in_dir(dirs.root());
    not_ready(&dirs.conf, &plugins);
    let daemon = Daemon::start(&dirs, &[]);
    let sb = Sandbox::new();
    let ns = netns(&dirs, "ns");

    let obj = sb
        .run(&[
            "--socket",
            socket(&daemon),
            "--json-errors",
            "status",
            "down",
            &ns,
        ])
        .fails_json();
    assert_eq!(obj["code"], 50, "{obj}");
    assert_eq!(obj["cniVersion"], "1.1.0", "{obj}");
    // The same object as cnitool running the plugin itself.
    let local = Sandbox::new();
    not_ready(&local.net_dir(), &local.plugins);
    let local_obj = local
        .run(&["--json-errors", "status", "down", &ns])
        .fails_json();
    assert_eq!(obj, local_obj);
    let err = sb
        .run(&["--socket", socket(&daemon), "status", "down", &ns])
        .fails();
    assert!(
        err.starts_with(
            "error: plugin down STATUS failed (cnid answered HTTP 503): network \"down\" is not ready"
        )
            && err.contains("plugin not ready; no leases left"),
        "{err}"
    );
}

#[test]
fn errors_come_back_with_the_daemons_code_and_status_1() {
    let (dirs, plugins, daemon) = daemon("1.0.0");
    let sb = Sandbox::new();
    let ns = netns(&dirs, "ns");
    let sock = socket(&daemon);

    // Unknown network: code 7, as when cnitool loads it itself.
    let obj = sb
        .run(&["--socket", sock, "--json-errors", "add", "nope", &ns])
        .fails_json();
    assert_eq!(obj["code"], 7, "{obj}");
    assert!(
        obj["msg"].as_str().is_some_and(|m| m.contains("\"nope\"")),
        "{obj}"
    );
    let err = sb.run(&["--socket", sock, "add", "nope", &ns]).fails();
    assert!(
        err.starts_with(&format!(
            "error: cnid answered HTTP 404: no network configuration with name \"nope\" \
             (networks there: \"{NET}\")"
        )),
        "{err}"
    );
    // A near name gets the library's "did you mean".
    let typo = &NET[..NET.len() - 1];
    let err = sb.run(&["--socket", sock, "add", typo, &ns]).fails();
    assert!(
        err.contains(&format!(
            "; did you mean \"{NET}\"? (networks there: \"{NET}\")"
        )),
        "{err}"
    );
    // The same through CNITOOL_JSON_ERRORS (the environment reaches the daemon backend).
    let obj = sb
        .run_env(
            &["--socket", sock, "del", "no/such", &ns],
            &[("CNITOOL_JSON_ERRORS", "1")],
        )
        .fails_json();
    assert_eq!(obj["code"], 7, "{obj}");

    // An invalid interface name: code 4, the daemon's details.
    let obj = sb
        .run(&[
            "--socket",
            sock,
            "--json-errors",
            "-i",
            "bad/if",
            "add",
            NET,
            &ns,
        ])
        .fails_json();
    assert_eq!(obj["code"], 4, "{obj}");
    assert_eq!(obj["details"], "bad/if", "{obj}");
    assert_eq!(obj["cniVersion"], "1.0.0", "{obj}");

    // CHECK of an attachment never added: code 3, as locally.
    let obj = sb
        .run(&["--socket", sock, "--json-errors", "check", NET, &ns])
        .fails_json();
    assert_eq!(obj["code"], 3, "{obj}");
    assert!(plugins.invocations().is_empty(), "{:?}", commands(&plugins));

    // No daemon on the socket: code 5, naming the socket.
    let missing = dirs.root().join("none.sock");
    let obj = sb
        .run(&[
            "--socket",
            missing.to_str().expect("utf-8 temp dir"),
            "--json-errors",
            "add",
            NET,
            &ns,
        ])
        .fails_json();
    assert_eq!(obj["code"], 5, "{obj}");
    assert!(
        obj["msg"].as_str().is_some_and(
            |m| m.starts_with(&format!("cannot connect to cnid at {}", missing.display()))
        ),
        "{obj}"
    );
}

#[test]
fn the_flag_wins_and_version_and_validate_stay_local() {
    let (dirs, plugins, daemon) = daemon("1.0.0");
    let sb = Sandbox::new();
    network(&sb.net_dir(), &sb.plugins, "1.0.0");
    let ns = netns(&dirs, "ns");
    let nowhere: PathBuf = dirs.root().join("nowhere.sock");
    let env = [("CNID_SOCKET", nowhere.to_str().expect("utf-8 temp dir"))];

    // --socket wins over CNID_SOCKET.
    sb.run_env(&["--socket", socket(&daemon), "add", NET, &ns], &env)
        .ok();
    assert_eq!(commands(&plugins), ["a ADD", "b ADD"]);
    assert!(sb.plugins.invocations_of("ADD").is_empty());
    // Without the flag, CNID_SOCKET is used (and nothing listens there),
    // although the local conf dir has the network.
    let obj = sb
        .run_env(&["--json-errors", "del", NET, &ns], &env)
        .fails_json();
    assert_eq!(obj["code"], 5, "{obj}");

    // version and validate ask the local plugins, socket or not.
    let version = sb.run_env(&["version", "a"], &env).ok();
    assert_eq!(version.stdout_json()["cniVersion"], "1.0.0");
    sb.run_env(&["--socket", socket(&daemon), "validate", NET], &env)
        .ok();
    assert!(plugins.invocations_of("VERSION").is_empty());
    assert!(!sb.plugins.invocations_of("VERSION").is_empty());
    sb.run(&["--socket", socket(&daemon), "del", NET, &ns]).ok();
}

#[test]
fn cni_timeout_is_the_requests_deadline() {
    let dirs = Dirs::new();
    let plugins = PluginDir::in_dir(dirs.root());
    // ADD hangs at a gate never opened, until it is killed.
    let hang = Gate::new(dirs.root());
    plugins.fake(
        "slow",
        &Fake::new(Response::ok(""))
            .on(
                "ADD",
                Response::ok(&result_json("1.0.0", "10.1.2.3/24")).with_shell(&hang.shell_wait()),
            )
            .on("VERSION", Response::ok(&version_json("1.0.0"))),
    );
    dirs.conf(
        "slow.conflist",
        &json!({"cniVersion": "1.0.0", "name": "slow", "plugins": [{"type": "slow"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let sb = Sandbox::new();
    let ns = netns(&dirs, "ns");

    let started = Instant::now();
    let obj = sb
        .run_env(
            &[
                "--socket",
                socket(&daemon),
                "--json-errors",
                "add",
                "slow",
                &ns,
            ],
            &[("CNI_TIMEOUT", "2")],
        )
        .fails_json();
    let elapsed = started.elapsed();
    assert_eq!(obj["code"], 11, "{obj}");
    assert_eq!(hang.started(), 1);
    // The request's 2 s (not the daemon's 60 s default), the kill, the
    // rollback.
    let timeout = Duration::from_secs(2);
    assert!(elapsed >= timeout, "took only {elapsed:?}");
    assert!(
        elapsed < timeout + RawExec::DEFAULT_KILL_GRACE + LOAD_MARGIN,
        "took {elapsed:?}"
    );
    // The daemon rolled the ADD back: nothing attached.
    assert_eq!(attachments(&daemon), Vec::<Value>::new());
    assert_eq!(plugins.invocations_of("DEL").len(), 1);
}

/// cnid refuses a netns and interface that are another container's (409):
/// cnitool, whose container ID comes from the netns path, says how to act
/// on it and `--force` sends `"force": true`. `--force` without a socket,
/// and `batch` with one, are refused rather than ignored.
#[test]
fn another_containers_netns_gets_a_hint_and_force_sends_it() {
    let (dirs, plugins, daemon) = daemon("1.0.0");
    let sb = Sandbox::new();
    let ns = netns(&dirs, "owned");
    let sock = socket(&daemon);
    // A runtime attached "pod-a" on that netns, with an ID of its own.
    let body = json!({"containerId": "pod-a", "netns": ns, "ifname": "eth0"}).to_string();
    let r = crate::support::daemon::post(&daemon.socket, &format!("/v1/networks/{NET}/add"), &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let ran = commands(&plugins).len();

    let err = sb.run(&["--socket", sock, "del", NET, &ns]).fails();
    assert!(err.contains("belongs to container \"pod-a\""), "{err}");
    assert!(
        err.contains("\nhint: ") && err.contains("repeat with --force"),
        "{err}"
    );
    let obj = sb
        .run(&["--socket", sock, "--json-errors", "del", NET, &ns])
        .fails_json();
    assert_eq!(obj["code"], 909, "{obj}");
    assert!(
        obj["details"]
            .as_str()
            .is_some_and(|d| d.contains("--force")),
        "{obj}"
    );
    assert_eq!(commands(&plugins).len(), ran, "a refused DEL ran a plugin");

    sb.run(&["--socket", sock, "del", NET, &ns, "--force"]).ok();
    assert!(
        commands(&plugins).len() > ran,
        "the forced DEL ran no plugin"
    );

    let err = sb.run(&["del", NET, &ns, "--force"]).fails();
    assert!(err.contains("--force is for cnid"), "{err}");
    let err = sb
        .run(&["--socket", sock, "batch", "up", NET, "--count", "1"])
        .fails();
    assert!(err.contains("drop --socket"), "{err}");
}
