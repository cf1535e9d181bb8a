//! Fault injection: every way a plugin (or what surrounds it) can fail, run
//! through the library (`cni_async::Cni` with rollback) and through the
//! daemon (the typed client), with the same properties asserted for each.
//!
//! Every case is a chain `[bridge (host-local IPAM), <faulty plugin>]` on a
//! bridge and subnet of this test's own, so that an ADD fault happens after
//! a real plugin allocated an IP and made a veth. For each fault:
//!
//! 1. the caller gets a typed error (variant or HTTP status, CNI code, a
//!    message naming the cause) within the deadline plus the slack (the
//!    kill grace and a margin a busy machine keeps);
//! 2. no process of the plugin's process group is left (nor any process
//!    running from the test's plugin dir);
//! 3. a failed ADD leaves no cache file (and no temp file) behind, and the
//!    daemon no ADD intent;
//! 4. host-local holds no IP, and the bridge has no port, after the rollback
//!    (ADD faults) or the DEL (DEL faults);
//! 5. for faults of the surroundings (cache read-only or full, text file
//!    busy): once the fault is gone, the same attachment ADDs and DELs.
//!
//! Plugins orphaned by a `kill -9` of the daemon: `daemon_orphans.rs`.
//!
//! DEL faults (a corrupt or truncated cache file, the conf file removed,
//! the netns deleted) follow a successful ADD and must not stop the DEL:
//! property 1 becomes "the DEL succeeds within the deadline plus the slack".
//!
//! The executor's failure modes are also tested one by one, with more
//! detail, in `cni-async/tests/exec_*.rs`, the operations' in
//! `cni-async/tests/ops_*.rs` and `cache_*.rs`, the daemon's in
//! `cnid/tests/daemon_*.rs`; `docs/reliability.md` maps each guarantee to
//! its tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs};
use crate::support::executable::{copy_executable, write_executable};
use crate::support::gate::LOAD_MARGIN;
use crate::support::netns::{LinkGuard, SubnetLease, TempNetns, host_local_ips};
use crate::support::require_root;
use crate::support::tmpfs::Tmpfs;
use cni_async::{CallOptions, Cni, Error, PluginExit, RawExec, Timeouts};
use cni_core::{NetworkConfigList, RuntimeConf};
use cnid::api::AttachmentRequest;
use cnid::client::{Client, ClientError};
use serde_json::{Value, json};

/// The deadline of every faulty operation (the real bridge plugin, ~100 ms
/// on a quiet machine, must finish within it on a busy one; the hanging
/// fakes hang 1000 s).
const DEADLINE: Duration = Duration::from_secs(2);
/// What the answer may take beyond it: the kill grace, the rollback, and
/// what a busy machine adds.
const SLACK: Duration = RawExec::DEFAULT_KILL_GRACE.saturating_add(LOAD_MARGIN);
const PLUGIN_DIR: &str = "/usr/lib/cni";
// The fast, well-behaved plugin (prints its prevResult on ADD).
use crate::support::noop::NOOP;
/// The default stdout cap of the executor.
const STDOUT_CAP: usize = 16 * 1024 * 1024;

// ---------------------------------------------------------------- the table

/// The second plugin of a case's chain.
#[derive(Debug, Clone, Copy)]
enum Plugin {
    /// A shell fake: runs `add` on ADD, succeeds quietly on every other verb,
    /// and records its pid (= its process group) first.
    Script(&'static str),
    /// A file with exactly this content and mode.
    File(&'static str, u32),
    /// Not installed anywhere.
    Absent,
    /// A copy of `cni-noop`.
    Good,
}

/// What surrounds the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Env {
    Plain,
    /// The plugin's stdin is padded to 256 KiB (for a slow reader).
    BigStdin,
    /// The plugin binary is held open for writing during the ADD.
    TextBusy,
    /// The cache dir is a read-only tmpfs.
    CacheReadOnly,
    /// The cache dir is a full tmpfs.
    CacheFull,
    /// After the ADD, the cache file is overwritten with garbage.
    CorruptCache,
    /// After the ADD, the cache file is cut in half.
    TruncatedCache,
    /// After the ADD, the network's conf file is removed.
    ConfRemoved,
    /// After the ADD, the container's netns is deleted.
    NetnsDeleted,
}

/// The answer a case must get.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The ADD fails: the library's error passes `lib`, both paths report
    /// CNI code `code` and a message containing `msg`, the daemon answers
    /// HTTP `http`.
    AddFails {
        lib: fn(&Error) -> bool,
        code: u32,
        http: u16,
        msg: &'static str,
    },
    /// The ADD succeeds; after the fault, the DEL succeeds.
    DelSucceeds,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    plugin: Plugin,
    env: Env,
    expect: Expect,
}

