//! Creating, opening and deleting named network namespaces, and their
//! compatibility with `ip netns`. Needs root.
#![cfg(feature = "netns")]

use crate::support;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::support::netns::{
    ip, ip_ok, link_exists_in, links, unique_id, unique_link_name, unique_netns_name,
};
use crate::support::require_root;
use cni_async::Error;
use cni_async::netns::{NETNS_RUN_DIR, Netns, NetnsGuard};

/// Whether `/proc/self/mountinfo` has a mount on `path`.
fn is_mounted(path: &Path) -> bool {
    let wanted = path.to_str().expect("utf-8 path");
    fs::read_to_string("/proc/self/mountinfo")
        .expect("cannot read mountinfo")
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(wanted))
}

/// The names `ip netns list` prints.
fn ip_netns_list() -> Vec<String> {
    ip_ok(&["netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn run_path(name: &str) -> PathBuf {
    Path::new(NETNS_RUN_DIR).join(name)
}

fn host_netns_inode() -> u64 {
    fs::metadata("/proc/thread-self/ns/net")
        .expect("own netns")
        .ino()
}

/// Runs `ip netns del NAME` on drop if the name still exists: cleanup for
/// namespaces made by `ip netns add` in these tests.
struct IpNetnsCleanup(String);

impl Drop for IpNetnsCleanup {
    fn drop(&mut self) {
        if run_path(&self.0).exists() {
            let _ = ip(&["netns", "del", &self.0]);
        }
    }
}

fn io_kind(e: &Error) -> Option<io::ErrorKind> {
    match e {
        Error::Netns { source, .. } => Some(source.kind()),
        _ => None,
    }
}

#[test]
fn create_makes_a_bind_mount_in_run_netns_and_delete_removes_it() {
    require_root!();
    let name = unique_netns_name();
    let path = run_path(&name);
    let ns = Netns::create(&name).expect("create");

    assert_eq!(ns.path(), path);
    assert_eq!(ns.name(), Some(name.as_str()));
    assert!(is_mounted(&path), "{} is not a mount point", path.display());
    assert_ne!(
        ns.inode().unwrap(),
        host_netns_inode(),
        "a new namespace, not ours"
    );
    assert_eq!(
        fs::metadata(&path).unwrap().ino(),
        ns.inode().unwrap(),
        "the file is the namespace"
    );
    assert!(Netns::list_named().unwrap().contains(&name));

    // The name is taken now.
    let again = Netns::create(&name).expect_err("second create of the same name");
    assert_eq!(
        io_kind(&again),
        Some(io::ErrorKind::AlreadyExists),
        "{again}"
    );

    ns.delete().expect("delete");
    assert!(!is_mounted(&path));
    assert!(!path.exists());
    assert!(!Netns::list_named().unwrap().contains(&name));
    let gone = Netns::open(&path).expect_err("open after delete");
    assert_eq!(io_kind(&gone), Some(io::ErrorKind::NotFound), "{gone}");
    let gone = Netns::delete_named(&name).expect_err("delete twice");
    assert_eq!(io_kind(&gone), Some(io::ErrorKind::NotFound), "{gone}");
}

#[test]
fn created_namespace_is_listed_by_ip_netns_and_usable_with_ip_n() {
    require_root!();
    let ns = NetnsGuard::create(&unique_netns_name()).expect("create");
    let name = ns.name().unwrap().to_owned();
    assert!(
        ip_netns_list().contains(&name),
        "ip netns list: {:?}",
        ip_netns_list()
    );

    let link = unique_link_name();
    ip_ok(&["-n", &name, "link", "add", &link, "type", "bridge"]);
    let links = ip_ok(&["-n", &name, "-br", "link"]);
    assert!(links.contains(&link), "ip -n {name} link: {links}");
    assert!(link_exists_in(ns.path(), &link));
    // Only inside.
    assert!(!support::netns::link_exists(&link));
    assert!(!ip(&["link", "show", &link]).status.success());

    // `ip netns identify` finds it by the namespace of a process inside:
    // the same inode, seen through iproute2.
    let mut identify = std::process::Command::new("ip");
    identify.args(["netns", "identify"]);
    let out = ns.exec_in(identify).expect("ip netns identify");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), name);
}

