//! GC through the real daemon, hardened: GC of one network never
//! touches another network's ADD intents (not even the temp file of one
//! being written); the request's deadline bounds the whole GC, hanging
//! DELs included, so operations queued behind it still run; an attachment
//! whose DEL the plugin refuses is named in `failed` and does not stop the
//! others; and no lock file is left for attachments that do not exist.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, eventually, eventually_async, kill_group, post};
use cni_core::stdin::GcAttachment;
use cnid::api::{AttachmentRequest, GcRequest};
use cnid::client::Client;
use serde_json::json;

/// A plugin steered by marker files in `data`: ADD fails while `add-fail`
/// exists; DEL appends its pid to `pids` and hangs while `del-hang` exists,
/// fails while `del-fail` exists; ADD and DEL refuse `CNI_ARGS` holding
/// `BAD=1` as the bridge plugin refuses unknown args. Everything else
/// succeeds (ADD with a result).
fn steered_plugin(data: &Path) -> String {
    format!(
        r#"cat > /dev/null
D='{data}'
refuse() {{ printf '{{"cniVersion":"1.0.0","code":4,"msg":"ARGS: unknown args [\"BAD\"]"}}'; exit 1; }}
case "$CNI_COMMAND" in
ADD)
  case ";$CNI_ARGS;" in *";BAD=1;"*) refuse;; esac
  if [ -e "$D/add-fail" ]; then printf '{{"cniVersion":"1.0.0","code":120,"msg":"add failed"}}'; exit 1; fi
  printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.219.0.2/24"}}]}}';;
DEL)
  case ";$CNI_ARGS;" in *";BAD=1;"*) refuse;; esac
  if [ -e "$D/del-hang" ]; then echo $$ >> "$D/pids"; sleep 1000; fi
  if [ -e "$D/del-fail" ]; then printf '{{"cniVersion":"1.0.0","code":121,"msg":"del failed"}}'; exit 1; fi;;
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac
exit 0"#,
        data = data.display()
    )
}

fn setup(networks: &[(&str, &str)]) -> Dirs {
    let dirs = Dirs::new();
    dirs.plugin("steered", &steered_plugin(&dirs.data));
    for (i, (name, version)) in networks.iter().enumerate() {
        dirs.conf(
            &format!("{i:02}-{name}.conflist"),
            &json!({"cniVersion": version, "name": name, "plugins": [{"type": "steered"}]}),
        );
    }
    dirs
}

fn mark(dirs: &Dirs, name: &str, on: bool) {
    let p = dirs.data.join(name);
    if on {
        std::fs::write(&p, b"").unwrap();
    } else {
        let _ = std::fs::remove_file(&p);
    }
}

