//! Plugins orphaned by a `kill -9` of the daemon (each plugin has its own
//! process group, so it outlives the daemon), and the restart that finds
//! them.
//!
//! Regression: the restart stopped every orphan at once
//! (SIGTERM, grace, SIGKILL), and a plugin stopped at an arbitrary
//! instruction tears what only it can repair (host-local killed between
//! creating an address's file and writing the container ID into it leaves
//! an empty reservation no DEL frees). Before that (the older regression
//! kept here), the restart rolled the ADD back while the orphan still ran,
//! and the orphan then allocated what nobody would delete.
//!
//! Now an orphan may finish within the deadline it was started with
//! (`CNID_DEADLINE_MS` in its environment), the rollback runs after it
//! exited, and only an orphan still running at its deadline is killed, with
//! a warning that the rollback repeats. A restart killed during that wait
//! finds the same orphans and waits again. Meanwhile the restart serves
//! everything else (before, it served nothing, not even `/v1/health`):
//! only the orphan's container, and its netns and ifname, wait.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually};
use crate::support::gate::{Gate, LOAD_MARGIN};
use crate::support::require_root;
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "orph";
/// What cnid logs when it found orphans and waits for them.
const WAITING: &str = "waiting for orphaned plugins";

/// A network of one plugin, `late`: its ADD starts a `setsid` helper,
/// records its pid, blocks at `gate`, then "allocates" (a file named after
/// the container in `resources/`) and notes that it finished; its DEL frees
/// the file.
struct Late {
    dirs: Dirs,
    gate: Gate,
    resources: PathBuf,
    finished: PathBuf,
    pid_file: PathBuf,
    helper_file: PathBuf,
    /// `DEL <container> <CNI_ARGS>` per DEL, in order.
    dels: PathBuf,
}

impl Late {
    fn new() -> Late {
        let dirs = Dirs::new();
        let resources = dirs.data.join("resources");
        fs::create_dir_all(&resources).expect("create resources dir");
        let finished = dirs.data.join("finished");
        let pid_file = dirs.data.join("late.pid");
        let helper_file = dirs.data.join("helper.pid");
        let dels = dirs.data.join("dels");
        let gate = Gate::new(dirs.root());
        dirs.plugin(
            "late",
            &format!(
                r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD)
  setsid sh -c 'echo $$ > {helper}; exec sleep 1000' < /dev/null > /dev/null 2>&1 &
  echo $$ > {pid}
{wait}
  touch {res}/"$CNI_CONTAINERID"
  echo "$CNI_CONTAINERID" >> {finished}
  echo '{{"cniVersion":"1.0.0"}}';;
DEL) echo "DEL $CNI_CONTAINERID $CNI_ARGS" >> {dels}; rm -f {res}/"$CNI_CONTAINERID";;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
                helper = helper_file.display(),
                pid = pid_file.display(),
                res = resources.display(),
                finished = finished.display(),
                dels = dels.display(),
                wait = gate.shell_wait(),
            ),
        );
        dirs.conf(
            "10-late.conflist",
            &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "late"}]}),
        );
        Late {
            dirs,
            gate,
            resources,
            finished,
            pid_file,
            helper_file,
            dels,
        }
    }

    /// Starts an ADD of `cid` (deadline `timeout_ms`) through a daemon,
    /// waits until its plugin blocks at the gate, `kill -9`s the daemon.
    /// Returns the plugin's and its helper's pids, killed on drop.
    async fn orphan(&self, cid: &str, timeout_ms: Option<u64>) -> Running {
        let mut daemon = Daemon::start(&self.dirs, &[]);
        let client = daemon.client().await;
        let mut req = AttachmentRequest::new(cid, "/proc/self/ns/net", "eth0");
        req.timeout_ms = timeout_ms;
        let add = tokio::spawn(async move { client.add(NET, &req).await });
        self.gate.wait_started(1).await;
        let running = self.running();
        assert!(!add.is_finished(), "the ADD is held at the gate");
        daemon.kill9();
        // The client would send the ADD again to a restart (within its
        // deadline); the runtime gives up on it here.
        add.abort();
        assert!(alive(running.plugin()), "the plugin outlived the daemon");
        running
    }

    /// The pids of the plugin blocked at the gate and of its helper, once
    /// both wrote them.
    fn running(&self) -> Running {
        eventually(Duration::from_secs(30), "the plugin's pid files", || {
            read_pid(&self.pid_file).is_some() && read_pid(&self.helper_file).is_some()
        });
        Running(vec![
            read_pid(&self.pid_file).expect("pid"),
            read_pid(&self.helper_file).expect("pid"),
        ])
    }
}

