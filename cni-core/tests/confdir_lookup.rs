//! Conf-dir scanning and lookup over real files in temp dirs.

use crate::support::{ConfDir, conf, conflist};
use cni_core::{Error, Version, confdir};

fn plugin_types(list: &cni_core::NetworkConfigList) -> Vec<&str> {
    list.plugins().iter().map(|p| p.plugin_type()).collect()
}

#[test]
fn sort_order_is_bytewise() {
    let d = ConfDir::new();
    // "10-" sorts before "9-" byte-wise: the 10- file wins for the shared name.
    d.write("9-b.conflist", &conflist("net", "from-9"));
    d.write("10-a.conflist", &conflist("net", "from-10"));
    let list = confdir::load_network(d.path(), "net").unwrap();
    assert_eq!(plugin_types(&list), ["from-10"]);

    let scan = confdir::scan(d.path()).unwrap();
    let files: Vec<_> = scan
        .networks
        .iter()
        .map(|n| n.path.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(files, ["10-a.conflist", "9-b.conflist"]);
    assert_eq!(scan.unique().len(), 1);
}

#[test]
fn name_matching_picks_the_right_file() {
    let d = ConfDir::new();
    d.write("10-a.conflist", &conflist("alpha", "a"));
    d.write("20-b.conflist", &conflist("beta", "b"));
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "beta").unwrap()),
        ["b"]
    );
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "alpha").unwrap()),
        ["a"]
    );
}

#[test]
fn conflist_wins_over_conf_even_when_conf_sorts_first() {
    let d = ConfDir::new();
    d.write("00-single.conf", &conf("net", "single"));
    d.write("99-list.conflist", &conflist("net", "list"));
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "net").unwrap()),
        ["list"]
    );
}

#[test]
fn conf_and_json_are_upconverted() {
    let d = ConfDir::new();
    d.write("10-one.conf", &conf("one", "bridge"));
    d.write("20-two.json", &conf("two", "ptp"));
    d.write("30-ignored.txt", &conf("three", "x"));
    let one = confdir::load_network(d.path(), "one").unwrap();
    assert_eq!(one.version(), Version::V0_4_0);
    assert_eq!(plugin_types(&one), ["bridge"]);
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "two").unwrap()),
        ["ptp"]
    );
    assert!(matches!(
        confdir::load_network(d.path(), "three"),
        Err(Error::NetworkNotFound { .. })
    ));
}

