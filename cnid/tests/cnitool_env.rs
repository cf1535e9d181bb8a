//! What the plugins get from cnitool's environment: CNI_ARGS, CAP_ARGS
//! (as `runtimeConfig` for plugins that declare the capability),
//! CNI_IFNAME and `-i`, CNI_PATH.

use crate::support;
use crate::support::fake::Fake;
use crate::support::tool::Sandbox;
use pretty_assertions::assert_eq;
use serde_json::json;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins
        .fake("first", &Fake::plugin("1.1.0", "10.1.2.3/24"));
    sb.plugins
        .fake("second", &Fake::plugin("1.1.0", "10.1.2.3/24"));
    sb.conflist(
        "envnet",
        "1.1.0",
        &[
            json!({"type": "first", "capabilities": {"portMappings": true, "mac": false}}),
            json!({"type": "second", "keep": {"big": 18446744073709551617u128}}),
        ],
    );
    sb
}

#[test]
fn cni_args_reach_every_plugin_unchanged() {
    let sb = sandbox();
    let netns = sb.netns("envtest");
    sb.run_env(
        &["add", "envnet", &netns],
        &[("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web")],
    )
    .ok();
    let adds = sb.plugins.invocations_of("ADD");
    assert_eq!(adds.len(), 2);
    for add in &adds {
        assert_eq!(
            add.var("CNI_ARGS"),
            Some("IgnoreUnknown=1;K8S_POD_NAME=web")
        );
    }
    // Without CNI_ARGS the variable is set, empty (as libcni).
    sb.plugins.clear_records();
    sb.run(&["del", "envnet", &netns]).ok();
    for del in sb.plugins.invocations_of("DEL") {
        assert_eq!(del.var("CNI_ARGS"), Some(""));
    }
}

#[test]
fn cap_args_become_runtime_config_of_declaring_plugins_only() {
    let sb = sandbox();
    let netns = sb.netns("envtest");
    let ports = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let cap_args = json!({"portMappings": ports, "mac": "aa:bb:cc:dd:ee:ff"}).to_string();
    sb.run_env(
        &["add", "envnet", &netns],
        &[("CAP_ARGS", cap_args.as_str())],
    )
    .ok();
    let adds = sb.plugins.invocations_of("ADD");
    let first = adds[0].stdin_json();
    assert_eq!(first["runtimeConfig"], json!({"portMappings": ports}));
    assert!(first.get("capabilities").is_none(), "{first}");
    let second = adds[1].stdin_json();
    assert!(second.get("runtimeConfig").is_none(), "{second}");
    // Everything else passes through exactly (a number above 2^64 too).
    assert!(
        String::from_utf8_lossy(&adds[1].stdin).contains("18446744073709551617"),
        "{}",
        String::from_utf8_lossy(&adds[1].stdin)
    );
    // The capability args are cached with the attachment.
    let id = adds[0].var("CNI_CONTAINERID").unwrap().to_owned();
    let rec = sb.cache_record("envnet", &id, "eth0").expect("cached");
    assert_eq!(
        rec["capabilityArgs"],
        json!({"portMappings": ports, "mac": "aa:bb:cc:dd:ee:ff"})
    );
}

#[test]
fn ifname_defaults_to_eth0_then_env_then_flag() {
    let sb = sandbox();
    let [a, b, c, d] = ["a", "b", "c", "d"].map(|n| sb.netns(n));
    sb.run(&["add", "envnet", &a]).ok();
    sb.run_env(&["add", "envnet", &b], &[("CNI_IFNAME", "net1")])
        .ok();
    sb.run_env(
        &["add", "-i", "net2", "envnet", &c],
        &[("CNI_IFNAME", "net1")],
    )
    .ok();
    sb.run(&["add", "envnet", &d, "--ifname", "net3"]).ok();
    let ifnames: Vec<String> = sb
        .plugins
        .invocations_of("ADD")
        .iter()
        .filter(|i| i.plugin == "first")
        .map(|i| i.var("CNI_IFNAME").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ifnames, ["eth0", "net1", "net2", "net3"]);
    // The cache entries are per interface.
    assert_eq!(sb.cache_entries().len(), 4);
    assert!(sb.cache_entries().iter().any(|e| e.ends_with("-net3")));
}

#[test]
fn cni_path_is_searched_in_order_and_passed_on() {
    let sb = sandbox();
    let netns = sb.netns("envtest");
    let empty = sb.root().join("empty-dir");
    std::fs::create_dir(&empty).unwrap();
    let path = format!("{}:{}", empty.display(), sb.plugins.bin().display());
    sb.run_env(&["add", "envnet", &netns], &[("CNI_PATH", path.as_str())])
        .ok();
    let adds = sb.plugins.invocations_of("ADD");
    assert_eq!(adds.len(), 2);
    for add in &adds {
        assert_eq!(add.var("CNI_PATH"), Some(path.as_str()));
        assert_eq!(add.var("CNI_COMMAND"), Some("ADD"));
        assert_eq!(add.var("CNI_NETNS"), Some(netns.as_str()));
    }
}

#[test]
fn unset_cni_path_means_the_default_dirs() {
    let sb = sandbox();
    let netns = sb.netns("envtest");
    // The fakes are not in the default dirs, so the lookup fails and names them.
    let mut cmd = sb.cnitool(&["add", "envnet", &netns]);
    cmd.env_remove("CNI_PATH");
    let err = support::tool::Run::of(cmd).fails();
    assert!(
        err.contains("plugin \"first\" not found in /opt/cni/bin:/usr/lib/cni"),
        "{err}"
    );
    let err = sb
        .run_env(&["add", "envnet", &netns], &[("CNI_PATH", "")])
        .fails();
    assert!(err.contains("/opt/cni/bin:/usr/lib/cni"), "{err}");
}

#[test]
fn plugins_get_the_six_cni_variables_of_the_spec() {
    let sb = sandbox();
    let netns = sb.netns("envtest");
    sb.run_env(&["add", "envnet", &netns], &[("CNI_TIMEOUT", "30")])
        .ok();
    // The plugins inherit the environment (as with libcni), but cnitool sets
    // exactly the six CNI_* variables of the spec.
    let add = &sb.plugins.invocations_of("ADD")[0];
    let cni_vars: Vec<&str> = add
        .env
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with("CNI_") && !["CNI_TIMEOUT", "CNI_CACHE_DIR"].contains(k))
        .collect();
    let mut sorted = cni_vars.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "CNI_ARGS",
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_IFNAME",
            "CNI_NETNS",
            "CNI_PATH"
        ]
    );
}