fn os_error(e: &Error, errno: i32) -> bool {
    match e {
        Error::Spawn { source, .. } | Error::Cache { source, .. } => {
            source.raw_os_error() == Some(errno)
        }
        _ => false,
    }
}

fn cases() -> Vec<Case> {
    use Expect::{AddFails, DelSucceeds};
    vec![
        Case {
            name: "hang",
            plugin: Plugin::Script("sleep 1000"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::Timeout { plugin_type, .. } if plugin_type == "f-hang"),
                code: 11,
                http: 504,
                msg: "timed out",
            },
        },
        Case {
            name: "hang-grandchild-holds-pipes",
            // The backgrounded sleep inherits stdout and stderr: pipe EOF
            // never comes while it lives.
            plugin: Plugin::Script("(exec sleep 1000) &\necho $! >> \"$PIDS\"\nsleep 1000"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::Timeout { .. }),
                code: 11,
                http: 504,
                msg: "timed out",
            },
        },
        Case {
            name: "crash-sigsegv",
            plugin: Plugin::Script("ulimit -c 0\necho 'about to crash' >&2\nkill -SEGV $$"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| {
                    matches!(
                        e,
                        Error::Plugin {
                            status: PluginExit::Signal(11),
                            ..
                        }
                    )
                },
                code: 999,
                http: 502,
                msg: "SIGSEGV",
            },
        },
        Case {
            name: "exit-0-without-output",
            plugin: Plugin::Script("exit 0"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::PluginOutput { .. }),
                code: 6,
                http: 502,
                msg: "printed no result",
            },
        },
        Case {
            name: "exit-1-without-output",
            plugin: Plugin::Script("echo 'boom: no such thing' >&2\nexit 1"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| {
                    matches!(
                        e,
                        Error::Plugin {
                            status: PluginExit::Code(1),
                            error: None,
                            ..
                        }
                    )
                },
                code: 999,
                http: 502,
                msg: "boom: no such thing",
            },
        },
        Case {
            name: "garbage-output",
            plugin: Plugin::Script("printf 'garbage {\\001\\377 not json'"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::PluginOutput { .. }),
                code: 6,
                http: 502,
                msg: "invalid reply",
            },
        },
        Case {
            name: "output-64mib",
            plugin: Plugin::Script("head -c 67108864 /dev/zero"),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::OutputTooLarge { limit, .. } if *limit == STDOUT_CAP),
                code: 5,
                http: 502,
                msg: "wrote more than 16777216 bytes",
            },
        },
        Case {
            name: "slow-stdin-reader",
            // 64 bytes every 100 ms of a 256 KiB stdin: our write blocks
            // long past the deadline.
            plugin: Plugin::Script(
                "while :; do dd bs=64 count=1 of=/dev/null 2>/dev/null; sleep 0.1; done",
            ),
            env: Env::BigStdin,
            expect: AddFails {
                lib: |e| matches!(e, Error::Timeout { .. }),
                code: 11,
                http: 504,
                msg: "timed out",
            },
        },
        Case {
            name: "exec-missing",
            plugin: Plugin::Absent,
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::PluginNotFound { skipped, .. } if skipped.is_empty()),
                code: 7,
                http: 503,
                msg: "not found",
            },
        },
        Case {
            name: "exec-not-executable",
            plugin: Plugin::File("#!/bin/sh\nexit 0\n", 0o644),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| matches!(e, Error::PluginNotFound { skipped, .. } if skipped.len() == 1),
                code: 7,
                http: 503,
                msg: "not executable",
            },
        },
        Case {
            name: "exec-text-file-busy",
            plugin: Plugin::Good,
            env: Env::TextBusy,
            expect: AddFails {
                lib: |e| {
                    os_error(e, libc::ETXTBSY)
                        && matches!(e, Error::Spawn { attempts, .. } if *attempts > 1)
                },
                code: 5,
                http: 502,
                msg: "busy",
            },
        },
        Case {
            name: "exec-bad-interpreter",
            plugin: Plugin::File("#!/nonexistent/interpreter\n", 0o755),
            env: Env::Plain,
            expect: AddFails {
                lib: |e| os_error(e, libc::ENOENT),
                code: 5,
                http: 502,
                msg: "cannot execute plugin",
            },
        },
        Case {
            name: "cache-read-only",
            plugin: Plugin::Good,
            env: Env::CacheReadOnly,
            expect: AddFails {
                lib: |e| os_error(e, libc::EROFS),
                code: 5,
                http: 500,
                msg: "Read-only file system",
            },
        },
        Case {
            name: "cache-full",
            plugin: Plugin::Good,
            env: Env::CacheFull,
            expect: AddFails {
                lib: |e| os_error(e, libc::ENOSPC),
                code: 5,
                http: 500,
                msg: "No space left on device",
            },
        },
        Case {
            name: "del-corrupt-cache",
            plugin: Plugin::Good,
            env: Env::CorruptCache,
            expect: DelSucceeds,
        },
        Case {
            name: "del-truncated-cache",
            plugin: Plugin::Good,
            env: Env::TruncatedCache,
            expect: DelSucceeds,
        },
        Case {
            name: "del-conf-removed",
            plugin: Plugin::Good,
            env: Env::ConfRemoved,
            expect: DelSucceeds,
        },
        Case {
            name: "del-netns-deleted",
            plugin: Plugin::Good,
            env: Env::NetnsDeleted,
            expect: DelSucceeds,
        },
    ]
}