/// Waits until the restarted `daemon` rolled the orphan's ADD back: its
/// intent gone and the rollback logged.
fn wait_rolled_back(late: &Late, daemon: &Daemon) {
    eventually(Duration::from_secs(30), "the rollback", || {
        late.dirs.intents().is_empty()
    });
    eventually(Duration::from_secs(30), "the rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
}

/// The pid a plugin wrote into `p`, once it did.
fn read_pid(p: &Path) -> Option<u32> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// A network of one plugin whose ADD writes its pid and blocks at a gate
/// of its own, then answers an empty result, and whose DEL appends a line
/// `DEL <record>` to `dels`.
struct GatedAdd {
    gate: Gate,
    pid_file: PathBuf,
}

impl GatedAdd {
    /// Plugin `plugin`, network `network` (conf file
    /// `20-<network>.conflist`); `record` is the shell words the DEL line
    /// holds (e.g. `$CNI_CONTAINERID`).
    fn new(dirs: &Dirs, plugin: &str, network: &str, dels: &Path, record: &str) -> GatedAdd {
        let gate = Gate::new(dirs.root());
        let pid_file = dirs.data.join(format!("{plugin}.pid"));
        dirs.plugin(
            plugin,
            &format!(
                r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) echo $$ > {pid}
{wait}
  echo '{{"cniVersion":"1.0.0"}}';;
DEL) echo "DEL {record}" >> {dels};;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
                pid = pid_file.display(),
                wait = gate.shell_wait(),
                dels = dels.display(),
            ),
        );
        dirs.conf(
            &format!("20-{network}.conflist"),
            &json!({"cniVersion": "1.0.0", "name": network, "plugins": [{"type": plugin}]}),
        );
        GatedAdd { gate, pid_file }
    }

    /// The pid of the plugin blocked at the gate.
    fn pid(&self) -> u32 {
        read_pid(&self.pid_file).expect("the gated ADD's pid")
    }
}

/// The orphan's and its helper's pids; both killed (their groups) on drop.
struct Running(Vec<u32>);

impl Running {
    fn plugin(&self) -> u32 {
        self.0[0]
    }

