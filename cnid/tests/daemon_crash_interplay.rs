//! Attacks on how three changes meet after a `kill -9`: the orphans a
//! killed daemon left (waited for at the next start, so none is stopped
//! half way), the netns owners and their claims (no operation acts on
//! another container's attachment), and the ADD journal kept across starts
//! when a record cannot be restored (an answered ADD is never forgotten).
//!
//! The network is one fake plugin, `atk`, that "allocates" a file per
//! container in `data/resources` on ADD and frees it on DEL; an ADD (DEL)
//! of container C blocks at the test's ADD (DEL) gate while the file
//! `data/hang-add-C` (`data/hang-del-C`) exists. A "reboot" is simulated as
//! `daemon_commit.rs` does: the journal's commit lines get another boot id
//! and the cache file is lost.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, kill_group, post};
use crate::support::gate::Gate;
use crate::support::require_root;
use crate::support::tmpfs::Tmpfs;
use crate::support::tool::{CNITOOL, CNITOOL_VARS};
use serde_json::{Value, json};

const NET: &str = "interplay";
/// What cnid logs when it found orphans and waits for them.
const WAITING: &str = "waiting for orphaned plugins";

struct Net {
    dirs: Dirs,
    add_gate: Gate,
    del_gate: Gate,
    resources: PathBuf,
}

