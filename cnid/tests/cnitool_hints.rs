//! Unknown names and paths get hints. A mistyped network lists the
//! networks that exist and suggests the closest; a missing conf dir says
//! the directory is missing; a missing absolute netns beside a near name is
//! refused before any plugin runs, and otherwise leads the plugin's error;
//! a second ADD of an attached netns says so (from the cache) instead of
//! the plugin's "already exists".

use crate::support::fake::{Fake, Response};
use crate::support::tool::Sandbox;
use serde_json::json;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("cnirs-bridge", "1.0.0", &[json!({"type": "p"})]);
    sb.conflist("cnirs-ptp", "1.0.0", &[json!({"type": "p"})]);
    sb
}

#[test]
fn a_mistyped_network_lists_the_networks_and_suggests_the_closest() {
    let sb = sandbox();
    let netns = sb.netns("hints");
    let err = sb.run(&["add", "cnirs-brige", &netns]).fails();
    assert!(
        err.contains(&format!(
            "no network configuration with name \"cnirs-brige\" in {}; did you mean \
             \"cnirs-bridge\"? (networks there: \"cnirs-bridge\", \"cnirs-ptp\")",
            sb.net_dir().display()
        )),
        "{err}"
    );
    assert!(sb.plugins.invocations().is_empty());
}

#[test]
fn a_missing_conf_dir_says_the_directory_is_missing() {
    let sb = sandbox();
    let missing = sb.root().join("nonexist");
    let netns = sb.netns("hints");
    let err = sb
        .run_env(
            &["add", "cnirs-bridge", &netns],
            &[("NETCONFPATH", missing.to_str().unwrap())],
        )
        .fails();
    assert_eq!(
        err,
        format!(
            "error: no network configurations: the conf dir {} does not exist\n",
            missing.display()
        )
    );
}

/// ADD and CHECK on a netns path that does not exist are refused before
/// any plugin runs, naming the path (code 4: `CNI_NETNS` is invalid),
/// instead of the plugin's `failed to Statfs` (code 999). DEL runs: the
/// spec has it succeed when the netns is gone.
#[test]
fn a_missing_absolute_netns_is_refused_before_the_plugins_naming_it() {
    let sb = Sandbox::new();
    let netns = sb.root().join("gone").display().to_string();
    sb.plugins.fake("p", &Fake::new(Response::ok("")));
    sb.conflist("net", "1.0.0", &[json!({"type": "p"})]);
    for verb in ["add", "check"] {
        let err = sb.run(&[verb, "net", &netns]).fails();
        assert_eq!(
            err,
            format!("error: netns {netns:?} does not exist\n"),
            "{verb}"
        );
        let json = sb.run(&["--json-errors", verb, "net", &netns]).fails_json();
        assert_eq!(json["code"], 4, "{verb}: {json}");
    }
    assert!(sb.plugins.invocations().is_empty());
    sb.run(&["del", "net", &netns]).ok();
    assert_eq!(sb.plugins.invocations_of("DEL").len(), 1);
}

/// A near name in the netns dir only adds a hint: the refusal is the
/// missing path's, whatever else the host holds.
#[test]
fn a_missing_absolute_netns_beside_a_near_name_is_refused_with_a_hint() {
    let sb = sandbox();
    let m1 = sb.netns("pod-m1");
    let typo = m1.replace("pod-m1", "pod-m2");
    let err = sb.run(&["add", "cnirs-bridge", &typo]).fails();
    assert_eq!(
        err,
        format!("error: netns {typo:?} does not exist; did you mean {m1}?\n")
    );
    let json = sb
        .run(&["--json-errors", "add", "cnirs-bridge", &typo])
        .fails_json();
    assert_eq!(json["code"], 4, "{json}");
    assert!(sb.plugins.invocations().is_empty());
}

/// A netns that goes while the plugins run (here the plugin removes it):
/// their error is led by the cause, their code kept.
#[test]
fn a_netns_gone_while_the_plugins_ran_leads_their_error() {
    let sb = Sandbox::new();
    let netns = sb.netns("going");
    sb.plugins.fake(
        "statfs",
        &Fake::new(
            Response::cni_error(
                999,
                &format!("failed to Statfs {netns:?}: no such file or directory"),
                "",
            )
            .with_shell("rm -f \"$CNI_NETNS\""),
        ),
    );
    sb.conflist("net", "1.0.0", &[json!({"type": "statfs"})]);
    let err = sb.run(&["add", "net", &netns]).fails();
    assert!(
        err.starts_with(&format!("error: netns {netns:?} does not exist: ")),
        "{err}"
    );
    assert!(err.contains("failed to Statfs"), "{err}");
    let netns = sb.netns("going");
    let json = sb
        .run(&["--json-errors", "add", "net", &netns])
        .fails_json();
    assert_eq!(json["code"], 999, "{json}");
}

#[test]
fn a_second_add_of_an_attached_netns_says_del_it_first() {
    let sb = sandbox();
    let netns = &sb.netns("hints-twice");
    sb.run(&["add", "cnirs-bridge", netns]).ok();
    let err = sb.run(&["add", "cnirs-bridge", netns]).fails();
    let id = crate::support::tool::expected_container_id(netns);
    assert_eq!(
        err,
        format!(
            "error: container {id:?} interface \"eth0\" is already attached to network \
             \"cnirs-bridge\": DEL it first\n"
        )
    );
    let json = sb
        .run(&["--json-errors", "add", "cnirs-bridge", netns])
        .fails_json();
    assert_eq!(json["code"], cnid::api::code::ALREADY_ATTACHED, "{json}");
    assert_eq!(sb.plugins.invocations_of("ADD").len(), 1);
    // Another interface, or another network, is another attachment.
    sb.run(&["add", "-i", "eth1", "cnirs-bridge", netns]).ok();
    sb.run(&["add", "cnirs-ptp", netns]).ok();
    // After the DEL, ADD again.
    sb.run(&["del", "cnirs-bridge", netns]).ok();
    sb.run(&["add", "cnirs-bridge", netns]).ok();
}
