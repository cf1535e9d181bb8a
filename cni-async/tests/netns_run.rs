//! Running closures and commands inside a network namespace, and the
//! assertion helpers built on that. Needs root.
#![cfg(feature = "netns")]

use std::fs;
use std::future::Future;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::support::netns::{
    TestNet, addrs_v4, exec_ok, ip, link_exists, link_exists_in, links, ping, try_addrs,
    unique_link_name, unique_netns_name,
};
use crate::support::require_root;
use cni_async::netns::{Netns, NetnsGuard};
use ipnet::IpNet;

fn thread_netns_inode() -> u64 {
    fs::metadata("/proc/thread-self/ns/net")
        .expect("own netns")
        .ino()
}

fn sh(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    cmd
}

#[test]
fn run_executes_the_closure_inside_and_leaves_the_caller_where_it_was() {
    require_root!();
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let before = thread_netns_inode();
    let caller = std::thread::current().id();

    let (inside, dev, thread) = ns
        .run(|| {
            (
                thread_netns_inode(),
                fs::read_to_string("/proc/thread-self/net/dev").unwrap(),
                std::thread::current().id(),
            )
        })
        .unwrap();

    assert_eq!(
        inside,
        ns.inode().unwrap(),
        "the closure ran in the namespace"
    );
    assert_ne!(thread, caller, "on another thread");
    let links: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim()))
        .collect();
    assert_eq!(links, vec!["lo"], "only loopback in a new namespace");
    assert_eq!(
        thread_netns_inode(),
        before,
        "the calling thread did not move"
    );

    // Borrowing from the caller's stack works (scoped thread).
    let local = String::from("borrowed");
    assert_eq!(ns.run(|| local.len()).unwrap(), 8);
}

#[test]
fn a_panic_inside_run_reaches_the_caller() {
    require_root!();
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let before = thread_netns_inode();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ns.run(|| panic!("boom inside")).unwrap();
    }));
    let payload = caught.expect_err("panic resumed");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom inside"));
    assert_eq!(thread_netns_inode(), before);
}

#[test]
fn a_link_made_with_exec_in_exists_only_inside() {
    require_root!();
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let link = unique_link_name();
    exec_ok(&ns, "ip", &["link", "add", &link, "type", "bridge"]);

    assert!(link_exists_in(ns.path(), &link));
    assert_eq!(links(ns.path()), vec!["lo".to_string(), link.clone()]);
    assert!(!link_exists(&link), "{link} leaked into the host namespace");
    assert!(!ip(&["link", "show", &link]).status.success());
}

#[test]
fn exec_in_returns_the_commands_output_and_runs_it_inside() {
    require_root!();
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let before = thread_netns_inode();

    let out = ns
        .exec_in(sh("readlink /proc/self/ns/net; echo to-stderr >&2; exit 3"))
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("net:[{}]", ns.inode().unwrap()),
        "the child's namespace"
    );
    assert_eq!(out.stderr, b"to-stderr\n");
    assert_eq!(thread_netns_inode(), before);

    let err = ns
        .exec_in(Command::new("/nonexistent/cni-test-binary"))
        .expect_err("no such program");
    assert!(
        err.to_string().contains("/nonexistent/cni-test-binary"),
        "the error names the command: {err}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn run_async_and_exec_in_async_on_a_current_thread_runtime() {
    require_root!();
    async_checks().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_async_and_exec_in_async_on_a_multi_thread_runtime() {
    require_root!();
    async_checks().await;
}

async fn async_checks() {
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let before = thread_netns_inode();

    let inside = ns.run_async(thread_netns_inode).await.unwrap();
    assert_eq!(inside, ns.inode().unwrap());

    let out = ns
        .exec_in_async(sh("readlink /proc/self/ns/net; echo e >&2"))
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("net:[{}]", ns.inode().unwrap())
    );
    assert_eq!(out.stderr, b"e\n");

    // The worker this task runs on never moved (on multi_thread the task may
    // have migrated, but no worker can have been switched: every worker's
    // namespace is ours).
    assert_eq!(thread_netns_inode(), before);
    let workers = tokio::task::spawn_blocking(thread_netns_inode)
        .await
        .unwrap();
    assert_eq!(workers, before);

    // A panic inside reaches the awaiting task.
    let caught = tokio::spawn({
        let ns = ns.try_clone().unwrap();
        async move { ns.run_async(|| panic!("async boom")).await }
    })
    .await;
    assert!(caught.unwrap_err().is_panic());
}

