//! Both spawn paths (our `clone3` and the `tokio::process` fallback) give a
//! plugin the same start: its own process group, our environment with the
//! request's variables over it, SIGPIPE at its default, no blocked signal,
//! stdin; and both reap it.

use std::path::Path;
use std::time::Duration;

use crate::support::fake::{PluginDir, env};
use cni_async::exec::{ExecRequest, PluginExec, RawExec};
use cni_core::Command;

/// What the plugin saw, one `key=value` a line.
/// The signal masks are grep's, which the shell execs last: the shell's
/// own change while it waits for a command.
const REPORT: &str = r#"echo "pid=$$"
echo "pgid=$(cut -d' ' -f5 /proc/$$/stat)"
echo "x=$CNI_X"
echo "path=${PATH:+set}"
echo "stdin=$(cat)"
exec grep -E '^Sig(Blk|Ign)' /proc/self/status
"#;

async fn run(exec: RawExec, path: &Path) -> Vec<(String, String)> {
    let vars = env(&[("CNI_COMMAND", "ADD"), ("CNI_X", "a"), ("CNI_X", "b")]);
    let req = ExecRequest::new(
        path,
        "fake",
        Command::Add,
        &vars,
        b"{\"in\":1}",
        Duration::from_secs(10),
    );
    let out = exec.exec(req).await.expect("plugin succeeds");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(['=', ':']).unwrap();
            (k.to_owned(), v.trim().to_owned())
        })
        .collect()
}

fn get<'a>(seen: &'a [(String, String)], key: &str) -> &'a str {
    &seen.iter().find(|(k, _)| k == key).unwrap().1
}

#[tokio::test]
async fn both_spawn_paths_start_a_plugin_alike_and_reap_it() {
    let dir = PluginDir::new();
    let path = dir.script("fake", REPORT);
    let own = run(RawExec::new(), &path).await;
    let posix = run(RawExec::new().with_posix_spawn(true), &path).await;
    for seen in [&own, &posix] {
        let pid = get(seen, "pid");
        assert_eq!(get(seen, "pgid"), pid, "a group of its own: {seen:?}");
        // Reaped: not even a zombie's /proc entry is left.
        assert!(!Path::new("/proc").join(pid).exists(), "{pid} not reaped");
        assert_eq!(get(seen, "x"), "b");
        assert_eq!(get(seen, "path"), "set", "our environment is inherited");
        assert_eq!(get(seen, "SigBlk"), "0000000000000000", "{seen:?}");
        let ignored = u64::from_str_radix(get(seen, "SigIgn"), 16).unwrap();
        assert_eq!(
            ignored & (1 << (libc::SIGPIPE - 1)),
            0,
            "SIGPIPE ignored: {seen:?}"
        );
        assert_eq!(get(seen, "stdin"), "{\"in\":1}");
    }
    // glibc's posix_spawn leaves its two internal signals (32 and 33)
    // ignored in the plugin; ours leaves them as exec does (default, unless
    // ignored here). Nothing else may differ.
    let internal = (1u64 << 31) | (1 << 32);
    let without_pids = |s: &[(String, String)]| -> Vec<(String, String)> {
        s.iter()
            .filter(|(k, _)| k != "pid" && k != "pgid")
            .map(|(k, v)| match k.as_str() {
                "SigIgn" => {
                    let mask = u64::from_str_radix(v, 16).unwrap() & !internal;
                    (k.clone(), format!("{mask:016x}"))
                }
                _ => (k.clone(), v.clone()),
            })
            .collect()
    };
    assert_eq!(without_pids(&own), without_pids(&posix));
}
