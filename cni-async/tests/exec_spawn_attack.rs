//! Attacks on both spawn paths (our `clone3` and the `tokio::process`
//! fallback): exec failures, concurrent plugins and stray signals, fds.

use std::path::Path;
use std::time::Duration;

use crate::support::fake::{PluginDir, env};
use cni_async::Error;
use cni_async::exec::{ExecRequest, PluginExec, RawExec};
use cni_core::Command;

fn both() -> [RawExec; 2] {
    [RawExec::new(), RawExec::new().with_posix_spawn(true)]
}

async fn run_with(
    exec: &RawExec,
    path: &Path,
    vars: &[(String, String)],
    stdin: &[u8],
) -> Result<cni_async::exec::ExecOutput, Error> {
    let req = ExecRequest::new(
        path,
        "attacked",
        Command::Add,
        vars,
        stdin,
        Duration::from_secs(20),
    );
    exec.exec(req).await
}

/// Each failure to exec is a spawn error naming the plugin, with the
/// kernel's errno as its source, on both paths.
#[tokio::test]
async fn exec_failures_are_spawn_errors_naming_the_plugin() {
    let dir = PluginDir::new();
    let not_exec = dir.file("noexec", b"#!/bin/sh\nexit 0\n", 0o644);
    let no_shebang = dir.file("garbage", b"\x01\x02\x03 not a program\n", 0o755);
    let no_interp = dir.file("nointerp", b"#!/nonexistent/interp\nexit 0\n", 0o755);
    let ok = dir.script("ok", "exit 0");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let huge = env(&[
        ("CNI_COMMAND", "ADD"),
        ("CNI_HUGE", &"x".repeat(200 * 1024)),
    ]);
    let nul = env(&[("CNI_COMMAND", "ADD"), ("CNI_NUL", "a\0b")]);
    let missing = dir.root().join("bin/missing");
    // The plugin, its environment, the errno (`None`: our own refusal).
    type Case<'a> = (&'a Path, &'a [(String, String)], Option<i32>);
    let cases: [Case<'_>; 6] = [
        (&missing, &vars, Some(libc::ENOENT)),
        (&not_exec, &vars, Some(libc::EACCES)),
        (&no_shebang, &vars, Some(libc::ENOEXEC)),
        (&no_interp, &vars, Some(libc::ENOENT)),
        (&ok, &huge, Some(libc::E2BIG)),
        (&ok, &nul, None),
    ];
    for exec in both() {
        for (path, vars, errno) in &cases {
            let e = run_with(&exec, path, vars, b"{}")
                .await
                .expect_err("cannot start");
            let Error::Spawn {
                path: p, source, ..
            } = &e
            else {
                panic!("{} ({exec:?}): not a spawn error: {e:?}", path.display());
            };
            assert_eq!(p, path);
            assert!(e.to_string().contains("attacked"), "{e}");
            assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}");
            match errno {
                Some(n) => assert_eq!(source.raw_os_error(), Some(*n), "{e:?} ({exec:?})"),
                None => assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput, "{e:?}"),
            }
        }
    }
    // A path with a NUL byte.
    let with_nul = Path::new("/usr/lib/cni/a\0b");
    for exec in both() {
        let e = run_with(&exec, with_nul, &vars, b"{}")
            .await
            .expect_err("nul");
        assert!(matches!(e, Error::Spawn { .. }), "{e:?}");
    }
}

/// Our fds above 2 without close-on-exec (from whoever started the test):
/// a plugin inherits them, whatever the spawn path.
fn inheritable_fds() -> Vec<u32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&fd| {
            // SAFETY: F_GETFD reads a flag; an fd closed meanwhile is -1.
            let flags = unsafe { libc::fcntl(fd as i32, libc::F_GETFD) };
            fd > 2 && flags >= 0 && flags & libc::FD_CLOEXEC == 0
        })
        .collect()
}

/// The plugin: its token back on stdout and stderr, then the fds it holds.
const ECHO_FDS: &str = r#"read tok
echo "tok=$tok"
echo "err=$tok" >&2
exec ls -l /proc/self/fd"#;

