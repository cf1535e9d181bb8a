//! What a sandbox request answers when cnid itself refuses one of its
//! networks' steps, or a plugin fails inside one: cnid's own refusal
//! travels through the library's sandbox orchestration and comes back
//! whole (HTTP status, CNI code, message, details, `Retry-After`), and a
//! plugin's failure keeps its evidence (plugin type and command in the
//! headers, exit status, code, message, details, stderr). Fake plugins;
//! the exact bodies are those cnid answered before its refusals crossed
//! the library as its own error type.

use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, get, post};
use crate::support::gate::Gate;
use serde_json::{Value, json};

const NETNS: &str = "/proc/self/ns/net";

fn body(cid: &str, networks: Value, extra: Value) -> String {
    let mut b = json!({"containerId": cid, "netns": NETNS, "networks": networks});
    if let (Some(b), Some(extra)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(extra.clone());
    }
    b.to_string()
}

/// Networks `na`, `nb` (a plugin that succeeds), `nc` (that plugin, then
/// one whose ADD fails with evidence), `ng` (an ADD held at `gate`).
fn world(dirs: &Dirs, gate: &Gate) {
    dirs.plugin(
        "ok",
        r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.1.0","ips":[{"address":"10.77.0.2/24"}]}';;
VERSION) printf '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}';;
esac"#,
    );
    dirs.plugin(
        "bad",
        r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) echo "add stderr evidence" >&2; printf '{"cniVersion":"1.1.0","code":100,"msg":"refused on purpose","details":"why not"}'; exit 1;;
VERSION) printf '{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}';;
esac"#,
    );
    dirs.plugin(
        "held",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) {}
  printf '{{"cniVersion":"1.1.0"}}';;
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac"#,
            gate.shell_wait()
        ),
    );
    for (file, name, plugins) in [
        ("10-na.conflist", "na", json!([{"type": "ok"}])),
        ("20-nb.conflist", "nb", json!([{"type": "ok"}])),
        (
            "30-nc.conflist",
            "nc",
            json!([{"type": "ok"}, {"type": "bad"}]),
        ),
        ("40-ng.conflist", "ng", json!([{"type": "held"}])),
    ] {
        dirs.conf(
            file,
            &json!({"cniVersion": "1.1.0", "name": name, "plugins": plugins}),
        );
    }
}

#[test]
fn sandbox_refusals_and_plugin_failures_come_back_whole() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    world(&dirs, &gate);
    let mut daemon = Daemon::start(&dirs, &["--max-parallel", "1"]);
    let s = daemon.socket.clone();
    let two = json!([{"name": "na", "ifname": "eth0"}, {"name": "nb", "ifname": "eth1"}]);
    let r = post(&s, "/v1/sandboxes/add", &body("c1", two.clone(), json!({})));
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));

    // cnid's own refusal in a step (the attachment's ADD is cached).
    let r = post(&s, "/v1/sandboxes/add", &body("c1", two, json!({})));
    assert_eq!(r.status, 409);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(
        r.json(),
        json!({"cniVersion": "1.1.0", "code": 909,
            "msg": "network \"na\" (ifname eth0) ADD: container \"c1\" interface \"eth0\" is already attached to network \"na\": DEL it first",
            "details": "a cached ADD result exists"})
    );

    // A plugin's failure in the second network's step.
    let r = post(
        &s,
        "/v1/sandboxes/add",
        &body(
            "c2",
            json!([{"name": "na", "ifname": "eth2"}, {"name": "nc", "ifname": "eth3"}]),
            json!({}),
        ),
    );
    assert_eq!(r.status, 502);
    assert_eq!(r.header("cnid-plugin"), Some("bad"));
    assert_eq!(r.header("cnid-plugin-command"), Some("ADD"));
    assert_eq!(
        r.json(),
        json!({"cniVersion": "1.1.0", "code": 100,
            "msg": "network \"nc\" (ifname eth3) ADD: plugin bad ADD failed (exit status 1): refused on purpose; why not (CNI code 100); stderr: \"add stderr evidence\"",
            "details": "why not; the networks set up before it were deleted again: na"})
    );

    // The one slot held by an ADD at the gate: a STATUS of a network runs
    // out of time while queued (cnid's refusal, merged as a sandbox's
    // STATUS merges its networks').
    let held = {
        let s = s.clone();
        std::thread::spawn(move || {
            post(
                &s,
                "/v1/sandboxes/add",
                &body("c5", json!([{"name": "ng", "ifname": "eth5"}]), json!({})),
            )
        })
    };
    gate.wait_started_blocking(1);
    let r = post(
        &s,
        "/v1/sandboxes/status",
        &body("c9", json!([{"name": "na"}]), json!({"timeoutMs": 300})),
    );
    assert_eq!(r.status, 504);
    assert_eq!(r.header("retry-after"), None);
    let v = r.json();
    assert_eq!(
        (v["cniVersion"].clone(), v["code"].clone()),
        (json!("1.1.0"), json!(11))
    );
    let msg = v["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("network \"na\": deadline expired after ")
            && msg.ends_with("ms while queued; no plugin was run"),
        "{v}"
    );

    // Shut down while a STATUS waits for the slot: refused, and the answer
    // says to come back.
    let status = {
        let s = s.clone();
        std::thread::spawn(move || {
            post(
                &s,
                "/v1/sandboxes/status",
                &body("c9", json!([{"name": "na"}]), json!({"timeoutMs": 60000})),
            )
        })
    };
    eventually(Duration::from_secs(30), "the STATUS queued", || {
        String::from_utf8_lossy(&get(&s, "/v1/operations").body).contains("\"queued\"")
    });
    daemon.signal(libc::SIGTERM);
    let r = status.join().unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        r.json(),
        json!({"cniVersion": "1.1.0", "code": 11, "msg": "network \"na\": cnid is shutting down"})
    );
    gate.release();
    assert_eq!(held.join().unwrap().status, 200);
    assert!(
        daemon.wait(Duration::from_secs(30)).is_some(),
        "cnid exits after its drain"
    );
}
