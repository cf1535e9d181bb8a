//! The on-disk result cache as the operations layer uses it: libcni's
//! layout and record format, when entries are written and removed, and how
//! corrupt, foreign and symlinked entries are handled.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::support::fake::{Fake, Invocation, Response, Rig, assert_json_eq, conflist, sh_quote};
use cni_async::Error;
use cni_core::cache::CacheEntry;
use cni_core::{CapabilityArgs, CniArgs, NetworkConfigList, RuntimeConf};
use serde_json::{Value, json};

fn result_json(ip: &str) -> Value {
    json!({"cniVersion":"1.0.0",
        "interfaces":[{"name":"eth0","sandbox":"/run/netns/c1"}],
        "ips":[{"address": ip,"gateway":"10.210.0.1","interface":0}]})
}

/// Two recording fakes `a` and `b` answering ADD with `result_json`.
fn two_plugin_rig(ip: &str) -> Rig {
    let rig = Rig::new();
    for p in ["a", "b"] {
        rig.fake(
            p,
            &Fake::new(Response::ok("")).on("ADD", Response::ok(&result_json(ip).to_string())),
        );
    }
    rig
}

fn two_plugin_list(name: &str) -> NetworkConfigList {
    conflist(json!({"cniVersion":"1.0.0","name": name,
        "plugins":[{"type":"a","capabilities":{"portMappings":true}},{"type":"b"}]}))
}

fn rt_with_args(cid: &str) -> RuntimeConf {
    let mut rt = RuntimeConf::new(cid, format!("/run/netns/{cid}"), "eth0");
    rt.args = CniArgs::parse("K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web").unwrap();
    rt.capability_args = CapabilityArgs::from_json(
        r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#,
    )
    .unwrap();
    rt
}

/// Standard base64 with padding, as Go encodes a `[]byte` in JSON.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn base64_matches_known_vectors() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
}

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn dels(calls: &[Invocation]) -> Vec<&Invocation> {
    calls.iter().filter(|c| c.command() == "DEL").collect()
}

#[tokio::test]
async fn record_has_libcni_layout_and_decodes_with_cni_core() {
    let rig = two_plugin_rig("10.210.0.2/24");
    let list = two_plugin_list("layout");
    let rt = rt_with_args("c1");
    rig.cni().add_network_list(&list, &rt).await.expect("ADD");

    let path = rig.cache_file("layout", "c1", "eth0");
    let bytes = fs::read(&path).expect("cache file at <cache>/results/<net>-<cid>-<ifname>");
    assert_eq!(mode(&path), 0o600, "cache file mode");
    assert_eq!(
        mode(&rig.cache_dir.join("results")),
        0o700,
        "results dir mode"
    );

    // Key order and values as libcni writes them.
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "kind",
            "containerId",
            "config",
            "ifName",
            "networkName",
            "netns",
            "cniArgs",
            "capabilityArgs",
            "result",
            "netnsIdentity"
        ]
    );
    // Ours, after libcni's keys (libcni ignores it): the boot id; the
    // path is no namespace here, so no device, inode or handle.
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_json_eq(
        &value,
        &json!({
            "kind": "cniCacheV1",
            "containerId": "c1",
            "config": base64(list.bytes()),
            "ifName": "eth0",
            "networkName": "layout",
            "netns": "/run/netns/c1",
            "cniArgs": [["K8S_POD_NAMESPACE", "ns1"], ["K8S_POD_NAME", "web"]],
            "capabilityArgs": {"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]},
            "result": result_json("10.210.0.2/24"),
            "netnsIdentity": {"bootId": boot.trim()},
        }),
        "cache record",
    );

    // Read back by cni-core's decoder, fields intact.
    let CacheEntry::Record(rec) = CacheEntry::decode(&bytes, "test").expect("decodes") else {
        panic!("not a cniCacheV1 record");
    };
    rec.check_matches("layout", "c1", "eth0").unwrap();
    assert_eq!(rec.config, list.bytes());
    assert_eq!(rec.netns, "/run/netns/c1");
    assert_eq!(rec.cni_args, rt.args);
    assert_eq!(rec.capability_args, rt.capability_args);
    assert_eq!(rec.result, Some(result_json("10.210.0.2/24")));
    assert_eq!(rec.runtime_conf(), rt);

    // No temp files left next to it.
    assert_eq!(rig.result_files(), ["layout-c1-eth0"]);
}