impl Net {
    fn new() -> Net {
        let dirs = Dirs::new();
        let resources = dirs.data.join("resources");
        fs::create_dir_all(&resources).expect("create resources dir");
        let add_gate = Gate::new(dirs.root());
        let del_gate = Gate::new(dirs.root());
        dirs.plugin(
            "atk",
            &format!(
                r#"in=$(cat)
case "$CNI_COMMAND" in
ADD)
  echo $$ > {data}/add-"$CNI_CONTAINERID".pid
  if [ -e {data}/hang-add-"$CNI_CONTAINERID" ]; then
{add_wait}
  fi
  touch {res}/"$CNI_CONTAINERID"
  echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.97.0.5/24"}}]}}';;
DEL)
  echo $$ > {data}/del-"$CNI_CONTAINERID".pid
  if [ -e {data}/hang-del-"$CNI_CONTAINERID" ]; then
{del_wait}
  fi
  printf '%s' "$in" > {data}/del-stdin-"$CNI_CONTAINERID"
  echo "DEL $CNI_CONTAINERID netns=$CNI_NETNS" >> {data}/dels
  rm -f {res}/"$CNI_CONTAINERID";;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
                data = dirs.data.display(),
                res = resources.display(),
                add_wait = add_gate.shell_wait(),
                del_wait = del_gate.shell_wait(),
            ),
        );
        dirs.conf(
            "10-interplay.conflist",
            &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "atk"}]}),
        );
        Net {
            dirs,
            add_gate,
            del_gate,
            resources,
        }
    }

    fn hang(&self, verb: &str, cid: &str) {
        fs::write(self.dirs.data.join(format!("hang-{verb}-{cid}")), b"").unwrap();
    }

    /// The pid (and process group) of the last `verb` (`add`, `del`)
    /// plugin run of `cid`.
    fn plugin_pid(&self, verb: &str, cid: &str) -> i32 {
        let path = self.dirs.data.join(format!("{verb}-{cid}.pid"));
        let mut pid = 0;
        eventually(
            Duration::from_secs(30),
            &format!("the {verb} plugin's pid"),
            || {
                pid = fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                pid > 0
            },
        );
        pid
    }

    /// The DELs the plugin finished: `DEL <container> netns=<netns>` lines.
    fn dels(&self) -> Vec<String> {
        fs::read_to_string(self.dirs.data.join("dels"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn resources(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.resources)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn cache_file(&self, cid: &str) -> PathBuf {
        self.dirs.cache.join(format!("results/{NET}-{cid}-eth0"))
    }

    /// ADD of `cid` on `netns` (eth0) through `socket`, in a thread: the
    /// status and the answer.
    fn add_in_thread(
        &self,
        socket: &Path,
        cid: &str,
        netns: &str,
    ) -> std::thread::JoinHandle<(u16, Value)> {
        let socket = socket.to_owned();
        let body = att(cid, netns);
        std::thread::spawn(move || call(&socket, "add", &body))
    }
}

fn att(cid: &str, netns: &str) -> Value {
    json!({"containerId": cid, "netns": netns, "ifname": "eth0"})
}

/// POSTs to `/v1/networks/interplay/{verb}`: the status and the answer.
fn call(socket: &Path, verb: &str, body: &Value) -> (u16, Value) {
    crate::support::daemon::call(socket, NET, verb, body)
}

/// cnitool on the daemon's conf dir, plugins and cache.
fn cnitool(dirs: &Dirs, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(&*CNITOOL);
    for var in CNITOOL_VARS {
        cmd.env_remove(var);
    }
    cmd.env("NETCONFPATH", &dirs.conf)
        .env("CNI_PATH", &dirs.bin)
        .env("CNI_CACHE_DIR", &dirs.cache)
        .args(args)
        .output()
        .expect("run cnitool")
}

/// Starts an ADD of `cid` on `netns` whose plugin blocks, `kill -9`s the
/// daemon and then the plugin (no orphan): an intent is left.
async fn cut_add(net: &Net, cid: &str, netns: &str) {
    let mut daemon = Daemon::start(&net.dirs, &[]);
    net.hang("add", cid);
    let add = net.add_in_thread(&daemon.socket, cid, netns);
    net.add_gate.wait_started(1).await;
    let plugin = Group(net.plugin_pid("add", cid));
    daemon.kill9();
    drop(plugin);
    let _ = add.join();
    assert_eq!(net.dirs.intents(), [format!("{NET}:{cid}:eth0.json")]);
    fs::remove_file(net.dirs.data.join(format!("hang-add-{cid}"))).unwrap();
}

/// Kills a process group on drop (an orphan the test left).
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Found by this attack: the rollback of an unfinished ADD, queued at
/// start, claimed nothing. Another container's ADD on the same netns and
/// ifname was admitted while that rollback ran (no record, no claim), and
/// the two ran at once on one interface: the rollback's DEL tears down
/// whatever is at that netns and ifname, which may be the new ADD's
/// interface. The rollback now claims its netns and ifname as any
/// admitted operation does: the other ADD gets 409 until it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_rollback_claims_its_netns_and_ifname() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("shared");
    let mut daemon = Daemon::start(&net.dirs, &[]);
    net.hang("add", "c-1");
    let add = net.add_in_thread(&daemon.socket, "c-1", &netns);
    net.add_gate.wait_started(1).await;
    let plugin = Group(net.plugin_pid("add", "c-1"));
    daemon.kill9();
    drop(plugin); // no orphan: the rollback is queued at once
    let _ = add.join();
    assert_eq!(net.dirs.intents(), ["interplay:c-1:eth0.json"]);

    // The restart rolls c-1 back; its DEL blocks.
    net.hang("del", "c-1");
    let daemon = Daemon::start(&net.dirs, &[]);
    net.del_gate.wait_started(1).await;

    // Meanwhile another container asks for the same netns and ifname.
    let (status, answer) = call(&daemon.socket, "add", &att("c-2", &netns));
    assert_eq!(
        status,
        409,
        "admitted while c-1's rollback runs on that netns and ifname: {answer}\n{}",
        daemon.log()
    );
    let msg = answer["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("\"c-1\""), "{msg}");

    net.del_gate.release();
    eventually(Duration::from_secs(30), "the rollback", || {
        net.dirs.intents().is_empty()
    });
    eventually(Duration::from_secs(30), "the rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
    // Free once it is done.
    let (status, answer) = call(&daemon.socket, "add", &att("c-2", &netns));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(net.resources(), ["c-2"]);
}

/// The journal's size, 0 when absent.
fn journal_len(dirs: &Dirs) -> u64 {
    fs::metadata(dirs.state.join("intents/journal")).map_or(0, |m| m.len())
}

/// Starts cnid without waiting, then waits until its log says it found
/// orphans and is waiting for them.
fn restart_waiting(dirs: &Dirs) -> Daemon {
    let mut daemon = Daemon::spawn_with(dirs, &[], |_| {});
    daemon.wait_log(WAITING, Duration::from_secs(30));
    daemon
}

/// A kept journal meets an orphan and kills during its wait: c-1 was
/// answered, then the machine went down and lost c-1's cache file; the
/// cache's file system is full, so the start keeps the journal (c-1's
/// commit line). Then an ADD of c-2 is cut by `kill -9` while its plugin
/// runs, and two restarts are killed while they wait for that orphan.
/// Once space is back, one start converges: the orphan finished before
/// c-2 was rolled back (its allocation freed), c-1's record is back byte
/// for byte, the journal is empty, nothing grew meanwhile, and c-1's DEL
/// frees c-1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_while_an_orphan_settles_with_a_kept_journal_converge() {
    require_root!();
    let net = Net::new();
    let cache = Tmpfs::mount(&net.dirs.cache);
    let mut daemon = Daemon::start(&net.dirs, &[]);
    let (status, answer) = call(&daemon.socket, "add", &att("c-1", &net.dirs.netns("c-1")));
    assert_eq!(status, 200, "{answer}");
    let written = fs::read(net.cache_file("c-1")).expect("c-1's record");
    daemon.kill9();

    // The reboot: c-1's file lost, the cache full.
    let journal = net.dirs.state.join("intents/journal");
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let text = fs::read_to_string(&journal).unwrap();
    assert!(text.contains(boot.trim()), "{text}");
    fs::write(&journal, text.replace(boot.trim(), "another-boot")).unwrap();
    fs::remove_file(net.cache_file("c-1")).unwrap();
    cache.fill();
    let mut daemon = Daemon::start(&net.dirs, &[]);
    assert!(
        daemon.log().contains("the ADD journal is kept"),
        "{}",
        daemon.log()
    );
    let kept = journal_len(&net.dirs);
    assert!(kept > 0);

    // c-2's ADD, cut while its plugin runs: an orphan.
    net.hang("add", "c-2");
    let add = net.add_in_thread(&daemon.socket, "c-2", &net.dirs.netns("c-2"));
    net.add_gate.wait_started(1).await;
    let _orphan = Group(net.plugin_pid("add", "c-2"));
    daemon.kill9();
    let _ = add.join();

    // Two restarts killed while they wait for it.
    let mut sizes = Vec::new();
    for _ in 0..2 {
        let mut waiting = restart_waiting(&net.dirs);
        waiting.kill9();
        assert_eq!(net.dirs.intents(), ["interplay:c-2:eth0.json"]);
        sizes.push(journal_len(&net.dirs));
    }
    assert!(sizes.iter().all(|s| *s == kept), "{kept} then {sizes:?}");
    let temps: Vec<String> = fs::read_dir(net.dirs.cache.join("results"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(temps.is_empty(), "failed restores left {temps:?}");

    // Space again; the orphan goes on.
    cache.free();
    let mut daemon = restart_waiting(&net.dirs);
    assert_eq!(
        net.resources(),
        ["c-1"],
        "c-2 rolled back before its orphan finished"
    );
    net.add_gate.release();
    daemon.wait_ready(Duration::from_secs(30));
    eventually(Duration::from_secs(30), "c-2's rollback", || {
        net.dirs.intents().is_empty() && net.resources() == ["c-1"]
    });
    let log = daemon.log();
    assert!(log.contains("finished=1 killed=0"), "{log}");
    assert_eq!(
        String::from_utf8_lossy(&fs::read(net.cache_file("c-1")).unwrap_or_default()),
        String::from_utf8_lossy(&written),
        "c-1's record restored:\n{log}"
    );
    assert_eq!(journal_len(&net.dirs), 0, "{log}");
    let (status, answer) = call(&daemon.socket, "del", &att("c-1", &net.dirs.netns("c-1")));
    assert_eq!(status, 204, "{answer}");
    assert!(net.resources().is_empty());
    assert!(net.dirs.cached().is_empty(), "{:?}", net.dirs.cached());
    drop(daemon);
}

/// Found by this attack: the rollback at start of an ADD cut by `kill -9`
/// ran its DEL in the netns even when, meanwhile (cnid down), another tool
/// had attached another container on that netns and ifname: the DEL tore
/// down the other container's interface (a rollback must never DEL an
/// attachment another container owns; the library's own rollback keeps
/// off it). It now runs without the netns, as the
/// library's does: the plugins release what they held for the cut ADD and
/// leave the interface alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_rollback_keeps_off_an_interface_another_tool_attached_meanwhile() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("m1");
    cut_add(&net, "c-1", &netns).await;
    // While cnid is down, cnitool attaches its container there.
    let out = cnitool(&net.dirs, &["add", NET, &netns]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs = net.resources();
    assert_eq!(theirs.len(), 1, "{theirs:?}");

    let daemon = Daemon::start(&net.dirs, &[]);
    eventually(Duration::from_secs(30), "the rollback", || {
        net.dirs.intents().is_empty()
    });
    let dels = fs::read_to_string(net.dirs.data.join("dels")).unwrap_or_default();
    assert_eq!(
        dels,
        "DEL c-1 netns=\n",
        "the rollback entered the netns of cnitool's attachment:\n{}",
        daemon.log()
    );
    assert_eq!(net.resources(), theirs);
    assert_eq!(net.dirs.cached().len(), 1, "{:?}", net.dirs.cached());
}

/// c-1 attached on `netns` and answered, then the machine went down and
/// lost c-1's cache file with the cache full: the start keeps c-1's commit
/// line for the next start. Then space comes back (cnid running).
fn kept_after_a_reboot(net: &Net, cache: &Tmpfs, netns: &str) -> Daemon {
    let mut daemon = Daemon::start(&net.dirs, &[]);
    let (status, answer) = call(&daemon.socket, "add", &att("c-1", netns));
    assert_eq!(status, 200, "{answer}");
    daemon.kill9();
    let journal = net.dirs.state.join("intents/journal");
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let text = fs::read_to_string(&journal).unwrap();
    fs::write(&journal, text.replace(boot.trim(), "another-boot")).unwrap();
    fs::remove_file(net.cache_file("c-1")).unwrap();
    cache.fill();
    let daemon = Daemon::start(&net.dirs, &[]);
    assert!(
        daemon.log().contains("the ADD journal is kept"),
        "{}",
        daemon.log()
    );
    cache.free();
    daemon
}

/// Found by this attack: a record the start could not restore (its commit
/// line kept in the journal, the cache full after a reboot) stands for an
/// ADD that was answered, and that the next start puts back; but the
/// owner check, which reads the cache, did not see it: another
/// container's ADD on the same netns and ifname was admitted, and the
/// next start restored the first record over the same interface (whose
/// DEL then tears down the second container's). The kept records count
/// as attachments now: 409 until the attachment's own DEL, which also
/// keeps the next start from bringing it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kept_for_the_next_start_owns_its_netns_and_ifname() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("shared");
    let cache = Tmpfs::mount(&net.dirs.cache);
    let mut daemon = kept_after_a_reboot(&net, &cache, &netns);

    let (status, answer) = call(&daemon.socket, "add", &att("c-9", &netns));
    assert_eq!(
        status,
        409,
        "admitted on the netns and ifname of c-1's kept record: {answer}\n{}",
        daemon.log()
    );
    let msg = answer["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("\"c-1\""), "{msg}");

    // c-1's DEL frees it, for good.
    let (status, answer) = call(&daemon.socket, "del", &att("c-1", &netns));
    assert_eq!(status, 204, "{answer}");
    let (status, answer) = call(&daemon.socket, "add", &att("c-9", &netns));
    assert_eq!(status, 200, "{answer}");
    daemon.kill9();
    let daemon = Daemon::start(&net.dirs, &[]);
    assert_eq!(
        net.dirs.cached(),
        [format!("{NET}-c-9-eth0")],
        "{}",
        daemon.log()
    );
    assert_eq!(net.resources(), ["c-9"]);
}

