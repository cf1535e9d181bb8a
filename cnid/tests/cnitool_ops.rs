//! The operations end to end with fake plugins: add, check, del (also from
//! the cache when the conf file is gone), gc, status.

use crate::support::fake::{Fake, Response, result_json};
use crate::support::tool::{Sandbox, expected_container_id};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

fn sandbox(version: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("a", &Fake::plugin(version, "10.1.2.3/24"));
    sb.plugins.fake("b", &Fake::plugin(version, "10.1.2.4/24"));
    sb.conflist(
        "opsnet",
        version,
        &[json!({"type": "a", "marker": "v1"}), json!({"type": "b"})],
    );
    sb
}

fn commands(sb: &Sandbox) -> Vec<String> {
    sb.plugins
        .invocations()
        .iter()
        .map(|i| format!("{} {}", i.plugin, i.var("CNI_COMMAND").unwrap_or("?")))
        .collect()
}

#[test]
fn add_prints_the_final_result_indented_and_caches_it() {
    let sb = sandbox("1.1.0");
    let netns = sb.netns("opstest");
    let run = sb.run(&["add", "opsnet", &netns]).ok();
    let want: Value = serde_json::from_str(&result_json("1.1.0", "10.1.2.4/24")).unwrap();
    assert_eq!(run.stdout_json(), want);
    // Go's result.Print: four-space indentation.
    assert!(
        run.stdout.starts_with("{\n    \"cniVersion\": \"1.1.0\""),
        "{}",
        run.stdout
    );
    assert_eq!(run.stderr, "");
    assert_eq!(commands(&sb), ["a ADD", "b ADD"]);
    // The second plugin got the first one's result as prevResult.
    let b = &sb.plugins.invocations_of("ADD")[1];
    assert_eq!(
        b.stdin_json()["prevResult"]["ips"][0]["address"],
        "10.1.2.3/24"
    );
    let id = expected_container_id(&netns);
    let rec = sb.cache_record("opsnet", &id, "eth0").expect("cache entry");
    assert_eq!(rec["kind"], "cniCacheV1");
    assert_eq!(rec["result"], want);
    assert_eq!(rec["netns"], netns.as_str());
}

#[test]
fn older_results_are_converted_to_the_list_version_before_printing() {
    let sb = Sandbox::new();
    let netns = sb.netns("opstest");
    sb.plugins
        .fake("old", &Fake::plugin("0.4.0", "10.1.2.3/24"));
    sb.conflist("convnet", "1.0.0", &[json!({"type": "old"})]);
    let out = sb.run(&["add", "convnet", &netns]).ok().stdout_json();
    assert_eq!(out["cniVersion"], "1.0.0");
    assert!(out["ips"][0].get("version").is_none(), "{out}");
}

#[test]
fn check_after_add_passes_and_prints_nothing() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["add", "opsnet", &netns]).ok();
    let run = sb.run(&["check", "opsnet", &netns]).ok();
    assert_eq!((run.stdout.as_str(), run.stderr.as_str()), ("", ""));
    let checks = sb.plugins.invocations_of("CHECK");
    assert_eq!(checks.len(), 2);
    assert_eq!(
        checks[0].stdin_json()["prevResult"]["ips"][0]["address"],
        "10.1.2.4/24"
    );
}

#[test]
fn check_without_add_fails_with_unknown_container() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    let err = sb.run(&["check", "opsnet", &netns]).fails();
    let id = expected_container_id(&netns);
    assert!(
        err.contains(&format!("no cached ADD result for container \"{id}\"")),
        "{err}"
    );
    assert!(err.contains("\"opsnet\""), "{err}");
    assert!(sb.plugins.invocations().is_empty(), "no plugin runs");
    let json = sb
        .run(&["check", "--json-errors", "opsnet", &netns])
        .fails_json();
    assert_eq!(json["code"], 3);
    assert_eq!(json["cniVersion"], "1.0.0", "the network's version");
}

#[test]
fn del_runs_plugins_in_reverse_and_removes_the_cache_entry() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["add", "opsnet", &netns]).ok();
    assert_eq!(sb.cache_entries().len(), 1);
    let run = sb.run(&["del", "opsnet", &netns]).ok();
    assert_eq!((run.stdout.as_str(), run.stderr.as_str()), ("", ""));
    assert_eq!(commands(&sb), ["a ADD", "b ADD", "b DEL", "a DEL"]);
    assert_eq!(
        sb.plugins.invocations_of("DEL")[0].stdin_json()["prevResult"]["ips"][0]["address"],
        "10.1.2.4/24"
    );
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
    // DEL again: fine, plugins run without prevResult.
    sb.run(&["del", "opsnet", &netns]).ok();
    let dels = sb.plugins.invocations_of("DEL");
    assert_eq!(dels.len(), 4);
    assert!(dels[2].stdin_json().get("prevResult").is_none());
}