#[tokio::test]
async fn empty_fields_are_omitted_like_go_omitempty() {
    let rig = two_plugin_rig("10.210.1.2/24");
    let list = two_plugin_list("sparse");
    // ADD needs a netns (netns_rule.rs); no CNI_ARGS, no capability args.
    let rt = RuntimeConf::new("c1", "/run/netns/sparse", "eth0");
    rig.cni().add_network_list(&list, &rt).await.expect("ADD");
    let value = rig.cache_json("sparse", "c1", "eth0").unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "kind",
            "containerId",
            "config",
            "ifName",
            "networkName",
            "netns",
            "result",
            "netnsIdentity"
        ]
    );
}

/// The cache is written only after the whole chain succeeded: plugin `b`
/// looks for the file while it runs; a failed ADD leaves no file at all.
#[tokio::test]
async fn written_only_after_the_whole_chain_succeeded() {
    let rig = Rig::new();
    let file = rig.cache_file("late", "c1", "eth0");
    let marker = rig.dir.scratch("seen-during-b");
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(&result_json("10.210.2.2/24").to_string()),
        ),
    );
    let probe = format!(
        "if [ -e {f} ]; then echo present > {m}; else echo absent > {m}; fi",
        f = sh_quote(&file.to_string_lossy()),
        m = sh_quote(&marker.to_string_lossy())
    );
    rig.fake(
        "b",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(&result_json("10.210.2.2/24").to_string()).with_shell(&probe),
        ),
    );
    let list = two_plugin_list("late");
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    rig.cni().add_network_list(&list, &rt).await.expect("ADD");
    assert_eq!(fs::read_to_string(&marker).unwrap().trim(), "absent");
    assert!(file.exists());

    // A chain whose last plugin fails: no cache file, no temp file.
    let rig = Rig::new();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(&result_json("10.210.2.3/24").to_string()),
        ),
    );
    rig.fake("b", &Fake::new(Response::cni_error(11, "try later", "")));
    let err = rig
        .cni()
        .add_network_list(&list, &rt)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(11), "{err}");
    assert!(!rig.cache_file("late", "c1", "eth0").exists());
    assert!(rig.result_files().is_empty(), "{:?}", rig.result_files());
}

#[tokio::test]
async fn removed_after_del_and_kept_when_del_fails() {
    let rig = Rig::new();
    let fail_flag = rig.dir.scratch("fail-del");
    let ok = result_json("10.210.3.2/24").to_string();
    rig.fake(
        "a",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(&ok)),
    );
    // `b` fails DEL while the flag file exists.
    let shell = format!(
        "if [ -e {f} ]; then echo '{{\"code\":11,\"msg\":\"busy\"}}'; exit 1; fi",
        f = sh_quote(&fail_flag.to_string_lossy())
    );
    rig.fake(
        "b",
        &Fake::new(Response::ok(""))
            .on("ADD", Response::ok(&ok))
            .on("DEL", Response::ok("").with_shell(&shell)),
    );
    let list = two_plugin_list("keep");
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cni = rig.cni();
    cni.add_network_list(&list, &rt).await.expect("ADD");
    let file = rig.cache_file("keep", "c1", "eth0");
    let before = fs::read(&file).unwrap();

    fs::write(&fail_flag, "").unwrap();
    let err = cni
        .del_network_list(&list, &rt)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(err.is_plugin_code(11), "{err}");
    assert_eq!(
        fs::read(&file).unwrap(),
        before,
        "cache entry kept unchanged after a failed DEL"
    );
    // DEL stops at the first failure: `a` never got DEL.
    let calls = rig.dir.invocations();
    assert_eq!(
        dels(&calls)
            .iter()
            .map(|c| c.plugin.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );

    // The retry gets the same prevResult and removes the entry.
    fs::remove_file(&fail_flag).unwrap();
    cni.del_network_list(&list, &rt).await.expect("DEL retry");
    assert!(!file.exists());
    let calls = rig.dir.invocations();
    let d = dels(&calls);
    assert_eq!(
        d.iter().map(|c| c.plugin.as_str()).collect::<Vec<_>>(),
        ["b", "b", "a"]
    );
    for call in &d {
        assert_json_eq(
            &call.stdin_json()["prevResult"],
            &result_json("10.210.3.2/24"),
            "DEL prevResult",
        );
    }
    // A repeated DEL is fine (no entry, no prevResult).
    cni.del_network_list(&list, &rt).await.expect("DEL again");
    let calls = rig.dir.invocations();
    let last = calls.last().unwrap();
    assert!(last.stdin_json().get("prevResult").is_none());
}

