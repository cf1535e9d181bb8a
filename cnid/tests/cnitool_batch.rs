//! `cnitool batch up|down` as root, with the real bridge and host-local
//! plugins on a bridge, subnet and host-local dataDir of each test's own,
//! and fake plugins (wrappers around `cni-noop`) for failures and slowness.
//!
//! Network rule: the only traffic is between the test's namespaces over its
//! own bridge, in its own leased /24; no ipMasq, no gateway, no default
//! route. Every test removes its namespaces (`PREFIX<number>`) and bridge in
//! guards, also when it panics.

use std::collections::BTreeSet;
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::gate::Gate;
use crate::support::netns::{
    LinkGuard, NETNS_DIR, SubnetLease, host_local_ips, ip, ip_json, ip_ok, unique_id,
};
use crate::support::require_root;
use crate::support::tool::{Run, Sandbox, expected_container_id};
use serde_json::{Value, json};

const PLUGIN_DIR: &str = "/usr/lib/cni";
use crate::support::noop::NOOP as CNI_NOOP;

fn require_plugins() {
    for p in ["bridge", "host-local"] {
        assert!(
            Path::new(PLUGIN_DIR).join(p).is_file(),
            "this test needs the reference plugin {PLUGIN_DIR}/{p} (Debian: containernetworking-plugins)"
        );
    }
}

/// The namespaces `prefix<number>` in `/run/netns`, sorted by number.
fn batch_namespaces(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(NETNS_DIR)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| {
                    n.strip_prefix(prefix)
                        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort_by_key(|n| (n.len(), n.clone()));
    names
}

/// Deletes every namespace `prefix<number>` on drop (also on panic).
#[derive(Debug)]
struct NamespacesGuard {
    prefix: String,
}

impl Drop for NamespacesGuard {
    fn drop(&mut self) {
        for name in batch_namespaces(&self.prefix) {
            let out = ip(&["netns", "del", &name]);
            if !out.status.success() {
                eprintln!(
                    "cleanup: ip netns del {name} failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim_end()
                );
            }
        }
    }
}

/// One test's world. Fields drop in order: namespaces, bridge, subnet
/// lease, then the temp dir (cache, host-local dataDir, fake plugins).
struct World {
    namespaces: NamespacesGuard,
    bridge: LinkGuard,
    subnet: SubnetLease,
    sb: Sandbox,
    network: String,
}

impl World {
    fn new() -> World {
        cni_test_support::assert_root("a batch World creates namespaces and a bridge");
        require_plugins();
        World {
            namespaces: NamespacesGuard {
                prefix: format!("cbt{}-", unique_id()),
            },
            bridge: LinkGuard::new(),
            subnet: SubnetLease::new(),
            sb: Sandbox::new(),
            network: format!("cnitool-batch-{}", unique_id()),
        }
    }

    fn prefix(&self) -> &str {
        &self.namespaces.prefix
    }

    fn data_dir(&self) -> PathBuf {
        self.sb.root().join("host-local")
    }

    /// Writes the network: bridge (host-local, our subnet; no gateway, no
    /// masquerading), then `extra` plugins. The bridge is made first with a
    /// fixed MAC, so that CHECK of an early member does not see its MAC
    /// change as ports join.
    fn bridge_network(&self, extra: &[Value]) {
        let mut plugins = vec![json!({
            "type": "bridge",
            "bridge": self.bridge.name(),
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.data_dir(),
                "ranges": [[{"subnet": self.subnet.cidr()}]]
            }
        })];
        plugins.extend_from_slice(extra);
        self.sb.conflist(&self.network, "1.0.0", &plugins);
        ip_ok(&["link", "add", self.bridge.name(), "type", "bridge"]);
        ip_ok(&[
            "link",
            "set",
            self.bridge.name(),
            "address",
            "02:cb:00:00:00:01",
        ]);
    }

    /// A fake plugin `name`: `shell` lines, then `cni-noop` (which passes
    /// `prevResult` on, or makes a result of its own).
    fn noop_plugin(&self, name: &str, shell: &str) {
        self.sb
            .plugins
            .script(name, &format!("{shell}\nexec '{CNI_NOOP}'"));
    }

    /// `cnitool ARGS` with the real plugins and the fake ones.
    fn run(&self, args: &[&str]) -> Run {
        let path = format!("{}:{PLUGIN_DIR}", self.sb.plugins.bin().display());
        self.sb.run_env(args, &[("CNI_PATH", path.as_str())])
    }

    fn up(&self, count: usize, concurrency: usize) -> Run {
        self.run(&[
            "batch",
            "up",
            &self.network,
            "--count",
            &count.to_string(),
            "--concurrency",
            &concurrency.to_string(),
            "--prefix",
            self.prefix(),
        ])
    }

    fn down(&self, extra: &[&str]) -> Run {
        let mut args = vec![
            "batch",
            "down",
            self.network.as_str(),
            "--prefix",
            self.prefix(),
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// Runs `cnitool ARGS` until a plugin run reached `gate`, then sends it
    /// SIGINT; asserts that it fails with exit status `status`; its stdout
    /// and stderr.
    fn interrupted(&self, args: &[&str], gate: &Gate, status: i32) -> (String, String) {
        self.interrupted_at(args, gate, 1, status)
    }

    /// [`Self::interrupted`] once `held` plugin runs reached `gate`.
    fn interrupted_at(
        &self,
        args: &[&str],
        gate: &Gate,
        held: usize,
        status: i32,
    ) -> (String, String) {
        let path = format!("{}:{PLUGIN_DIR}", self.sb.plugins.bin().display());
        let child = self
            .sb
            .cnitool(args)
            .env("CNI_PATH", &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cnitool");
        gate.wait_started_blocking(held);
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let out = child.wait_with_output().expect("wait for cnitool");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(status), "{stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    }

    /// The host-side veths on the bridge.
    fn bridge_ports(&self) -> Vec<String> {
        ip_json(&["link", "show", "master", self.bridge.name()])
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["ifname"].as_str().map(str::to_owned))
            .collect()
    }

    /// Asserts that nothing of the batch is left.
    #[track_caller]
    fn assert_clean(&self) {
        assert_eq!(batch_namespaces(self.prefix()), Vec::<String>::new());
        assert_eq!(self.bridge_ports(), Vec::<String>::new(), "veths left");
        assert_eq!(
            host_local_ips(&self.data_dir(), &self.network),
            Vec::<String>::new(),
            "host-local still holds addresses"
        );
        assert_eq!(self.sb.cache_entries(), Vec::<String>::new());
    }
}

/// The IPv4 addresses (`a.b.c.d/len`) of `ifname` in namespace `name`.
fn ipv4_addrs(name: &str, ifname: &str) -> Vec<String> {
    ip_json(&["-n", name, "addr", "show", "dev", ifname])
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]))
        .collect()
}

