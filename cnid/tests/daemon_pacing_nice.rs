//! The CPU weight of a paced burst (`--plugin-slots`):
//! while operations wait for a slot, the plugins started run with a lower
//! nice value than cnid's own, and so does what they fork; nothing else
//! does. After a burst (answered, cancelled or out of time) every thread
//! of cnid is back at cnid's own nice value and the next plugin starts
//! with it; a cnid started with a positive nice value is boosted relative
//! to it; a cnid without `CAP_SYS_NICE` runs its plugins unboosted, and
//! without an error.
//!
//! The fake plugin records, per ADD and in a file of its own, its
//! container, its own nice value and that of a process it forked, read
//! at its start (before its gate).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, eventually_async, raise_nofile};
use crate::support::gate::Gate;
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use serde_json::json;

const NET: &str = "pnice";
/// How long a test waits for a state it caused (generous: a busy machine).
const WAIT: Duration = Duration::from_secs(60);
/// The capability to lower a nice value (linux/capability.h).
const CAP_SYS_NICE: libc::c_ulong = 23;

/// The nice value of the calling thread (what a process it starts gets).
fn own_nice() -> i32 {
    // SAFETY: getpriority of our own thread.
    unsafe { libc::getpriority(libc::PRIO_PROCESS as _, libc::gettid() as libc::id_t) }
}

/// Field 19 (nice) of a `/proc/.../stat` file; the command name (field 2)
/// may hold spaces, so fields are counted after its closing parenthesis.
fn stat_nice(stat: &str) -> i32 {
    let rest = &stat[stat.rfind(')').expect("stat has a comm") + 2..];
    rest.split(' ')
        .nth(16)
        .expect("field 19")
        .parse()
        .expect("a nice value")
}

/// Every thread of `pid`: its id, name and nice value.
fn thread_nices(pid: i32) -> Vec<(String, i32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("threads of cnid")
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue; // a thread that ended meanwhile
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        v.push((
            format!("{} {}", e.file_name().to_string_lossy(), comm.trim()),
            stat_nice(&stat),
        ));
    }
    v
}

/// Installs the network: one plugin `pnice` that records, on ADD, its
/// container, its own nice value and that of a child (`cut`, forked), then
/// waits at `gate` when its container's name starts with `gated-`.
fn setup(dirs: &Dirs, gate: &Gate) -> PathBuf {
    let records = dirs.data.join("nices");
    std::fs::create_dir_all(&records).unwrap();
    dirs.plugin(
        "pnice",
        &format!(
            r#"cat > /dev/null
if [ "$CNI_COMMAND" = VERSION ]; then printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}'; exit 0; fi
if [ "$CNI_COMMAND" = ADD ]; then
  own=$(cut -d' ' -f19 /proc/$$/stat)
  child=$(cut -d' ' -f19 /proc/self/stat)
  echo "$CNI_CONTAINERID $own $child" > "{records}/$$"
  case "$CNI_CONTAINERID" in gated-*)
{wait}
  ;; esac
  printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.99.0.2/24"}}]}}'
fi"#,
            records = records.display(),
            wait = gate.shell_wait(),
        ),
    );
    dirs.conf(
        "10-pnice.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "pnice"}]}),
    );
    records
}

/// What the plugin recorded: container, own nice, its child's nice.
fn recorded(records: &Path) -> Vec<(String, i32, i32)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(records).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() == 3 {
            v.push((
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            ));
        }
    }
    v.sort();
    v
}

fn req(dirs: &Dirs, cid: &str, timeout_ms: Option<u64>) -> AttachmentRequest {
    let mut r = AttachmentRequest::new(cid, dirs.netns(cid), "eth0");
    r.timeout_ms = timeout_ms;
    r
}

type Added = tokio::task::JoinHandle<Result<serde_json::Value, cnid::client::ClientError>>;

/// Sends the ADD `r` on a connection of its own, in a task.
fn spawn_add(daemon: &Daemon, r: AttachmentRequest) -> Added {
    let socket = daemon.socket.clone();
    tokio::spawn(async move {
        let c = Client::connect(&socket).await.expect("connect");
        c.add(NET, &r).await
    })
}

/// Sends `n` ADDs of containers `gated-0..n` at once, each on a
/// connection of its own, and waits until all of them are running (left
/// their queues: in a slot or waiting for one) and `in_plugin` of them
/// reached the gate.
async fn burst(
    dirs: &Dirs,
    daemon: &Daemon,
    gate: &Gate,
    n: usize,
    in_plugin: usize,
    timeout_ms: Option<u64>,
) -> Vec<Added> {
    let adds: Vec<_> = (0..n)
        .map(|i| spawn_add(daemon, req(dirs, &format!("gated-{i}"), timeout_ms)))
        .collect();
    let client = daemon.client().await;
    eventually_async(WAIT, "every ADD of the burst running", || async {
        let ops = client.operations(None).await.unwrap();
        ops.iter()
            .filter(|o| o.state == "running")
            .filter(|o| {
                !o.container_id
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("gated-hold")
            })
            .count()
            >= n
    })
    .await;
    gate.wait_started(in_plugin).await;
    adds
}

