//! The reaper acts on proven identity, not on paths and clocks, with the
//! real bridge + host-local chain: a live process's namespace attached as
//! `/proc/PID/ns/net` survives a restart whatever its record's mtime (a
//! clock stepped forward after boot moves the boot time past it); a
//! reap's DEL never hands plugins a path.

use crate::daemon_reaper::NET;
use crate::support;
use crate::support::daemon::{Daemon, Dirs, before_this_boot};
use crate::support::gate::Gate;
use crate::support::netns::{
    LinkGuard, ProcNs, SubnetLease, TempNetns, addrs_v4, host_local_ips, ip, ip_ok,
};
use crate::support::reaper::{chain, reaps_logged};
use crate::support::tool::CNITOOL;
use cnid::api::AttachmentRequest;
use serde_json::json;

/// Sets the mtime of `dirs`'s record `name` before this boot's start:
/// what an NTP step forward after boot does to a record written before
/// the step (btime = now - uptime moves with the clock).
fn date_before_boot(dirs: &Dirs, name: &str) {
    std::fs::File::options()
        .write(true)
        .open(dirs.cache.join("results").join(name))
        .expect("open record")
        .set_modified(before_this_boot())
        .expect("date record");
}

/// Gives record `name` another boot id: written in an earlier boot.
fn another_boot(dirs: &Dirs, name: &str) {
    let path = dirs.cache.join("results").join(name);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(boot.trim(), "an-earlier-boot")).unwrap();
}

/// A live process's namespace attached as `/proc/PID/ns/net`, its record
/// dated before the boot, cnid restarted: the start's pass leaves it (the
/// process keeps its address, host-local its reservation, a later ADD
/// gets another address), while an attachment of another boot whose
/// namespace is gone goes in the same pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_proc_namespace_survives_a_restart_whatever_its_records_mtime() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let proc_ns = ProcNs::new();
    let live = AttachmentRequest::new("reap-proc", proc_ns.path(), "eth0");
    let res = client.add(NET, &live).await.expect("ADD live");
    let ip = support::shim::ipv4_of(&res);
    let gone = TempNetns::new();
    client
        .add(
            NET,
            &AttachmentRequest::new("reap-old", gone.path(), "eth0"),
        )
        .await
        .expect("ADD gone");
    daemon.kill9();
    drop(gone);
    date_before_boot(&dirs, &format!("{NET}-reap-proc-eth0"));
    another_boot(&dirs, &format!("{NET}-reap-old-eth0"));
    date_before_boot(&dirs, &format!("{NET}-reap-old-eth0"));

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    // Both are judged by the start's pass: once the gone one is reaped,
    // that pass is over.
    reaps_logged(&daemon, 1).await;
    assert_eq!(dirs.cached(), vec![format!("{NET}-reap-proc-eth0")]);
    assert_eq!(proc_ns.ipv4_addrs("eth0"), vec![ip.clone()]);
    let addr = ip.split('/').next().unwrap().to_owned();
    assert_eq!(host_local_ips(&c.data_dir, NET), vec![addr.clone()]);
    let other = TempNetns::new();
    let req = AttachmentRequest::new("reap-next", other.path(), "eth0");
    let next = client.add(NET, &req).await.expect("ADD next");
    assert_ne!(
        support::shim::ipv4_of(&next),
        ip,
        "the live address given again"
    );
    client.del(NET, &req).await.expect("DEL next");
    client.del(NET, &live).await.expect("DEL live");
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
    drop(c);
}