fn pids(dirs: &Dirs) -> Vec<i32> {
    std::fs::read_to_string(dirs.data.join("pids"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills the process groups of the hanging DELs (each plugin leads its
/// own group), also when the test fails.
struct HangReaper(PathBuf);

impl Drop for HangReaper {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(&self.0)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
        {
            kill_group(pid);
        }
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Each container on a netns path of its own (the daemon refuses a
/// request on another container's netns and ifname).
fn req(dirs: &Dirs, cid: &str) -> AttachmentRequest {
    AttachmentRequest::new(cid, dirs.netns(cid), "eth0")
}

fn gc_all(timeout_ms: Option<u64>) -> GcRequest {
    GcRequest {
        valid_attachments: Vec::new(),
        timeout_ms,
    }
}

fn ids(list: &[GcAttachment]) -> Vec<String> {
    list.iter().map(|a| a.container_id.clone()).collect()
}

/// Defect: GC scanned the whole intents dir and deleted every dot-file in
/// it as a crash leftover, including the temp file of an intent another
/// ADD was writing, whose rename then failed (500). Now GC of `gcx` reads
/// `gcx`'s files only: a planted temp file and an unreadable intent of
/// `busy` stay where they are, and ADD/DEL loops on `busy` beside GC loops
/// on `gcx` all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_of_one_network_never_breaks_adds_on_another() {
    const LOOPS: usize = 3;
    const CYCLES: usize = 15;
    const GC_LOOPS: usize = 2;
    const MIN_GCS: usize = 5;
    let dirs = setup(&[("busy", "1.1.0"), ("gcx", "1.1.0")]);
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;

    // What an ADD of `busy` being recorded looks like, and an unreadable
    // intent of `busy`: GC of `gcx` must leave both alone.
    let intents = dirs.state.join("intents");
    let planted_tmp = intents.join(".busy:planted:eth0.json.tmp-1");
    let planted_bad = intents.join("busy:unreadable:eth0.json");
    std::fs::write(&planted_tmp, b"{\"half\":").unwrap();
    std::fs::write(&planted_bad, b"{not json").unwrap();
    client.gc("gcx", &gc_all(None)).await.expect("GC of gcx");
    assert!(
        planted_tmp.exists(),
        "GC of gcx removed the temp file of an intent of busy"
    );
    assert!(
        planted_bad.exists(),
        "GC of gcx moved an intent file of busy aside"
    );

    // The loops.
    let adds_done = Arc::new(AtomicBool::new(false));
    let gcs = Arc::new(AtomicUsize::new(0));
    let mut gc_tasks = Vec::new();
    for _ in 0..GC_LOOPS {
        let (cl, done, gcs) = (client.clone(), adds_done.clone(), gcs.clone());
        gc_tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            let mut mine = 0;
            while !(done.load(Ordering::SeqCst) && mine >= MIN_GCS) {
                if let Err(e) = cl.gc("gcx", &gc_all(None)).await {
                    errors.push(format!("GC: {e}"));
                }
                mine += 1;
                gcs.fetch_add(1, Ordering::SeqCst);
            }
            errors
        }));
    }
    let mut add_tasks = Vec::new();
    for l in 0..LOOPS {
        let cl = client.clone();
        let reqs: Vec<AttachmentRequest> = (0..CYCLES)
            .map(|i| req(&dirs, &format!("busy-{l}-{i}")))
            .collect();
        add_tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for (i, r) in reqs.into_iter().enumerate() {
                if let Err(e) = cl.add("busy", &r).await {
                    errors.push(format!("ADD busy-{l}-{i}: {e}"));
                }
                if let Err(e) = cl.del("busy", &r).await {
                    errors.push(format!("DEL busy-{l}-{i}: {e}"));
                }
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for t in add_tasks {
        errors.extend(t.await.unwrap());
    }
    adds_done.store(true, Ordering::SeqCst);
    for t in gc_tasks {
        errors.extend(t.await.unwrap());
    }
    println!(
        "{} ADD/DEL cycles on busy beside {} GCs of gcx: {} errors",
        LOOPS * CYCLES,
        gcs.load(Ordering::SeqCst),
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "{} errors, first ones: {:#?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(planted_tmp.exists() && planted_bad.exists());
    assert!(!intents.join("corrupt").exists());
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
}

/// Defect: each stale DEL got a fresh full deadline, so hanging DELs kept
/// the network's exclusive gate for one deadline each, and an ADD queued
/// behind the GC timed out (504). Now the GC's deadline bounds the whole
/// GC: the hanging DEL is killed at it, the others are not started, all
/// are answered in `failed`, and the queued ADD runs right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deadline_bounds_hanging_dels_and_the_add_queued_behind_it_succeeds() {
    const GC_MS: u64 = 2000;
    /// cnid's kill grace (SIGTERM, then SIGKILL after 1 s).
    const KILL_GRACE: Duration = Duration::from_secs(1);
    const MARGIN: Duration = Duration::from_secs(3);
    let dirs = setup(&[("gcdl", "1.0.0")]);
    let _reaper = HangReaper(dirs.data.join("pids"));
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;

    // Three cached attachments, and two ADDs that failed and could not be
    // rolled back (their intents stay).
    for cid in ["cached-1", "cached-2", "cached-3"] {
        client.add("gcdl", &req(&dirs, cid)).await.expect("ADD");
    }
    mark(&dirs, "add-fail", true);
    mark(&dirs, "del-fail", true);
    for cid in ["intent-1", "intent-2"] {
        let e = client.add("gcdl", &req(&dirs, cid)).await.unwrap_err();
        assert_eq!(e.status(), Some(502), "{e}");
    }
    mark(&dirs, "add-fail", false);
    mark(&dirs, "del-fail", false);
    assert_eq!(
        dirs.intents(),
        ["gcdl:intent-1:eth0.json", "gcdl:intent-2:eth0.json"]
    );
    // From now on every DEL hangs.
    mark(&dirs, "del-hang", true);

    let started = Instant::now();
    let gc = {
        let cl = client.with_request_id("the-gc");
        tokio::spawn(async move {
            let r = cl.gc("gcdl", &gc_all(Some(GC_MS))).await;
            (r, started.elapsed())
        })
    };
    // The GC holds the gate: its first DEL hangs.
    eventually(Duration::from_secs(10), "the first DEL of GC hangs", || {
        !pids(&dirs).is_empty()
    });
    // An ADD arrives behind it, with a deadline shorter than the GC would
    // take if each hanging DEL had its own deadline.
    let add = {
        let cl = client.with_request_id("the-late-add");
        let mut r = req(&dirs, "late");
        r.timeout_ms = Some(8000);
        tokio::spawn(async move { cl.add("gcdl", &r).await })
    };
    eventually_async(
        Duration::from_secs(10),
        "the ADD is queued behind GC",
        || async {
            client
                .operations(None)
                .await
                .unwrap()
                .iter()
                .any(|o| o.request_id == "the-late-add" && o.state == "queued")
        },
    )
    .await;

    let (out, elapsed) = gc.await.unwrap();
    println!(
        "GC with 5 hanging DELs and a {GC_MS} ms deadline answered after {elapsed:?}; DELs started: {}",
        pids(&dirs).len()
    );
    assert!(
        elapsed < Duration::from_millis(GC_MS) + KILL_GRACE + MARGIN,
        "GC took {elapsed:?} with a deadline of {GC_MS} ms"
    );
    let summary = out.expect("GC answers 200 with what it could not delete");
    assert!(summary.deleted.is_empty(), "{summary:?}");
    assert_eq!(
        summary
            .failed
            .iter()
            .map(|f| f.container_id.as_str())
            .collect::<Vec<_>>(),
        ["intent-1", "intent-2", "cached-1", "cached-2", "cached-3"]
    );
    for f in &summary.failed {
        assert_eq!(f.error.code, 11, "{f:?}");
    }
    // The hanging DEL was killed; no other was started.
    let started_dels = pids(&dirs);
    assert_eq!(started_dels.len(), 1, "{started_dels:?}");
    eventually(Duration::from_secs(10), "the hanging DEL is gone", || {
        !started_dels.iter().any(|p| alive(*p))
    });

    add.await
        .unwrap()
        .expect("the ADD queued behind GC succeeds");
    // Nothing was lost: the five are still recorded for the next GC.
    mark(&dirs, "del-hang", false);
    let summary = client
        .gc(
            "gcdl",
            &GcRequest {
                valid_attachments: vec![GcAttachment {
                    container_id: "late".into(),
                    ifname: "eth0".into(),
                }],
                timeout_ms: None,
            },
        )
        .await
        .expect("GC without hanging DELs");
    assert_eq!(
        ids(&summary.deleted),
        ["intent-1", "intent-2", "cached-1", "cached-2", "cached-3"]
    );
    assert!(summary.failed.is_empty(), "{summary:?}");
    assert!(dirs.intents().is_empty());
    assert_eq!(dirs.cached(), ["gcdl-late-eth0"]);
}

/// Defect: an ADD with `CNI_ARGS` the plugin refuses failed, its rollback
/// failed the same way, and its intent made every later GC of the network
/// answer 502 "ARGS: unknown args" without naming the attachment. Now GC
/// deletes the others and answers 200 with the refused one in `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attachment_is_named_and_does_not_poison_gc() {
    let dirs = setup(&[("gcbad", "1.1.0")]);
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    for cid in ["good-1", "good-2"] {
        client.add("gcbad", &req(&dirs, cid)).await.expect("ADD");
    }
    let mut bad = req(&dirs, "bad");
    bad.cni_args = "K=1;BAD=1".into();
    let e = client.add("gcbad", &bad).await.unwrap_err();
    assert_eq!(e.status(), Some(502), "{e}");
    assert!(e.to_string().contains("ARGS: unknown args"), "{e}");
    assert_eq!(dirs.intents(), ["gcbad:bad:eth0.json"]);

    for round in 1..=2 {
        let summary = client
            .gc("gcbad", &gc_all(None))
            .await
            .unwrap_or_else(|e| panic!("GC {round}: {e}"));
        let want: &[&str] = if round == 1 {
            &["good-1", "good-2"]
        } else {
            &[]
        };
        assert_eq!(ids(&summary.deleted), want, "round {round}");
        assert!(summary.plugins_called);
        let [f] = summary.failed.as_slice() else {
            panic!("round {round}: {summary:?}");
        };
        assert_eq!(
            (f.container_id.as_str(), f.ifname.as_str()),
            ("bad", "eth0")
        );
        assert_eq!(f.error.code, 4, "{f:?}");
        assert!(f.error.msg.contains("ARGS: unknown args"), "{f:?}");
    }
    // On the wire.
    let r = post(
        &dirs.socket,
        "/v1/networks/gcbad/gc",
        r#"{"validAttachments":[]}"#,
    );
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["deleted"], json!([]));
    assert_eq!(v["failed"][0]["containerID"], "bad");
    assert_eq!(v["failed"][0]["ifname"], "eth0");
    assert_eq!(v["failed"][0]["error"]["code"], 4);
    assert_eq!(dirs.intents(), ["gcbad:bad:eth0.json"]);
    assert!(dirs.cached().is_empty());
}

/// Defect: every CHECK of an unknown attachment and every failed ADD left
/// a lock file behind for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_files_for_attachments_that_do_not_exist() {
    let dirs = setup(&[("lk", "1.0.0")]);
    let daemon = Daemon::start(&dirs, &[]);
    let client: Client = daemon.client().await;
    let locks = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dirs.cache.join("locks"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    for i in 0..30 {
        let e = client
            .check("lk", &req(&dirs, &format!("unknown-{i}")))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(404), "{e}");
    }
    mark(&dirs, "add-fail", true);
    for i in 0..5 {
        let e = client
            .add("lk", &req(&dirs, &format!("failed-{i}")))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(502), "{e}");
    }
    mark(&dirs, "add-fail", false);
    for i in 0..5 {
        let r = req(&dirs, &format!("cycle-{i}"));
        client.add("lk", &r).await.expect("ADD");
        assert_eq!(locks(), [format!("lk-cycle-{i}-eth0.lock")]);
        client.del("lk", &r).await.expect("DEL");
    }
    assert_eq!(locks(), Vec::<String>::new());
}