/// Many plugins at once from every worker, half of each spawn path, while
/// a thread forks and execs with std and SIGUSR1 (a handler of tokio's)
/// and SIGCHLD keep arriving: each plugin gets its own stdin, its stdout and
/// stderr come back to its own run, and it holds no fd of ours but its
/// three pipes (and `ls`'s dir fd).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_plugins_never_cross_streams_nor_see_our_fds() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = PluginDir::new();
    let path = dir.script("echo", ECHO_FDS);
    let mut usr1 =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let forker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                std::process::Command::new("/bin/true").status().unwrap();
                // SAFETY: raise a signal we handle (tokio's handler).
                unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
                n += 1;
            }
            n
        })
    };
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let inherited = inheritable_fds();
    let mut tasks = Vec::new();
    for i in 0..48 {
        let path = path.clone();
        let vars = vars.clone();
        tasks.push(tokio::spawn(async move {
            let exec = if i % 2 == 0 {
                RawExec::new()
            } else {
                RawExec::new().with_posix_spawn(true)
            };
            let token = format!("token-{i}-{}", "z".repeat(i * 7));
            let out = run_with(&exec, &path, &vars, format!("{token}\n").as_bytes())
                .await
                .unwrap_or_else(|e| panic!("run {i}: {e:?}"));
            (token, out)
        }));
    }
    for t in tasks {
        let (token, out) = t.await.unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stdout.lines().next(), Some(&*format!("tok={token}")));
        assert_eq!(stderr.trim_end(), format!("err={token}"));
        let mut fds: Vec<u32> = stdout
            .lines()
            .skip(2)
            .filter_map(|l| {
                l.split_once(" -> ")
                    .map(|(a, b)| (a.rsplit(' ').next().unwrap(), b))
            })
            .filter(|(_, target)| !target.starts_with("/proc/"))
            .map(|(fd, _)| fd.parse().unwrap())
            .filter(|fd| !inherited.contains(fd))
            .collect();
        fds.sort_unstable();
        assert_eq!(fds, [0, 1, 2], "{token}: {stdout}");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(forker.join().unwrap() > 0);
    // Drain what arrived; the handler saw signals during the runs.
    let _ = tokio::time::timeout(Duration::from_millis(1), usr1.recv()).await;
}

/// Set in the copy of this test binary that runs with fds 0, 1, 2 closed.
const CLOSED_STDIO: &str = "CNI_ATTACK_CLOSED_STDIO";

/// An embedder started with fds 0, 1 and 2 closed (a daemon): the pipe ends
/// we make land there, and the plugin must still get its own three pipes
/// (stdin in, stdout and stderr back), on both paths. Runs in a copy of
/// this binary, which closes them before the runs.
#[test]
fn plugins_of_an_embedder_without_stdio_get_their_pipes() {
    if let Some(report) = std::env::var_os(CLOSED_STDIO) {
        let report = std::path::PathBuf::from(report);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = PluginDir::new();
        let path = dir.script("echo", "cat\necho err >&2");
        let vars = env(&[("CNI_COMMAND", "ADD")]);
        // After the runtime's own fds, so that our pipes land on 0, 1, 2.
        for fd in 0..3 {
            // SAFETY: this process is ours alone (one test); nothing uses
            // its stdio after this but Rust's std, which ignores EBADF.
            unsafe { libc::close(fd) };
        }
        let mut seen = String::new();
        for exec in both() {
            match rt.block_on(run_with(&exec, &path, &vars, b"ping")) {
                Ok(out) => seen.push_str(&format!(
                    "out={} err={}\n",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr).trim_end()
                )),
                Err(e) => seen.push_str(&format!("error: {e:?}\n")),
            }
        }
        seen.push_str(&rt.block_on(leaks_after_many_runs(&dir)));
        std::fs::write(report, seen).unwrap();
        return;
    }
    let dir = PluginDir::new();
    let report = dir.scratch("report");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "exec_spawn_attack::plugins_of_an_embedder_without_stdio_get_their_pipes",
            "--exact",
            "--test-threads=1",
        ])
        .env(CLOSED_STDIO, &report)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{status:?}");
    let seen = std::fs::read_to_string(&report).unwrap();
    assert_eq!(
        seen,
        "out=ping err=err\nout=ping err=err\nfds +0, children 0, threads +0\n"
    );
}

/// Our fds, our children (zombies included) and our threads.
fn census() -> (usize, usize, usize) {
    let count = |dir: &str| std::fs::read_dir(dir).unwrap().count();
    let me = std::process::id();
    let children = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == me).then_some(())
        })
        .count();
    (count("/proc/self/fd"), children, count("/proc/self/task"))
}