/// Found by this attack: while a start keeps a record it could not
/// restore, the attachment's operations ran without it: its DEL got no
/// `prevResult` (the journal's promise: an answered ADD keeps its cached
/// result for the next DEL), its CHECK answered "not attached". Each
/// operation on that attachment now tries the restore again first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_kept_for_the_next_start_is_put_back_for_its_attachments_operations() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("c-1");
    let cache = Tmpfs::mount(&net.dirs.cache);
    let daemon = kept_after_a_reboot(&net, &cache, &netns);
    assert!(net.dirs.cached().is_empty());

    let (status, answer) = call(&daemon.socket, "check", &att("c-1", &netns));
    assert_eq!(
        status,
        204,
        "CHECK of the answered ADD: {answer}\n{}",
        daemon.log()
    );
    let (status, answer) = call(&daemon.socket, "del", &att("c-1", &netns));
    assert_eq!(status, 204, "{answer}");
    let stdin: Value = serde_json::from_slice(
        &fs::read(net.dirs.data.join("del-stdin-c-1")).expect("c-1's DEL ran"),
    )
    .expect("DEL stdin is JSON");
    assert_eq!(
        stdin["prevResult"]["ips"][0]["address"], "10.97.0.5/24",
        "c-1's DEL got no prevResult: {stdin}"
    );
    assert!(net.resources().is_empty());
    assert!(net.dirs.cached().is_empty(), "{:?}", net.dirs.cached());
}