    fn helper(&self) -> u32 {
        self.0[1]
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for &g in &self.0 {
            if let Ok(raw) = i32::try_from(g)
                && raw > 1
            {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(raw),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|s| s != "Z" && s != "X")
}

/// A variable of a process's environment.
fn environ_var(pid: u32, name: &str) -> Option<String> {
    let env = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{name}=");
    env.split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// `CLOCK_MONOTONIC` in ms, the clock of `CNID_DEADLINE_MS`.
fn monotonic_ms() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Starts cnid without waiting, then waits until its log says it found
/// orphans and is waiting for them.
fn restart_waiting(dirs: &Dirs) -> Daemon {
    let mut daemon = Daemon::spawn_with(dirs, &[], |_| {});
    daemon.wait_log(WAITING, Duration::from_secs(30));
    daemon
}

/// The orphan finishes its ADD (within its deadline) while the restarted
/// daemon waits; only then is the ADD rolled back, so what the orphan
/// allocated is freed. A helper the plugin started in a session of its
/// own is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_plugin_finishes_before_the_restart_rolls_its_add_back() {
    require_root!();
    let late = Late::new();
    let running = late.orphan("late-1", None).await;
    let deadline: u64 = environ_var(running.plugin(), "CNID_DEADLINE_MS")
        .expect("the plugin's deadline is in its environment")
        .parse()
        .expect("a number");
    let left = deadline.saturating_sub(monotonic_ms());
    assert!(
        left > 30_000 && left <= 60_000,
        "the deadline is the ADD's (60 s by default): {left} ms left"
    );

    let mut daemon = restart_waiting(&late.dirs);
    // Waiting: the orphan runs, its ADD is not rolled back.
    assert!(alive(running.plugin()), "the orphan was not stopped");
    assert_eq!(late.dirs.intents(), ["orph:late-1:eth0.json"]);
    late.gate.release();
    daemon.wait_ready(Duration::from_secs(30));
    wait_rolled_back(&late, &daemon);
    let log = daemon.log();
    println!(
        "orphans: the orphan finished its ADD ({:?}), resources left after the rollback {:?}, helper alive {}",
        fs::read_to_string(&late.finished)
            .unwrap_or_default()
            .trim(),
        names(&late.resources),
        alive(running.helper())
    );
    assert_eq!(
        fs::read_to_string(&late.finished).unwrap_or_default(),
        "late-1\n",
        "the orphan finished its ADD:\n{log}"
    );
    assert!(
        names(&late.resources).is_empty(),
        "the rollback ran after the orphan finished, and freed its allocation:\n{log}"
    );
    assert!(!alive(running.plugin()));
    assert!(
        alive(running.helper()),
        "a plugin's setsid helper is not an orphan to kill"
    );
    assert!(log.contains("finished=1 killed=0"), "{log}");
    assert!(!log.contains("killed at its deadline"), "{log}");
    assert!(log.contains("plugin_killed_at_deadline=false"), "{log}");
}

/// An orphan still running at its deadline is killed then (not before),
/// and the rollback that follows says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_still_running_at_its_deadline_is_killed_and_the_rollback_says_so() {
    require_root!();
    let late = Late::new();
    let running = late.orphan("late-2", Some(3_000)).await;
    let deadline: u64 = environ_var(running.plugin(), "CNID_DEADLINE_MS")
        .expect("deadline")
        .parse()
        .expect("a number");
    let mut daemon = restart_waiting(&late.dirs);
    daemon.wait_log(
        "orphaned plugins of a previous cnid are gone",
        Duration::from_secs(3) + LOAD_MARGIN * 2,
    );
    let ready_at = monotonic_ms();
    wait_rolled_back(&late, &daemon);
    let log = daemon.log();
    println!(
        "orphans: settled {} ms after the orphan's deadline; plugin alive {}, finished {:?}",
        ready_at as i64 - deadline as i64,
        alive(running.plugin()),
        fs::read_to_string(&late.finished).unwrap_or_default()
    );
    assert!(
        ready_at >= deadline,
        "the orphan was killed before its deadline"
    );
    assert!(!alive(running.plugin()), "killed at its deadline");
    assert!(!late.finished.exists(), "it never finished");
    assert!(names(&late.resources).is_empty());
    assert!(
        log.contains("orphaned plugin still running at its deadline"),
        "{log}"
    );
    assert!(log.contains("late-2"), "the warning names the container");
    assert!(
        log.contains("whose plugin was killed at its deadline"),
        "{log}"
    );
    assert!(log.contains("plugin_killed_at_deadline=true"), "{log}");
    assert!(log.contains("finished=0 killed=1"), "{log}");
}

/// A restart killed (`kill -9`) while it waits for orphans: the next one
/// finds the same orphan, with the same deadline, and waits again; the
/// orphan finishes and is rolled back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_killed_while_it_waits_for_orphans_waits_again() {
    require_root!();
    let late = Late::new();
    let running = late.orphan("late-3", None).await;
    let mut first = restart_waiting(&late.dirs);
    first.kill9();
    assert!(alive(running.plugin()), "the orphan still runs");
    assert_eq!(late.dirs.intents(), ["orph:late-3:eth0.json"]);
    let mut second = restart_waiting(&late.dirs);
    assert!(alive(running.plugin()));
    late.gate.release();
    second.wait_ready(Duration::from_secs(30));
    eventually(Duration::from_secs(30), "the rollback", || {
        late.dirs.intents().is_empty()
    });
    assert_eq!(
        fs::read_to_string(&late.finished).unwrap_or_default(),
        "late-3\n"
    );
    assert!(names(&late.resources).is_empty(), "{}", second.log());
    assert!(second.log().contains("finished=1 killed=0"));
}

