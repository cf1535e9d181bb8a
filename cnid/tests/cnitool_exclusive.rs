//! Concurrent `cnitool add` and `cnitool del` processes on one attachment:
//! the "already attached" refusal (code 909) is made under the
//! attachment's lock (`AddRequest::exclusive`), so of several ADDs at once
//! exactly one runs the plugins, an ADD waiting behind a DEL attaches, and
//! the plugins' runs (serialized by the lock, so recorded in their real
//! order) never show two ADDs in a row.
//!
//! Ordering: a gated plugin holds the lock; the other processes are
//! waited for until each is parked in `epoll_wait` (`/proc/PID/wchan`).
//! cnitool runs a current-thread runtime with inline cache I/O, so before
//! it holds the lock the only place it can park is the lock's backoff: a
//! parked process has found the lock taken (and, before the fix, had
//! passed a check made outside it).

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::Instant;

use crate::support::fake::{Fake, Response, sh_quote};
use crate::support::gate::{GATE_WAIT_LIMIT, Gate};
use crate::support::tool::Sandbox;
use serde_json::{Value, json};

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.231.0.2/24"}]}"#;

/// A sandbox with network `excl`: plugins `first` (its ADD or DEL, as
/// `gated` says, held at `gate` after writing its parent's pid, the
/// cnitool running it, to `ppids`) and `second`.
struct Rig {
    sb: Sandbox,
    gate: Gate,
    ppids: PathBuf,
    netns: String,
}

impl Rig {
    fn new(gated: Option<&str>) -> Rig {
        let sb = Sandbox::new();
        let gate = Gate::new(sb.root());
        let ppids = sb.root().join("ppids");
        let held = format!(
            "echo $PPID >> {}\n{}",
            sh_quote(&ppids.to_string_lossy()),
            gate.shell_wait()
        );
        let (add, del) = (Response::ok(RESULT), Response::ok(""));
        let first = match gated {
            Some("ADD") => Fake::new(del).on("ADD", add.with_shell(&held)),
            Some("DEL") => Fake::new(del.clone())
                .on("ADD", add)
                .on("DEL", del.with_shell(&held)),
            None => Fake::new(del).on("ADD", add),
            Some(other) => panic!("no gate for {other}"),
        };
        sb.plugins.fake("first", &first);
        sb.plugins.fake(
            "second",
            &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
        );
        sb.conflist(
            "excl",
            "1.0.0",
            &[json!({"type": "first"}), json!({"type": "second"})],
        );
        let netns = sb.netns("excl");
        Rig {
            sb,
            gate,
            ppids,
            netns,
        }
    }

    /// Starts `cnitool --json-errors VERB excl NETNS`.
    fn start(&self, verb: &str) -> Child {
        self.sb
            .cnitool(&["--json-errors", verb, "excl", &self.netns])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cnitool")
    }

    /// The pid of the cnitool whose plugin reached the gate.
    fn holder(&self) -> u32 {
        let text = std::fs::read_to_string(&self.ppids).expect("ppids");
        let pids: Vec<u32> = text.lines().map(|l| l.parse().expect("pid")).collect();
        assert_eq!(pids.len(), 1, "more than one plugin at the gate: {pids:?}");
        pids[0]
    }

    /// The plugins' runs, in order: `"ADD first"`, ...
    fn runs(&self) -> Vec<String> {
        self.sb
            .plugins
            .invocations()
            .iter()
            .map(|c| format!("{} {}", c.command(), c.plugin))
            .collect()
    }

    fn recorded(&self) -> bool {
        self.sb.cache_entries().len() == 1
    }
}

/// Whether process `pid` is blocked in `epoll_wait`: a cnitool waiting for
/// a timer (the lock's backoff) or for its plugin. Fails the test when it
/// has exited (a zombie, not yet waited for): it never waited.
#[track_caller]
fn parked(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    assert_ne!(
        state,
        Some("Z"),
        "cnitool {pid} exited instead of waiting for the lock"
    );
    // wchan names the kernel function; where it is hidden ("0"), the
    // system call it is blocked in (x86_64: epoll_wait 232, epoll_pwait
    // 281, epoll_pwait2 441) says the same.
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w.contains("epoll_wait"))
        || std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .is_ok_and(|s| matches!(s.split_whitespace().next(), Some("232" | "281" | "441")))
}

