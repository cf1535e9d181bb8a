//! Regression: with the shim's list in cnid's own conf
//! dir, cnid loaded a network whose only plugin was `cnid-shim` aimed at
//! cnid's own socket: an ADD waited on itself until its deadline, and the
//! rollback's DEL and every later DEL the same way. cnid now refuses such
//! a network (listed under the networks' errors, named by readiness and by
//! the "not found" answer), and `cnid-shim install` refuses cnid's own
//! conf dir.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, get, post};
use crate::support::shim::SHIM;
use serde_json::json;

fn self_loop_list(dirs: &Dirs, socket: &str) {
    dirs.conf(
        "00-shim.conflist",
        &json!({"cniVersion": "1.0.0", "name": "loop",
                "plugins": [{"type": "cnid-shim", "socket": socket, "network": "loop"}]}),
    );
}

#[test]
fn a_network_that_calls_cnid_itself_is_refused_and_named() {
    let dirs = Dirs::new();
    std::os::unix::fs::symlink(&*SHIM, dirs.bin.join("cnid-shim")).unwrap();
    self_loop_list(&dirs, &dirs.socket.display().to_string());
    let daemon = Daemon::start(&dirs, &[]);

    let nets = get(&daemon.socket, "/v1/networks").json();
    assert_eq!(nets["networks"], json!([]), "{nets}");
    let errors = nets["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{nets}");
    assert!(
        errors[0]["file"]
            .as_str()
            .unwrap()
            .ends_with("00-shim.conflist")
    );
    assert!(
        errors[0]["reason"]
            .as_str()
            .unwrap()
            .contains("calls cnid itself"),
        "{nets}"
    );

    let ready = get(&daemon.socket, "/v1/health/ready");
    assert_eq!(ready.status, 503);
    assert!(
        ready.json()["reason"]
            .as_str()
            .unwrap()
            .contains("calls cnid itself"),
        "{}",
        ready.json()
    );

    // An ADD is answered at once, not at its deadline.
    let started = Instant::now();
    let body = json!({"containerId": "c1", "netns": dirs.netns("c1"), "ifname": "eth0", "timeoutMs": 5000});
    let answer = post(&daemon.socket, "/v1/networks/loop/add", &body.to_string());
    assert_eq!(
        answer.status,
        404,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // The same socket under another path (a link to its dir) is recognised.
    let alias = dirs.root().join("alias");
    std::os::unix::fs::symlink(dirs.socket.parent().unwrap(), &alias).unwrap();
    drop(daemon);
    self_loop_list(&dirs, &alias.join("cnid.sock").display().to_string());
    let daemon = Daemon::start(&dirs, &[]);
    let nets = get(&daemon.socket, "/v1/networks").json();
    assert_eq!(nets["networks"], json!([]), "{nets}");
}

#[test]
fn the_shim_is_not_installed_into_cnids_own_conf_dir() {
    let dirs = Dirs::new();
    dirs.recording_network("10-podnet.conflist", "podnet", "1.0.0");
    let _daemon = Daemon::start(&dirs, &[]);
    let before: Vec<_> = std::fs::read_dir(&dirs.conf)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let out = Command::new(&*SHIM)
        .args(["install", "--wait", "10s", "--socket"])
        .arg(&dirs.socket)
        .arg("--conf-dir")
        .arg(&dirs.conf)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is the conf dir of cnid"), "{stderr}");
    let after: Vec<_> = std::fs::read_dir(&dirs.conf)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(before, after);
}