#[tokio::test]
async fn del_without_entry_runs_without_prev_result() {
    let rig = two_plugin_rig("10.210.4.2/24");
    let list = two_plugin_list("none");
    let rt = RuntimeConf::new("c1", "", "eth0");
    rig.cni().del_network_list(&list, &rt).await.expect("DEL");
    let calls = rig.dir.invocations();
    assert_eq!(
        calls.iter().map(|c| c.plugin.as_str()).collect::<Vec<_>>(),
        ["b", "a"]
    );
    for call in &calls {
        assert_eq!(call.command(), "DEL");
        assert!(
            call.stdin_json().get("prevResult").is_none(),
            "{:?}",
            call.stdin_json()
        );
    }
}

/// A truncated record and one of an unknown kind are moved to `corrupt/`
/// (bytes intact), and DEL proceeds without prevResult.
#[tokio::test]
async fn corrupt_entry_is_moved_aside_and_del_proceeds() {
    for (label, bad) in [
        (
            "truncated",
            &br#"{"kind":"cniCacheV1","containerId":"c1","config":"e30=","ifName":"eth0","netwo"#[..],
        ),
        (
            "unknown kind",
            br#"{"kind":"cniCacheV7","containerId":"c1"}"#,
        ),
        ("not an object", b"[1,2,3]"),
    ] {
        let rig = two_plugin_rig("10.210.5.2/24");
        let list = two_plugin_list("bad");
        let rt = RuntimeConf::new("c1", "", "eth0");
        let file = rig.cache_file("bad", "c1", "eth0");
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(&file, bad).unwrap();

        rig.cni()
            .del_network_list(&list, &rt)
            .await
            .unwrap_or_else(|e| panic!("{label}: DEL: {e}"));
        let calls = rig.dir.invocations();
        assert_eq!(calls.len(), 2, "{label}");
        for call in &calls {
            assert!(call.stdin_json().get("prevResult").is_none(), "{label}");
        }
        assert!(!file.exists(), "{label}: corrupt entry still in results/");
        let moved = rig.corrupt_files();
        assert_eq!(moved.len(), 1, "{label}: {moved:?}");
        assert!(moved[0].starts_with("bad-c1-eth0."), "{label}: {moved:?}");
        assert_eq!(
            fs::read(rig.cache_dir.join("corrupt").join(&moved[0])).unwrap(),
            bad,
            "{label}"
        );
    }
}