/// Many runs on both paths, completed and cancelled at any step (a
/// timeout of ours around the call), in a process of their own (the
/// closed-stdio copy): what they left behind once every plugin is reaped.
async fn leaks_after_many_runs(dir: &PluginDir) -> String {
    let echo = dir.script("echo2", "cat");
    let hang = dir.script("hang", "exec sleep 1000");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let (fds, _, threads) = census();
    for round in 0..20u64 {
        for exec in both() {
            let exec = exec.with_kill_grace(Duration::from_millis(50));
            run_with(&exec, &echo, &vars, b"x").await.unwrap();
            let cancelled = run_with(&exec, &hang, &vars, b"x");
            let _ = tokio::time::timeout(Duration::from_millis(round % 5), cancelled).await;
        }
    }
    // The cancelled runs' reapers finish on this runtime.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while census().1 > 0 && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (fds_after, children, threads_after) = census();
    format!(
        "fds {:+}, children {children}, threads {:+}\n",
        fds_after as i64 - fds as i64,
        threads_after as i64 - threads as i64
    )
}

/// What a busy machine may add to a bound.
const MARGIN: Duration = crate::support::gate::LOAD_MARGIN;

/// A run of `body` (after it wrote its pid to `$PIDS`) with `timeout` and
/// a 256 KiB stdout cap, 1 MiB of stdin; the result and how long it took.
async fn run_limited(
    exec: &RawExec,
    dir: &PluginDir,
    name: &str,
    body: &str,
    timeout: Duration,
) -> (
    Result<cni_async::exec::ExecOutput, Error>,
    Duration,
    Vec<u32>,
) {
    use crate::support::fake::{read_pids, sh_quote};
    let pids = dir.scratch(&format!("{name}.pids"));
    let script = format!(
        "PIDS={}\necho $$ >> \"$PIDS\"\n{body}",
        sh_quote(&pids.to_string_lossy())
    );
    let path = dir.script(name, &script);
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let stdin = vec![b'x'; 1 << 20];
    let req = ExecRequest::new(&path, "attacked", Command::Add, &vars, &stdin, timeout)
        .with_limits(cni_async::exec::OutputLimits {
            stdout: 256 * 1024,
            ..Default::default()
        });
    let start = std::time::Instant::now();
    let r = exec.exec(req).await;
    let elapsed = start.elapsed();
    (r, elapsed, read_pids(&pids))
}

/// Both paths alike: a plugin that exits without reading its stdin (EPIPE
/// on our write) is judged by its exit status; one flooding stdout is cut
/// at the cap; one that leaves a grandchild in a session of its own
/// (`setsid`, out of reach of the group kill) holding stdout returns its
/// output after the drain window; one that hangs with a grandchild holding
/// stdout times out; and of the plugin's own group nothing is left.
#[tokio::test]
async fn pipe_faults_end_alike_on_both_spawn_paths() {
    use crate::support::fake::{GroupReaper, our_zombie, wait_gone};
    let grace = Duration::from_millis(200);
    for exec in both() {
        let exec = exec.with_kill_grace(grace);
        let dir = PluginDir::new();

        let (r, _, pids) =
            run_limited(&exec, &dir, "epipe", "echo bye >&2; exit 2", MARGIN * 10).await;
        let e = r.expect_err("exit 2");
        assert_eq!(
            e.to_string(),
            "plugin attacked ADD failed (exit status 2): bye",
            "{exec:?}"
        );
        assert!(!our_zombie(pids[0]), "{exec:?}");

        let (r, elapsed, pids) = run_limited(
            &exec,
            &dir,
            "flood",
            "head -c 4194304 /dev/zero\nexec sleep 1000",
            MARGIN * 3,
        )
        .await;
        assert!(
            matches!(r, Err(Error::OutputTooLarge { .. })),
            "{r:?} ({exec:?})"
        );
        assert!(elapsed < grace + MARGIN, "{elapsed:?}");
        assert!(wait_gone(&pids, MARGIN).await.is_empty(), "{exec:?}");

        let pid_file = dir.scratch("away.pids");
        let _reaper = GroupReaper(pid_file.clone());
        let (r, elapsed, pids) = run_limited(
            &exec,
            &dir,
            "away",
            "export PIDS\nsetsid sh -c 'echo $$ >> \"$PIDS\"; exec sleep 1000' &\n\
             while [ $(wc -l < \"$PIDS\") -lt 2 ]; do :; done\necho done",
            MARGIN * 3,
        )
        .await;
        let out = r.unwrap_or_else(|e| panic!("{e:?} ({exec:?})"));
        assert_eq!(out.stdout, b"done\n");
        assert!(
            elapsed < RawExec::DEFAULT_DRAIN_WINDOW + MARGIN,
            "{elapsed:?}"
        );
        assert!(!our_zombie(pids[0]), "{exec:?}");
        std::fs::write(&pid_file, format!("{}\n", pids[1])).unwrap();
        drop(_reaper);

        let timeout = Duration::from_millis(300);
        let (r, elapsed, pids) = run_limited(
            &exec,
            &dir,
            "hang",
            "sleep 1000 &\necho $! >> \"$PIDS\"\nwait",
            timeout,
        )
        .await;
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?} ({exec:?})");
        assert!(elapsed < timeout + grace + MARGIN, "{elapsed:?}");
        assert!(wait_gone(&pids, MARGIN).await.is_empty(), "{exec:?}");
    }
}

