//! A plugin's stderr on success reaches the caller (the sink set with
//! `CniBuilder::plugin_stderr`) and a tracing event naming the plugin, verb
//! and network, escaped and capped; 300 KB of it cannot deadlock the run; a
//! failing plugin keeps its stderr in the error, as libcni does.

mod support;

use cni_test_support::log::LogBuf;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cni_async::exec::{LOG_STDERR_MAX, PluginStderr};
use cni_async::{Cni, Error, OutputLimits, RawExec};
use cni_core::Command;
use serde_json::json;
use support::fake::{Fake, RIG_KILL_GRACE, Response, Rig, conflist, runtime, write_file};

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.0.2/24"}]}"#;

/// Margin a loaded 2-core machine keeps on top of what the code bounds.
const LOAD_MARGIN: Duration = Duration::from_secs(20);
/// The operations' deadline in these tests.
const DEADLINE: Duration = Duration::from_secs(30);

/// What the sink was handed, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    plugin_type: String,
    command: Command,
    network: String,
    container_id: Option<String>,
    ifname: Option<String>,
    bytes: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// The log of this test binary: one global subscriber, installed by every
/// test before it runs anything (a thread-local default would race with
/// the other tests' threads over tracing's per-callsite interest cache).
fn log_buf() -> LogBuf {
    static LOG: OnceLock<LogBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = LogBuf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
        buf
    })
    .clone()
}

fn cni_with_sink(rig: &Rig, limits: OutputLimits) -> (Cni, Log) {
    log_buf();
    let seen: Log = Arc::default();
    let into = seen.clone();
    let cni = Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        // Fake plugins, stand-in netns paths: no namespace check.
        .check_netns(false)
        .cache_dir(&rig.cache_dir)
        .exec(Arc::new(RawExec::new().with_kill_grace(RIG_KILL_GRACE)))
        .timeouts(cni_async::Timeouts::uniform(DEADLINE))
        .output_limits(limits)
        .plugin_stderr(Arc::new(move |s: &PluginStderr<'_>| {
            into.lock().unwrap().push(Seen {
                plugin_type: s.plugin_type.to_owned(),
                command: s.command,
                network: s.network.to_owned(),
                container_id: s.container_id.map(str::to_owned),
                ifname: s.ifname.map(str::to_owned),
                bytes: s.bytes.to_vec(),
            });
        }))
        .build();
    (cni, seen)
}

fn noisy(stdout: &str, stderr: &str) -> Response {
    Response {
        stderr: stderr.as_bytes().to_vec(),
        ..Response::ok(stdout)
    }
}

#[tokio::test]
async fn successful_plugins_stderr_goes_to_the_sink_with_plugin_and_verb() {
    let rig = Rig::new();
    rig.fake(
        "talker",
        &Fake::new(noisy("", "warning: del x\n"))
            .on("ADD", noisy(RESULT, "warning: x\nwarning: y\n")),
    );
    rig.fake(
        "quiet",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    let list = conflist(json!({
        "cniVersion": "1.0.0", "name": "stderrnet",
        "plugins": [{"type": "talker"}, {"type": "quiet"}]
    }));
    let (cni, seen) = cni_with_sink(&rig, OutputLimits::default());
    let rt = runtime("c1", "eth0");
    cni.add_network_list(&list, &rt)
        .await
        .expect("ADD succeeds");
    cni.del_network_list(&list, &rt)
        .await
        .expect("DEL succeeds");

    let seen = seen.lock().unwrap().clone();
    let expect = |command, bytes: &str| Seen {
        plugin_type: "talker".into(),
        command,
        network: "stderrnet".into(),
        container_id: Some("c1".into()),
        ifname: Some("eth0".into()),
        bytes: bytes.as_bytes().to_vec(),
    };
    // The quiet plugin (empty stderr) is not reported.
    assert_eq!(
        seen,
        vec![
            expect(Command::Add, "warning: x\nwarning: y\n"),
            expect(Command::Del, "warning: del x\n"),
        ]
    );
}

#[tokio::test]
async fn big_stderr_before_the_result_neither_deadlocks_nor_is_lost() {
    const BIG: usize = 300 * 1024;
    let rig = Rig::new();
    let blob: Vec<u8> = (0..BIG).map(|i| b"abcdefghij\n"[i % 11]).collect();
    let file = write_file(&rig.dir.scratch("big-stderr"), &blob, 0o644);
    // stderr first (far more than a pipe buffer), then the result: a reader
    // that waited for stdout's end before reading stderr would hang here.
    rig.fake(
        "big",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(RESULT).with_shell(&format!("cat '{}' >&2", file.display())),
        ),
    );
    let list =
        conflist(json!({"cniVersion": "1.0.0", "name": "bignet", "plugins": [{"type": "big"}]}));

    // Default limits (1 MiB of stderr): the sink gets all of it.
    let (cni, seen) = cni_with_sink(&rig, OutputLimits::default());
    let rt = runtime("c1", "eth0");
    let result = tokio::time::timeout(DEADLINE + LOAD_MARGIN, cni.add_network_list(&list, &rt))
        .await
        .expect("ADD ends within its deadline")
        .expect("ADD succeeds");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&result.to_json()).unwrap()["ips"][0]["address"],
        json!("10.219.0.2/24")
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].bytes.len(), BIG);
        assert!(seen[0].bytes == blob, "the sink gets the bytes as written");
    }

    // A smaller stderr cap: the rest is read and dropped, the sink gets the
    // first bytes, and the run still completes.
    let rig2 = Rig::new();
    rig2.fake(
        "big",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(RESULT).with_shell(&format!("cat '{}' >&2", file.display())),
        ),
    );
    let cap = 64 * 1024;
    let (cni, seen) = cni_with_sink(
        &rig2,
        OutputLimits {
            stderr: cap,
            ..OutputLimits::default()
        },
    );
    tokio::time::timeout(DEADLINE + LOAD_MARGIN, cni.add_network_list(&list, &rt))
        .await
        .expect("ADD ends within its deadline")
        .expect("ADD succeeds");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].bytes == blob[..cap], "the first {cap} bytes");
}

