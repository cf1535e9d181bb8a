//! `cnitool gc --stale [--dry-run]`: the library's stale-attachment scan
//! and reap (`cni_async::stale`, what cnid's reaper uses) for hosts without
//! cnid. A cached attachment whose netns is gone is DELed with its cached
//! config, result (`prevResult`) and args and no netns, and loses its
//! record; one whose netns is its network namespace stays (whatever the
//! record's mtime), and so does one the caller cannot see from its mount
//! namespace; `--dry-run` deletes nothing; an unreadable conf dir deletes
//! nothing.

use crate::support::daemon::before_this_boot;
use crate::support::fake::Fake;
use crate::support::netns::{
    LinkGuard, NETNS_DIR, ProcNs, SubnetLease, TempNetns, addrs_v4, host_local_ips, ip_ok,
};
use crate::support::shim::go_tool;
use crate::support::tool::{Run, Sandbox, expected_container_id};

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
    assert_eq!(dels[0].var("CNI_NETNS"), Some(""));
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

/// A bridge + host-local network of the test's own for `sb`, and the
/// `CNI_PATH` cnitool runs with on it ([`real_path`]).
struct RealNet {
    name: &'static str,
    data_dir: std::path::PathBuf,
    path: String,
    _bridge: LinkGuard,
    _subnet: SubnetLease,
}

impl RealNet {
    fn new(sb: &Sandbox, name: &'static str) -> Self {
        crate::support::require_plugins(&["bridge", "host-local"]);
        let bridge = LinkGuard::new();
        let subnet = SubnetLease::new();
        ip_ok(&["link", "add", "name", bridge.name(), "type", "bridge"]);
        ip_ok(&["link", "set", bridge.name(), "up"]);
        let data_dir = sb.root().join("host-local");
        sb.conflist(
            name,
            "1.0.0",
            &[
                serde_json::json!({"type": "bridge", "bridge": bridge.name(), "isGateway": false,
                "ipMasq": false, "ipam": {"type": "host-local", "dataDir": data_dir,
                "ranges": [[{"subnet": subnet.cidr()}]]}}),
            ],
        );
        RealNet {
            name,
            data_dir,
            path: real_path(sb),
            _bridge: bridge,
            _subnet: subnet,
        }
    }

    fn env(&self) -> [(&'static str, &str); 1] {
        [("CNI_PATH", self.path.as_str())]
    }

    /// `cnitool add` of the namespace at `netns`: its `eth0` gets one
    /// IPv4 address, returned.
    fn add(&self, sb: &Sandbox, netns: &str) -> Vec<String> {
        sb.run_env(&["add", self.name, netns], &self.env()).ok();
        let ip: Vec<String> = addrs_v4(netns, "eth0")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(ip.len(), 1);
        ip
    }

    /// The addresses host-local holds.
    fn reserved(&self) -> Vec<String> {
        host_local_ips(&self.data_dir, self.name)
    }

    /// `cnitool del` of the namespace at `netns`: host-local holds nothing
    /// after it.
    fn del(&self, sb: &Sandbox, netns: &str) {
        sb.run_env(&["del", self.name, netns], &self.env()).ok();
        assert!(self.reserved().is_empty());
    }
}

/// Dates a cache record before this boot (as a clock stepped forward
/// after the boot, or a record from another boot, shows it).
fn date_before_boot(record: &std::path::Path) {
    std::fs::File::options()
        .write(true)
        .open(record)
        .unwrap()
        .set_modified(before_this_boot())
        .unwrap();
}

fn real_path(sb: &Sandbox) -> String {
    format!("{}:/usr/lib/cni", sb.plugins.bin().display())
}

/// A live process's namespace attached by `cnitool add` as
/// `/proc/PID/ns/net`, its record dated before the boot (a clock stepped
/// forward after boot): `gc --stale --dry-run` does not list it, and
/// `gc --stale` leaves it (the process keeps its address).
#[test]
fn gc_stale_leaves_a_live_proc_namespace_whatever_its_records_mtime() {
    crate::support::require_root!();
    let sb = Sandbox::new();
    let real = RealNet::new(&sb, "gcstaleproc");
    let env = real.env();
    let p = ProcNs::new();
    let ip = real.add(&sb, &p.path());
    let records = sb.cache_entries();
    assert_eq!(records.len(), 1);
    date_before_boot(&sb.cache_dir().join("results").join(&records[0]));

    let dry = sb
        .run_env(&["gc", "--stale", "--dry-run"], &env)
        .ok()
        .stdout_json();
    assert_eq!(dry["stale"].as_array().unwrap().len(), 0, "{dry}");
    let done = sb.run_env(&["gc", "--stale"], &env).ok().stdout_json();
    assert_eq!(done["stale"].as_array().unwrap().len(), 0, "{done}");
    assert_eq!(sb.cache_entries(), records);
    assert_eq!(p.ipv4_addrs("eth0"), ip);
    assert_eq!(real.reserved().len(), 1);
    real.del(&sb, &p.path());
}

/// `cnitool gc --stale` in a mount namespace that does not see the netns
/// dir (a tmpfs over it, as a unit with a private /run has): a live named
/// namespace attached from the host is not "gone" for it; nothing is
/// deleted, even without --dry-run.
#[test]
fn gc_stale_outside_the_hosts_mounts_leaves_a_namespace_it_cannot_see() {
    crate::support::require_root!();
    let sb = Sandbox::new();
    let real = RealNet::new(&sb, "gcstalemnt");
    let ns = TempNetns::new();
    let ip = real.add(&sb, &ns.path());

    let tool = sb.cnitool(&["gc", "--stale"]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs cnitest {NETNS_DIR} && test ! -e {} && exec \"$0\" \"$@\"",
            ns.path()
        ))
        .arg(tool.get_program())
        .args(tool.get_args())
        .env("CNI_PATH", &real.path)
        .stdin(std::process::Stdio::null());
    for (k, v) in tool.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(d) = tool.get_current_dir() {
        cmd.current_dir(d);
    }
    let run = Run::of(cmd).ok();
    let done = run.stdout_json();
    assert_eq!(done["stale"].as_array().unwrap().len(), 0, "{done}");
    assert!(
        run.stderr.contains("does not see the host's mounts"),
        "{}",
        run.stderr
    );
    assert_eq!(sb.cache_entries().len(), 1);
    assert_eq!(ns.ipv4_addrs("eth0"), ip);
    assert_eq!(real.reserved().len(), 1);
    real.del(&sb, &ns.path());
}