/// A restart that finds an orphan serves at once: `/v1/health` and an ADD
/// of another container are answered while the orphan is held at its
/// gate; a DEL of the orphan's attachment waits (queued) until the orphan
/// finished and its ADD was rolled back, and runs after that rollback.
///
/// Regression: the restart served nothing, not even `/v1/health`, until
/// every orphan was gone (up to its deadline: 60 s by default, 300 s at
/// most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_serves_at_once_while_an_orphan_holds_only_its_attachment() {
    require_root!();
    let (late, running, daemon, client) = restart_with_an_orphan("late-4").await;
    let ready = crate::support::daemon::get(&daemon.socket, "/v1/health/ready");
    let other = AttachmentRequest::new("free-1", "/proc/self/ns/net", "eth1");
    client
        .add("free", &other)
        .await
        .expect("an ADD of another container is served while the orphan runs");
    assert!(alive(running.plugin()), "the orphan still runs");
    assert_eq!(
        late.dirs.intents(),
        ["orph:late-4:eth0.json"],
        "not rolled back yet"
    );

    // A DEL of the orphan's attachment waits for it.
    let mut mine = AttachmentRequest::new("late-4", "/proc/self/ns/net", "eth0");
    mine.cni_args = "OURS=1".into();
    let del = tokio::spawn({
        let client = client.clone();
        async move { client.del(NET, &mine).await }
    });
    eventually(Duration::from_secs(30), "the DEL queued", || {
        queued(&daemon, "late-4", "DEL")
    });
    assert!(!del.is_finished(), "the DEL waits for the orphan");
    assert!(alive(running.plugin()));
    assert_eq!(
        fs::read_to_string(&late.dels).unwrap_or_default(),
        "ADD free-1\n",
        "no DEL ran while the orphan ran"
    );

    late.gate.release();
    del.await
        .expect("task")
        .expect("the DEL is answered once the orphan is gone");
    let dels = fs::read_to_string(&late.dels).unwrap_or_default();
    println!(
        "orphans: health {} while the orphan ran; DELs after it: {dels:?}",
        ready.status
    );
    assert_eq!(
        dels,
        "ADD free-1\nDEL late-4 \nDEL late-4 OURS=1\n",
        "the rollback ran first, then the request:\n{}",
        daemon.log()
    );
    assert!(late.dirs.intents().is_empty());
    assert!(names(&late.resources).is_empty(), "{}", daemon.log());
    eventually(Duration::from_secs(30), "the summary", || {
        daemon.log().contains("finished=1 killed=0")
    });
}

/// A second network, `free`, of one plugin that passes and appends
/// `ADD <container>` to the `late` plugin's record of DELs.
fn free_network(late: &Late) {
    late.dirs.plugin(
        "pass",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) echo "ADD $CNI_CONTAINERID" >> {dels}; echo '{{"cniVersion":"1.0.0"}}';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            dels = late.dels.display()
        ),
    );
    late.dirs.conf(
        "20-free.conflist",
        &json!({"cniVersion": "1.0.0", "name": "free", "plugins": [{"type": "pass"}]}),
    );
}

/// A request of another container on an orphan's netns and ifname waits
/// for the orphan too, and runs after the orphan's ADD was rolled back
/// (which tears down what the orphan made there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_an_orphans_netns_and_ifname_waits_for_its_rollback() {
    require_root!();
    let (late, running, daemon, client) = restart_with_an_orphan("late-5").await;
    // The orphan's slot: the same netns and ifname, another container.
    let on_slot = AttachmentRequest::new("slot-1", "/proc/self/ns/net", "eth0");
    let add = tokio::spawn({
        let client = client.clone();
        async move { client.add("free", &on_slot).await }
    });
    eventually(
        Duration::from_secs(30),
        "the ADD on the slot queued",
        || queued(&daemon, "slot-1", "ADD"),
    );
    assert!(!add.is_finished(), "the ADD waits for the orphan");
    assert!(alive(running.plugin()));

    late.gate.release();
    add.await
        .expect("task")
        .expect("the ADD on the slot is answered once the orphan is gone");
    let ran = fs::read_to_string(&late.dels).unwrap_or_default();
    println!("orphans: after the orphan on the slot: {ran:?}");
    assert_eq!(
        ran,
        "DEL late-5 \nADD slot-1\n",
        "the orphan's rollback ran first:\n{}",
        daemon.log()
    );
}

/// An orphan of an ADD of `cid` (held at its gate), `free` besides, and a
/// restart that found it: served while the orphan runs (it cannot end).
async fn restart_with_an_orphan(cid: &str) -> (Late, Running, Daemon, cnid::client::Client) {
    let late = Late::new();
    free_network(&late);
    let running = late.orphan(cid, None).await;
    let mut daemon = restart_waiting(&late.dirs);
    daemon.wait_ready(Duration::from_secs(10) + LOAD_MARGIN);
    let client = daemon.client().await;
    (late, running, daemon, client)
}

/// Whether `container` has a `verb` queued in the daemon.
fn queued(daemon: &Daemon, container: &str, verb: &str) -> bool {
    let ops = crate::support::daemon::get(
        &daemon.socket,
        &format!("/v1/operations?containerId={container}"),
    );
    ops.json()["operations"].as_array().is_some_and(|a| {
        a.iter()
            .any(|o| o["verb"] == verb && o["state"] == "queued")
    })
}