#[test]
fn ip_netns_del_deletes_a_namespace_we_created() {
    require_root!();
    let name = unique_netns_name();
    let ns = Netns::create(&name).expect("create");
    let _cleanup = IpNetnsCleanup(name.clone());
    ip_ok(&["netns", "del", &name]);
    assert!(!run_path(&name).exists());
    assert!(!is_mounted(&run_path(&name)));
    assert!(!ip_netns_list().contains(&name));
    // Our fd still holds the namespace itself, which is fine; deleting by
    // name now finds nothing.
    let gone = ns.delete().expect_err("already deleted");
    assert_eq!(io_kind(&gone), Some(io::ErrorKind::NotFound), "{gone}");
}

#[test]
fn a_namespace_made_by_ip_netns_add_is_opened_and_deleted_natively() {
    require_root!();
    let name = unique_netns_name();
    let _cleanup = IpNetnsCleanup(name.clone());
    ip_ok(&["netns", "add", &name]);

    let ns = Netns::open_named(&name).expect("open");
    assert_eq!(ns.name(), Some(name.as_str()));
    assert_eq!(links(ns.path()), vec!["lo"]);
    ns.delete().expect("delete");

    assert!(!run_path(&name).exists());
    assert!(!is_mounted(&run_path(&name)));
    assert!(!ip_netns_list().contains(&name));

    // And by name only.
    ip_ok(&["netns", "add", &name]);
    Netns::delete_named(&name).expect("delete by name");
    assert!(!run_path(&name).exists());
    assert!(!is_mounted(&run_path(&name)));
}

#[test]
fn an_empty_file_left_by_an_interrupted_create_is_not_a_namespace_but_deletable() {
    require_root!();
    let name = unique_netns_name();
    let path = run_path(&name);
    fs::create_dir_all(NETNS_RUN_DIR).unwrap();
    fs::write(&path, b"").unwrap();
    let _cleanup = IpNetnsCleanup(name.clone());

    let err = Netns::open(&path).expect_err("an empty file");
    assert!(
        cni_core::error::Chain(&err)
            .to_string()
            .contains("not a network namespace"),
        "{err}"
    );
    Netns::delete_named(&name).expect("delete the leftover");
    assert!(!path.exists());
}

#[test]
fn guard_deletes_its_namespace_on_drop() {
    require_root!();
    let name = unique_netns_name();
    {
        let ns = NetnsGuard::create(&name).expect("create");
        assert!(ns.path().exists());
    }
    assert!(!run_path(&name).exists());
    assert!(!is_mounted(&run_path(&name)));

    // Disarmed, it keeps the namespace.
    let kept = NetnsGuard::create(&name).expect("create").into_inner();
    assert!(run_path(&name).exists());
    kept.delete().unwrap();
    assert!(!run_path(&name).exists());
}

#[test]
fn guard_deletes_its_namespace_when_the_test_panics() {
    require_root!();

    // A panicking thread, as a failing test is.
    let (tx, rx) = mpsc::channel();
    let joined = std::thread::spawn(move || {
        let ns = NetnsGuard::create(&unique_netns_name()).expect("create");
        tx.send(ns.path().to_owned()).unwrap();
        panic!("test failure while the namespace exists");
    })
    .join();
    assert!(joined.is_err(), "the thread panicked");
    let path = rx.recv().unwrap();
    assert!(!path.exists(), "{} left behind", path.display());
    assert!(!is_mounted(&path));

    // catch_unwind on this thread.
    let mut seen = None;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let ns = NetnsGuard::create(&unique_netns_name()).expect("create");
        seen = Some(ns.path().to_owned());
        panic!("boom");
    }));
    assert!(caught.is_err());
    let path = seen.unwrap();
    assert!(!path.exists(), "{} left behind", path.display());
}