fn ping_from(name: &str, to: Ipv4Addr) -> bool {
    let to = to.to_string();
    (0..3).any(|_| {
        Command::new("ip")
            .args(["netns", "exec", name, "ping", "-c1", "-W1", &to])
            .stdin(Stdio::null())
            .output()
            .expect("run ping")
            .status
            .success()
    })
}

fn addr_of(cidr: &str) -> Ipv4Addr {
    cidr.split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("not an IPv4 address: {cidr}"))
}

/// The `ips` of a member of a summary, as strings.
fn ips_of(member: &Value) -> Vec<String> {
    member["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in {member}"))
        .iter()
        .map(|v| v.as_str().expect("ip is a string").to_owned())
        .collect()
}

#[test]
fn up_twenty_namespaces_then_down_twice() {
    require_root!();
    let w = World::new();
    w.bridge_network(&[]);
    let prefix = w.prefix();

    let run = w.up(20, 4).ok();
    let summary = run.stdout_json();
    assert_eq!(summary["network"], w.network.as_str(), "{summary}");
    assert_eq!(summary["prefix"], prefix);
    assert_eq!(summary["attached"], 20);
    assert_eq!(summary["failed"], 0);
    assert!(summary["elapsedMs"].is_u64(), "{summary}");
    // Progress, one line per tenth when stderr is not a terminal.
    assert!(
        run.stderr
            .contains("batch up: 20/20 done (100%): 20 attached, 0 failed"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 10, "{}", run.stderr);

    let members = summary["namespaces"].as_array().expect("namespaces");
    assert_eq!(members.len(), 20);
    let mut all_ips = BTreeSet::new();
    for (i, m) in members.iter().enumerate() {
        let name = format!("{prefix}{i}");
        let path = format!("{NETNS_DIR}/{name}");
        assert_eq!(m["namespace"], name.as_str(), "{m}");
        assert_eq!(m["path"], path.as_str(), "{m}");
        // The container ID cnitool add would use for that path.
        assert_eq!(m["containerId"], expected_container_id(&path).as_str());
        assert_eq!(m["ifname"], "eth0");
        assert_eq!(m["error"], Value::Null);
        let ips = ips_of(m);
        assert_eq!(ips.len(), 1, "{m}");
        assert_eq!(
            addr_of(&ips[0]).octets()[..3],
            w.subnet.host(0).octets()[..3],
            "{} outside {}",
            ips[0],
            w.subnet.cidr()
        );
        // The interface really has it.
        assert_eq!(ipv4_addrs(&name, "eth0"), ips, "in {name}");
        all_ips.insert(ips[0].clone());
    }
    assert_eq!(all_ips.len(), 20, "addresses are distinct");
    let names = batch_namespaces(prefix);
    assert_eq!(names.len(), 20, "{names:?}");
    // `ip netns list` shows them.
    let listed = ip_ok(&["netns", "list"]);
    for name in &names {
        assert!(
            listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name} not in `ip netns list`"
        );
    }
    assert_eq!(host_local_ips(&w.data_dir(), &w.network).len(), 20);
    assert_eq!(w.bridge_ports().len(), 20);
    assert_eq!(w.sb.cache_entries().len(), 20);
    // No default route anywhere.
    for name in [&names[0], &names[19]] {
        let routes = ip_json(&["-n", name, "-4", "route", "show", "default"]);
        assert_eq!(routes, json!([]), "default route in {name}");
    }

    // Traffic from the first to the last, over our bridge.
    let last = addr_of(&ips_of(&members[19])[0]);
    assert!(
        ping_from(&names[0], last),
        "{} cannot ping {last}",
        names[0]
    );

    // Plain cnitool finds a member: CHECK, then DEL of the first.
    let first = format!("{NETNS_DIR}/{prefix}0");
    w.run(&["check", &w.network, &first]).ok();
    w.run(&["del", &w.network, &first]).ok();
    assert_eq!(host_local_ips(&w.data_dir(), &w.network).len(), 19);
    assert_eq!(w.sb.cache_entries().len(), 19);

    // down: the 19 cached attachments, and a DEL of the first (no longer
    // cached, its namespace still there) as cnitool del would run it.
    let run = w.down(&["--concurrency", "4"]).ok();
    let summary = run.stdout_json();
    pretty_assertions::assert_eq!(
        json!({
            "network": summary["network"],
            "prefix": summary["prefix"],
            "detached": summary["detached"],
            "deleted": summary["deleted"],
            "errors": summary["errors"],
        }),
        json!({
            "network": w.network,
            "prefix": prefix,
            "detached": 20,
            "deleted": 20,
            "errors": [],
        })
    );
    assert!(
        run.stderr
            .contains("batch down: 20/20 done (100%): 20 torn down, 0 errors"),
        "{}",
        run.stderr
    );
    w.assert_clean();

    // Again: nothing to do, and quiet but for saying so.
    let run = w.down(&["-q"]).ok();
    let summary = run.stdout_json();
    assert_eq!(
        (
            &summary["detached"],
            &summary["deleted"],
            &summary["errors"]
        ),
        (&json!(0), &json!(0), &json!([]))
    );
    assert!(
        run.stderr.starts_with(&format!(
            "batch down: nothing matches the prefix {prefix:?}"
        )),
        "{}",
        run.stderr
    );
    w.assert_clean();
}

