//! Hostile names: path traversal (`../x`, `a/b`, `..`), NUL and very long
//! values in every name and ID field of every daemon endpoint and of
//! cnitool. Each is refused before any plugin runs (or, where the value is
//! only compared, accepted harmlessly), and no file appears anywhere but
//! where it should.
//!
//! Complements `daemon_bad_input.rs` (malformed bodies, the first traversal
//! cases), `cni-async/tests/ops_validation.rs` (the library, every verb)
//! and `cni-core`'s validators.

use crate::support;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::daemon::{Daemon, Dirs, RawAnswer, get, post, runs};
use crate::support::fake::Fake;
use crate::support::tool::Sandbox;
use serde_json::{Value, json};

const NETNS: &str = "/proc/self/ns/net";
const NET: &str = "sec";

/// Every path under `root` (files and dirs), except daemon logs and the
/// plugin's records.
fn tree(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("cnid-") && name.ends_with(".log") || name == "records" {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

/// Percent-encodes a path segment or query value, every byte that is not
/// unreserved.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The hostile values, by label.
fn hostile() -> Vec<(&'static str, String)> {
    vec![
        ("../x", "../x".into()),
        ("a/b", "a/b".into()),
        ("..", "..".into()),
        ("NUL", "a\0b".into()),
        ("very long", "a".repeat(300)),
    ]
}

/// What an endpoint must answer for a field: a status and CNI code.
#[derive(Debug, Clone, Copy)]
struct Want(u16, Option<u64>);

#[test]
fn every_name_and_id_of_every_endpoint_refuses_traversal_nul_and_overlong_values() {
    let dirs = Dirs::new();
    let records = dirs.recording_network("10-sec.conflist", NET, "1.1.0");
    // Conf files that name their network with a traversal: not loaded.
    for (file, name) in [("20-dots.conflist", "../x"), ("21-slash.conflist", "a/b")] {
        dirs.conf(
            file,
            &json!({"cniVersion": "1.1.0", "name": name, "plugins": [{"type": "rec"}]}),
        );
    }
    let daemon = Daemon::start(&dirs, &[]);
    let s = &daemon.socket;
    let nets = get(s, "/v1/networks").json();
    let errors = nets["errors"].to_string();
    assert!(
        errors.contains("20-dots.conflist") && errors.contains("21-slash.conflist"),
        "{nets}"
    );
    assert_eq!(nets["networks"].as_array().map(Vec::len), Some(1), "{nets}");
    let before = tree(dirs.root());

    let attach = |cid: &str, ifname: &str| {
        json!({"containerId": cid, "netns": NETNS, "ifname": ifname}).to_string()
    };
    let gc = |cid: &str, ifname: &str| {
        json!({"validAttachments": [{"containerID": cid, "ifname": ifname}]}).to_string()
    };
    // (what, method, path, body, wanted answer)
    let mut table: Vec<(String, &str, String, String, Want)> = Vec::new();
    for (label, v) in hostile() {
        let long = label == "very long";
        let e = enc(&v);
        for verb in ["add", "del", "check"] {
            // The network name, percent-encoded in the path.
            table.push((
                format!("{verb}: network {label}"),
                "POST",
                format!("/v1/networks/{e}/{verb}"),
                attach("c1", "eth0"),
                // A long name is valid but too long with the others (400, 4).
                if long {
                    Want(400, Some(4))
                } else {
                    Want(400, Some(7))
                },
            ));
            table.push((
                format!("{verb}: containerId {label}"),
                "POST",
                format!("/v1/networks/{NET}/{verb}"),
                attach(&v, "eth0"),
                Want(400, Some(4)),
            ));
            table.push((
                format!("{verb}: ifname {label}"),
                "POST",
                format!("/v1/networks/{NET}/{verb}"),
                attach("c1", &v),
                Want(400, Some(4)),
            ));
        }
        for verb in ["status", "gc"] {
            let body = if verb == "gc" {
                gc("c1", "eth0")
            } else {
                String::new()
            };
            table.push((
                format!("{verb}: network {label}"),
                "POST",
                format!("/v1/networks/{e}/{verb}"),
                body,
                // A long name is a valid name that no network has.
                if long {
                    Want(404, Some(7))
                } else {
                    Want(400, Some(7))
                },
            ));
        }
        // GC's valid attachments are only compared, never used in a path:
        // a long ID is a harmless no-match; the rest are invalid.
        table.push((
            format!("gc: validAttachments containerID {label}"),
            "POST",
            format!("/v1/networks/{NET}/gc"),
            gc(&v, "eth0"),
            if long {
                Want(200, None)
            } else {
                Want(400, Some(4))
            },
        ));
        table.push((
            format!("gc: validAttachments ifname {label}"),
            "POST",
            format!("/v1/networks/{NET}/gc"),
            gc("c1", &v),
            Want(400, Some(4)),
        ));
        table.push((
            format!("get network {label}"),
            "GET",
            format!("/v1/networks/{e}"),
            String::new(),
            if long {
                Want(404, Some(7))
            } else {
                Want(400, Some(7))
            },
        ));
        for endpoint in ["attachments", "operations"] {
            table.push((
                format!("{endpoint}?containerId={label}"),
                "GET",
                format!("/v1/{endpoint}?containerId={e}"),
                String::new(),
                if long {
                    Want(200, None)
                } else {
                    Want(400, Some(4))
                },
            ));
        }
    }
    // Unencoded traversal in the path never reaches a handler.
    for (path, want) in [
        ("/v1/networks/../add", Want(400, Some(7))),
        ("/v1/networks/../x/add", Want(404, Some(904))),
        ("/v1/networks/a/b/add", Want(404, Some(904))),
        ("/v1/../v1/health", Want(404, Some(904))),
    ] {
        table.push((
            format!("raw path {path}"),
            "POST",
            path.into(),
            attach("c1", "eth0"),
            want,
        ));
    }

    let mut failures = Vec::new();
    for (what, method, path, body, Want(status, code)) in &table {
        let r: RawAnswer = if *method == "GET" {
            get(s, path)
        } else {
            post(s, path, body)
        };
        let body_text = String::from_utf8_lossy(&r.body).into_owned();
        if r.status != *status {
            failures.push(format!(
                "{what}: HTTP {} (want {status}): {body_text}",
                r.status
            ));
            continue;
        }
        if let Some(code) = code {
            let got = r.json()["code"].as_u64();
            if got != Some(*code) {
                failures.push(format!("{what}: code {got:?} (want {code}): {body_text}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} requests answered wrongly:\n{}",
        failures.len(),
        table.len(),
        failures.join("\n")
    );
    // Nothing ran (but the GC that a harmless no-match let through),
    // nothing was written, nothing was created anywhere.
    let attachment_runs = || -> Vec<support::daemon::Run> {
        runs(&records)
            .into_iter()
            .filter(|r| r.command != "GC")
            .collect()
    };
    println!(
        "names: {} hostile requests over every endpoint answered as specified; \
         plugin runs for them: {} (GC runs for the harmless no-match: {})",
        table.len(),
        attachment_runs().len(),
        runs(&records).len() - attachment_runs().len()
    );
    assert!(attachment_runs().is_empty(), "{:?}", attachment_runs());
    let after = tree(dirs.root());
    let new: Vec<&PathBuf> = after.difference(&before).collect();
    assert!(new.is_empty(), "files appeared: {new:?}");
    assert!(dirs.cached().is_empty() && dirs.intents().is_empty());
    // A name just short of the limit works end to end; one byte more is
    // refused before anything runs.
    let fits = "c".repeat(server_limit() - NET.len() - "eth0".len() - 2);
    let r = post(
        s,
        &format!("/v1/networks/{NET}/add"),
        &attach(&fits, "eth0"),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        post(
            s,
            &format!("/v1/networks/{NET}/del"),
            &attach(&fits, "eth0")
        )
        .status,
        204
    );
    let r = post(
        s,
        &format!("/v1/networks/{NET}/add"),
        &attach(&format!("{fits}c"), "eth0"),
    );
    assert_eq!(
        (r.status, r.cni_error()),
        (400, 4),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(
        attachment_runs().len(),
        2,
        "only the ADD and DEL that fit ran"
    );
    assert_eq!(get(s, "/v1/health").status, 200);
}

/// The daemon's limit on `<network>-<containerID>-<ifname>` (documented in
/// API.md; the cache's temp file name must fit in 255 bytes).
fn server_limit() -> usize {
    222
}

#[test]
fn cnitool_refuses_traversal_in_network_and_ifname_and_passes_cni_args_through() {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("secnet", "1.0.0", &[json!({"type": "p"})]);
    // Networks that exist in NETCONFPATH under hostile names: found by
    // name, refused by validation before anything runs.
    for (file, name) in [("20-dots.conflist", "../x"), ("21-slash.conflist", "a/b")] {
        sb.conf(
            file,
            &json!({"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "p"}]}),
        );
    }
    let netns = &sb.netns("sectest");
    let before = tree(sb.root());
    let long = "a".repeat(300);
    // (what, arguments, environment)
    type Case = (String, Vec<String>, Vec<(&'static str, String)>);
    let mut cases: Vec<Case> = Vec::new();
    for verb in ["add", "check", "del", "gc", "status"] {
        for net in ["../x", "a/b", "..", "../../../../etc/passwd", long.as_str()] {
            cases.push((
                format!("{verb} network {net:.20}"),
                vec![verb.into(), net.into(), netns.into()],
                vec![],
            ));
        }
    }
    for verb in ["add", "check", "del"] {
        for ifname in ["../x", "a/b", "..", long.as_str()] {
            cases.push((
                format!("{verb} -i {ifname:.20}"),
                vec![
                    verb.into(),
                    "-i".into(),
                    ifname.into(),
                    "secnet".into(),
                    netns.into(),
                ],
                vec![],
            ));
            cases.push((
                format!("{verb} CNI_IFNAME={ifname:.20}"),
                vec![verb.into(), "secnet".into(), netns.into()],
                vec![("CNI_IFNAME", ifname.to_owned())],
            ));
        }
    }
    for (what, args, env) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let run = sb.run_env(&args, &env);
        assert_eq!(run.code, Some(1), "{what}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stdout.is_empty(), "{what}: {}", run.stdout);
    }
    assert!(
        sb.plugins.invocations().is_empty(),
        "a plugin ran for a hostile name"
    );
    let new: Vec<PathBuf> = tree(sb.root()).difference(&before).cloned().collect();
    assert!(new.is_empty(), "files appeared: {new:?}");

    // CNI_ARGS values are data for plugins, never paths of ours: they reach
    // the plugin unchanged and the cache file is the attachment's.
    let args = "IgnoreUnknown=1;K8S_POD_NAME=../../x;K8S_POD_NAMESPACE=a/b;X=..";
    sb.run_env(&["add", "secnet", netns], &[("CNI_ARGS", args)])
        .ok();
    let calls = sb.plugins.invocations();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].var("CNI_ARGS"), Some(args));
    let entries = sb.cache_entries();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].starts_with("secnet-cnitool-"), "{entries:?}");
    let record: Value = sb
        .cache_record(
            "secnet",
            entries[0]
                .trim_start_matches("secnet-")
                .trim_end_matches("-eth0"),
            "eth0",
        )
        .expect("record");
    assert_eq!(record["cniArgs"][1], json!(["K8S_POD_NAME", "../../x"]));
    sb.run_env(&["del", "secnet", netns], &[("CNI_ARGS", args)])
        .ok();
    assert!(sb.cache_entries().is_empty());
    println!(
        "names: cnitool refused {} hostile network names and interface names; CNI_ARGS passed through",
        cases.len()
    );
}