/// Asserts every thread of cnid runs at `nice`.
fn assert_threads_at(daemon: &Daemon, nice: i32) {
    let threads = thread_nices(daemon.pid());
    let off: Vec<_> = threads.iter().filter(|(_, n)| *n != nice).collect();
    assert!(
        off.is_empty(),
        "threads of cnid not at its nice {nice}: {off:?} (all: {threads:?})"
    );
}

/// One ADD on the idle daemon: its plugin and the plugin's child start at
/// `nice`.
async fn assert_idle_add_at(dirs: &Dirs, daemon: &Daemon, records: &Path, nice: i32) {
    daemon
        .client()
        .await
        .add(NET, &req(dirs, "idle", None))
        .await
        .expect("ADD on the idle daemon");
    let idle: Vec<_> = recorded(records)
        .into_iter()
        .filter(|r| r.0 == "idle")
        .collect();
    assert_eq!(
        idle,
        vec![("idle".to_owned(), nice, nice)],
        "a plugin of the idle daemon"
    );
}

/// The setting measured for a burst: twice the CPUs.
fn twice_the_cpus() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_burst_leaves_every_thread_and_the_next_plugin_at_cnids_own_nice() {
    crate::support::require_root!();
    raise_nofile();
    const N: usize = 40;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = setup(&dirs, &gate);
    let base = own_nice();
    let slots = twice_the_cpus();
    let daemon = Daemon::start(&dirs, &["--plugin-slots", &slots.to_string()]);
    assert_threads_at(&daemon, base);
    let adds = burst(&dirs, &daemon, &gate, N, N.min(slots), None).await;
    gate.release();
    for a in adds {
        a.await.unwrap().expect("ADD of the burst");
    }
    let burst: Vec<_> = recorded(&records);
    assert_eq!(burst.len(), N, "{burst:?}");
    for (cid, own, child) in &burst {
        assert_eq!(
            own, child,
            "{cid}: a plugin's child starts with the plugin's nice"
        );
        assert!(
            *own <= base,
            "{cid}: a plugin never runs below cnid's weight"
        );
    }
    if N > slots {
        assert!(
            burst.iter().any(|(_, own, _)| *own < base),
            "plugins started while {N} operations wanted {slots} slots are boosted: {burst:?}"
        );
    }
    assert_threads_at(&daemon, base);
    assert_idle_add_at(&dirs, &daemon, &records, base).await;
    assert_threads_at(&daemon, base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_burst_cut_short_by_deadlines_and_disconnects_leaves_no_boost_behind() {
    crate::support::require_root!();
    raise_nofile();
    const N: usize = 22;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = setup(&dirs, &gate);
    let base = own_nice();
    let daemon = Daemon::start(&dirs, &["--plugin-slots", "2"]);
    // Two operations hold the slots, their plugins hung until their
    // deadline kills them.
    let holders: Vec<_> = (0..2)
        .map(|i| spawn_add(&daemon, req(&dirs, &format!("gated-hold-{i}"), Some(3_000))))
        .collect();
    gate.wait_started(2).await;
    let adds = burst(&dirs, &daemon, &gate, N, 2, None).await;
    for h in holders {
        assert!(
            h.await.unwrap().is_err(),
            "a hung ADD past its deadline fails"
        );
    }
    // The slots the holders left went to two of the waiting operations,
    // boosted.
    gate.wait_started(4).await;
    // Half of the clients leave.
    for a in adds.iter().step_by(2) {
        a.abort();
    }
    gate.release();
    for a in adds {
        match a.await {
            Ok(r) => {
                r.expect("ADD of the burst");
            }
            Err(e) => assert!(e.is_cancelled()),
        }
    }
    let client = daemon.client().await;
    eventually_async(WAIT, "no operation left", || async {
        client.operations(None).await.unwrap().is_empty()
    })
    .await;
    let rec = recorded(&records);
    assert!(
        rec.iter()
            .any(|r| r.0.starts_with("gated-") && !r.0.starts_with("gated-hold") && r.1 < base),
        "plugins started while the burst waited on 2 slots are boosted: {rec:?}"
    );
    assert_threads_at(&daemon, base);
    assert_idle_add_at(&dirs, &daemon, &records, base).await;
    assert_threads_at(&daemon, base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_burst_lent_runs_while_the_cpus_idle_leaves_no_boost_behind() {
    crate::support::require_root!();
    raise_nofile();
    const N: usize = 16;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = setup(&dirs, &gate);
    let base = own_nice();
    // The CPUs busy until the whole burst waits behind the held slot; then
    // idle: the waiting operations are lent runs, two (CPUs) at each look,
    // while the others still wait.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| cpus.install(c));
    let held = hold_the_slot(&dirs, &daemon, &gate).await;
    let adds = burst(&dirs, &daemon, &gate, N, 1, None).await;
    cpus.set(Cpus::Idle);
    gate.wait_started(N + 1).await;
    let burst: Vec<_> = recorded(&records)
        .into_iter()
        .filter(|r| r.0.starts_with("gated-") && r.0 != "gated-hold")
        .collect();
    assert_eq!(
        burst.len(),
        N,
        "every ADD lent a run, the slot held: {burst:?}"
    );
    assert!(
        burst.iter().any(|r| r.1 < base),
        "plugins lent a run while others waited are boosted: {burst:?}"
    );
    for (cid, own, child) in &burst {
        assert_eq!(own, child, "{cid}: a plugin's child starts with its nice");
        assert!(*own <= base, "{cid}: never below cnid's weight");
    }
    gate.release();
    held.await.unwrap().expect("ADD holding the slot");
    for a in adds {
        a.await.unwrap().expect("ADD of the burst");
    }
    assert_threads_at(&daemon, base);
    assert_idle_add_at(&dirs, &daemon, &records, base).await;
    assert_threads_at(&daemon, base);
}

/// Starts `gated-hold`, an ADD whose plugin holds the only slot until the
/// gate opens.
async fn hold_the_slot(dirs: &Dirs, daemon: &Daemon, gate: &Gate) -> Added {
    let held = spawn_add(daemon, req(dirs, "gated-hold", None));
    gate.wait_started(1).await;
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_an_operation_that_gave_up_waiting_runs_unboosted_when_nothing_waits() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = setup(&dirs, &gate);
    let base = own_nice();
    let daemon = Daemon::start(&dirs, &["--plugin-slots", "1"]);
    let held = hold_the_slot(&dirs, &daemon, &gate).await;
    // It waits a quarter of its 4 s for the slot, then runs without one:
    // two operations run, none waits, so the burst is no larger than
    // what runs and its plugin gets no more weight than cnid's own.
    daemon
        .client()
        .await
        .add(NET, &req(&dirs, "late", Some(4_000)))
        .await
        .expect("ADD run without a slot");
    let late: Vec<_> = recorded(&records)
        .into_iter()
        .filter(|r| r.0 == "late")
        .collect();
    assert_eq!(
        late,
        vec![("late".to_owned(), base, base)],
        "nothing waited when it started"
    );
    gate.release();
    held.await.unwrap().expect("ADD holding the slot");
    assert_threads_at(&daemon, base);
}

/// Lowers the nice value of the process about to exec by `by` (a
/// `pre_exec` hook), and drops `CAP_SYS_NICE` from its bounding set when
/// `no_cap` (root's exec then grants it no more) with `RLIMIT_NICE` 0
/// (no unprivileged lowering either).
fn niced(cmd: &mut std::process::Command, by: i32, no_cap: bool) {
    // SAFETY: async-signal-safe calls on the child only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpriority(libc::PRIO_PROCESS as _, 0, by) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if no_cap {
                let zero = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::setrlimit(libc::RLIMIT_NICE, &zero) != 0
                    || libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// The burst of the nice-value tests with cnid at nice 5: one operation
/// holds the only slot, four wait for it, then all go. Returns the
/// records of the burst's plugins.
async fn burst_at_nice_5(no_cap: bool) -> (Vec<(String, i32, i32)>, String) {
    const N: usize = 4;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = setup(&dirs, &gate);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| niced(c, 5, no_cap));
    assert_threads_at(&daemon, 5);
    let held = hold_the_slot(&dirs, &daemon, &gate).await;
    let adds = burst(&dirs, &daemon, &gate, N, 1, None).await;
    gate.release();
    held.await.unwrap().expect("ADD holding the slot");
    for a in adds {
        a.await.unwrap().expect("ADD of the burst");
    }
    assert_threads_at(&daemon, 5);
    assert_idle_add_at(&dirs, &daemon, &records, 5).await;
    assert_threads_at(&daemon, 5);
    let burst = recorded(&records)
        .into_iter()
        .filter(|r| r.0.starts_with("gated-") && r.0 != "gated-hold")
        .collect();
    (burst, daemon.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_the_boost_is_relative_to_cnids_own_nice_and_threads_return_to_it() {
    crate::support::require_root!();
    let (burst, _) = burst_at_nice_5(false).await;
    assert_eq!(burst.len(), 4, "{burst:?}");
    for (cid, own, child) in &burst {
        assert_eq!(
            own, child,
            "{cid}: a plugin's child starts with the plugin's nice"
        );
        assert!(*own <= 5, "{cid}: never below cnid's weight: {burst:?}");
    }
    // The first of the waiting ones started while three others waited.
    assert!(
        burst.iter().any(|r| r.1 < 5),
        "a paced burst is boosted below 5: {burst:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_without_cap_sys_nice_plugins_run_at_cnids_own_nice_without_error() {
    crate::support::require_root!();
    let (burst, log) = burst_at_nice_5(true).await;
    assert_eq!(burst.len(), 4, "{burst:?}");
    for r in &burst {
        assert_eq!(
            (r.1, r.2),
            (5, 5),
            "no boost without CAP_SYS_NICE: {burst:?}"
        );
    }
    for l in log.lines() {
        assert!(
            !l.contains("ERROR") && !l.contains("WARN"),
            "cnid logged: {l}"
        );
    }
}