#[test]
fn failing_members_are_rolled_back_and_reported() {
    require_root!();
    let w = World::new();
    // Appended to the chain: fails the ADD of members with an odd number.
    w.noop_plugin(
        "failodd",
        r#"case "$CNI_COMMAND:$CNI_NETNS" in ADD:*[13579]) export CNI_NOOP_FAIL=1;; esac"#,
    );
    w.bridge_network(&[json!({"type": "failodd"})]);
    let prefix = w.prefix();

    let run = w.up(6, 3);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains(&format!(
            "error: 3 of 6 namespaces failed to attach ({prefix}1, {prefix}3, {prefix}5; \
             see the summary on stdout); the first, {prefix}1: plugin failodd ADD failed"
        )),
        "{}",
        run.stderr
    );
    let summary = run.stdout_json();
    assert_eq!(
        (&summary["attached"], &summary["failed"]),
        (&json!(3), &json!(3))
    );
    for (i, m) in summary["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .enumerate()
    {
        assert_eq!(m["namespace"], format!("{prefix}{i}").as_str());
        if i % 2 == 1 {
            let error = m["error"]
                .as_str()
                .unwrap_or_else(|| panic!("no error in {m}"));
            assert!(
                error.contains("plugin failodd ADD failed") && error.contains("CNI_NOOP_FAIL"),
                "{error}"
            );
            assert_eq!(m["ips"], json!([]));
        } else {
            assert_eq!(m["error"], Value::Null, "{m}");
            assert_eq!(ips_of(m).len(), 1, "{m}");
        }
    }
    // The failed members were rolled back (their addresses released, their
    // veths gone) and their namespaces deleted; the others stay up.
    let even: Vec<String> = [0, 2, 4].iter().map(|i| format!("{prefix}{i}")).collect();
    assert_eq!(batch_namespaces(prefix), even);
    assert_eq!(host_local_ips(&w.data_dir(), &w.network).len(), 3);
    assert_eq!(w.bridge_ports().len(), 3);
    assert_eq!(w.sb.cache_entries().len(), 3);

    let summary = w.down(&[]).ok().stdout_json();
    assert_eq!(
        (
            &summary["detached"],
            &summary["deleted"],
            &summary["errors"]
        ),
        (&json!(3), &json!(3), &json!([]))
    );
    w.assert_clean();
}