#[test]
fn invalid_names_are_rejected() {
    require_root!();
    for bad in ["", ".", "..", "a/b", "../etc", &"n".repeat(256)] {
        match Netns::create(bad) {
            Err(Error::NetnsName { name, .. }) => assert_eq!(name, bad),
            other => panic!("create({bad:?}): {other:?}"),
        }
        assert!(matches!(
            Netns::delete_named(bad),
            Err(Error::NetnsName { .. })
        ));
        assert!(matches!(
            Netns::open_named(bad),
            Err(Error::NetnsName { .. })
        ));
    }
    let err = Netns::create("a/b").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid network namespace name \"a/b\": contains '/'"
    );
}

#[test]
fn open_by_proc_path_and_rejects_other_files() {
    require_root!();
    let own = Netns::open("/proc/self/ns/net").expect("own namespace");
    assert_eq!(own.inode().unwrap(), host_netns_inode());
    assert_eq!(own.name(), None);
    assert_eq!(own.path(), Path::new("/proc/self/ns/net"));
    let err = own.delete().expect_err("not a named namespace");
    assert_eq!(io_kind(&err), Some(io::ErrorKind::InvalidInput), "{err}");

    let pid = std::process::id();
    let by_pid = Netns::open(format!("/proc/{pid}/ns/net")).unwrap();
    assert_eq!(by_pid.inode().unwrap(), host_netns_inode());

    for not_net in ["/proc/self/ns/uts", "/proc/self/ns/mnt", "/etc/hostname"] {
        let err = Netns::open(not_net).expect_err(not_net);
        assert!(
            cni_core::error::Chain(&err)
                .to_string()
                .contains("not a network namespace"),
            "{not_net}: {err}"
        );
    }
    let err = Netns::open(format!("/run/netns/cnt-missing-{}", unique_id())).unwrap_err();
    assert_eq!(io_kind(&err), Some(io::ErrorKind::NotFound), "{err}");
}

#[test]
fn delete_refuses_a_name_that_now_refers_to_another_namespace() {
    require_root!();
    let name = unique_netns_name();
    let first = Netns::create(&name).unwrap();
    let stale = Netns::open_named(&name).unwrap();
    first.delete().unwrap();
    let second = NetnsGuard::create(&name).unwrap();
    assert_ne!(second.inode().unwrap(), stale.inode().unwrap());

    let err = stale
        .delete()
        .expect_err("must not delete the new namespace");
    assert!(
        cni_core::error::Chain(&err)
            .to_string()
            .contains("another network namespace"),
        "{err}"
    );
    assert!(run_path(&name).exists());
    assert!(is_mounted(&run_path(&name)));
    drop(second);
    assert!(!run_path(&name).exists());
}

#[test]
fn twenty_namespaces_created_concurrently_are_distinct_and_all_cleaned_up() {
    require_root!();
    let names: Vec<String> = (0..20).map(|_| unique_netns_name()).collect();
    let guards: Vec<NetnsGuard> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|name| s.spawn(move || NetnsGuard::create(name).expect("create")))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    let mut inodes: Vec<u64> = guards.iter().map(|g| g.inode().unwrap()).collect();
    inodes.sort_unstable();
    inodes.dedup();
    assert_eq!(inodes.len(), 20, "20 distinct namespaces");
    let listed = ip_netns_list();
    for name in &names {
        assert!(listed.contains(name), "{name} not in ip netns list");
    }
    for g in &guards {
        assert_eq!(links(g.path()), vec!["lo"]);
    }

    // Dropped concurrently too.
    std::thread::scope(|s| {
        for g in guards {
            s.spawn(move || drop(g));
        }
    });
    let listed = ip_netns_list();
    for name in &names {
        assert!(!run_path(name).exists(), "{name} left behind");
        assert!(!is_mounted(&run_path(name)), "{name} still mounted");
        assert!(!listed.contains(name));
    }
}