#[test]
fn del_of_an_attachment_never_added_runs_the_plugins_and_succeeds() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["del", "opsnet", &netns]).ok();
    assert_eq!(commands(&sb), ["b DEL", "a DEL"]);
}

#[test]
fn del_failure_keeps_the_cache_entry() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["add", "opsnet", &netns]).ok();
    sb.plugins.fake(
        "a",
        &Fake::new(Response::cni_error(101, "cannot release", "ip 10.1.2.3")),
    );
    let err = sb.run(&["del", "opsnet", &netns]).fails();
    assert!(err.contains("plugin a DEL failed"), "{err}");
    assert!(err.contains("cannot release"), "{err}");
    assert_eq!(sb.cache_entries().len(), 1);
}

#[test]
fn del_after_the_conf_file_was_removed_uses_the_cached_config() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run_env(&["add", "opsnet", &netns], &[("CNI_ARGS", "K=v")])
        .ok();
    std::fs::remove_file(sb.net_dir().join("opsnet.conflist")).unwrap();
    sb.plugins.clear_records();
    // CNI_ARGS not given again: the cached ones are used.
    sb.run(&["del", "opsnet", &netns]).ok();
    let dels = sb.plugins.invocations_of("DEL");
    assert_eq!(
        dels.iter().map(|d| d.plugin.as_str()).collect::<Vec<_>>(),
        ["b", "a"]
    );
    let a = dels[1].stdin_json();
    assert_eq!(a["marker"], "v1", "the cached plugin config: {a}");
    assert_eq!(a["prevResult"]["ips"][0]["address"], "10.1.2.4/24");
    assert_eq!(dels[1].var("CNI_ARGS"), Some("K=v"));
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
}

#[test]
fn del_without_conf_and_without_cache_reports_the_missing_network() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    let err = sb.run(&["del", "nosuchnet", &netns]).fails();
    assert!(
        err.contains("no network configuration with name \"nosuchnet\""),
        "{err}"
    );
    assert!(err.contains(&sb.net_dir().display().to_string()), "{err}");
    // An empty conf dir: the "no configurations" error, naming the dir.
    std::fs::remove_file(sb.net_dir().join("opsnet.conflist")).unwrap();
    let err = sb.run(&["del", "opsnet", &netns]).fails();
    assert!(
        err.contains(&format!(
            "no network configurations found in {}",
            sb.net_dir().display()
        )),
        "{err}"
    );
    assert!(sb.plugins.invocations().is_empty());
}

