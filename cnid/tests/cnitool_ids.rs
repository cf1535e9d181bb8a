//! Container IDs and netns paths: `cnitool-` + hex of the first 10 bytes of
//! SHA-512 of the absolute netns path, as the reference cnitool derives them.

use crate::support;
use std::os::unix::fs::symlink;

use crate::support::fake::Fake;
use crate::support::tool::{Sandbox, expected_container_id};
use serde_json::json;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.plugins
        .fake("rec", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("idnet", "1.0.0", &[json!({"type": "rec"})]);
    sb
}

#[test]
fn container_id_of_an_absolute_path_matches_sha512sum() {
    let sb = sandbox();
    // A path that exists on every Linux host (cnitool refuses a missing one).
    sb.run(&["add", "idnet", "/proc/self/ns/net"]).ok();
    let add = &sb.plugins.invocations_of("ADD")[0];
    // Computed by hand once with `printf '%s' /proc/self/ns/net | sha512sum`
    // (first 20 hex digits) and by python3's hashlib: the same value.
    assert_eq!(
        add.var("CNI_CONTAINERID"),
        Some("cnitool-cd2667f4483f699b01b0")
    );
    assert_eq!(
        expected_container_id("/proc/self/ns/net"),
        "cnitool-cd2667f4483f699b01b0"
    );
    assert_eq!(add.var("CNI_NETNS"), Some("/proc/self/ns/net"));
    // The cache entry is named after it.
    assert!(
        sb.cache_record("idnet", "cnitool-cd2667f4483f699b01b0", "eth0")
            .is_some(),
        "{:?}",
        sb.cache_entries()
    );
}

#[test]
fn absolute_paths_are_cleaned_lexically() {
    let sb = sandbox();
    let a = sb.netns("a");
    let root = sb.root().display().to_string();
    let messy = format!("/{root}/./netns/../netns/a/");
    sb.run(&["add", "idnet", &messy]).ok();
    let add = &sb.plugins.invocations_of("ADD")[0];
    assert_eq!(add.var("CNI_NETNS"), Some(a.as_str()));
    assert_eq!(
        add.var("CNI_CONTAINERID"),
        Some(expected_container_id(&a).as_str())
    );
}

#[test]
fn relative_netns_path_is_made_absolute_from_the_working_dir() {
    let sb = sandbox();
    // The sandbox runs cnitool with its temp dir as working directory.
    let want = sb.netns("x");
    sb.run(&["add", "idnet", "netns/../netns/x"]).ok();
    let add = &sb.plugins.invocations_of("ADD")[0];
    assert_eq!(add.var("CNI_NETNS"), Some(want.as_str()));
    assert_eq!(
        add.var("CNI_CONTAINERID"),
        Some(expected_container_id(&want).as_str())
    );
}

#[test]
fn a_symlinked_working_dir_is_taken_from_pwd_as_go_does() {
    let sb = sandbox();
    let real = sb.root().join("real");
    let link = sb.root().join("link");
    std::fs::create_dir(&real).unwrap();
    symlink(&real, &link).unwrap();
    for name in ["x", "y", "z"] {
        std::fs::write(real.join(name), b"").unwrap();
    }

    // PWD names the working dir through the link: Go's os.Getwd keeps it,
    // and so does cnitool (no symlink resolution).
    let mut cmd = sb.cnitool(&["add", "idnet", "x"]);
    cmd.current_dir(&link).env("PWD", &link);
    support::tool::Run::of(cmd).ok();
    // Without PWD the kernel's answer (the resolved path) is used.
    let mut cmd = sb.cnitool(&["add", "idnet", "y"]);
    cmd.current_dir(&link);
    support::tool::Run::of(cmd).ok();
    // A PWD that is not the working dir is ignored.
    let mut cmd = sb.cnitool(&["add", "idnet", "z"]);
    cmd.current_dir(&real).env("PWD", sb.root());
    support::tool::Run::of(cmd).ok();

    let netns: Vec<String> = sb
        .plugins
        .invocations_of("ADD")
        .iter()
        .map(|i| i.var("CNI_NETNS").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        netns,
        [
            format!("{}/x", link.display()),
            format!("{}/y", real.canonicalize().unwrap().display()),
            format!("{}/z", real.canonicalize().unwrap().display()),
        ]
    );
}

#[test]
fn the_same_netns_gives_the_same_attachment_across_runs() {
    let sb = sandbox();
    let abs = sb.netns("same");
    sb.run(&["add", "idnet", &abs]).ok();
    // Relative spelling of the same path: same container ID, so CHECK finds
    // the cached result and DEL removes it.
    let sub = sb.root().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut cmd = sb.cnitool(&["check", "idnet", "../netns/same"]);
    cmd.current_dir(&sub);
    support::tool::Run::of(cmd).ok();
    sb.run(&[
        "del",
        "idnet",
        &format!("{}/netns/./same", sb.root().display()),
    ])
    .ok();
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
    let ids: Vec<String> = sb
        .plugins
        .invocations()
        .iter()
        .map(|i| i.var("CNI_CONTAINERID").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.iter().all(|i| *i == expected_container_id(&abs)),
        "{ids:?}"
    );
}