#[tokio::test]
async fn failing_plugin_keeps_stderr_in_the_error_not_the_sink() {
    let rig = Rig::new();
    rig.fake(
        "bad",
        &Fake::new(Response::fail(1, "", "boom: no such thing\n")),
    );
    let list =
        conflist(json!({"cniVersion": "1.0.0", "name": "badnet", "plugins": [{"type": "bad"}]}));
    let (cni, seen) = cni_with_sink(&rig, OutputLimits::default());
    let err = cni
        .add_network_list(&list, &runtime("c1", "eth0"))
        .await
        .expect_err("the plugin fails")
        .into_innermost();
    match &err {
        Error::Plugin {
            plugin_type,
            command,
            stderr,
            ..
        } => {
            assert_eq!(plugin_type, "bad");
            assert_eq!(*command, Command::Add);
            assert_eq!(stderr, "boom: no such thing\n");
        }
        other => panic!("expected Error::Plugin, got {other:?}"),
    }
    assert!(err.to_string().contains("boom: no such thing"), "{err}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "failures do not go to the sink"
    );
}

#[tokio::test]
async fn stderr_of_a_success_is_logged_escaped_and_capped_without_a_sink() {
    let buf = log_buf();
    let rig = Rig::new();
    let tail = "Z".repeat(2 * LOG_STDERR_MAX);
    let stderr = format!("warning: \u{1b}[31mred\n{tail}");
    rig.fake(
        "talker",
        &Fake::new(Response::ok("")).on("ADD", noisy(RESULT, &stderr)),
    );
    let list =
        conflist(json!({"cniVersion": "1.0.0", "name": "lognet", "plugins": [{"type": "talker"}]}));
    rig.cni()
        .add_network_list(&list, &runtime("c7", "eth0"))
        .await
        .expect("ADD succeeds");

    let log = buf.text();
    let line = log
        .lines()
        .find(|l| {
            l.contains("plugin succeeded with output on stderr") && l.contains("network=lognet")
        })
        .unwrap_or_else(|| panic!("no stderr event in:\n{log}"));
    assert!(line.contains(" INFO "), "{line}");
    for part in [
        "plugin=talker",
        "command=ADD",
        "network=lognet",
        "container=c7",
        "ifname=eth0",
        &format!("stderr_bytes={}", stderr.len()),
        &format!("shown_bytes={LOG_STDERR_MAX}"),
        "warning: \\u{1b}[31mred\\u{a}ZZZ",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(!line.contains('\u{1b}'), "raw ESC in the log: {line}");
    let zs = line.matches('Z').count();
    assert!(zs < LOG_STDERR_MAX + 100, "capped: {zs} Zs in {line}");
}
