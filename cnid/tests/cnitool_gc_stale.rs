//! `cnitool gc --stale [--dry-run]`: the library's stale-attachment scan
//! and reap (`cni_async::stale`, what cnid's reaper uses) for hosts without
//! cnid. A cached attachment whose netns is gone is DELed with its cached
//! config, result (`prevResult`) and recorded netns, and loses its record;
//! one whose netns is a network namespace stays; `--dry-run` deletes
//! nothing; an unreadable conf dir deletes nothing.

use crate::support::fake::Fake;
use crate::support::tool::{Sandbox, expected_container_id};

const NET: &str = "gcstale";

/// Two attachments: `alive` on a link to a live network namespace, `gone`
/// on a path that no longer exists. Returns (alive netns, gone netns).
fn two_attachments(sb: &Sandbox) -> (String, String) {
    sb.plugins.fake("a", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist(NET, "1.0.0", &[serde_json::json!({"type": "a"})]);
    let alive = sb.root().join("alive-ns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &alive).unwrap();
    let alive = alive.to_str().unwrap().to_owned();
    // Exists at ADD (cnitool refuses a missing netns), removed after it.
    let gone = sb.netns("gone-ns");
    sb.run(&["add", NET, &alive]).ok();
    sb.run(&["add", NET, &gone]).ok();
    std::fs::remove_file(&gone).unwrap();
    assert_eq!(sb.cache_entries().len(), 2);
    sb.plugins.clear_records();
    (alive, gone)
}

#[test]
fn gc_stale_deletes_only_what_lost_its_namespace_and_dry_run_nothing() {
    crate::support::require_root!();
    let sb = Sandbox::new();
    let (alive, gone) = two_attachments(&sb);
    let gone_id = expected_container_id(&gone);

    let dry = sb.run(&["gc", "--stale", "--dry-run"]).ok().stdout_json();
    assert_eq!(dry["dryRun"], true, "{dry}");
    let listed = dry["stale"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{dry}");
    assert_eq!(listed[0]["containerID"], gone_id.as_str());
    assert_eq!(listed[0]["netns"], gone.as_str());
    assert_eq!(listed[0]["reason"], "namespace gone");
    assert_eq!(listed[0]["deleted"], false);
    assert!(sb.plugins.invocations().is_empty(), "a dry run ran plugins");
    assert_eq!(sb.cache_entries().len(), 2);

    let done = sb.run(&["gc", "--stale"]).ok().stdout_json();
    assert_eq!(done["stale"][0]["deleted"], true, "{done}");
    let dels = sb.plugins.invocations_of("DEL");
    assert_eq!(dels.len(), 1);
    assert_eq!(dels[0].var("CNI_CONTAINERID"), Some(gone_id.as_str()));
    assert_eq!(dels[0].var("CNI_NETNS"), Some(gone.as_str()));
    assert_eq!(
        dels[0].stdin_json()["prevResult"]["ips"][0]["address"],
        "10.1.2.3/24"
    );
    assert_eq!(
        sb.cache_entries(),
        vec![format!("{NET}-{}-eth0", expected_container_id(&alive))]
    );
    // Nothing left to do.
    let again = sb.run(&["gc", "--stale"]).ok().stdout_json();
    assert_eq!(again["stale"].as_array().unwrap().len(), 0, "{again}");
}

#[test]
fn gc_stale_deletes_nothing_while_the_conf_dir_is_unreadable() {
    crate::support::require_root!();
    let sb = Sandbox::new();
    two_attachments(&sb);
    let missing = sb.root().join("no-such-net.d");
    let err = sb
        .run_env(
            &["gc", "--stale"],
            &[("NETCONFPATH", missing.to_str().unwrap())],
        )
        .fails();
    assert!(err.contains("nothing is deleted"), "{err}");
    assert!(sb.plugins.invocations().is_empty());
    assert_eq!(sb.cache_entries().len(), 2);
}

#[test]
fn gc_needs_a_network_unless_stale() {
    let sb = Sandbox::new();
    let err = sb.run(&["gc"]).fails();
    assert!(err.contains("NETWORK"), "{err}");
    let err = sb.run(&["gc", NET, "--dry-run"]).fails();
    assert!(err.contains("--stale"), "{err}");
}