/// Runs this workspace's cnitool on the host: `VERB NET NETNS` with `dirs`'s
/// conf dir, `cache` as its cache dir and `cni_path` as `CNI_PATH`;
/// fails the test unless it succeeds.
fn host_cnitool(dirs: &Dirs, cache: &std::path::Path, cni_path: &str, verb: &str, netns: &str) {
    let out = std::process::Command::new(&*CNITOOL)
        .args([verb, NET, netns])
        .env("NETCONFPATH", &dirs.conf)
        .env("CNI_PATH", cni_path)
        .env("CNI_CACHE_DIR", cache)
        .env_remove("CNI_ARGS")
        .env_remove("CAP_ARGS")
        .env_remove("CNI_IFNAME")
        .env_remove("CNID_SOCKET")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cnitool {verb}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A named namespace made (and deleted on drop) under a name of the
/// test's choosing.
struct NamedNs(String);

impl NamedNs {
    fn add(name: &str) -> NamedNs {
        ip_ok(&["netns", "add", name]);
        NamedNs(name.to_owned())
    }
}

impl Drop for NamedNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// The namespace deleted without DEL; while the reap's DEL runs (its
/// first plugin held at a gate), a namespace of the same name is made and
/// `cnitool add` attaches it: the reap's DEL has an empty CNI_NETNS, so
/// bridge does not delete cnitool's eth0 in the new namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaps_del_never_enters_a_namespace_re_created_at_the_path() {
    support::require_root!();
    support::require_plugins(&["bridge", "host-local"]);
    let dirs = Dirs::new();
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    ip_ok(&["link", "add", "name", bridge.name(), "type", "bridge"]);
    ip_ok(&["link", "set", bridge.name(), "up"]);
    let data_dir = dirs.data.join("host-local");
    let gate = Gate::new(&dirs.data);
    let seen = dirs.data.join("gated.log");
    // Last in the list: the first plugin of a DEL.
    dirs.plugin(
        "gated",
        &format!(
            r#"input=$(cat)
echo "$CNI_COMMAND netns=$CNI_NETNS" >> {seen}
if [ "$CNI_COMMAND" = DEL ]; then
{wait}
fi
if [ "$CNI_COMMAND" = ADD ]; then printf '%s' "$input" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["prevResult"]))'; fi
if [ "$CNI_COMMAND" = VERSION ]; then printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}'; fi
exit 0
"#,
            seen = seen.display(),
            wait = gate.shell_wait()
        ),
    );
    dirs.conf(
        "10-reap.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [
            {"type": "bridge", "bridge": bridge.name(), "isGateway": false, "ipMasq": false,
             "ipam": {"type": "host-local", "dataDir": data_dir,
                      "ranges": [[{"subnet": subnet.cidr()}]]}},
            {"type": "gated"}]}),
    );
    let daemon = Daemon::start(&dirs, &["--stale-after", "1s"]);
    let client = daemon.client().await;
    let ns = TempNetns::new();
    let name = ns.name().to_owned();
    let path = ns.path();
    client
        .add(NET, &AttachmentRequest::new("reap-four", &path, "eth0"))
        .await
        .expect("ADD");
    drop(ns);
    tokio::task::block_in_place(|| gate.wait_started_blocking(1));
    // The reap's DEL is held; the name is taken again and attached.
    let again = NamedNs::add(&name);
    let cache = dirs.data.join("cnitool-cache");
    let cni_path = format!("{}:/usr/lib/cni", dirs.bin.display());
    host_cnitool(&dirs, &cache, &cni_path, "add", &path);
    let addrs = addrs_v4(&path, "eth0");
    assert_eq!(addrs.len(), 1, "cnitool's eth0");
    gate.release();
    reaps_logged(&daemon, 1).await;
    assert_eq!(addrs_v4(&path, "eth0"), addrs, "cnitool's eth0 was deleted");
    let log = std::fs::read_to_string(&seen).unwrap();
    assert!(log.lines().any(|l| l == "DEL netns="), "{log}");
    assert!(
        !log.lines().any(|l| l == format!("DEL netns={path}")),
        "{log}"
    );
    host_cnitool(&dirs, &cache, &cni_path, "del", &path);
    assert!(host_local_ips(&data_dir, NET).is_empty());
    drop(again);
}

/// Runs cnid in a mount namespace of its own with a tmpfs over the netns
/// dir: it does not see the namespaces the host made (a unit with a
/// private /run, a pod without mount propagation).
fn private_netns_dir(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return fail();
            }
            let root = c"/";
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return fail();
            }
            let (src, dir, fs) = (c"cnidtest", c"/run/netns", c"tmpfs");
            if libc::mount(src.as_ptr(), dir.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) != 0 {
                return fail();
            }
            Ok(())
        });
    }
}

/// Rewrites record `name` (a new file, as a writer's rename gives) with
/// another boot id.
fn another_boot_renamed(dirs: &Dirs, name: &str) {
    let path = dirs.cache.join("results").join(name);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let tmp = dirs.cache.join("results").join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text.replace(boot.trim(), "an-earlier-boot")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

/// cnid with `--stale-after 1s` in a mount namespace that does not see the
/// netns dir: a live namespace attached from the host by cnitool into the
/// shared cache is never reaped (only what another boot id proves gone
/// is), and cnid says once that it does not see the host's mounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cnid_outside_the_hosts_mounts_reaps_only_by_boot_id() {
    support::require_root!();
    let dirs = Dirs::new();
    let c = chain(&dirs, NET, &[]);
    let cnitool = |verb: &str, path: &str| {
        host_cnitool(&dirs, &dirs.cache, "/usr/lib/cni", verb, path);
    };
    let live = TempNetns::new();
    let control = TempNetns::new();
    cnitool("add", &live.path());
    cnitool("add", &control.path());
    let ip = live.ipv4_addrs("eth0");
    assert_eq!(ip.len(), 1);
    let control_name = format!(
        "{NET}-{}-eth0",
        crate::support::tool::expected_container_id(&control.path())
    );
    drop(control);

    let daemon = Daemon::start_with(&dirs, &["--stale-after", "1s"], private_netns_dir);
    let client = daemon.client().await;
    // The control attachment becomes another boot's: a pass reaps it, and
    // that pass judged the live one too, both seen since the start.
    another_boot_renamed(&dirs, &control_name);
    reaps_logged(&daemon, 1).await;
    assert_eq!(
        dirs.cached(),
        vec![format!(
            "{NET}-{}-eth0",
            crate::support::tool::expected_container_id(&live.path())
        )]
    );
    assert_eq!(live.ipv4_addrs("eth0"), ip);
    assert_eq!(host_local_ips(&c.data_dir, NET).len(), 1);
    // Said once, where operators look.
    let ready = crate::support::daemon::get(&dirs.socket, "/v1/health/ready").json();
    assert!(
        ready["staleReaper"]
            .as_str()
            .is_some_and(|s| s.contains("limited")),
        "{ready}"
    );
    let m = client.metrics().await.unwrap();
    assert!(m.contains("cnid_stale_host_mounts_visible 0"), "{m}");
    assert_eq!(
        daemon
            .log()
            .matches("does not see the host's mounts")
            .count(),
        1
    );
    drop(daemon);
    cnitool("del", &live.path());
    assert!(host_local_ips(&c.data_dir, NET).is_empty());
}