// ------------------------------------------------------------ the world

/// One path's resources: temp dirs, a bridge name, a subnet.
struct World {
    dirs: Dirs,
    bridge: LinkGuard,
    subnet: SubnetLease,
}

impl World {
    fn new() -> World {
        cni_test_support::assert_root("the fault World creates namespaces and a bridge");
        crate::support::require_plugins(&["bridge", "host-local"]);
        World {
            dirs: Dirs::new(),
            bridge: LinkGuard::new(),
            subnet: SubnetLease::new(),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dirs.data.join("host-local")
    }

    fn pids_file(&self, case: &Case) -> PathBuf {
        self.dirs.data.join(format!("pids-{}", case.name))
    }

    fn plugin_path(&self, case: &Case) -> PathBuf {
        self.dirs.bin.join(plugin_type(case))
    }

    /// Installs the case's plugin.
    fn install(&self, case: &Case) {
        let path = self.plugin_path(case);
        match case.plugin {
            Plugin::Absent => {}
            Plugin::Good => {
                copy_executable(AsRef::<Path>::as_ref(&NOOP), &path, 0o755);
            }
            Plugin::File(content, mode) => {
                write_executable(&path, content.as_bytes(), mode);
            }
            Plugin::Script(add) => {
                let pids = self.pids_file(case);
                let body = format!(
                    "#!/bin/sh\nPIDS='{pids}'\necho $$ >> \"$PIDS\"\n\
                     case \"$CNI_COMMAND\" in\n\
                     ADD)\n{add}\n;;\n\
                     VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}}';;\n\
                     *) cat > /dev/null;;\n\
                     esac\n",
                    pids = pids.display()
                );
                write_executable(&path, body.as_bytes(), 0o755);
            }
        }
    }

    fn conflist(&self, case: &Case) -> Value {
        let mut faulty = json!({"type": plugin_type(case)});
        if case.env == Env::BigStdin {
            faulty["pad"] = Value::String("x".repeat(256 * 1024));
        }
        json!({
            "cniVersion": "1.0.0",
            "name": net_name(case),
            "plugins": [
                {"type": "bridge", "bridge": self.bridge.name(), "isGateway": false, "ipMasq": false,
                 "ipam": {"type": "host-local", "dataDir": self.data_dir(),
                          "ranges": [[{"subnet": self.subnet.cidr()}]]}},
                faulty
            ]
        })
    }

    fn conf_file(&self, case: &Case) -> PathBuf {
        self.dirs.conf.join(format!("{}.conflist", net_name(case)))
    }

    fn bridge_ports(&self) -> Vec<String> {
        fs::read_dir(format!("/sys/class/net/{}/brif", self.bridge.name()))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn plugin_type(case: &Case) -> String {
    format!("f-{}", case.name)
}

fn net_name(case: &Case) -> String {
    format!("f-{}", case.name)
}

fn container_id(case: &Case) -> String {
    format!("fc-{}", case.name)
}

/// Holds a file open for writing: exec of it fails with ETXTBSY.
struct HeldForWriting(#[allow(dead_code)] fs::File);

// ------------------------------------------------------------ processes

fn proc_state(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let _ppid = f.next()?;
    let pgrp = f.next()?.parse().ok()?;
    Some((state, pgrp))
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Live (not zombie) processes in any of `groups`, or whose command line
/// mentions `fragment`.
fn leftovers(groups: &[u32], fragment: &str) -> Vec<String> {
    let mut out = Vec::new();
    for pid in all_pids() {
        let Some((state, pgrp)) = proc_state(pid) else {
            continue;
        };
        if state == 'Z' || state == 'X' {
            continue;
        }
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if groups.contains(&pgrp) || cmdline.contains(fragment) {
            out.push(format!("{pid} (group {pgrp}): {}", cmdline.trim_end()));
        }
    }
    out
}

/// Waits up to 5 s for every process of the case to be gone (processes
/// already killed may need a turn on a busy CPU); returns what is left.
async fn wait_no_leftovers(groups: &[u32], fragment: &str) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let left = leftovers(groups, fragment);
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sorted names in `dir` (empty if it does not exist).
fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn recorded_pids(path: &Path) -> Vec<u32> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Kills whatever a failing case left, so the test binary can go on.
fn kill_groups(groups: &[u32]) {
    let ours = nix::unistd::getpgrp().as_raw();
    for &g in groups {
        if let Ok(raw) = i32::try_from(g)
            && raw > 1
            && raw != ours
        {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(raw),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

// ------------------------------------------------------------ the paths

/// The library or the daemon, behind one interface.
enum Via {
    Library,
    Daemon { client: Client, _daemon: Daemon },
}

/// What one call returned, path-independently.
#[derive(Debug)]
enum Answer {
    Ok,
    Failed {
        /// The library's error (None through the daemon).
        lib: Option<Error>,
        http: Option<u16>,
        code: u32,
        msg: String,
    },
}

impl Answer {
    fn of_lib<T>(r: Result<T, Error>) -> Answer {
        match r {
            Ok(_) => Answer::Ok,
            Err(e) => Answer::Failed {
                code: e.code(),
                msg: cni_core::error::Chain(&e).to_string(),
                lib: Some(e),
                http: None,
            },
        }
    }

    fn of_client<T>(r: Result<T, ClientError>) -> Answer {
        match r {
            Ok(_) => Answer::Ok,
            Err(ClientError::Api { status, error, .. }) => Answer::Failed {
                lib: None,
                http: Some(status),
                code: error.code,
                msg: error.msg,
            },
            Err(e) => Answer::Failed {
                lib: None,
                http: None,
                code: 0,
                msg: format!("no answer: {e}"),
            },
        }
    }

    fn brief(&self) -> String {
        match self {
            Answer::Ok => "ok".into(),
            Answer::Failed { http, code, .. } => match http {
                Some(h) => format!("HTTP {h}, code {code}"),
                None => format!("code {code}"),
            },
        }
    }
}

struct Runner {
    // Declared first: the daemon goes before the dirs it uses.
    path: Via,
    world: World,
    violations: Vec<String>,
    table: Vec<String>,
}

impl Runner {
    fn label(&self) -> &'static str {
        match self.path {
            Via::Library => "library",
            Via::Daemon { .. } => "daemon",
        }
    }

    /// The cache dir the case's operations use.
    fn cache_dir(&self, case: &Case) -> PathBuf {
        match self.path {
            Via::Library => self.world.dirs.root().join("lib-cache").join(case.name),
            Via::Daemon { .. } => self.world.dirs.cache.clone(),
        }
    }

    fn cni(&self, case: &Case) -> Cni {
        Cni::builder()
            .plugin_dirs([self.world.dirs.bin.clone(), PathBuf::from(PLUGIN_DIR)])
            .cache_dir(self.cache_dir(case))
            .timeouts(Timeouts::uniform(Duration::from_secs(20)))
            .build()
    }

    fn opts() -> CallOptions {
        CallOptions {
            timeout: Some(DEADLINE),
            rollback: true,
        }
    }

    fn request(case: &Case, netns: &str) -> AttachmentRequest {
        let mut req = AttachmentRequest::new(container_id(case), netns, "eth0");
        req.timeout_ms = Some(u64::try_from(DEADLINE.as_millis()).expect("ms"));
        req
    }

    async fn add(&self, case: &Case, list: &NetworkConfigList, netns: &str) -> Answer {
        match &self.path {
            Via::Library => {
                let rt = RuntimeConf::new(container_id(case), netns, "eth0");
                Answer::of_lib(
                    self.cni(case)
                        .add_network_list(list, &rt)
                        .options(&Self::opts())
                        .await,
                )
            }
            Via::Daemon { client, .. } => Answer::of_client(
                client
                    .add(&net_name(case), &Self::request(case, netns))
                    .await,
            ),
        }
    }

    async fn del(&self, case: &Case, list: &NetworkConfigList, netns: &str) -> Answer {
        match &self.path {
            Via::Library => {
                let rt = RuntimeConf::new(container_id(case), netns, "eth0");
                let cni = self.cni(case);
                if case.env == Env::ConfRemoved {
                    // The caller no longer has the configuration.
                    Answer::of_lib(
                        cni.del_cached(&net_name(case), &rt)
                            .options(&Self::opts())
                            .await,
                    )
                } else {
                    Answer::of_lib(cni.del_network_list(list, &rt).options(&Self::opts()).await)
                }
            }
            Via::Daemon { client, .. } => Answer::of_client(
                client
                    .del(&net_name(case), &Self::request(case, netns))
                    .await,
            ),
        }
    }

    fn violation(&mut self, case: &Case, what: String) {
        self.violations
            .push(format!("{} via the {}: {what}", case.name, self.label()));
    }

    fn results_dir(&self, case: &Case) -> PathBuf {
        self.cache_dir(case).join("results")
    }

    /// The files in the cache's results dir that belong to this case's
    /// attachment (or are temp files).
    fn cache_files(&self, case: &Case) -> Vec<String> {
        let mine = format!("{}-{}-eth0", net_name(case), container_id(case));
        dir_names(&self.results_dir(case))
            .into_iter()
            .filter(|n| n.contains(&mine) || n.starts_with('.'))
            .collect()
    }

    async fn run(&mut self, case: &Case) {
        self.world.install(case);
        let list =
            NetworkConfigList::from_value(&self.world.conflist(case)).expect("conflist parses");
        let mut ns = Some(TempNetns::new());
        let data_dir = self.world.data_dir();
        let net = net_name(case);
        let pids_file = self.world.pids_file(case);

        // The environment of the fault.
        let mut tmpfs = None;
        let mut held = None;
        match case.env {
            Env::CacheReadOnly => {
                let t = Tmpfs::mount(&self.cache_dir(case));
                t.read_only();
                tmpfs = Some(t);
            }
            Env::CacheFull => {
                let t = Tmpfs::mount(&self.cache_dir(case));
                t.fill();
                tmpfs = Some(t);
            }
            Env::TextBusy => {
                held = Some(HeldForWriting(
                    fs::OpenOptions::new()
                        .write(true)
                        .open(self.world.plugin_path(case))
                        .expect("open the plugin for writing"),
                ));
            }
            _ => {}
        }

        let netns = ns.as_ref().expect("netns").path();
        let started = Instant::now();
        let answer = self.add(case, &list, &netns).await;
        let mut elapsed = started.elapsed();
        drop(held);

        let answer = match case.expect {
            Expect::AddFails { .. } => answer,
            Expect::DelSucceeds => {
                if !matches!(answer, Answer::Ok) {
                    self.violation(case, format!("the ADD before the fault failed: {answer:?}"));
                    return;
                }
                let ips = host_local_ips(&data_dir, &net);
                if ips.len() != 1 {
                    self.violation(case, format!("the ADD holds {ips:?}, not one IP"));
                }
                let cache_file = self
                    .results_dir(case)
                    .join(format!("{net}-{}-eth0", container_id(case)));
                match case.env {
                    Env::CorruptCache => {
                        fs::write(
                            &cache_file,
                            b"{\"kind\":\"cniCacheV1\",\"containerId\":\x00\xff",
                        )
                        .expect("corrupt the cache file");
                    }
                    Env::TruncatedCache => {
                        let bytes = fs::read(&cache_file).expect("read the cache file");
                        fs::write(&cache_file, &bytes[..bytes.len() / 2])
                            .expect("truncate the cache file");
                    }
                    Env::ConfRemoved => {
                        if let Via::Daemon { client, .. } = &self.path {
                            fs::remove_file(self.world.conf_file(case))
                                .expect("remove the conf file");
                            let end = Instant::now() + Duration::from_secs(10);
                            while client.network(&net).await.is_ok() {
                                assert!(Instant::now() < end, "the daemon never dropped {net}");
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    Env::NetnsDeleted => {
                        // Dropping the guard runs `ip netns del`.
                        drop(ns.take());
                    }
                    _ => {}
                }
                // The same path, also when it no longer exists.
                let started = Instant::now();
                let answer = self.del(case, &list, &netns).await;
                elapsed = started.elapsed();
                if matches!(case.env, Env::CorruptCache | Env::TruncatedCache) {
                    let aside = dir_names(&self.cache_dir(case).join("corrupt"));
                    if !aside.iter().any(|n| n.contains(&net)) {
                        self.violation(
                            case,
                            format!("the bad cache file was not moved aside ({aside:?})"),
                        );
                    }
                }
                answer
            }
        };

        // 1. The answer, within the deadline plus the slack.
        if elapsed > DEADLINE + SLACK {
            self.violation(case, format!("answered after {elapsed:?}"));
        }
        match (case.expect, &answer) {
            (Expect::DelSucceeds, Answer::Ok) => {}
            (Expect::DelSucceeds, other) => {
                self.violation(case, format!("the DEL failed: {other:?}"));
            }
            (Expect::AddFails { .. }, Answer::Ok) => {
                self.violation(case, "the ADD succeeded".into());
            }
            (
                Expect::AddFails {
                    lib,
                    code,
                    http,
                    msg,
                },
                Answer::Failed {
                    lib: got_lib,
                    http: got_http,
                    code: got_code,
                    msg: got_msg,
                },
            ) => {
                if let Some(e) = got_lib
                    && !lib(e.innermost())
                {
                    self.violation(case, format!("unexpected error: {e:?}"));
                }
                // The library runs with rollback: a failed ADD was undone,
                // and its error must not say a DEL is owed.
                if let Some(e) = got_lib
                    && e.del_owed()
                {
                    self.violation(case, format!("rolled back, yet a DEL owed: {e:?}"));
                }
                if matches!(self.path, Via::Daemon { .. }) && *got_http != Some(http) {
                    self.violation(case, format!("HTTP {got_http:?}, not {http}: {got_msg}"));
                }
                if *got_code != code {
                    self.violation(case, format!("code {got_code}, not {code}: {got_msg}"));
                }
                if !got_msg.contains(msg) {
                    self.violation(
                        case,
                        format!("message {got_msg:?} does not mention {msg:?}"),
                    );
                }
            }
        }

        // 2. No process of the plugin's group, none from our plugin dir.
        let groups = recorded_pids(&pids_file);
        let bin = format!("{}/", self.world.dirs.bin.display());
        let left = wait_no_leftovers(&groups, &bin).await;
        if !left.is_empty() {
            kill_groups(&groups);
            self.violation(case, format!("processes left: {left:?}"));
        }

        // 3. No cache file (nor temp file) for the attachment; no intent.
        let files = self.cache_files(case);
        if !files.is_empty() {
            self.violation(case, format!("cache files left: {files:?}"));
        }
        if matches!(self.path, Via::Daemon { .. }) {
            let intents: Vec<String> = self
                .world
                .dirs
                .intents()
                .into_iter()
                .filter(|i| i.starts_with(&format!("{net}:")))
                .collect();
            if !intents.is_empty() {
                self.violation(case, format!("ADD intents left: {intents:?}"));
            }
        }
        drop(tmpfs);

        // Once the fault is gone, the same attachment can be added (and
        // deleted): the failed ADD left nothing that refuses it (regression:
        // the daemon kept the intent of a rolled-back ADD after a cache
        // error, and answered 409 to every later ADD until a DEL).
        if matches!(
            case.env,
            Env::CacheReadOnly | Env::CacheFull | Env::TextBusy
        ) {
            let again = self.add(case, &list, &netns).await;
            if !matches!(again, Answer::Ok) {
                self.violation(case, format!("ADD after the fault cleared: {again:?}"));
            }
            let del = self.del(case, &list, &netns).await;
            if !matches!(del, Answer::Ok) {
                self.violation(case, format!("DEL after the fault cleared: {del:?}"));
            }
        }

        // 4. No IP held, no veth on the bridge, no eth0 in the netns.
        let ips = host_local_ips(&data_dir, &net);
        if !ips.is_empty() {
            self.violation(case, format!("host-local still holds {ips:?}"));
        }
        let allocated = data_dir.join(&net).join("last_reserved_ip.0").exists();
        let bridge_ran = case.env != Env::CacheReadOnly;
        if bridge_ran && !allocated {
            self.violation(
                case,
                "the bridge plugin never allocated an IP: the case proves nothing".into(),
            );
        }
        // A veth whose peer's netns was deleted goes with the netns, which
        // the kernel tears down asynchronously: give it a moment.
        let end = Instant::now() + Duration::from_secs(10);
        let mut ports = self.world.bridge_ports();
        while !ports.is_empty() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(20)).await;
            ports = self.world.bridge_ports();
        }
        if !ports.is_empty() {
            self.violation(case, format!("veths left on the bridge: {ports:?}"));
        }
        if let Some(ns) = &ns
            && ns.exec("ip", &["link", "show", "eth0"]).status.success()
        {
            self.violation(case, "eth0 left in the container's netns".into());
        }
        self.table.push(format!(
            "{:<28} {:<8} {:<17} {:>5} ms; plugin groups {}, left {}; IPs left {}; cache files left {}",
            case.name,
            self.label(),
            answer.brief(),
            elapsed.as_millis(),
            groups.len(),
            left.len(),
            ips.len(),
            files.len()
        ));
    }
}

impl Runner {
    async fn run_all(mut self) {
        for case in cases() {
            self.run(&case).await;
        }
        println!("fault injection via the {}:", self.label());
        for line in &self.table {
            println!("  {line}");
        }
        assert!(
            self.violations.is_empty(),
            "{} violation(s):\n{}",
            self.violations.len(),
            self.violations.join("\n")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_through_the_library_with_rollback() {
    require_root!();
    let runner = Runner {
        path: Via::Library,
        world: World::new(),
        violations: Vec::new(),
        table: Vec::new(),
    };
    runner.run_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_through_the_daemon() {
    require_root!();
    let world = World::new();
    // Every case's plugin and network exist before the daemon starts.
    for case in cases() {
        world.install(&case);
        world.dirs.conf(
            &format!("{}.conflist", net_name(&case)),
            &world.conflist(&case),
        );
    }
    let daemon = Daemon::start(&world.dirs, &[]);
    let client = daemon.client().await;
    let runner = Runner {
        path: Via::Daemon {
            client,
            _daemon: daemon,
        },
        world,
        violations: Vec::new(),
        table: Vec::new(),
    };
    runner.run_all().await;
}