/// `a-b` + `c` and `a` + `b-c` share the file name `a-b-c-eth0`. The record
/// of one is never used as the other's prevResult, nor deleted by its DEL,
/// nor listed as a CHECK-able attachment.
#[tokio::test]
async fn record_of_a_colliding_attachment_is_neither_used_nor_deleted() {
    let rig = two_plugin_rig("10.210.6.2/24");
    let cni = rig.cni();
    let owner = two_plugin_list("a-b");
    let other = two_plugin_list("a");
    let owner_rt = RuntimeConf::new("c", "/run/netns/c", "eth0");
    let other_rt = RuntimeConf::new("b-c", "/run/netns/b-c", "eth0");
    cni.add_network_list(&owner, &owner_rt)
        .await
        .expect("ADD a-b/c");
    let file = rig.cache_file("a-b", "c", "eth0");
    assert_eq!(file, rig.cache_file("a", "b-c", "eth0"));
    let before = fs::read(&file).unwrap();

    assert!(
        cni.cached_result(&other, &other_rt)
            .await
            .unwrap()
            .is_none()
    );
    assert!(cni.cached_config("a", &other_rt).await.unwrap().is_none());
    let err = cni
        .check_network_list(&other, &other_rt)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::NotAttached { .. }), "{err}");

    cni.del_network_list(&other, &other_rt)
        .await
        .expect("DEL a/b-c");
    let calls = rig.dir.invocations();
    for call in dels(&calls) {
        assert!(
            call.stdin_json().get("prevResult").is_none(),
            "foreign record used as prevResult"
        );
    }
    assert_eq!(
        fs::read(&file).unwrap(),
        before,
        "foreign record deleted or changed"
    );
    assert!(
        rig.corrupt_files().is_empty(),
        "a foreign record is not corrupt"
    );
    // It is still the owner's.
    assert!(
        cni.cached_result(&owner, &owner_rt)
            .await
            .unwrap()
            .is_some()
    );
}

/// A symlink at the entry's path is never followed: DEL runs without
/// prevResult, the link is moved aside, its target is untouched.
#[tokio::test]
async fn symlinked_entry_is_refused() {
    let rig = two_plugin_rig("10.210.7.2/24");
    let list = two_plugin_list("link");
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let cni = rig.cni();
    // A valid record for this very attachment, outside the cache dir.
    cni.add_network_list(&list, &rt).await.expect("ADD");
    let file = rig.cache_file("link", "c1", "eth0");
    let target = rig.dir.scratch("elsewhere");
    fs::rename(&file, &target).unwrap();
    let target_bytes = fs::read(&target).unwrap();
    std::os::unix::fs::symlink(&target, &file).unwrap();

    assert!(
        cni.cached_result(&list, &rt).await.unwrap().is_none(),
        "symlink followed by cached_result"
    );
    assert!(
        fs::symlink_metadata(&file).is_err(),
        "symlink left in results/"
    );
    assert_eq!(rig.corrupt_files().len(), 1);

    std::os::unix::fs::symlink(&target, &file).unwrap();
    cni.del_network_list(&list, &rt).await.expect("DEL");
    let calls = rig.dir.invocations();
    for call in dels(&calls) {
        assert!(
            call.stdin_json().get("prevResult").is_none(),
            "symlink followed by DEL"
        );
    }
    assert_eq!(
        fs::read(&target).unwrap(),
        target_bytes,
        "symlink target changed"
    );
    assert_eq!(rig.corrupt_files().len(), 2);
    let moved = rig.cache_dir.join("corrupt").join(&rig.corrupt_files()[0]);
    assert!(
        fs::symlink_metadata(&moved)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link itself is moved"
    );

    // CHECK with only a symlink there is refused as "not attached".
    std::os::unix::fs::symlink(&target, &file).unwrap();
    let err = cni
        .check_network_list(&list, &rt)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::NotAttached { .. }), "{err}");
}

/// A bare result (what libcni wrote before cniCacheV1) is used as
/// prevResult and removed by DEL.
#[tokio::test]
async fn legacy_bare_result_is_used_and_removed() {
    let rig = two_plugin_rig("10.210.8.2/24");
    let list = two_plugin_list("legacy");
    let rt = RuntimeConf::new("c1", "", "eth0");
    let file = rig.cache_file("legacy", "c1", "eth0");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    fs::write(&file, result_json("10.210.8.9/24").to_string()).unwrap();
    rig.cni().del_network_list(&list, &rt).await.expect("DEL");
    for call in rig.dir.invocations() {
        assert_json_eq(
            &call.stdin_json()["prevResult"],
            &result_json("10.210.8.9/24"),
            "legacy prevResult",
        );
    }
    assert!(!file.exists());
}