/// Another container's unfinished ADD on the orphan's netns and ifname
/// (its plugin already gone) is held with the orphan and rolled back once
/// the orphan is gone, at once: its rollback, first in its own held queue,
/// is not waited for before that queue is released (which waited for the
/// rollback's whole deadline, then answered it 504 and left the cut ADD's
/// allocation in place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_add_on_an_orphans_slot_is_rolled_back_when_the_orphan_ends() {
    require_root!();
    let late = Late::new();
    // `quick`: its ADD blocks at a gate of its own, its DEL is recorded
    // with the `late` plugin's.
    let quick = GatedAdd::new(
        &late.dirs,
        "quick",
        "quick",
        &late.dels,
        "$CNI_CONTAINERID $CNI_ARGS",
    );
    let mut daemon = Daemon::start(&late.dirs, &[]);
    let client = daemon.client().await;
    let orphan_add = tokio::spawn({
        let client = client.clone();
        async move {
            let req = AttachmentRequest::new("slot-a", "/proc/self/ns/net", "eth0");
            client.add(NET, &req).await
        }
    });
    late.gate.wait_started(1).await;
    // Another container on the same netns and ifname (forced past the
    // owner check).
    let cut_add = tokio::spawn(async move {
        let mut req = AttachmentRequest::new("slot-b", "/proc/self/ns/net", "eth0");
        req.force = true;
        client.add("quick", &req).await
    });
    quick.gate.wait_started(1).await;
    let pid = quick.pid();
    let running = late.running();
    daemon.kill9();
    orphan_add.abort();
    cut_add.abort();
    // slot-b's plugin ends before the restart: only slot-a's is an orphan.
    quick.gate.release();
    eventually(Duration::from_secs(30), "quick's ADD gone", || !alive(pid));
    assert_eq!(
        late.dirs.intents(),
        ["orph:slot-a:eth0.json", "quick:slot-b:eth0.json"]
    );

    let mut daemon = restart_waiting(&late.dirs);
    daemon.wait_ready(Duration::from_secs(10) + LOAD_MARGIN);
    assert!(alive(running.plugin()), "slot-a's orphan runs");
    late.gate.release();
    // Both rollbacks run once the orphan is gone, well within the DEL's
    // deadline (60 s).
    eventually(
        Duration::from_secs(15) + LOAD_MARGIN,
        "both unfinished ADDs rolled back",
        || late.dirs.intents().is_empty(),
    );
    let dels = fs::read_to_string(&late.dels).unwrap_or_default();
    let log = daemon.log();
    assert!(dels.contains("DEL slot-a "), "{dels:?}\n{log}");
    assert!(dels.contains("DEL slot-b "), "{dels:?}\n{log}");
    assert!(!log.contains("deadline expired while queued"), "{log}");
}

/// A process a plugin left running in a process group of its own (not a
/// session: `setpgid`, as Go's `Setpgid` or a shell's job control do)
/// inherits the plugin's environment, mark included, but is no plugin the
/// daemon ran: a restart neither holds its container for it nor kills it
/// at the ADD's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_helper_in_a_group_of_its_own_is_no_orphan() {
    require_root!();
    let dirs = Dirs::new();
    let helper_file = dirs.data.join("helper.pid");
    dirs.plugin(
        "forker",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD)
  perl -e 'setpgrp(0, 0); open(my $f, ">", $ARGV[0]) or die; print $f "$$\n"; close $f; exec "sleep", "1000"' {helper} < /dev/null > /dev/null 2>&1 &
  while [ ! -s {helper} ]; do sleep 0.01; done
  echo '{{"cniVersion":"1.0.0"}}';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            helper = helper_file.display(),
        ),
    );
    dirs.conf(
        "10-forker.conflist",
        &json!({"cniVersion": "1.0.0", "name": "forker", "plugins": [{"type": "forker"}]}),
    );
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = AttachmentRequest::new("helped", "/proc/self/ns/net", "eth0");
    client.add("forker", &req).await.expect("ADD");
    let pid: u32 = fs::read_to_string(&helper_file)
        .expect("helper pid")
        .trim()
        .parse()
        .expect("a pid");
    let helper = Running(vec![pid]);
    assert!(alive(pid));
    assert!(
        environ_var(pid, "CNID_STATE_DIR").is_some(),
        "the helper carries the mark"
    );
    daemon.kill9();

    let mut daemon = Daemon::start(&dirs, &[]);
    daemon.wait_ready(Duration::from_secs(10) + LOAD_MARGIN);
    let log = daemon.log();
    assert!(
        !log.contains(WAITING),
        "the helper was taken for an orphan:\n{log}"
    );
    // Its container is not held: a CHECK is answered at once.
    let client = daemon.client().await;
    client.check("forker", &req).await.expect("CHECK");
    assert!(alive(helper.0[0]), "the helper runs on:\n{}", daemon.log());
}

