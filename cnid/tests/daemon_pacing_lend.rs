//! Pacing (`--plugin-slots`) is work-conserving: while the CPUs idle,
//! operations waiting for a slot held by plugins that wait (a gated fake
//! plugin) are lent a run and do not wait out the slot's wait bound; while
//! the CPUs are busy the slots hold. The CPUs' idleness is the test's own
//! (`support::cpus`: a `/proc/stat` of cnid's own), not the machine's.
//!
//! A slot is held [`SLOT_LEASE`] (10 s) at most, and an ADD waits
//! [`SLOT_WAIT`] (15 s) at most for one (its deadline is long: 120 s): an
//! ADD whose plugin starts well within the lease of the slots' holders,
//! the holders still in their plugins, was lent a run. The plugin records
//! its own start, so the figures hold on a busy machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, Run, eventually_async, gated_network, runs};
use crate::support::gate::Gate;
use crate::support::reaper::metric;
use cnid::api::AttachmentRequest;
use cnid::client::{Client, ClientError};

const NET: &str = "plend";
const WAIT: Duration = Duration::from_secs(60);
/// A slot's wait bound (`cnid::daemon::pace::SLOT_WAIT`).
const SLOT_WAIT: Duration = Duration::from_secs(15);
/// A slot's lease (`cnid::daemon::pace::SLOT_LEASE`).
const SLOT_LEASE: Duration = Duration::from_secs(10);
/// How long after the holders' plugins started a lent ADD's plugin
/// starts at the latest: a tick or two (100 ms each) after it arrived,
/// with room for a busy machine, and well before the lease ends.
const LENT_BEFORE: Duration = Duration::from_secs(5);

/// A daemon with `slots` slots seeing `cpus`, whose ADDs of containers
/// named `hold-*` wait at `gate`; and the dir of its plugin's records.
fn start(dirs: &Dirs, gate: &Gate, cpus: &FakeCpus, slots: usize) -> (Daemon, PathBuf) {
    start_with(dirs, gate, cpus, &["--plugin-slots", &slots.to_string()])
}

/// [`start`] with the daemon's arguments `args`.
fn start_with(dirs: &Dirs, gate: &Gate, cpus: &FakeCpus, args: &[&str]) -> (Daemon, PathBuf) {
    let records = gated_network(
        dirs,
        ("10-plend.conflist", NET, "rec"),
        r#"[ "$CNI_COMMAND" = ADD ] && case "$CNI_CONTAINERID" in hold-*) true;; *) false;; esac"#,
        gate,
    );
    let daemon = Daemon::start_with(dirs, args, |c| cpus.install(c));
    (daemon, records)
}

/// How long after the first holder's plugin the ADD plugin of `cid`
/// started (from the plugin's records, once the holders ended).
fn started_after_the_holders(records: &Path, cid: &str) -> Duration {
    run_after_the_holders(records, cid, |r| r.command == "ADD")
}

/// How long after the first holder's plugin the first run of `cid` that
/// `pick` picks started.
fn run_after_the_holders(records: &Path, cid: &str, pick: impl Fn(&Run) -> bool) -> Duration {
    let r = runs(records);
    let first = |of: &dyn Fn(&Run) -> bool| {
        r.iter()
            .filter(|x| of(x))
            .map(|x| x.start)
            .min()
            .unwrap_or_else(|| panic!("no run of {cid} recorded: {r:?}"))
    };
    let held = first(&|x| x.command == "ADD" && x.container.starts_with("hold-"));
    let ran = first(&|x| x.container == cid && pick(x));
    Duration::from_nanos(ran.saturating_sub(held) as u64)
}

type Added = tokio::task::JoinHandle<(Result<serde_json::Value, ClientError>, Duration)>;

/// Sends the ADD of `cid` (deadline `timeout_ms`) on a connection of its
/// own; yields its answer and how long it took.
fn add(daemon: &Daemon, dirs: &Dirs, cid: &str, timeout_ms: u64) -> Added {
    let mut r = AttachmentRequest::new(cid, dirs.netns(cid), "eth0");
    r.timeout_ms = Some(timeout_ms);
    let socket = daemon.socket.clone();
    tokio::spawn(async move {
        let c = Client::connect(&socket).await.expect("connect");
        let sent = Instant::now();
        let out = c.add(NET, &r).await;
        (out, sent.elapsed())
    })
}

