//! The systemd units keep cnid where it sees the host's namespaces: in the
//! host's mount, PID and network namespaces. cnid hands plugins the
//! runtime's netns paths (`/run/netns/NAME`, `/proc/PID/ns/net`) and its
//! stale-attachment reaper looks at them; a mount namespace of the unit's
//! own may not see a namespace mounted after cnid started, a PID namespace
//! of its own hides the runtime's processes. (The DaemonSet's side, hostPID
//! and the netns dir mounted with propagation, is `lint.py`'s, run by
//! `make deploy-check`.)

use std::path::{Path, PathBuf};

/// systemd settings that give the service a mount, PID or network
/// namespace of its own (systemd.exec(5): each of the mount ones sets up a
/// private mount namespace).
const ISOLATING: &[&str] = &[
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "PrivateNetwork",
    "PrivatePIDs",
    "PrivateUsers",
    "PrivateIPC",
    "ProtectSystem",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "ProtectHostname",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ExecPaths",
    "NoExecPaths",
    "TemporaryFileSystem",
    "BindPaths",
    "BindReadOnlyPaths",
    "RootDirectory",
    "RootImage",
    "RootEphemeral",
    "MountAPIVFS",
    "MountFlags",
    "MountImages",
    "ExtensionImages",
    "ExtensionDirectories",
    "NetworkNamespacePath",
    "IPCNamespacePath",
    "JoinsNamespaceOf",
    "DynamicUser",
];

/// The values that leave a setting off.
fn off(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "no" | "false" | "off" | "0"
    )
}

/// `(key, value)` of a unit's `[Service]` section, continuation lines
/// joined, comments left out.
fn service_settings(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.starts_with('#') || t.starts_with(';') || t.is_empty()) {
            continue;
        }
        if cur.is_empty() && t.starts_with('[') {
            section = t.to_owned();
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        if section == "[Service]"
            && let Some((k, v)) = cur.split_once('=')
        {
            let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push((k.trim().to_owned(), v));
        }
        cur.clear();
    }
    out
}

/// What in a unit's text would isolate cnid from the host's namespaces.
fn isolation(text: &str) -> Vec<String> {
    service_settings(text)
        .into_iter()
        .filter(|(k, v)| ISOLATING.contains(&k.as_str()) && !off(v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

fn units() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .collect();
    v.sort();
    v
}

#[test]
fn the_service_runs_cnid_in_the_host_namespaces() {
    let units = units();
    assert!(!units.is_empty(), "no .service in contrib/systemd");
    for unit in units {
        let text = std::fs::read_to_string(&unit).unwrap();
        assert!(
            text.contains("ExecStart=/usr/bin/cnid"),
            "{} does not run cnid",
            unit.display()
        );
        let found = isolation(&text);
        assert!(
            found.is_empty(),
            "{} gives cnid namespaces of its own ({}): it must see the host's /run/netns and PIDs",
            unit.display(),
            found.join(", ")
        );
    }
}

/// The check itself: each isolating setting added to the real unit is
/// caught (also after a continuation line, and in any case of "yes"),
/// settings left off and other sections are not.
#[test]
fn the_namespace_check_catches_isolation_added_to_the_unit() {
    let unit = &units()[0];
    let real = std::fs::read_to_string(unit).unwrap();
    assert_eq!(isolation(&real), Vec::<String>::new());
    for (added, needle) in [
        ("PrivateTmp=yes", "PrivateTmp=yes"),
        ("PrivateMounts=true", "PrivateMounts=true"),
        ("ProtectHome=read-only", "ProtectHome=read-only"),
        ("ProtectSystem=strict", "ProtectSystem=strict"),
        ("TemporaryFileSystem=/run", "TemporaryFileSystem=/run"),
        (
            "InaccessiblePaths=/run/netns",
            "InaccessiblePaths=/run/netns",
        ),
        ("PrivatePIDs=Yes", "PrivatePIDs=Yes"),
        ("MountFlags=private", "MountFlags=private"),
        ("ReadOnlyPaths=/etc \\\n    /usr", "ReadOnlyPaths=/etc /usr"),
    ] {
        let broken = real.replacen("[Service]\n", &format!("[Service]\n{added}\n"), 1);
        assert!(
            isolation(&broken).iter().any(|f| f == needle),
            "{added} not caught: {:?}",
            isolation(&broken)
        );
    }
    let fine = real.replacen("[Service]\n", "[Service]\nPrivateTmp=no\n", 1);
    assert_eq!(isolation(&fine), Vec::<String>::new());
    let elsewhere = format!("{real}\n[X-Other]\nPrivateTmp=yes\n");
    assert_eq!(isolation(&elsewhere), Vec::<String>::new());
}