/// An ADD cut by a `kill -9` inside the real chain (`[bridge
/// (host-local), gate]`, held in the gate), sent again by the client to
/// the restart: held behind the orphan, which finishes; the cut ADD is
/// rolled back first, then the resent one runs. Exactly one attachment,
/// one reservation (the result's, on the namespace's `eth0`), one veth;
/// its DEL leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_add_cut_inside_the_real_chain_gets_one_attachment_and_one_address() {
    use crate::support::netns::{
        LinkGuard, SubnetLease, TempNetns, bridge_ports, host_local_ips, ip_ok,
    };
    use crate::support::soak::OrphanSweep;
    require_root!();
    crate::support::require_plugins(&["bridge", "host-local"]);
    const RES: &str = "res";
    let dirs = Dirs::new();
    let _sweep = OrphanSweep(dirs.root().display().to_string());
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join("host-local");
    let gate = Gate::new(dirs.root());
    dirs.plugin(
        "resgate",
        &format!(
            r#"conf=$(cat)
case "$CNI_COMMAND" in
ADD)
{}
printf '%s' "$conf" | perl -MJSON::PP -0777 -e 'print encode_json(decode_json(<STDIN>)->{{prevResult}})';;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            gate.shell_wait()
        ),
    );
    dirs.conf(
        "10-res.conflist",
        &json!({
            "cniVersion": "1.0.0",
            "name": RES,
            "plugins": [
                {"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": data_dir,
                          "ranges": [[{"subnet": subnet.cidr()}]]}},
                {"type": "resgate"}
            ]
        }),
    );
    let ns = TempNetns::new();
    let req = AttachmentRequest::new("resent", ns.path(), "eth0");
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let add = tokio::spawn({
        let (client, req) = (client.clone(), req.clone());
        async move { client.add(RES, &req).await }
    });
    gate.wait_started(1).await;
    daemon.kill9();
    let cut = host_local_ips(&data_dir, RES);
    assert_eq!(cut.len(), 1, "the cut ADD reserved an address: {cut:?}");

    // The client sends the ADD again to the restart (the socket file of
    // the killed cnid refuses it meanwhile); it waits for the orphan.
    let mut daemon = restart_waiting(&dirs);
    daemon.wait_ready(Duration::from_secs(10) + LOAD_MARGIN);
    eventually(
        Duration::from_secs(30) + LOAD_MARGIN,
        "the resent ADD queued behind the orphan",
        || queued(&daemon, "resent", "ADD"),
    );
    assert!(!add.is_finished());
    gate.release();
    let result = add
        .await
        .expect("task")
        .unwrap_or_else(|e| panic!("the resent ADD: {e:?}\n{}", daemon.log()));

    let ips = host_local_ips(&data_dir, RES);
    let log = daemon.log();
    assert_eq!(ips.len(), 1, "one reservation: {ips:?}\n{log}");
    let address = result["ips"][0]["address"].as_str().unwrap_or_default();
    assert!(
        address.starts_with(&format!("{}/", ips[0])),
        "the result's address {address:?} is the reservation {ips:?}\n{log}"
    );
    let shown = ns.exec("ip", &["-o", "addr", "show", "eth0"]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&format!(" {address} ")),
        "eth0 has {address}: {}",
        String::from_utf8_lossy(&shown.stdout)
    );
    assert_eq!(
        bridge_ports(br).len(),
        1,
        "one veth: {:?}",
        bridge_ports(br)
    );
    let client = daemon.client().await;
    let listed = client
        .attachments(Some("resent"))
        .await
        .expect("attachments");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(log.contains("unfinished ADD rolled back"), "{log}");

    client.del(RES, &req).await.expect("DEL");
    assert!(host_local_ips(&data_dir, RES).is_empty());
    assert!(bridge_ports(br).is_empty());
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
}