/// `n` ADDs of `hold-*` holding every slot, in their plugins.
async fn hold(daemon: &Daemon, dirs: &Dirs, gate: &Gate, n: usize) -> Vec<Added> {
    let held = (0..n)
        .map(|i| add(daemon, dirs, &format!("hold-{i}"), 120_000))
        .collect();
    gate.wait_started(n).await;
    held
}

/// Opens the gate and waits for the holders' answers.
async fn release(gate: &Gate, held: Vec<Added>) {
    gate.release();
    for h in held {
        h.await.unwrap().0.expect("a holder, released");
    }
}

/// The ADD of `cid` with a deadline of `deadline_ms`, nothing lent: it
/// waits a quarter of its deadline for the held slot, then runs without.
async fn waits_its_quarter(daemon: &Daemon, dirs: &Dirs, cid: &str, deadline_ms: u64) {
    let (out, took) = add(daemon, dirs, cid, deadline_ms).await.unwrap();
    out.expect("run without a slot after its wait");
    let quarter = Duration::from_millis(deadline_ms / 4);
    assert!(
        took >= quarter,
        "nothing to lend, the slot held: answered after {took:?}, before its wait ({quarter:?}) ended"
    );
}

/// Waits until `cid`'s operation runs (left its queue: in a slot or
/// waiting for one).
async fn until_running(daemon: &Daemon, cid: &str) {
    let client = daemon.client().await;
    eventually_async(WAIT, &format!("the ADD of {cid} running"), || async {
        client
            .operations(Some(cid))
            .await
            .unwrap()
            .iter()
            .any(|o| o.state == "running")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_while_the_cpus_idle_32_adds_behind_slots_held_by_waiting_plugins_are_lent_runs()
 {
    crate::support::require_root!();
    crate::support::daemon::raise_nofile();
    const N: usize = 32;
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let cpus = FakeCpus::new(dirs.root(), Cpus::Idle);
    let (daemon, records) = start(&dirs, &gate, &cpus, 2);
    let held = hold(&daemon, &dirs, &gate, 2).await;
    let sent = Instant::now();
    let adds: Vec<_> = (0..N)
        .map(|i| add(&daemon, &dirs, &format!("w-{i}"), 120_000))
        .collect();
    for a in adds {
        let (out, took) = a.await.unwrap();
        out.expect("a lent ADD");
        assert!(
            took < SLOT_WAIT,
            "an ADD waited out its slot wait: {took:?}"
        );
    }
    let all = sent.elapsed();
    assert!(
        held.iter().all(|h| !h.is_finished()),
        "the holders still in their plugins"
    );
    let m = daemon.client().await.metrics().await.unwrap();
    let paced = |how: &str| {
        metric(
            &m,
            &format!("cnid_paced_operations_total{{how=\"{how}\"}} "),
        )
    };
    assert_eq!(
        (paced("slot"), paced("lent"), paced("waited_out")),
        (2, N as u64, 0),
        "the holders in their slots, every other one lent a run"
    );
    release(&gate, held).await;
    let last = (0..N)
        .map(|i| started_after_the_holders(&records, &format!("w-{i}")))
        .max()
        .unwrap();
    assert!(
        last < SLOT_LEASE - crate::support::gate::LOAD_MARGIN,
        "the last of {N} plugins started {last:?} after the holders': not lent (a slot frees after {SLOT_LEASE:?})"
    );
    eprintln!(
        "{N} ADDs behind 2 held slots, 2 idle CPUs: the last plugin started {last:?} after the holders', all answered {all:?} after sending"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_while_the_cpus_are_busy_an_add_waits_for_the_slot_its_full_bound() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let (daemon, _) = start(&dirs, &gate, &cpus, 1);
    let held = hold(&daemon, &dirs, &gate, 1).await;
    waits_its_quarter(&daemon, &dirs, "late", 4_000).await;
    assert!(!held[0].is_finished());
    release(&gate, held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_unreadable_cpu_times_lend_nothing_and_lending_resumes_once_readable() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let cpus = FakeCpus::new(dirs.root(), Cpus::Unreadable);
    let (daemon, records) = start(&dirs, &gate, &cpus, 1);
    let held = hold(&daemon, &dirs, &gate, 1).await;
    // Pacing as without lending.
    waits_its_quarter(&daemon, &dirs, "late", 2_000).await;
    // Readable again, the CPUs idle: the next waiter is lent a run.
    cpus.set(Cpus::Idle);
    add(&daemon, &dirs, "next", 120_000)
        .await
        .unwrap()
        .0
        .expect("a lent ADD");
    assert!(!held[0].is_finished(), "the holder still in its plugin");
    release(&gate, held).await;
    let next = started_after_the_holders(&records, "next");
    assert!(
        next < LENT_BEFORE,
        "next's plugin started {next:?} after the holder's (its slot's lease: {SLOT_LEASE:?}): lending never resumed"
    );
    let log = daemon.log();
    assert!(!log.contains("panicked"), "cnid log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_an_add_waiting_for_a_slot_at_shutdown_is_still_lent_a_run_in_the_drain() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let (mut daemon, records) = start(&dirs, &gate, &cpus, 1);
    let held = hold(&daemon, &dirs, &gate, 1).await;
    let waiting = add(&daemon, &dirs, "drained", 120_000);
    until_running(&daemon, "drained").await;
    // SIGTERM: the daemon finishes what runs; then the CPUs idle.
    daemon.signal(libc::SIGTERM);
    daemon.wait_log("shutting down", WAIT);
    cpus.set(Cpus::Idle);
    let (out, took) = waiting.await.unwrap();
    out.expect("the ADD that waited, answered in the drain");
    assert!(took < SLOT_WAIT, "answered after {took:?}");
    assert!(!held[0].is_finished(), "the holder still in its plugin");
    release(&gate, held).await;
    let drained = started_after_the_holders(&records, "drained");
    assert!(
        drained < LENT_BEFORE,
        "its plugin started {drained:?} after the holder's (its slot's lease: {SLOT_LEASE:?}): nothing lent in the drain"
    );
    let status = daemon.wait(WAIT).expect("cnid exits after the drain");
    assert!(status.success(), "{status}; log:\n{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_periodic_check_waiting_for_a_slot_is_lent_a_run_once_a_request_of_its_container_waits_behind_it()
 {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    // Busy while the scene is set: the holder holds the slot, not lent.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let args = ["--plugin-slots", "1", "--check-every", "1s"];
    let (daemon, records) = start_with(&dirs, &gate, &cpus, &args);
    let client = daemon.client().await;
    let bg = AttachmentRequest::new("bg", dirs.netns("bg"), "eth0");
    client.add(NET, &bg).await.expect("ADD bg");
    let held = hold(&daemon, &dirs, &gate, 1).await;
    let holder = client.operations(Some("hold-0")).await.unwrap()[0].id;
    // A periodic CHECK of bg that arrived after the holder took the only
    // slot: out of its queue, it waits for the slot (background work is
    // lent no run).
    eventually_async(
        WAIT,
        "a periodic CHECK of bg waiting for the slot",
        || async {
            client
                .operations(Some("bg"))
                .await
                .unwrap()
                .iter()
                .any(|o| o.verb == "CHECK" && o.state == "running" && o.id > holder)
        },
    )
    .await;
    // The CPUs idle; a runtime CHECK of bg waits behind the periodic one.
    cpus.set(Cpus::Idle);
    let mut check = bg.clone();
    check.cni_args = "SEQ=7".into();
    check.timeout_ms = Some(120_000);
    client
        .check(NET, &check)
        .await
        .expect("the runtime CHECK of bg");
    assert!(!held[0].is_finished(), "the holder still in its plugin");
    release(&gate, held).await;
    let checked =
        run_after_the_holders(&records, "bg", |r| r.command == "CHECK" && r.seq == Some(7));
    assert!(
        checked < LENT_BEFORE,
        "the runtime CHECK of bg started {checked:?} after the holder (its slot's lease: {SLOT_LEASE:?}): the periodic CHECK ahead of it was lent no run"
    );
}