#[tokio::test]
async fn cached_attachments_lists_all_or_one_container() {
    let rig = two_plugin_rig("10.210.9.2/24");
    let cni = rig.cni();
    let net1 = two_plugin_list("net1");
    let net2 = two_plugin_list("net2");
    cni.add_network_list(&net1, &RuntimeConf::new("c1", "/run/netns/c1", "eth0"))
        .await
        .unwrap();
    cni.add_network_list(&net1, &RuntimeConf::new("c1", "/run/netns/c1", "eth1"))
        .await
        .unwrap();
    cni.add_network_list(&net2, &rt_with_args("c2"))
        .await
        .unwrap();
    cni.add_network_list(&net2, &RuntimeConf::new("c11", "/run/netns/c11", "eth0"))
        .await
        .unwrap();
    // Not listed: a legacy bare result, garbage, a record under a wrong name.
    let results = rig.cache_dir.join("results");
    fs::write(
        results.join("net3-c1-eth0"),
        result_json("10.210.9.3/24").to_string(),
    )
    .unwrap();
    fs::write(results.join("net4-c1-eth0"), b"{garbage").unwrap();
    fs::copy(results.join("net1-c1-eth0"), results.join("net5-c1-eth0")).unwrap();

    let all = cni.cached_attachments(None).await.unwrap();
    let key = |r: &cni_core::cache::CacheRecord| {
        (
            r.network_name.clone(),
            r.container_id.clone(),
            r.if_name.clone(),
        )
    };
    let keys: Vec<_> = all.iter().map(key).collect();
    let k = |n: &str, c: &str, i: &str| (n.to_owned(), c.to_owned(), i.to_owned());
    assert_eq!(
        keys,
        [
            k("net1", "c1", "eth0"),
            k("net1", "c1", "eth1"),
            k("net2", "c11", "eth0"),
            k("net2", "c2", "eth0")
        ]
    );
    let c2 = &all[3];
    assert_eq!(c2.runtime_conf(), rt_with_args("c2"));
    assert_eq!(c2.config, net2.bytes());

    let c1: Vec<_> = cni
        .cached_attachments(Some("c1"))
        .await
        .unwrap()
        .iter()
        .map(key)
        .collect();
    assert_eq!(c1, [k("net1", "c1", "eth0"), k("net1", "c1", "eth1")]);
    let c11: Vec<_> = cni
        .cached_attachments(Some("c11"))
        .await
        .unwrap()
        .iter()
        .map(key)
        .collect();
    assert_eq!(c11, [k("net2", "c11", "eth0")]);
    assert!(cni.cached_attachments(Some("c9")).await.unwrap().is_empty());
    assert!(cni.cached_attachments(Some("../c1")).await.is_err());
    // Listing moves nothing.
    assert!(rig.corrupt_files().is_empty());

    // An empty cache dir (never created) lists nothing.
    let empty = Rig::new();
    assert!(
        empty
            .cni()
            .cached_attachments(None)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn cached_config_returns_stored_bytes_and_args() {
    let rig = two_plugin_rig("10.210.10.2/24");
    let cni = rig.cni();
    // Unusual formatting: the exact bytes are stored, not a re-serialization.
    let bytes = b"{ \"cniVersion\": \"1.0.0\",\n  \"name\": \"cfg\", \"plugins\": [ {\"type\": \"a\"}, {\"type\": \"b\", \"n\": 1.50} ] }\n";
    let list = NetworkConfigList::from_bytes(bytes, None).unwrap();
    let rt = rt_with_args("c1");
    assert!(cni.cached_config("cfg", &rt).await.unwrap().is_none());
    cni.add_network_list(&list, &rt).await.expect("ADD");

    let (stored, got) = cni
        .cached_config("cfg", &RuntimeConf::new("c1", "/run/netns/c1", "eth0"))
        .await
        .unwrap()
        .expect("cached config");
    assert_eq!(stored, bytes);
    assert_eq!(got.args, rt.args);
    assert_eq!(got.capability_args, rt.capability_args);
    assert_eq!(got.container_id, "c1");
    assert_eq!(got.ifname, "eth0");
}

/// DEL from the cache after the conf is gone: the stored list, CNI_ARGS,
/// capability args and netns are used; the entry is removed; a second call
/// finds nothing (code 3).
#[tokio::test]
async fn del_cached_uses_the_stored_config_and_args() {
    let rig = two_plugin_rig("10.210.11.2/24");
    let cni = rig.cni();
    let list = two_plugin_list("gone");
    let rt = rt_with_args("c1");
    cni.add_network_list(&list, &rt).await.expect("ADD");
    drop(list);

    let bare = RuntimeConf::new("c1", "", "eth0");
    cni.del_cached("gone", &bare).await.expect("del_cached");
    let calls = rig.dir.invocations();
    let d = dels(&calls);
    assert_eq!(
        d.iter().map(|c| c.plugin.as_str()).collect::<Vec<_>>(),
        ["b", "a"]
    );
    assert_eq!(
        d[0].var("CNI_ARGS"),
        Some("K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web")
    );
    assert_eq!(d[0].var("CNI_NETNS"), Some("/run/netns/c1"));
    assert_json_eq(
        &d[1].stdin_json(),
        &json!({"type":"a","name":"gone","cniVersion":"1.0.0",
            "runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]},
            "prevResult": result_json("10.210.11.2/24")}),
        "DEL stdin from the cached config",
    );
    assert!(!rig.cache_file("gone", "c1", "eth0").exists());

    let err = cni
        .del_cached("gone", &bare)
        .await
        .unwrap_err()
        .into_innermost();
    assert!(matches!(err, Error::NotAttached { .. }), "{err}");
    assert_eq!(err.code(), 3);
}

/// A record whose `result` is not a usable result: DEL warns, runs without
/// prevResult and then removes the entry.
#[tokio::test]
async fn unusable_cached_result_means_del_without_prev_result() {
    let rig = two_plugin_rig("10.210.12.2/24");
    let list = two_plugin_list("badres");
    let rt = RuntimeConf::new("c1", "", "eth0");
    let file = rig.cache_file("badres", "c1", "eth0");
    fs::create_dir_all(file.parent().unwrap()).unwrap();
    let rec = json!({"kind":"cniCacheV1","containerId":"c1","config": base64(list.bytes()),
        "ifName":"eth0","networkName":"badres","result":{"cniVersion":"1.0.0","ips":"not a list"}});
    fs::write(&file, rec.to_string()).unwrap();
    let cni = rig.cni();
    assert!(
        cni.cached_result(&list, &rt).await.is_err(),
        "an unusable result is an error here"
    );
    cni.del_network_list(&list, &rt).await.expect("DEL");
    let calls = rig.dir.invocations();
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert!(call.stdin_json().get("prevResult").is_none());
    }
    assert!(!file.exists());
}

/// A list whose plugins come partly from `<confdir>/<name>/*.conf`: the
/// cache stores a self-contained list, so DEL from the cache after the conf
/// dir is gone still runs every plugin.
#[tokio::test]
async fn del_cached_runs_plugins_that_came_from_plugin_files() {
    let rig = two_plugin_rig("10.210.13.2/24");
    let confdir = rig.dir.scratch("net.d");
    fs::create_dir_all(confdir.join("files")).unwrap();
    fs::write(
        confdir.join("10-files.conflist"),
        br#"{"cniVersion":"1.0.0","name":"files","plugins":[{"type":"a"}]}"#,
    )
    .unwrap();
    fs::write(
        confdir.join("files").join("20-b.conf"),
        br#"{"type":"b","fromFile":true}"#,
    )
    .unwrap();
    let list = NetworkConfigList::from_file(&confdir.join("10-files.conflist")).unwrap();
    assert_eq!(list.plugins().len(), 2);
    let cni = rig.cni();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&list, &rt).await.expect("ADD");
    fs::remove_dir_all(&confdir).unwrap();

    cni.del_cached("files", &rt).await.expect("del_cached");
    let calls = rig.dir.invocations();
    let d = dels(&calls);
    assert_eq!(
        d.iter().map(|c| c.plugin.as_str()).collect::<Vec<_>>(),
        ["b", "a"]
    );
    assert_json_eq(
        &d[0].stdin_json(),
        &json!({"type":"b","fromFile":true,"name":"files","cniVersion":"1.0.0",
            "prevResult": result_json("10.210.13.2/24")}),
        "DEL of the plugin from a file",
    );
}