/// A GC while an orphan still runs the ADD its container's unfinished
/// intent records leaves that intent alone: the orphan holds no gate in
/// the restarted daemon, so a DEL then would run beside it (what it
/// allocates afterwards freed by nobody but the rollback). The rollback
/// after the orphan deletes it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gc_while_an_orphan_runs_leaves_its_unfinished_add_to_the_rollback() {
    require_root!();
    let (late, running, daemon, client) = restart_with_an_orphan("late-gc").await;
    let req = cnid::api::GcRequest {
        valid_attachments: Vec::new(),
        timeout_ms: None,
    };
    let answer = client.gc(NET, &req).await.expect("GC");
    let dels = fs::read_to_string(&late.dels).unwrap_or_default();
    assert!(
        answer.deleted.iter().all(|a| a.container_id != "late-gc"),
        "GC deleted the orphan's ADD: {answer:?}\n{}",
        daemon.log()
    );
    assert_eq!(dels, "", "no DEL ran beside the orphan");
    assert!(alive(running.plugin()));
    assert_eq!(late.dirs.intents(), ["orph:late-gc:eth0.json"]);

    late.gate.release();
    eventually(Duration::from_secs(30), "the rollback", || {
        late.dirs.intents().is_empty()
    });
    assert_eq!(
        fs::read_to_string(&late.dels).unwrap_or_default(),
        "DEL late-gc \n"
    );
    assert!(names(&late.resources).is_empty(), "the rollback freed it");
}

/// SIGTERM while an orphan holds its container: the held request is
/// answered (the queue is drained, as every queued one is at a stop),
/// cnid stops without waiting for the orphan and without killing it, and
/// the unfinished ADD stays for the next start, which finds the same
/// orphan and rolls the ADD back after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_an_orphan_holds_its_container_keeps_it_for_the_next_start() {
    require_root!();
    let (late, running, mut daemon, client) = restart_with_an_orphan("late-term").await;
    let req = AttachmentRequest::new("late-term", "/proc/self/ns/net", "eth0");
    let del = tokio::spawn(async move { client.del(NET, &req).await });
    eventually(Duration::from_secs(30), "the DEL held", || {
        queued(&daemon, "late-term", "DEL")
    });
    daemon.signal(libc::SIGTERM);
    let status = daemon.wait(Duration::from_secs(10) + LOAD_MARGIN);
    assert!(
        status.is_some_and(|s| s.success()),
        "cnid stops at once: {status:?}\n{}",
        daemon.log()
    );
    let answered = del.await.expect("task");
    assert!(answered.is_err(), "the held DEL did not run: {answered:?}");
    assert!(alive(running.plugin()), "the orphan was not killed");
    assert_eq!(late.dirs.intents(), ["orph:late-term:eth0.json"]);
    assert_eq!(fs::read_to_string(&late.dels).unwrap_or_default(), "");

    let mut daemon = restart_waiting(&late.dirs);
    late.gate.release();
    daemon.wait_ready(Duration::from_secs(30));
    eventually(Duration::from_secs(30), "the rollback", || {
        late.dirs.intents().is_empty()
    });
    assert_eq!(
        fs::read_to_string(&late.dels).unwrap_or_default(),
        "DEL late-term \n"
    );
    assert!(names(&late.resources).is_empty());
}

/// A GC's orphan holds every queue; an unfinished ADD of a container no
/// orphan works on is rolled back after it, with a deadline counted from
/// then: queued at the start, the rollback's deadline ran out while the
/// GC's orphan (whose own may be longer) held it, and the ADD stayed
/// until the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_add_waits_out_a_gc_orphan_and_is_still_rolled_back() {
    require_root!();
    let dirs = Dirs::new();
    let gc_gate = Gate::new(dirs.root());
    let dels = dirs.data.join("dels");
    dirs.plugin(
        "gcgate",
        &format!(
            r#"cat > /dev/null
case "$CNI_COMMAND" in
GC)
{wait};;
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac"#,
            wait = gc_gate.shell_wait()
        ),
    );
    dirs.conf(
        "10-gcnet.conflist",
        &json!({"cniVersion": "1.1.0", "name": "gcnet", "plugins": [{"type": "gcgate"}]}),
    );
    let add_gate = GatedAdd::new(&dirs, "addgate", "addnet", &dels, "$CNI_CONTAINERID");
    let mut daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let add = tokio::spawn({
        let client = client.clone();
        async move {
            let req = AttachmentRequest::new("gc-held", "/proc/self/ns/net", "eth0");
            client.add("addnet", &req).await
        }
    });
    add_gate.gate.wait_started(1).await;
    let gc = tokio::spawn(async move {
        let req = cnid::api::GcRequest {
            valid_attachments: Vec::new(),
            timeout_ms: None,
        };
        client.gc("gcnet", &req).await
    });
    gc_gate.wait_started(1).await;
    daemon.kill9();
    add.abort();
    gc.abort();
    // The ADD's plugin ends with no daemon: only the GC's is an orphan.
    let pid = add_gate.pid();
    add_gate.gate.release();
    eventually(Duration::from_secs(30), "the ADD's plugin gone", || {
        !alive(pid)
    });
    assert_eq!(dirs.intents(), ["addnet:gc-held:eth0.json"]);

    // A DEL deadline of 1 s: it runs out while the GC's orphan holds.
    let mut daemon = Daemon::spawn_with(&dirs, &["--timeout-del", "1s"], |_| {});
    daemon.wait_log(WAITING, Duration::from_secs(30));
    daemon.wait_ready(Duration::from_secs(10) + LOAD_MARGIN);
    // Let the rollback's deadline pass, counted from the start (an
    // elapsed time, not an ordering: the bug needs it, the fix ignores it).
    tokio::time::sleep(Duration::from_secs(1) + LOAD_MARGIN).await;
    gc_gate.release();
    eventually(
        Duration::from_secs(15) + LOAD_MARGIN,
        "the unfinished ADD rolled back after the GC's orphan",
        || dirs.intents().is_empty(),
    );
    let log = daemon.log();
    assert_eq!(
        fs::read_to_string(&dels).unwrap_or_default(),
        "DEL gc-held\n",
        "{log}"
    );
    assert!(!log.contains("deadline expired while queued"), "{log}");
}