#[test]
fn up_refuses_a_prefix_in_use() {
    require_root!();
    let w = World::new();
    w.noop_plugin("noop", "");
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "noop"})]);
    let taken = format!("{}3", w.prefix());
    ip_ok(&["netns", "add", &taken]);

    let err = w
        .run(&[
            "--json-errors",
            "batch",
            "up",
            &w.network,
            "--count",
            "5",
            "--prefix",
            w.prefix(),
        ])
        .fails_json();
    assert_eq!(err["code"], 4, "{err}");
    let msg = err["msg"].as_str().expect("msg");
    assert!(
        msg.contains(&format!("({taken})")) && msg.contains("cnitool batch down"),
        "{msg}"
    );
    // Nothing was made.
    assert_eq!(batch_namespaces(w.prefix()), std::slice::from_ref(&taken));
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());

    // down takes it (a DEL as cnitool del would run it, then the namespace).
    let summary = w.down(&["-q"]).ok().stdout_json();
    assert_eq!(
        (&summary["detached"], &summary["deleted"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(batch_namespaces(w.prefix()), Vec::<String>::new());
}

#[test]
fn interrupted_up_tears_everything_down() {
    require_root!();
    let w = World::new();
    // Every ADD holds at a gate, never opened: the interrupt kills it. The
    // invocations are recorded.
    let gate = Gate::new(w.sb.root());
    let record = w.sb.root().join("calls");
    w.noop_plugin(
        "slow",
        &format!(
            "echo \"$CNI_COMMAND $CNI_CONTAINERID\" >> '{}'\n\
             if [ \"$CNI_COMMAND\" = ADD ]; then\n{}\nfi",
            record.display(),
            gate.shell_wait()
        ),
    );
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "slow"})]);
    // Once an ADD is in flight (held at the gate), SIGINT: exit status 130
    // (it was 1, with nothing on stdout) and the partial
    // summary.
    let (stdout, stderr) = w.interrupted(
        &[
            "batch",
            "up",
            &w.network,
            "--count",
            "8",
            "--concurrency",
            "2",
            "--prefix",
            w.prefix(),
        ],
        &gate,
        130,
    );
    let summary: Value = serde_json::from_str(&stdout).expect("a JSON summary");
    assert_eq!(summary["network"], json!(w.network), "{summary}");
    assert_eq!(summary["interrupted"], "SIGINT", "{summary}");
    assert_eq!(summary["tornDown"], true, "{summary}");
    let members = summary["namespaces"].as_array().expect("namespaces");
    assert!(!members.is_empty(), "{summary}");
    assert!(
        members
            .iter()
            .all(|m| m["error"].as_str().is_some_and(|e| e.contains("SIGINT"))),
        "held at the gate, no member attached: {summary}"
    );
    assert_eq!(summary["attached"], 0, "{summary}");
    assert!(
        stderr.contains("batch up interrupted by SIGINT; the ")
            && stderr.contains("namespaces made so far (0 attached, ")
            && stderr.contains(" were torn down"),
        "{stderr}"
    );

    // Everything that got an ADD got a DEL; nothing is left.
    let calls = fs::read_to_string(&record).expect("read the calls");
    let of = |verb: &str| -> BTreeSet<&str> {
        calls
            .lines()
            .filter_map(|l| l.strip_prefix(verb)?.strip_prefix(' '))
            .collect()
    };
    let (adds, dels) = (of("ADD"), of("DEL"));
    // The one or two (concurrency 2) that were held.
    assert!(!adds.is_empty() && adds.len() <= 2, "{calls}");
    assert!(adds.is_subset(&dels), "ADD without DEL: {calls}");
    assert_eq!(batch_namespaces(w.prefix()), Vec::<String>::new());
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());
}