/// Go's cnitool on libcni (`cnid/tests/go/cnitool`) with `sb`'s conf dir,
/// cache dir and the real plugins.
fn go_cnitool(sb: &Sandbox, go: &std::path::Path, args: &[&str]) -> Run {
    let mut cmd = std::process::Command::new(go);
    cmd.args(args)
        .env("NETCONFPATH", sb.net_dir())
        .env("CNI_PATH", real_path(sb))
        .env("CNI_CACHE_DIR", sb.cache_dir())
        .env_remove("CNI_ARGS")
        .env_remove("CAP_ARGS")
        .env_remove("CNI_IFNAME")
        .stdin(std::process::Stdio::null());
    Run::of(cmd)
}

/// A record our cnitool wrote, `netnsIdentity` included, is read and
/// DELed by Go libcni (it ignores the key): its DEL succeeds (libcni fails
/// a DEL whose cached record it cannot decode), the address is released
/// and the record removed.
#[test]
fn go_libcni_dels_a_record_with_identity() {
    crate::support::require_root!();
    let Some(go) = go_tool("cnitool") else {
        return;
    };
    let sb = Sandbox::new();
    let real = RealNet::new(&sb, "gcstalego1");
    let net = real.name;
    let ns = TempNetns::new();
    real.add(&sb, &ns.path());
    let cid = expected_container_id(&ns.path());
    let rec = sb.cache_record(net, &cid, "eth0").expect("record");
    assert!(
        rec["netnsIdentity"]["bootId"].is_string() && rec["netnsIdentity"]["ino"].is_u64(),
        "{rec}"
    );
    assert_eq!(real.reserved().len(), 1);
    go_cnitool(&sb, &go, &["del", net, &ns.path()]).ok();
    assert!(sb.cache_entries().is_empty(), "{:?}", sb.cache_entries());
    assert!(real.reserved().is_empty());
    assert!(!ns.exec("ip", &["link", "show", "eth0"]).status.success());
}

/// Records Go libcni wrote (no identity; with `netns`, as libcni 1.2+
/// writes it: Debian's older libcni leaves it out, which our scanner keeps
/// as "no netns") dated before the boot: one of a live process's
/// `/proc/PID/ns/net` is kept (a path that is a namespace now is never
/// judged on the clock), one whose named namespace is gone is reaped as
/// `rebooted` (the rules for records without identity).
#[test]
fn a_go_libcni_record_is_reaped_only_by_the_rules_without_identity() {
    crate::support::require_root!();
    let Some(go) = go_tool("cnitool") else {
        return;
    };
    let sb = Sandbox::new();
    let real = RealNet::new(&sb, "gcstalego2");
    let (net, env) = (real.name, real.env());
    let p = ProcNs::new();
    let gone = TempNetns::new();
    go_cnitool(&sb, &go, &["add", net, &p.path()]).ok();
    go_cnitool(&sb, &go, &["add", net, &gone.path()]).ok();
    let ip = p.ipv4_addrs("eth0");
    assert_eq!(ip.len(), 1);
    let gone_path = gone.path();
    drop(gone);
    for (name, netns) in [(&p.path(), p.path()), (&gone_path, gone_path.clone())] {
        let cid = expected_container_id(name);
        let file = sb
            .cache_dir()
            .join("results")
            .join(format!("{net}-{cid}-eth0"));
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("netnsIdentity"), "{text}");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        if v.get("netns").is_none() {
            v["netns"] = netns.into();
        }
        std::fs::write(&file, v.to_string()).unwrap();
        date_before_boot(&file);
    }
    let dry = sb
        .run_env(&["gc", "--stale", "--dry-run"], &env)
        .ok()
        .stdout_json();
    let listed = dry["stale"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{dry}");
    assert_eq!(listed[0]["netns"], gone_path.as_str());
    assert_eq!(listed[0]["reason"], "rebooted");
    let done = sb.run_env(&["gc", "--stale"], &env).ok().stdout_json();
    assert_eq!(done["stale"][0]["deleted"], true, "{done}");
    assert_eq!(
        sb.cache_entries(),
        vec![format!("{net}-{}-eth0", expected_container_id(&p.path()))]
    );
    assert_eq!(p.ipv4_addrs("eth0"), ip);
    assert_eq!(real.reserved().len(), 1);
    go_cnitool(&sb, &go, &["del", net, &p.path()]).ok();
    assert!(real.reserved().is_empty());
}