/// A restart finds an orphan of container `held-1`'s ADD and a stale
/// attachment of the same container on another network (its namespace
/// deleted while no cnid ran). The reap of that attachment and a runtime
/// DEL of it, sent meanwhile, both wait for the orphan (nothing of the
/// container runs beside it); once it ends the ADD is rolled back, the
/// reap is the one DEL of the attachment, and the runtime's DEL finds it
/// reaped and runs no plugin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_containers_reap_and_runtime_del_wait_for_its_orphan() {
    require_root!();
    const REC: &str = "orphrec";
    let late = Late::new();
    let records = late.dirs.data.join("records");
    fs::create_dir_all(&records).expect("records dir");
    late.dirs.plugin(
        "rec",
        &crate::support::daemon::recording_plugin(&records, ""),
    );
    late.dirs.conf(
        "30-orphrec.conflist",
        &json!({"cniVersion": "1.0.0", "name": REC, "plugins": [{"type": "rec"}]}),
    );
    let ns = crate::support::netns::TempNetns::new();
    let req = AttachmentRequest::new("held-1", ns.path(), "eth1");
    {
        let mut first = Daemon::start(&late.dirs, &[]);
        first.client().await.add(REC, &req).await.expect("ADD");
        first.kill9();
    }
    let running = late.orphan("held-1", None).await;
    drop(ns);

    let mut daemon = Daemon::spawn_with(&late.dirs, &["--stale-after", "1s"], |_| {});
    daemon.wait_log(WAITING, Duration::from_secs(30));
    let client = daemon.client().await;
    let queued = |reap: bool| {
        let client = client.clone();
        async move {
            client
                .operations(Some("held-1"))
                .await
                .unwrap()
                .iter()
                .any(|o| o.request_id.starts_with("reap-") == reap && o.network == REC)
        }
    };
    crate::support::daemon::eventually_async(
        Duration::from_secs(30),
        "the reap queued behind the hold",
        || queued(true),
    )
    .await;
    let mut del = AttachmentRequest::new("held-1", "", "eth1");
    del.timeout_ms = Some(120_000);
    let del = {
        let client = client.clone();
        tokio::spawn(async move { client.del(REC, &del).await })
    };
    crate::support::daemon::eventually_async(
        Duration::from_secs(30),
        "the runtime's DEL queued",
        || queued(false),
    )
    .await;
    let runs = |what: &str| -> Vec<String> {
        crate::support::daemon::runs(&records)
            .into_iter()
            .filter(|r| r.container == "held-1")
            .map(|r| format!("{} {what}", r.command))
            .collect()
    };
    assert_eq!(runs("held"), ["ADD held"], "nothing ran beside the orphan");
    assert!(alive(running.plugin()));
    assert!(!del.is_finished(), "the runtime's DEL waits for the orphan");

    late.gate.release();
    daemon.wait_ready(Duration::from_secs(30));
    del.await.unwrap().expect("the runtime's DEL");
    wait_rolled_back(&late, &daemon);
    assert_eq!(
        runs("after"),
        ["ADD after", "DEL after"],
        "one DEL: the reap's"
    );
    let log = daemon.log();
    assert_eq!(log.matches("stale attachment deleted").count(), 1, "{log}");
    assert!(
        log.contains("already deleted by the stale-attachment reaper"),
        "{log}"
    );
    assert!(late.dirs.cached().is_empty(), "{:?}", late.dirs.cached());
    assert!(names(&late.resources).is_empty(), "{log}");
}