/// Interrupted with some members attached and others held mid-ADD: the
/// summary's counts and stderr's agree (they told 46 attached and 48 torn
/// down, the 2 in flight unnamed).
#[test]
fn interrupted_up_counts_attached_and_in_flight_alike_in_summary_and_stderr() {
    require_root!();
    let w = World::new();
    // Members 0 and 1 attach; 2 and 3 hold at the gate, never opened. At
    // concurrency 2, 2 and 3 start only as 0 and 1 end: with both held,
    // 0 and 1 are attached.
    let gate = Gate::new(w.sb.root());
    w.noop_plugin(
        "slow",
        &format!(
            "case \"$CNI_COMMAND:$CNI_NETNS\" in ADD:*[23]) {} ;; esac",
            gate.shell_wait()
        ),
    );
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "slow"})]);
    let (stdout, stderr) = w.interrupted_at(
        &[
            "batch",
            "up",
            &w.network,
            "--count",
            "4",
            "--concurrency",
            "2",
            "--prefix",
            w.prefix(),
        ],
        &gate,
        2,
        130,
    );
    let summary: Value = serde_json::from_str(&stdout).expect("a JSON summary");
    assert_eq!(summary["attached"], 2, "{summary}");
    assert_eq!(summary["failed"], 2, "{summary}");
    assert_eq!(summary["namespacesMade"], 4, "{summary}");
    assert_eq!(summary["tornDown"], true, "{summary}");
    assert!(
        stderr.contains(
            "batch up interrupted by SIGINT; the 4 namespaces made so far \
             (2 attached, 2 not attached) were torn down"
        ),
        "{stderr}"
    );
    assert_eq!(batch_namespaces(w.prefix()), Vec::<String>::new());
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());
}

#[test]
fn down_refuses_an_unknown_network_and_uses_the_cached_config_once_the_file_is_gone() {
    require_root!();
    let w = World::new();
    let record = w.sb.root().join("calls");
    w.noop_plugin(
        "rec",
        &format!(
            "echo \"$CNI_COMMAND $CNI_CONTAINERID\" >> '{}'",
            record.display()
        ),
    );
    let file =
        w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "rec"})]);
    let prefix = w.prefix();
    w.up(3, 2).ok();
    let names = batch_namespaces(prefix);
    assert_eq!(names.len(), 3);

    // A network with neither a file nor cached attachments in them: the
    // namespaces are left alone.
    let msg = w
        .run(&["batch", "down", "no-such-net", "--prefix", prefix])
        .fails();
    assert!(
        msg.contains("neither a configuration nor cached attachments")
            && msg.contains(&names.join(", ")),
        "{msg}"
    );
    assert_eq!(batch_namespaces(prefix), names);

    // The network's file is gone: DEL with the configuration cached at ADD.
    fs::remove_file(&file).expect("remove the conflist");
    let summary = w.down(&["-q"]).ok().stdout_json();
    assert_eq!(
        (
            &summary["detached"],
            &summary["deleted"],
            &summary["errors"]
        ),
        (&json!(3), &json!(3), &json!([]))
    );
    let calls = fs::read_to_string(&record).expect("read the calls");
    let dels: BTreeSet<&str> = calls
        .lines()
        .filter_map(|l| l.strip_prefix("DEL "))
        .collect();
    let want: BTreeSet<String> = names
        .iter()
        .map(|n| expected_container_id(&format!("{NETNS_DIR}/{n}")))
        .collect();
    assert_eq!(dels, want.iter().map(String::as_str).collect(), "{calls}");
    assert_eq!(batch_namespaces(prefix), Vec::<String>::new());
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());
}