/// An embedder that blocks signals in its threads (a `sigwait` thread
/// design): the plugin still starts with none blocked and SIGPIPE at its
/// default, on both paths (`posix_spawn` left it our thread's mask: SIGTERM
/// blocked, so the group kill waited out the grace).
#[test]
fn a_blocked_signal_of_ours_is_not_blocked_in_the_plugin() {
    let dir = PluginDir::new();
    let path = dir.script(
        "mask",
        "echo \"pgid=$(cut -d' ' -f5 /proc/$$/stat) pid=$$\"\n\
         exec grep -E '^Sig(Blk|Ign)' /proc/self/status",
    );
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let seen = std::thread::spawn(move || {
        // SAFETY: sigset_t filled by sigemptyset/sigaddset, then applied to
        // this thread alone.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR2] {
                libc::sigaddset(&mut set, sig);
            }
            assert_eq!(
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
                0
            );
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        both()
            .map(|exec| {
                let out = rt.block_on(run_with(&exec, &path, &vars, b"{}")).unwrap();
                String::from_utf8(out.stdout).unwrap()
            })
            .to_vec()
    })
    .join()
    .unwrap();
    for out in &seen {
        let line = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or_else(|| panic!("{key} in {out}"))
                .trim()
                .to_owned()
        };
        assert_eq!(line("SigBlk:"), "0000000000000000", "{seen:?}");
        let ignored = u64::from_str_radix(&line("SigIgn:"), 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{seen:?}");
        let (pgid, pid) = line("pgid=")
            .split_once(" pid=")
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .unwrap();
        assert_eq!(pgid, pid, "a group of its own: {seen:?}");
    }
}

/// Our running children whose command line names `path`.
fn our_children_running(path: &Path) -> Vec<String> {
    let me = std::process::id();
    let needle = path.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let ppid: u32 = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (ppid == me && (cmdline.contains(&needle) || stat.contains(") Z "))).then_some(stat)
        })
        .collect()
}

/// A run polled on a runtime that was shut down: nothing there can wait
/// for a plugin, so the run fails; a plugin it started must not be left
/// running, nor unreaped (before: left running, on both paths).
/// In a process of its own (`alone`): a zombie has no command line, so
/// every zombie child counts, and another test's child may be one for a
/// moment before its test reaps it.
#[test]
fn a_run_on_a_shut_down_runtime_leaves_no_plugin_behind() {
    if !cni_test_support::process::alone(
        "exec_spawn_attack::a_run_on_a_shut_down_runtime_leaves_no_plugin_behind",
    ) {
        return;
    }
    let dir = PluginDir::new();
    // The shell stays (no exec): its command line names the plugin.
    let path = dir.script("hang", "sleep 1000\nexit 0");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    for exec in both() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        drop(rt);
        let r = handle.block_on(run_with(&exec, &path, &vars, b"{}"));
        assert!(matches!(r, Err(Error::Spawn { .. })), "{r:?} ({exec:?})");
        // Returned: whatever it started was killed and reaped already.
        let left = our_children_running(&path);
        for stat in &left {
            let pid: i32 = stat.split(' ').next().unwrap().parse().unwrap();
            // SAFETY: cleanup of our own leftover child's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{left:?} ({exec:?})");
    }
}
