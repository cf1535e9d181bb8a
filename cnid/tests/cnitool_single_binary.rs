//! `cnitool` is one file: copied alone into an empty dir (and run with
//! `PATH=/usr/bin:/bin`), `batch` and `--socket` still work. They used to exec the
//! `cnitool-batch` and `cnitool-daemon` binaries, looked for next to
//! cnitool and in `PATH`, and failed with "cannot run ...".

use std::path::PathBuf;

use crate::support::daemon::{Daemon, Dirs};
use crate::support::executable::copy_executable;
use crate::support::fake::{Fake, PluginDir};
use crate::support::netns::unique_id;
use crate::support::tool::{CNITOOL, Run, Sandbox};
use serde_json::json;

/// A copy of cnitool, alone in a dir of `sb`'s.
fn lone_cnitool(sb: &Sandbox) -> PathBuf {
    let dir = sb.root().join("lone");
    std::fs::create_dir(&dir).expect("create dir");
    let copy = dir.join("cnitool");
    copy_executable(&CNITOOL, &copy, 0o755)
}

/// `sb.cnitool(args)` run with `program` instead, and a `PATH` of the
/// system dirs only.
fn run_lone(sb: &Sandbox, program: &PathBuf, args: &[&str], env: &[(&str, &str)]) -> Run {
    let std_cmd = sb.cnitool(args);
    let mut cmd = std::process::Command::new(program);
    cmd.args(std_cmd.get_args());
    for (k, v) in std_cmd.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(dir) = std_cmd.get_current_dir() {
        cmd.current_dir(dir);
    }
    cmd.env("PATH", "/usr/bin:/bin").envs(env.iter().copied());
    Run::of(cmd)
}

#[test]
fn batch_runs_in_a_lone_cnitool() {
    let sb = Sandbox::new();
    let network = format!("lone-{}", unique_id());
    sb.plugins.fake("a", &Fake::plugin("1.0.0", "10.9.8.7/24"));
    sb.conflist(&network, "1.0.0", &[json!({"type": "a"})]);
    let cnitool = lone_cnitool(&sb);
    let prefix = format!("lone{}-", unique_id());
    // Nothing to tear down: a success with an empty summary.
    let run = run_lone(
        &sb,
        &cnitool,
        &["batch", "down", &network, "--prefix", &prefix, "-q"],
        &[],
    )
    .ok();
    let summary = run.stdout_json();
    assert_eq!(summary["network"], network.as_str(), "{summary}");
    assert_eq!(summary["prefix"], prefix.as_str(), "{summary}");
    assert_eq!(summary["detached"], 0, "{summary}");
    assert_eq!(summary["errors"], json!([]), "{summary}");
}

#[test]
fn the_socket_runs_in_a_lone_cnitool() {
    let dirs = Dirs::new();
    let plugins = PluginDir::in_dir(dirs.root());
    plugins.fake("a", &Fake::plugin("1.0.0", "10.9.8.7/24"));
    std::fs::write(
        dirs.conf.join("lonenet.conflist"),
        br#"{"cniVersion":"1.0.0","name":"lonenet","plugins":[{"type":"a"}]}"#,
    )
    .expect("write conf");
    let daemon = Daemon::start(&dirs, &[]);
    let netns = dirs.data.join("ns");
    std::os::unix::fs::symlink("/proc/self/ns/net", &netns).expect("netns stand-in");
    let netns = netns.to_str().expect("utf-8 temp dir");

    // cnitool's own conf dir is empty: the result comes from the daemon.
    let sb = Sandbox::new();
    let cnitool = lone_cnitool(&sb);
    let socket = daemon.socket.to_str().expect("utf-8 temp dir");
    let run = run_lone(
        &sb,
        &cnitool,
        &["--socket", socket, "add", "lonenet", netns],
        &[],
    )
    .ok();
    let result = run.stdout_json();
    assert_eq!(result["ips"][0]["address"], "10.9.8.7/24", "{result}");
    run_lone(
        &sb,
        &cnitool,
        &["del", "lonenet", netns],
        &[("CNID_SOCKET", socket)],
    )
    .ok();
}