/// Found by this attack: a GC did not see a record the start kept for the
/// next: the attachment, stale by the runtime's valid list, was not
/// deleted (the next start put it back), and it went on owning its netns
/// and ifname. GC now puts the network's kept records back first, deletes
/// the stale ones as any (their DEL with its `prevResult`), and its
/// deletions free their netns and ifname at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_deletes_a_record_kept_for_the_next_start() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("shared");
    let cache = Tmpfs::mount(&net.dirs.cache);
    let mut daemon = kept_after_a_reboot(&net, &cache, &netns);

    let raw = post(
        &daemon.socket,
        &format!("/v1/networks/{NET}/gc"),
        &json!({"validAttachments": []}).to_string(),
    );
    assert_eq!(raw.status, 200, "{}", String::from_utf8_lossy(&raw.body));
    let summary = raw.json();
    assert_eq!(
        summary["deleted"],
        json!([{"containerID": "c-1", "ifname": "eth0"}]),
        "{summary}\n{}",
        daemon.log()
    );
    let stdin: Value = serde_json::from_slice(
        &fs::read(net.dirs.data.join("del-stdin-c-1")).expect("c-1's DEL ran"),
    )
    .expect("DEL stdin is JSON");
    assert_eq!(
        stdin["prevResult"]["ips"][0]["address"], "10.97.0.5/24",
        "{stdin}"
    );
    assert!(net.resources().is_empty());
    let (status, answer) = call(&daemon.socket, "add", &att("c-9", &netns));
    assert_eq!(status, 200, "{answer}");
    daemon.kill9();
    let daemon = Daemon::start(&net.dirs, &[]);
    assert_eq!(
        net.dirs.cached(),
        [format!("{NET}-c-9-eth0")],
        "{}",
        daemon.log()
    );
}

