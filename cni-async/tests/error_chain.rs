//! A wrapped error prints each part of its chain once: every message names
//! only its own part and reaches the cause through `source()`, so walking
//! the chain (what anyhow's `{:#}` does) never repeats a part, and
//! `Chain` (used for error objects and logs) shows every part.

use std::error::Error as _;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use cni_async::Error;
use cni_core::Command;
use cni_core::error::Chain;

fn parts(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        out.push(s.to_string());
        next = s.source();
    }
    out
}

fn representative() -> Vec<Error> {
    let io = || io::Error::from_raw_os_error(20); // Not a directory
    let cache = || Error::Cache {
        path: PathBuf::from("/var/lib/cni/results/x"),
        op: "read",
        source: io(),
    };
    let timeout = || Error::Timeout {
        plugin_type: "slow".into(),
        command: Command::Add,
        elapsed: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        stderr_so_far: String::new(),
    };
    vec![
        cache(),
        Error::Spawn {
            plugin_type: "p".into(),
            command: Command::Add,
            path: "/opt/cni/bin/p".into(),
            attempts: 1,
            source: io::Error::from_raw_os_error(13),
        },
        Error::Io {
            plugin_type: "p".into(),
            command: Command::Del,
            during: "reading stdout",
            source: io(),
        },
        Error::Core(cni_core::Error::Io {
            path: "/etc/cni/net.d/10-x.conflist".into(),
            source: io(),
        }),
        Error::Context {
            context: "network \"n\" (ifname eth0) DEL".into(),
            source: Box::new(Error::Context {
                context: "delete stale attachment c1 eth0 of network n".into(),
                source: Box::new(cache()),
            }),
        },
        Error::RollbackFailed {
            error: Box::new(timeout()),
            rollback: Box::new(cache()),
        },
        Error::Multiple {
            operation: "GC of network n".into(),
            errors: vec![cache(), timeout()].into(),
        },
    ]
}

#[test]
fn a_printed_chain_never_repeats_a_part() {
    for e in representative() {
        let parts = parts(&e);
        for (i, a) in parts.iter().enumerate() {
            for b in &parts[i + 1..] {
                assert!(
                    !a.contains(b.as_str()),
                    "{a:?} repeats its cause {b:?} (chain {parts:?})"
                );
            }
        }
        // The one-line form has every part, once.
        let line = Chain(&e).to_string();
        assert_eq!(line, parts.join(": "));
    }
}

#[test]
fn one_line_forms_keep_the_cause() {
    let e = Error::Context {
        context: "network \"n\" (ifname eth0) ADD".into(),
        source: Box::new(Error::Cache {
            path: PathBuf::from("/var/lib/cni/results/x"),
            op: "write",
            source: io::Error::from_raw_os_error(20),
        }),
    };
    assert_eq!(e.to_string(), "network \"n\" (ifname eth0) ADD");
    let msg = e.to_error_object("1.0.0").msg;
    assert_eq!(
        msg,
        "network \"n\" (ifname eth0) ADD: result cache /var/lib/cni/results/x: write failed: Not a directory (os error 20)"
    );
    assert!(e.source().is_some());
    // Inside a list, each error keeps its cause.
    let m = Error::Multiple {
        operation: "remove".into(),
        errors: vec![e].into(),
    };
    assert_eq!(
        Chain(&m)
            .to_string()
            .matches("Not a directory (os error 20)")
            .count(),
        1
    );
}

/// `Multiple` follows the convention of the rest (its
/// message is its own part, the errors are its source), and the whole
/// chain is one re-exported `Chain` away.
#[test]
fn multiple_names_its_count_and_its_source_lists_every_error() {
    let cause = || io::Error::from_raw_os_error(20);
    let m = Error::Multiple {
        operation: "GC of network n".into(),
        errors: vec![
            Error::Context {
                context: "delete stale attachment c1 eth0 of network n".into(),
                source: Box::new(Error::Cache {
                    path: PathBuf::from("/var/lib/cni/results/a"),
                    op: "read",
                    source: cause(),
                }),
            },
            Error::Cache {
                path: PathBuf::from("/var/lib/cni/results/b"),
                op: "write",
                source: cause(),
            },
        ]
        .into(),
    };
    assert_eq!(m.to_string(), "GC of network n failed with 2 error(s)");
    let list = m.source().expect("the errors are the source").to_string();
    assert_eq!(
        list,
        "[1] delete stale attachment c1 eth0 of network n: result cache \
         /var/lib/cni/results/a: read failed: Not a directory (os error 20); \
         [2] result cache /var/lib/cni/results/b: write failed: Not a directory (os error 20)"
    );
    // The re-export is the same type cni-core defines.
    let chain: cni_async::Chain<'_> = Chain(&m);
    assert_eq!(
        chain.to_string(),
        format!("GC of network n failed with 2 error(s): {list}")
    );
    // The error object and kind still answer for the first error.
    assert_eq!(m.to_error_object("1.1.0").msg, chain.to_string());
}