/// Waits (up to [`GATE_WAIT_LIMIT`]) until every process of `pids` is parked.
fn wait_parked(pids: &[u32]) {
    let end = Instant::now() + GATE_WAIT_LIMIT;
    while !pids.iter().all(|p| parked(*p)) {
        assert!(
            Instant::now() < end,
            "cnitools {pids:?} not all parked within {GATE_WAIT_LIMIT:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("wait for cnitool")
}

/// Checks a refused ADD: status 1, nothing on stdout, the 909 error object.
#[track_caller]
fn assert_refused(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(err["code"], cnid::api::code::ALREADY_ATTACHED, "{err}");
    assert!(
        err["msg"]
            .as_str()
            .is_some_and(|m| m.ends_with("is already attached to network \"excl\": DEL it first")),
        "{err}"
    );
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Of `n` ADDs, exactly one succeeded (printing the result) and the rest
/// were refused with 909; the plugins ran once.
#[track_caller]
fn assert_one_added(rig: &Rig, outs: &[Output]) {
    let (ok, refused): (Vec<&Output>, Vec<&Output>) =
        outs.iter().partition(|o| o.status.code() == Some(0));
    assert_eq!(ok.len(), 1, "{} ADDs succeeded: {outs:?}", ok.len());
    let printed: Value = serde_json::from_slice(&ok[0].stdout).expect("the result");
    assert_eq!(printed["ips"][0]["address"], "10.231.0.2/24", "{printed}");
    for out in refused {
        assert_refused(out);
    }
    assert_eq!(rig.runs(), ["ADD first", "ADD second"]);
    assert!(rig.recorded(), "{:?}", rig.sb.cache_entries());
}

/// Six `cnitool add` at once, the first to hold the lock held at its
/// plugin until the five others are parked on the lock: one attaches,
/// five answer 909, the plugins ran once. Five rounds. Before the fix the
/// five had passed the check and ran the plugins one after the other.
#[test]
fn concurrent_cnitool_adds_held_at_the_lock_attach_once_and_refuse_the_rest() {
    for round in 0..5 {
        let rig = Rig::new(Some("ADD"));
        let children: Vec<Child> = (0..6).map(|_| rig.start("add")).collect();
        rig.gate.wait_started_blocking(1);
        let holder = rig.holder();
        let waiting: Vec<u32> = children
            .iter()
            .map(Child::id)
            .filter(|p| *p != holder)
            .collect();
        assert_eq!(waiting.len(), 5, "round {round}: the holder is not ours");
        wait_parked(&waiting);
        assert_eq!(rig.gate.started(), 1, "round {round}");
        rig.gate.release();
        let outs: Vec<Output> = children.into_iter().map(finish).collect();
        assert_one_added(&rig, &outs);
    }
}

/// Six `cnitool add` at once with nothing held: whatever the interleaving
/// (some may find the record at once, some wait for the lock), one
/// attaches and five answer 909. Ten rounds.
#[test]
fn concurrent_cnitool_adds_free_running_attach_once_whatever_the_interleaving() {
    for _ in 0..10 {
        let rig = Rig::new(None);
        let children: Vec<Child> = (0..6).map(|_| rig.start("add")).collect();
        let outs: Vec<Output> = children.into_iter().map(finish).collect();
        assert_one_added(&rig, &outs);
    }
}

/// A `cnitool del` started while an ADD runs its plugins waits for it, then
/// deletes what it made: no record is left, and the next ADD attaches
/// again (it is not "already attached").
#[test]
fn a_cnitool_del_waiting_behind_a_running_add_deletes_what_it_made() {
    let rig = Rig::new(Some("ADD"));
    let add = rig.start("add");
    rig.gate.wait_started_blocking(1);
    let del = rig.start("del");
    wait_parked(&[del.id()]);
    rig.gate.release();
    assert_ok(&finish(add));
    assert_ok(&finish(del));
    assert_eq!(
        rig.runs(),
        ["ADD first", "ADD second", "DEL second", "DEL first"]
    );
    assert!(!rig.recorded(), "{:?}", rig.sb.cache_entries());
    assert_ok(&finish(rig.start("add")));
    assert!(rig.recorded());
}

/// A `cnitool add` started while a DEL of the attachment runs waits for
/// the DEL and then attaches: its check sees what the DEL left (before the
/// fix it read the record the DEL was removing and answered 909).
#[test]
fn a_cnitool_add_waiting_behind_a_running_del_attaches_after_it() {
    let rig = Rig::new(Some("DEL"));
    assert_ok(&finish(rig.start("add")));
    let del = rig.start("del");
    rig.gate.wait_started_blocking(1);
    let add = rig.start("add");
    wait_parked(&[add.id()]);
    rig.gate.release();
    assert_ok(&finish(del));
    let added = finish(add);
    assert_ok(&added);
    assert_eq!(
        rig.runs(),
        [
            "ADD first",
            "ADD second",
            "DEL second",
            "DEL first",
            "ADD first",
            "ADD second"
        ]
    );
    assert!(rig.recorded(), "{:?}", rig.sb.cache_entries());
}

/// Four `cnitool add` and two `cnitool del` at once, free running, eight
/// rounds: every ADD attaches or answers 909, every DEL succeeds; in the
/// plugins' runs an ADD is never followed by another ADD (a DEL comes
/// between), and the record is there exactly when the last run was an ADD.
#[test]
fn racing_cnitool_adds_and_dels_never_add_twice_and_the_record_follows_the_last() {
    for round in 0..8 {
        let rig = Rig::new(None);
        let children: Vec<(&str, Child)> = ["add", "del", "add", "add", "del", "add"]
            .into_iter()
            .map(|verb| (verb, rig.start(verb)))
            .collect();
        for (verb, child) in children {
            let out = finish(child);
            if verb == "add" && out.status.code() != Some(0) {
                assert_refused(&out);
            } else {
                assert_ok(&out);
            }
        }
        // One plugin's view is enough: `first` runs first on ADD, last on DEL.
        let firsts: Vec<String> = rig
            .runs()
            .into_iter()
            .filter(|r| r.ends_with(" first"))
            .collect();
        for pair in firsts.windows(2) {
            assert_ne!(
                pair,
                ["ADD first", "ADD first"],
                "round {round}: {firsts:?}"
            );
        }
        let last_add = firsts.last().is_some_and(|r| r == "ADD first");
        assert_eq!(rig.recorded(), last_add, "round {round}: {firsts:?}");
    }
}