/// A full state file system at the start that must turn a cut ADD into an
/// intent file: the start fails, naming the state dir and the error, and
/// changes nothing (the journal keeps the open ADD); once there is space,
/// the next start rolls it back and leaves no temp file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_dir_at_start_fails_the_start_and_loses_nothing() {
    require_root!();
    let net = Net::new();
    let state = Tmpfs::mount(&net.dirs.state);
    let netns = net.dirs.netns("c-1");
    {
        let mut daemon = Daemon::start(&net.dirs, &[]);
        net.hang("add", "c-1");
        let add = net.add_in_thread(&daemon.socket, "c-1", &netns);
        net.add_gate.wait_started(1).await;
        let plugin = Group(net.plugin_pid("add", "c-1"));
        daemon.kill9();
        drop(plugin);
        let _ = add.join();
    }
    let journal = fs::read(net.dirs.state.join("intents/journal")).unwrap();
    state.fill();

    let mut failed = Daemon::spawn_with(&net.dirs, &[], |_| {});
    let status = failed
        .wait(Duration::from_secs(30))
        .expect("the start gives up");
    assert!(!status.success());
    let log = failed.log();
    assert!(
        log.contains("No space left on device")
            && log.contains(&net.dirs.state.display().to_string()),
        "{log}"
    );
    assert_eq!(
        fs::read(net.dirs.state.join("intents/journal")).unwrap(),
        journal,
        "the journal changed"
    );

    state.free();
    let daemon = Daemon::start(&net.dirs, &[]);
    eventually(Duration::from_secs(30), "the rollback", || {
        net.dirs.intents().is_empty()
    });
    eventually(Duration::from_secs(30), "the rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
    let left: Vec<String> = fs::read_dir(net.dirs.state.join("intents"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n != "journal")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The rollback's own DEL cut by `kill -9`: its plugin is an orphan the
/// next start waits for (not only an ADD's), while the intent stays; once
/// the orphan finished, the rollback runs again (a DEL repeated is
/// harmless), holds the netns and ifname while it runs, and the intent is
/// gone after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_cut_by_kill_9_is_waited_for_and_repeated() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("c-1");
    cut_add(&net, "c-1", &netns).await;
    net.hang("del", "c-1");
    let mut daemon = Daemon::start(&net.dirs, &[]);
    net.del_gate.wait_started(1).await;
    let _orphan = Group(net.plugin_pid("del", "c-1"));
    daemon.kill9();
    assert_eq!(net.dirs.intents(), ["interplay:c-1:eth0.json"]);

    let mut daemon = restart_waiting(&net.dirs);
    assert!(net.dels().is_empty(), "{:?}", net.dels());
    assert_eq!(net.dirs.intents(), ["interplay:c-1:eth0.json"]);
    net.del_gate.release();
    daemon.wait_ready(Duration::from_secs(30));
    eventually(Duration::from_secs(30), "the repeated rollback", || {
        net.dirs.intents().is_empty() && net.dels().len() == 2
    });
    let line = format!("DEL c-1 netns={netns}");
    assert_eq!(net.dels(), [line.clone(), line]);
    // Its claim goes when the operation ended.
    eventually(Duration::from_secs(30), "the rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
    assert!(
        daemon.log().contains("finished=1 killed=0"),
        "{}",
        daemon.log()
    );
    let (status, answer) = call(&daemon.socket, "add", &att("c-2", &netns));
    assert_eq!(status, 200, "{answer}");
}

/// The network of a cut ADD is gone from the conf dir at the restart
/// (removed, or its file broken: no last good version exists in a new
/// process): the rollback runs with the configuration the intent
/// recorded, while readiness says the network is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_runs_with_its_recorded_config_when_the_network_is_gone() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("c-1");
    cut_add(&net, "c-1", &netns).await;
    fs::write(net.dirs.conf.join("10-interplay.conflist"), b"{ broken").unwrap();
    let daemon = Daemon::start(&net.dirs, &[]);
    eventually(Duration::from_secs(30), "the rollback", || {
        net.dirs.intents().is_empty()
    });
    assert_eq!(net.dels(), [format!("DEL c-1 netns={netns}")]);
    let ready = crate::support::daemon::get(&daemon.socket, "/v1/health/ready");
    assert_eq!(
        ready.status,
        503,
        "{}",
        String::from_utf8_lossy(&ready.body)
    );
}