#[test]
fn gc_deletes_every_cached_attachment_of_the_network_then_gcs_plugins() {
    let sb = sandbox("1.1.0");
    sb.conflist("othernet", "1.1.0", &[json!({"type": "a"})]);
    let (ns1, ns2, ns3) = (sb.netns("g1"), sb.netns("g2"), sb.netns("g3"));
    sb.run_env(&["add", "opsnet", &ns1], &[("CNI_ARGS", "N=1")])
        .ok();
    sb.run(&["add", "-i", "eth1", "opsnet", &ns2]).ok();
    sb.run(&["add", "othernet", &ns3]).ok();
    assert_eq!(sb.cache_entries().len(), 3);
    sb.plugins.clear_records();

    let run = sb.run(&["gc", "opsnet", "/whatever"]).ok();
    assert_eq!(run.stderr, "");
    // What was deleted is printed, as cnid answers GC.
    let printed = run.stdout_json();
    let mut deleted: Vec<(String, String)> = printed["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["containerID"].as_str().unwrap().to_owned(),
                a["ifname"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    deleted.sort();
    let mut want = vec![
        (expected_container_id(&ns1), "eth0".to_owned()),
        (expected_container_id(&ns2), "eth1".to_owned()),
    ];
    want.sort();
    assert_eq!(deleted, want);
    assert_eq!(printed["pluginsCalled"], true);

    // Only othernet's entry is left.
    let left = sb.cache_entries();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with("othernet-"), "{left:?}");
    // Each stale attachment got a DEL (reverse order, its cached args), then
    // each plugin a GC with empty attachment lists.
    let calls = sb.plugins.invocations();
    let dels: Vec<(String, String, String, String)> = calls
        .iter()
        .filter(|i| i.var("CNI_COMMAND") == Some("DEL"))
        .map(|i| {
            (
                i.plugin.clone(),
                i.var("CNI_CONTAINERID").unwrap_or_default().to_owned(),
                i.var("CNI_IFNAME").unwrap_or_default().to_owned(),
                i.var("CNI_ARGS").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let g1 = expected_container_id(&ns1);
    let g2 = expected_container_id(&ns2);
    // Per attachment: last plugin first, with the cached ifname and args.
    for (id, ifname, args) in [(&g1, "eth0", "N=1"), (&g2, "eth1", "")] {
        let of_this: Vec<_> = dels.iter().filter(|d| d.1 == *id).collect();
        let want = [
            (
                "b".to_owned(),
                id.clone(),
                ifname.to_owned(),
                args.to_owned(),
            ),
            (
                "a".to_owned(),
                id.clone(),
                ifname.to_owned(),
                args.to_owned(),
            ),
        ];
        assert_eq!(of_this, want.iter().collect::<Vec<_>>());
    }
    assert_eq!(dels.len(), 4, "{dels:?}");
    let gcs: Vec<_> = calls
        .iter()
        .filter(|i| i.var("CNI_COMMAND") == Some("GC"))
        .collect();
    assert_eq!(
        gcs.iter().map(|i| i.plugin.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    for gc in gcs {
        let stdin = gc.stdin_json();
        assert_eq!(stdin["cni.dev/valid-attachments"], json!([]));
        assert_eq!(stdin["cni.dev/attachments"], json!([]));
        assert_eq!(stdin["name"], "opsnet");
    }
    // GC runs after all the DELs.
    let last_del = calls
        .iter()
        .rposition(|i| i.var("CNI_COMMAND") == Some("DEL"))
        .unwrap();
    let first_gc = calls
        .iter()
        .position(|i| i.var("CNI_COMMAND") == Some("GC"))
        .unwrap();
    assert!(last_del < first_gc);
}

#[test]
fn gc_of_an_older_network_deletes_but_sends_no_gc() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["add", "opsnet", &netns]).ok();
    sb.plugins.clear_records();
    sb.run(&["gc", "opsnet", &netns]).ok();
    assert_eq!(commands(&sb), ["b DEL", "a DEL"]);
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
}

#[test]
fn gc_reports_every_failure() {
    let sb = sandbox("1.1.0");
    let netns = sb.netns("opstest");
    sb.run(&["add", "opsnet", &netns]).ok();
    sb.plugins.fake(
        "b",
        &Fake::new(Response::fail(1, "", "b is broken"))
            .on("GC", Response::fail(1, "", "gc broken")),
    );
    let err = sb.run(&["gc", "opsnet", &netns]).fails();
    assert!(err.contains("b is broken"), "{err}");
    assert!(err.contains("gc broken"), "{err}");
    // The failed DEL keeps the entry for a later GC or DEL.
    assert_eq!(sb.cache_entries().len(), 1);
}

#[test]
fn status_runs_on_1_1_0_networks_and_reports_not_ready() {
    let sb = sandbox("1.1.0");
    let netns = sb.netns("opstest");
    let run = sb.run(&["status", "opsnet", &netns]).ok();
    assert_eq!(
        (run.stdout.as_str(), run.stderr.as_str()),
        ("network opsnet: ready\n", "")
    );
    assert_eq!(commands(&sb), ["a STATUS", "b STATUS"]);
    // The netns argument may be left out.
    let run = sb.run(&["status", "opsnet"]).ok();
    assert_eq!(run.stdout, "network opsnet: ready\n");
    let st = &sb.plugins.invocations_of("STATUS")[0];
    assert_eq!(st.var("CNI_CONTAINERID"), Some(""));
    assert_eq!(st.stdin_json()["name"], "opsnet");

    sb.plugins.fake(
        "b",
        &Fake::new(Response::ok("")).on("STATUS", Response::cni_error(50, "no IPs left", "")),
    );
    let err = sb.run(&["status", "opsnet", &netns]).fails();
    assert!(err.contains("not ready"), "{err}");
    assert!(err.contains("no IPs left"), "{err}");
    let json = sb
        .run_env(
            &["status", "opsnet", &netns],
            &[("CNITOOL_JSON_ERRORS", "1")],
        )
        .fails_json();
    assert_eq!(json["code"], 50);
    assert!(
        json["msg"].as_str().unwrap().contains("no IPs left"),
        "{json}"
    );
}

#[test]
fn status_of_an_older_network_runs_nothing() {
    let sb = sandbox("1.0.0");
    let netns = sb.netns("opstest");
    sb.run(&["status", "opsnet", &netns]).ok();
    assert!(sb.plugins.invocations().is_empty());
}