#[test]
fn a_signal_stops_down_and_the_next_down_finishes() {
    require_root!();
    let w = World::new();
    // Every DEL holds at a gate until the test opens it.
    let gate = Gate::new(w.sb.root());
    w.noop_plugin(
        "slowdel",
        &format!(
            "if [ \"$CNI_COMMAND\" = DEL ]; then\n{}\nfi",
            gate.shell_wait()
        ),
    );
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "slowdel"})]);
    let prefix = w.prefix();
    w.up(3, 3).ok();

    // Once a DEL is in flight (held at the gate), SIGINT.
    let (stdout, stderr) = w.interrupted(
        &[
            "batch",
            "down",
            &w.network,
            "--prefix",
            prefix,
            "--concurrency",
            "1",
        ],
        &gate,
        1,
    );
    assert_eq!(stdout, "", "no summary");
    assert!(
        stderr.contains("batch down interrupted by SIGINT; 3 namespaces left"),
        "{stderr}"
    );
    // The killed DEL's namespace and cache record stay, as the others.
    assert_eq!(batch_namespaces(prefix).len(), 3);
    assert_eq!(w.sb.cache_entries().len(), 3);

    gate.release();
    let summary = w.down(&["-q"]).ok().stdout_json();
    assert_eq!(
        (&summary["detached"], &summary["deleted"]),
        (&json!(3), &json!(3))
    );
    assert_eq!(batch_namespaces(prefix), Vec::<String>::new());
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());
}

/// Defect: `batch down --prefix kk-` (a typo) exited 0 with
/// `"detached": 0` and said nothing, so a harness leaked its batch
/// silently. Now stderr says that nothing matched.
#[test]
fn down_with_a_prefix_that_matches_nothing_says_so() {
    require_root!();
    let w = World::new();
    w.noop_plugin("rec", "true");
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "rec"})]);
    w.up(2, 2).ok();
    let typo = format!("{}typo-", w.prefix());
    let run = w
        .run(&["batch", "down", &w.network, "--prefix", &typo])
        .ok();
    assert_eq!(run.stdout_json()["detached"], 0);
    assert!(
        run.stderr.contains(&format!(
            "batch down: nothing matches the prefix {typo:?}: no network namespace \
             {NETNS_DIR}/{typo}<number> and no cached attachment of network {:?} in one",
            w.network
        )),
        "{}",
        run.stderr
    );
    // The real batch is untouched.
    assert_eq!(batch_namespaces(w.prefix()).len(), 2);
    w.down(&["-q"]).ok();
    assert_eq!(batch_namespaces(w.prefix()), Vec::<String>::new());
}

/// Defect: `batch down cnirs-ptp` on namespaces attached to
/// `cnirs-bridge` reported `"network":"cnirs-ptp","detached":3` (it did
/// clean them: a member's teardown DELs every cached attachment of its
/// container). Now the summary says, per namespace, what was detached from
/// which network: here a DEL of the named network without a cached
/// attachment (as `cnitool del` runs it), and the cached attachment to the
/// other one.
#[test]
fn down_of_another_network_says_what_was_detached_from_which() {
    require_root!();
    let w = World::new();
    w.noop_plugin("rec", "true");
    w.sb.conflist(&w.network, "1.0.0", &[json!({"type": "rec"})]);
    let other = format!("{}-other", w.network);
    w.sb.conflist(&other, "1.0.0", &[json!({"type": "rec"})]);
    let prefix = w.prefix();
    w.up(2, 2).ok();
    let run = w
        .run(&["batch", "down", &other, "--prefix", prefix, "-q"])
        .ok();
    let summary = run.stdout_json();
    assert_eq!(summary["network"], json!(other));
    assert_eq!(summary["detached"], 4, "{summary}");
    assert_eq!(
        summary["namespaces"],
        json!(
            [0, 1]
                .iter()
                .map(|i| json!({
                    "namespace": format!("{prefix}{i}"),
                    "detached": [
                        {"network": other, "ifname": "eth0", "cached": false},
                        {"network": w.network, "ifname": "eth0", "cached": true},
                    ],
                    "deleted": true,
                }))
                .collect::<Vec<_>>()
        ),
        "{summary}"
    );
    assert_eq!(w.sb.cache_entries(), Vec::<String>::new());
    assert_eq!(batch_namespaces(prefix), Vec::<String>::new());
}