#[test]
fn plugin_subdirectory_is_appended_sorted() {
    let d = ConfDir::new();
    d.write(
        "10-net.conflist",
        r#"{"cniVersion":"1.1.0","name":"net","plugins":[{"type":"inline"}]}"#,
    );
    d.write("net/20-b.conf", r#"{"type":"second"}"#);
    d.write("net/10-a.conf", r#"{"type":"first"}"#);
    d.write("net/30-c.json", r#"{"type":"not-a-conf-ext"}"#);
    let list = confdir::load_network(d.path(), "net").unwrap();
    assert_eq!(plugin_types(&list), ["inline", "first", "second"]);

    // The cache gets a self-contained list that reproduces the same plugins.
    let cached = cni_core::NetworkConfigList::from_bytes(&list.cache_bytes(), None).unwrap();
    assert_eq!(plugin_types(&cached), ["inline", "first", "second"]);
    assert!(cached.load_only_inlined_plugins());
}

#[test]
fn plugin_subdirectory_alone_is_enough() {
    let d = ConfDir::new();
    d.write("10-net.conflist", r#"{"cniVersion":"1.1.0","name":"net"}"#);
    d.write("net/10-a.conf", r#"{"type":"only"}"#);
    let list = confdir::load_network(d.path(), "net").unwrap();
    assert_eq!(plugin_types(&list), ["only"]);
    // Without inline plugins and without plugin files there is nothing to run.
    d.write(
        "20-empty.conflist",
        r#"{"cniVersion":"1.1.0","name":"empty"}"#,
    );
    let e = confdir::load_network(d.path(), "empty").unwrap_err();
    assert!(e.to_string().contains("20-empty.conflist"), "{e}");
}

#[test]
fn load_only_inlined_plugins_ignores_the_subdirectory() {
    let d = ConfDir::new();
    d.write(
        "10-net.conflist",
        r#"{"cniVersion":"1.1.0","name":"net","loadOnlyInlinedPlugins":"True","plugins":[{"type":"inline"}]}"#,
    );
    d.write("net/10-a.conf", r#"{"type":"extra"}"#);
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "net").unwrap()),
        ["inline"]
    );
}

#[test]
fn bad_files_are_skipped_and_named() {
    let d = ConfDir::new();
    let bad = d.write("10-broken.conflist", "{ not json");
    d.write("20-good.conflist", &conflist("good", "bridge"));
    let bad_type = d.write(
        "30-badtype.conf",
        r#"{"name":"x","cniVersion":"1.0.0","type":"../../bin/sh"}"#,
    );

    // A broken file before the match does not hide it (libcni would fail here).
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "good").unwrap()),
        ["bridge"]
    );

    // Not found: the error names the skipped files.
    let e = confdir::load_network(d.path(), "missing").unwrap_err();
    match &e {
        Error::NetworkNotFound { name, skipped, .. } => {
            assert_eq!(name, "missing");
            let paths: Vec<_> = skipped.iter().map(|s| s.path.clone()).collect();
            assert_eq!(paths, [bad.clone(), bad_type.clone()]);
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("10-broken.conflist") && msg.contains("30-badtype.conf"),
        "{msg}"
    );

    let scan = confdir::scan(d.path()).unwrap();
    assert_eq!(scan.networks.len(), 1);
    assert_eq!(scan.skipped.len(), 2);
}

#[test]
fn no_configs_is_distinct_from_not_found() {
    let d = ConfDir::new();
    assert!(matches!(
        confdir::load_network(d.path(), "x"),
        Err(Error::NoConfigs { .. })
    ));
    // A missing dir is "no configs" too.
    let missing = d.path().join("nope");
    let e = confdir::load_network(&missing, "x").unwrap_err();
    assert!(matches!(e, Error::NoConfigs { missing: true, .. }), "{e:?}");
    // A missing dir says so, rather than "no configurations" alone.
    assert_eq!(
        e.to_string(),
        format!(
            "no network configurations: the conf dir {} does not exist",
            missing.display()
        )
    );
    // Files of other extensions do not count.
    d.write("README.md", "hi");
    assert!(matches!(
        confdir::load_network(d.path(), "x"),
        Err(Error::NoConfigs { .. })
    ));
    // Only conflists, none matching: not found.
    d.write("10-a.conflist", &conflist("a", "x"));
    assert!(matches!(
        confdir::load_network(d.path(), "x"),
        Err(Error::NetworkNotFound { .. })
    ));
}

/// Before: "no network configuration with name "cnirs-brige"" named
/// nothing that exists. Now the names are listed, in conf-dir order
/// (each once, conflists then single confs), and a typo gets the closest.
#[test]
fn not_found_lists_the_networks_and_suggests_the_closest() {
    let d = ConfDir::new();
    d.write("10-bridge.conflist", &conflist("cnirs-bridge", "bridge"));
    d.write("20-ptp.conflist", &conflist("cnirs-ptp", "ptp"));
    d.write("30-again.conflist", &conflist("cnirs-bridge", "bridge"));
    d.write(
        "40-single.conf",
        r#"{"name":"solo","cniVersion":"1.0.0","type":"bridge"}"#,
    );
    let e = confdir::load_network(d.path(), "cnirs-brige").unwrap_err();
    match &e {
        Error::NetworkNotFound { available, .. } => {
            assert_eq!(available, &["cnirs-bridge", "cnirs-ptp", "solo"]);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        format!(
            "no network configuration with name \"cnirs-brige\" in {}; did you mean \
             \"cnirs-bridge\"? (networks there: \"cnirs-bridge\", \"cnirs-ptp\", \"solo\")",
            d.path().display()
        )
    );
    // Nothing close: the list alone.
    let e = confdir::load_network(d.path(), "kube").unwrap_err();
    assert!(
        e.to_string()
            .ends_with(" (networks there: \"cnirs-bridge\", \"cnirs-ptp\", \"solo\")"),
        "{e}"
    );
    assert!(!e.to_string().contains("did you mean"), "{e}");
}

#[test]
fn symlinks_inside_are_followed_outside_refused() {
    let d = ConfDir::new();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("evil.conflist");
    std::fs::write(&target, conflist("evil", "x")).unwrap();
    std::os::unix::fs::symlink(&target, d.path().join("10-evil.conflist")).unwrap();

    // Kubernetes ConfigMap style: ..data/ inside the dir.
    d.write("..data/20-ok.conflist", &conflist("ok", "bridge"));
    std::os::unix::fs::symlink("..data/20-ok.conflist", d.path().join("20-ok.conflist")).unwrap();

    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "ok").unwrap()),
        ["bridge"]
    );
    let e = confdir::load_network(d.path(), "evil").unwrap_err();
    assert!(e.to_string().contains("points outside"), "{e}");
}