#[tokio::test]
async fn dropping_exec_in_async_kills_the_command() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let ns = NetnsGuard::create(&unique_netns_name()).unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!(
        "echo $$ > {}.tmp; mv {0}.tmp {0}; exec sleep 1000",
        pid_file.display()
    );

    // Dropped once the command runs (it wrote its pid).
    let pid: u32 = tokio::select! {
        r = ns.exec_in_async(sh(&script)) => panic!("sleep 1000 cannot have finished: {r:?}"),
        pid = async {
            let end = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(pid) = fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse().ok()) {
                    break pid;
                }
                assert!(Instant::now() < end, "the command never wrote its pid");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        } => pid,
    };
    let started = Instant::now();
    // Gone, or a zombie the runtime has yet to reap.
    loop {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"));
        let dead = match &stat {
            Err(_) => true,
            Ok(s) => s
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        };
        if dead {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "sleep {pid} still runs: {stat:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn exec_in_async_outside_a_runtime_is_an_error() {
    require_root!();
    let ns = Netns::open("/proc/self/ns/net").unwrap();
    let mut fut = std::pin::pin!(ns.exec_in_async(Command::new("true")));
    // Polled once, outside any runtime: it fails before its first await.
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(result) = fut.as_mut().poll(&mut cx) else {
        panic!("pending without a runtime");
    };
    let err = result.expect_err("no runtime");
    assert!(err.to_string().contains("run `true`"), "{err}");
}

#[test]
fn addrs_and_ping_between_two_namespaces_over_a_veth_pair() {
    require_root!();
    let mut net = TestNet::new();
    let a = net.netns();
    let b = net.netns();
    let b_name = b.name().unwrap().to_owned();
    let (ip_a, ip_b) = (net.host(1), net.host(2));
    let (net_a, net_b) = (format!("{ip_a}/24"), format!("{ip_b}/24"));

    exec_ok(
        &a,
        "ip",
        &[
            "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b_name,
        ],
    );
    exec_ok(&a, "ip", &["addr", "add", &net_a, "dev", "va"]);
    exec_ok(&b, "ip", &["addr", "add", &net_b, "dev", "vb"]);
    for (ns, dev) in [(&a, "va"), (&b, "vb")] {
        exec_ok(ns, "ip", &["link", "set", dev, "up"]);
        exec_ok(ns, "ip", &["link", "set", "lo", "up"]);
    }

    assert_eq!(addrs_v4(&a, "va"), vec![net_a.parse::<IpNet>().unwrap()]);
    assert_eq!(addrs_v4(&b, "vb"), vec![net_b.parse::<IpNet>().unwrap()]);
    assert!(link_exists_in(a.path(), "va") && !link_exists_in(a.path(), "vb"));
    assert!(ping(&a, IpAddr::V4(ip_b)), "a -> b");
    assert!(ping(&b, IpAddr::V4(ip_a)), "b -> a");
    assert!(ping(&a, "127.0.0.1".parse().unwrap()), "own loopback");
    // No default route: an address outside the subnet is unreachable at once.
    assert!(!ping(&a, "10.255.255.254".parse().unwrap()));

    let err = try_addrs(a.path(), "nosuchdev").expect_err("no such device");
    assert!(err.contains("nosuchdev"), "{err}");
}
