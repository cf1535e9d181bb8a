//! Modes of what cnid keeps on disk (SECURITY.md): its state dir and
//! `intents/` 0700, `cnid.lock` 0600, the cache's `results/`, `locks/` and
//! `corrupt/` 0700 with 0600 files. Dirs found open to others are tightened
//! at start with a warning (they used to keep 0755, and the lock file was
//! 0644); the shared cache dir itself keeps its mode; a state dir owned by
//! another user is refused.

use crate::support;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::daemon::{CNID, Daemon, Dirs, post};
use serde_json::json;

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o7777
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn network(dirs: &Dirs) {
    dirs.plugin(
        "p",
        r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD) printf '{"cniVersion":"1.0.0","ips":[{"address":"10.9.0.2/24"}]}';;
VERSION) printf '{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}';;
esac"#,
    );
    dirs.conf(
        "10-modes.conflist",
        &json!({"cniVersion": "1.0.0", "name": "modes", "plugins": [{"type": "p"}]}),
    );
}

#[test]
fn existing_open_dirs_and_lock_file_are_tightened_at_start() {
    let dirs = Dirs::new();
    network(&dirs);
    for d in [
        dirs.state.join("intents"),
        dirs.cache.join("results"),
        dirs.cache.join("locks"),
        dirs.cache.join("corrupt"),
    ] {
        mkdir(&d, 0o755);
    }
    fs::set_permissions(&dirs.state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&dirs.cache, fs::Permissions::from_mode(0o755)).unwrap();
    let lock = dirs.state.join("cnid.lock");
    fs::write(&lock, b"").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();

    let daemon = Daemon::start(&dirs, &[]);
    assert_eq!(mode(&dirs.state), 0o700, "state dir");
    assert_eq!(mode(&dirs.state.join("intents")), 0o700, "intents dir");
    assert_eq!(mode(&lock), 0o600, "cnid.lock");
    for sub in ["results", "locks", "corrupt"] {
        assert_eq!(mode(&dirs.cache.join(sub)), 0o700, "cache {sub}/");
    }
    // Shared with libcni and other tools: left as it is.
    assert_eq!(mode(&dirs.cache), 0o755, "cache dir");
    let log = daemon.log();
    assert!(
        log.contains("state directory was open to other users; made it 0700"),
        "{log}"
    );
    assert!(
        log.contains("cache directory was open to other users; made it 0700"),
        "{log}"
    );
    assert!(log.contains("was=0755"), "{log}");
}

#[test]
fn fresh_dirs_and_files_are_private() {
    let dirs = Dirs::new();
    network(&dirs);
    let daemon = Daemon::start(&dirs, &[]);
    assert_eq!(mode(&dirs.state), 0o700, "state dir");
    assert_eq!(mode(&dirs.state.join("intents")), 0o700, "intents dir");
    assert_eq!(mode(&dirs.state.join("cnid.lock")), 0o600, "cnid.lock");
    let body = json!({"containerId": "c1", "netns": "/proc/self/ns/net"}).to_string();
    let r = post(&daemon.socket, "/v1/networks/modes/add", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(mode(&dirs.cache), 0o700, "cache dir");
    for sub in ["results", "locks"] {
        assert_eq!(mode(&dirs.cache.join(sub)), 0o700, "cache {sub}/");
    }
    assert_eq!(mode(&dirs.cache.join("results/modes-c1-eth0")), 0o600);
    assert_eq!(mode(&dirs.cache.join("locks/modes-c1-eth0.lock")), 0o600);
}

#[test]
fn a_cache_dir_others_can_write_is_warned_about() {
    let dirs = Dirs::new();
    network(&dirs);
    mkdir(&dirs.cache, 0o777);
    let daemon = Daemon::start(&dirs, &[]);
    let log = daemon.log();
    assert!(
        log.contains("the cache directory can be written by other users"),
        "{log}"
    );
    assert_eq!(mode(&dirs.cache), 0o777, "left as it is");
}

#[test]
fn a_state_dir_owned_by_another_user_is_refused() {
    support::require_root!();
    let dirs = Dirs::new();
    mkdir(&dirs.state, 0o700);
    std::os::unix::fs::chown(&dirs.state, Some(65534), Some(65534)).unwrap();
    let mut child = Command::new(CNID)
        .arg("--socket")
        .arg(&dirs.socket)
        .arg("--conf-dir")
        .arg(&dirs.conf)
        .arg("--cache-dir")
        .arg(&dirs.cache)
        .arg("--state-dir")
        .arg(&dirs.state)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cnid");
    // It must refuse at once; one that starts is stopped and fails the test.
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for cnid") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cnid started with a state dir owned by another user");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains(&format!(
            "state dir {}: owned by uid 65534, not by us (uid 0)",
            dirs.state.display()
        )),
        "{stderr}"
    );
    assert!(!dirs.socket.exists(), "no socket was bound");
    assert_eq!(fs::metadata(&dirs.state).unwrap().uid(), 65534);
}