#[test]
fn unreadable_dir_is_an_io_error_naming_it() {
    let d = ConfDir::new();
    let file = d.write("not-a-dir", "x");
    let e = confdir::load_network(&file, "x").unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("not-a-dir"), "{e}");
}

/// go-cni, ocicni and the kubelet sort `.conf`, `.conflist` and `.json`
/// together and take the first file that loads as the default network: a
/// Multus-style `00-multus.conf` in front of `10-calico.conflist` must be the
/// default, not bypassed. Lookup by name keeps libcni's rule (a `.conflist`
/// wins over a `.conf` of the same name).
#[test]
fn default_network_is_the_first_file_of_any_extension() {
    let d = ConfDir::new();
    d.write("00-multus.conf", &conf("multus-cni-network", "multus"));
    d.write("10-calico.conflist", &conflist("k8s-pod-network", "calico"));
    d.write("05-broken.conflist", "{");
    d.write("20-extra.json", &conf("extra", "extra"));
    let scan = confdir::scan(d.path()).unwrap();
    let default = scan.default_network().expect("a default network");
    assert_eq!(default.list.name(), "multus-cni-network");
    assert_eq!(plugin_types(&default.list), ["multus"]);
    let names: Vec<&str> = scan.unique().iter().map(|n| n.list.name()).collect();
    assert_eq!(names, ["multus-cni-network", "k8s-pod-network", "extra"]);
    assert_eq!(scan.skipped.len(), 1, "{:?}", scan.skipped);

    // By name, a .conflist beats an earlier .conf of the same name.
    d.write("01-dup.conf", &conf("k8s-pod-network", "single"));
    let scan = confdir::scan(d.path()).unwrap();
    let found = scan.find("k8s-pod-network").unwrap();
    assert_eq!(plugin_types(&found.list), ["calico"]);
    assert_eq!(
        plugin_types(&confdir::load_network(d.path(), "k8s-pod-network").unwrap()),
        ["calico"]
    );
    let shadowed: Vec<_> = scan
        .shadowed(found)
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    assert_eq!(shadowed, ["01-dup.conf"]);
    // unique() keeps the name's place of first appearance, with libcni's pick.
    let unique: Vec<&str> = scan
        .unique()
        .iter()
        .map(|n| n.path.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(
        unique,
        ["00-multus.conf", "10-calico.conflist", "20-extra.json"]
    );
}

/// A list that offers only versions newer than 1.1.0 stays refused, but
/// the load warning and the lookup of its name say why: the versions it
/// asks for and the highest supported, not "no network configuration".
#[test]
fn a_list_of_only_newer_versions_is_refused_saying_why() {
    let d = ConfDir::new();
    let path = d.write(
        "10-new.conflist",
        r#"{"cniVersion":"2.0.0","cniVersions":["1.2.0"],"name":"newnet","plugins":[{"type":"bridge"}]}"#,
    );
    d.write("20-good.conflist", &conflist("good", "bridge"));

    let scan = confdir::scan(d.path()).unwrap();
    assert_eq!(scan.skipped.len(), 1);
    assert_eq!(scan.skipped[0].path, path);
    assert_eq!(scan.skipped[0].network.as_deref(), Some("newnet"));
    let reason = &scan.skipped[0].reason;
    assert!(
        reason.contains("2.0.0, 1.2.0") && reason.contains("the highest supported is 1.1.0"),
        "{reason}"
    );

    let e = confdir::load_network(d.path(), "newnet").unwrap_err();
    assert!(matches!(e, Error::NetworkNotFound { .. }), "{e:?}");
    assert_eq!(e.code(), 7);
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "network configuration with name \"newnet\" in {} is not usable: ",
            d.path().display()
        )) && msg.contains("2.0.0, 1.2.0")
            && msg.contains("the highest supported is 1.1.0")
            && msg.contains("10-new.conflist"),
        "{msg}"
    );

    // Another name still reads "not found", listing the refused file.
    let other = confdir::load_network(d.path(), "other")
        .unwrap_err()
        .to_string();
    assert!(
        other.starts_with("no network configuration with name \"other\"")
            && other.contains("10-new.conflist"),
        "{other}"
    );

    // A version that does not parse names its field.
    let bad = d.write(
        "30-bad.conflist",
        r#"{"cniVersion":"1.0.0","cniVersions":["x"],"name":"badver","plugins":[{"type":"bridge"}]}"#,
    );
    let scan = confdir::scan(d.path()).unwrap();
    let s = scan.skipped.iter().find(|s| s.path == bad).unwrap();
    assert!(s.reason.contains("field 'cniVersions'"), "{}", s.reason);
    assert_eq!(s.network, None);
}
