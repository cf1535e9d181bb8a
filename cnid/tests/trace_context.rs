//! W3C trace context reaches the plugins: from a runtime's environment
//! through cnid-shim (as headers) and cnid to the plugin; from cnitool's
//! environment to its plugins, in process and through `--socket`; a
//! malformed `traceparent` is dropped on the way (the plugin gets it
//! empty, not the caller's raw value), and cnid's operation lines carry
//! the trace id.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use crate::support::daemon::{Daemon, Dirs};
use crate::support::shim::{Call, plugin_conf};
use crate::support::tool::CNITOOL;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const BAD_TP: &str = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";

/// A network `traced` of one plugin that writes, per call, its command,
/// container and the three trace variables (`unset` when unset) to
/// `<data>/env/<COMMAND>-<CONTAINER>`.
fn traced_network(dirs: &Dirs) -> std::path::PathBuf {
    let records = dirs.data.join("env");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "envrec",
        &format!(
            r#"cat > /dev/null
if [ "$CNI_COMMAND" = VERSION ]; then printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}'; exit 0; fi
printf '%s\n' "${{TRACEPARENT-unset}}" "${{TRACESTATE-unset}}" "${{BAGGAGE-unset}}" > "{dir}/$CNI_COMMAND-${{CNI_CONTAINERID:--}}"
if [ "$CNI_COMMAND" = ADD ]; then printf '{{"cniVersion":"1.1.0","ips":[{{"address":"10.98.0.2/24"}}]}}'; fi
"#,
            dir = records.display()
        ),
    );
    dirs.conf(
        "10-traced.conflist",
        &json!({"cniVersion": "1.1.0", "name": "traced", "plugins": [{"type": "envrec"}]}),
    );
    records
}

/// What the plugin got for `command` of `container`: TRACEPARENT,
/// TRACESTATE, BAGGAGE.
fn got(records: &Path, command: &str, container: &str) -> Vec<String> {
    let path = records.join(format!("{command}-{container}"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Runs the shim for `call` with `trace` in its environment.
fn shim_with(call: &Call, trace: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = call.command();
    for v in ["TRACEPARENT", "TRACESTATE", "BAGGAGE"] {
        cmd.env_remove(v);
    }
    cmd.envs(trace.iter().copied());
    let mut child = cmd.spawn().expect("spawn cnid-shim");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&call.config).unwrap())
        .unwrap();
    child.wait_with_output().expect("wait for cnid-shim")
}

fn cnitool(dirs: &Dirs, args: &[&str], trace: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(&*CNITOOL);
    for v in [
        "TRACEPARENT",
        "TRACESTATE",
        "BAGGAGE",
        "CNID_SOCKET",
        "CNI_ARGS",
        "CAP_ARGS",
        "CNI_IFNAME",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("NETCONFPATH", &dirs.conf)
        .env("CNI_PATH", &dirs.bin)
        .env("CNI_CACHE_DIR", dirs.root().join("tool-cache"))
        .envs(trace.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cnitool")
}

#[test]
fn a_runtimes_trace_reaches_the_plugin_through_the_shim_and_cnid() {
    let dirs = Dirs::new();
    let records = traced_network(&dirs);
    let daemon = Daemon::start(&dirs, &[]);
    let conf = plugin_conf(
        "k8s-pod-network",
        "1.1.0",
        &dirs.socket,
        json!({"network": "traced"}),
    );

    let add = Call::new("ADD", "c1", &dirs.netns("c1"), &conf);
    let out = shim_with(
        &add,
        &[
            ("TRACEPARENT", TP),
            ("TRACESTATE", "congo=t61rcWkgMzE"),
            ("BAGGAGE", "pod=web"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        got(&records, "ADD", "c1"),
        [TP, "congo=t61rcWkgMzE", "pod=web"]
    );
    // The operation's log lines name the trace.
    let log = daemon.log();
    assert!(
        log.lines().any(|l| l.contains("operation done")
            && l.contains(&format!("trace_id=\"{TRACE_ID}\""))
            && l.contains("container=\"c1\"")),
        "{log}"
    );

    // A malformed traceparent (upper-case hex) is dropped, its tracestate
    // with it: the plugin gets them empty, not the runtime's raw values.
    let del = Call::new("DEL", "c1", &dirs.netns("c1"), &conf);
    let out = shim_with(&del, &[("TRACEPARENT", BAD_TP), ("TRACESTATE", "congo=1")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(got(&records, "DEL", "c1"), ["", "", ""]);

    // No trace at all: set empty all the same (cnid's own environment
    // never passes for a request's).
    let out = shim_with(&Call::new("ADD", "c2", &dirs.netns("c2"), &conf), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(got(&records, "ADD", "c2"), ["", "", ""]);
}

#[test]
fn cnitools_environment_reaches_the_plugin_in_process_and_through_cnid() {
    let dirs = Dirs::new();
    let records = traced_network(&dirs);

    // In process.
    let ns = dirs.netns("t1");
    let out = cnitool(
        &dirs,
        &["add", "traced", &ns],
        &[("TRACEPARENT", TP), ("BAGGAGE", "k=v")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cid = std::fs::read_dir(&records)
        .unwrap()
        .find_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_prefix("ADD-")
                .map(str::to_owned)
        })
        .expect("the ADD's record");
    assert_eq!(got(&records, "ADD", &cid), [TP, "", "k=v"]);
    // A malformed one is not inherited as it is.
    let out = cnitool(&dirs, &["del", "traced", &ns], &[("TRACEPARENT", BAD_TP)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(got(&records, "DEL", &cid), ["", "", ""]);

    // Through cnid: sent as headers.
    let daemon = Daemon::start(&dirs, &[]);
    let socket = dirs.socket.to_str().unwrap();
    let ns2 = dirs.netns("t2");
    let out = cnitool(
        &dirs,
        &["--socket", socket, "add", "traced", &ns2],
        &[("TRACEPARENT", TP), ("TRACESTATE", "rojo=00f067aa0ba902b7")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cid2 = std::fs::read_dir(&records)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| {
            n.strip_prefix("ADD-")
                .filter(|c| *c != cid)
                .map(str::to_owned)
        })
        .expect("the second ADD's record");
    assert_eq!(
        got(&records, "ADD", &cid2),
        [TP, "rojo=00f067aa0ba902b7", ""]
    );
    assert!(
        daemon.log().contains(&format!("trace_id=\"{TRACE_ID}\"")),
        "{}",
        daemon.log()
    );
}
