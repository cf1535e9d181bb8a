//! Control characters in requests: every name that carries one is refused
//! (400, the field named, the value escaped in the message), and nothing a
//! request or a plugin sends reaches the daemon's log raw. An interface
//! name `"\u001b[31mX"` used to be accepted and written into the log as is.

use crate::support::daemon::{Daemon, Dirs, RawAnswer, post, raw_bytes};
use serde_json::{Value, json};

/// Characters a terminal acts on or that hide text: ESC (a CSI sequence),
/// BEL, DEL, the C1 CSI, a bidirectional override.
const NASTY: [&str; 5] = ["\u{1b}[31m", "\u{7}", "\u{7f}", "\u{9b}2J", "\u{202e}"];

/// The first control or otherwise unprintable character in `log` that is
/// not a line end, with some context.
fn raw_control(log: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(log);
    text.char_indices()
        .find(|&(_, c)| c != '\n' && cni_core::validate::is_unprintable(c))
        .map(|(i, c)| {
            let from = text[..i].rfind('\n').map_or(0, |n| n + 1);
            let to = text[i..].find('\n').map_or(text.len(), |n| i + n);
            format!("{c:?} in line {:?}", &text[from..to])
        })
}

#[track_caller]
fn refused(what: &str, r: &RawAnswer, code: u64, field: &str) {
    assert_eq!(
        r.status,
        400,
        "{what}: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.cni_error(), code, "{what}");
    let msg = r.json()["msg"].as_str().unwrap_or_default().to_owned();
    assert!(msg.contains(field), "{what}: {msg}");
    assert!(
        !msg.chars().any(cni_core::validate::is_unprintable),
        "{what}: unescaped value in {msg:?}"
    );
}

#[test]
fn control_characters_are_refused_and_never_logged_raw() {
    let dirs = Dirs::new();
    // A plugin that writes control characters to stderr (kept at debug
    // level) and, on the network "failing", fails with them in its message.
    dirs.plugin(
        "loud",
        r#"cat > /dev/null
printf 'stderr \033[31mred\007 \302\233 done\n' >&2
case "$CNI_COMMAND" in
ADD) if [ "$FAIL" = 1 ]; then
       printf '{"cniVersion":"1.0.0","code":101,"msg":"bad \\u001b[2J \\u009b","details":"\\u001b"}'
       exit 1
     fi
     printf '{"cniVersion":"1.0.0","ips":[{"address":"10.9.0.2/24"}]}';;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}';;
esac"#,
    );
    dirs.plugin("failing", "FAIL=1 exec \"$(dirname \"$0\")/loud\"");
    dirs.conf(
        "10-ok.conflist",
        &json!({"cniVersion": "1.0.0", "name": "ok", "plugins": [{"type": "loud"}]}),
    );
    dirs.conf(
        "20-failing.conflist",
        &json!({"cniVersion": "1.0.0", "name": "failing", "plugins": [{"type": "failing"}]}),
    );
    let daemon = Daemon::start_with(&dirs, &[], |cmd| {
        cmd.env("RUST_LOG", "debug");
    });
    let s = &daemon.socket;
    let netns = "/proc/self/ns/net";
    let body = |cid: &str, netns: &str, ifname: &str, args: &str| {
        json!({"containerId": cid, "netns": netns, "ifname": ifname, "cniArgs": args}).to_string()
    };

    for bad in NASTY {
        let ifname = format!("{bad}X").chars().take(8).collect::<String>();
        for verb in ["add", "check", "del"] {
            let r = post(
                s,
                &format!("/v1/networks/ok/{verb}"),
                &body("c1", netns, &ifname, ""),
            );
            refused(
                &format!("{verb} ifname {ifname:?}"),
                &r,
                4,
                "interface name",
            );
        }
        let r = post(
            s,
            "/v1/networks/ok/add",
            &body(&format!("c{bad}"), netns, "eth0", ""),
        );
        refused(&format!("container ID with {bad:?}"), &r, 4, "container ID");
        let r = post(
            s,
            "/v1/networks/ok/add",
            &body("c1", &format!("{netns}{bad}"), "eth0", ""),
        );
        refused(&format!("netns with {bad:?}"), &r, 4, "netns");
        let r = post(
            s,
            "/v1/networks/ok/del",
            &body("c1", &format!("/run/netns/{bad}"), "eth0", ""),
        );
        refused(&format!("DEL netns with {bad:?}"), &r, 4, "netns");
        let r = post(
            s,
            "/v1/networks/ok/add",
            &body("c1", netns, "eth0", &format!("K=v{bad}")),
        );
        refused(&format!("cniArgs with {bad:?}"), &r, 4, "CNI_ARGS");
        let gc = json!({"validAttachments": [{"containerID": "c1", "ifname": format!("e{bad}")}]});
        let r = post(s, "/v1/networks/ok/gc", &gc.to_string());
        refused(&format!("GC ifname with {bad:?}"), &r, 4, "interface name");
        // Percent-encoded into the path.
        let encoded: String = bad.bytes().map(|b| format!("%{b:02X}")).collect();
        let r = post(
            s,
            &format!("/v1/networks/n{encoded}x/add"),
            &body("c1", netns, "eth0", ""),
        );
        refused(&format!("network name with {bad:?}"), &r, 7, "network name");
    }
    // The reported case, exactly.
    let r = post(
        s,
        "/v1/networks/ok/add",
        &body("c1", netns, "\u{1b}[31mX", ""),
    );
    refused("ESC in ifname", &r, 4, "interface name");
    assert_eq!(
        r.json()["msg"],
        Value::from(
            "invalid interface name \"\\u{1b}[31mX\": contains a control or other non-printable character"
        )
    );
    // A header with a control character (hyper refuses it; the answer does
    // not matter, the log does).
    let _ = raw_bytes(
        s,
        b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Request-Id: a\x1b[2Jb\r\nConnection: close\r\n\r\n",
    );

    // Plugins with control characters in stderr and in their error
    // message; capability args with them pass through to the plugin.
    let mut ok = json!({"containerId": "c1", "netns": netns});
    ok["capabilityArgs"] = json!({"x": "\u{1b}[5m"});
    let r = post(s, "/v1/networks/ok/add", &ok.to_string());
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = post(s, "/v1/networks/failing/add", &ok.to_string());
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.cni_error(), 101);
    let r = post(s, "/v1/networks/ok/del", &ok.to_string());
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));

    drop(daemon);
    let log = std::fs::read_dir(dirs.root())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect::<Vec<_>>()
        .concat();
    let text = String::from_utf8_lossy(&log);
    // The log did see the plugin's output and the failures (escaped).
    assert!(
        text.contains("\\u{1b}[31mred"),
        "plugin stderr not logged:\n{text}"
    );
    assert!(text.contains("operation failed"), "{text}");
    if let Some(found) = raw_control(&log) {
        panic!("raw control character in the daemon's log: {found}");
    }
}
