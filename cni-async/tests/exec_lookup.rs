//! Finding plugin binaries, and what happens when one cannot be started.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::fake::{PluginDir, env};
use crate::support::gate::{LOAD_MARGIN, poll_once};
use cni_async::Error;
use cni_async::exec::{ExecRequest, PluginExec, RawExec};
use cni_core::Command;

#[test]
fn first_executable_in_path_order_wins_and_non_executables_are_skipped() {
    let a = PluginDir::new();
    let b = PluginDir::new();
    let c = PluginDir::new();
    a.file("bridge", b"#!/bin/sh\n", 0o644);
    fs::create_dir(b.bin().join("bridge")).expect("mkdir");
    let found = c.script("bridge", "exit 0");
    c.script("other", "exit 0");
    let dirs: Vec<PathBuf> = vec![
        "/nonexistent-cni-dir".into(),
        a.bin().to_owned(),
        b.bin().to_owned(),
        c.bin().to_owned(),
    ];
    assert_eq!(
        RawExec::new().find_plugin("bridge", &dirs).expect("found"),
        found
    );

    // A later dir does not win over an earlier one.
    let d = PluginDir::new();
    let first = d.script("bridge", "exit 0");
    let dirs2 = vec![d.bin().to_owned(), c.bin().to_owned()];
    assert_eq!(
        RawExec::new().find_plugin("bridge", &dirs2).expect("found"),
        first
    );
}

#[test]
fn missing_plugin_names_the_dirs_and_the_skipped_files() {
    let a = PluginDir::new();
    let skipped = a.file("macvlan", b"#!/bin/sh\n", 0o600);
    let dirs = vec![a.bin().to_owned(), "/nonexistent-cni-dir".into()];
    let err = RawExec::new()
        .find_plugin("macvlan", &dirs)
        .expect_err("not found");
    match &err {
        Error::PluginNotFound {
            plugin_type,
            dirs: d,
            skipped: s,
        } => {
            assert_eq!(plugin_type, "macvlan");
            assert_eq!(d, &dirs);
            assert_eq!(s, &vec![skipped.clone()]);
        }
        other => panic!("expected not found, got {other:?}"),
    }
    assert_eq!(err.code(), 7);
    let msg = err.to_string();
    assert!(msg.contains(&a.bin().display().to_string()), "{msg}");
    assert!(msg.contains("not executable"), "{msg}");

    let err = RawExec::new()
        .find_plugin("macvlan", &[])
        .expect_err("no dirs");
    assert!(err.to_string().contains("no plugin dirs"), "{err}");
}

#[test]
fn plugin_types_with_a_path_separator_are_refused() {
    let a = PluginDir::new();
    a.script("x", "exit 0");
    let dirs = vec![a.bin().to_owned()];
    for bad in ["../bin/x", "/bin/sh", "sub/x", "", ".."] {
        let err = RawExec::new().find_plugin(bad, &dirs).expect_err(bad);
        assert!(matches!(err, Error::Core(_)), "{bad:?}: {err:?}");
        assert_eq!(err.code(), 7, "{bad:?}");
    }
}

async fn spawn_error(path: PathBuf) -> (std::io::Error, u32) {
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Add,
        &vars,
        b"{}",
        Duration::from_secs(2),
    );
    match RawExec::new().exec(req).await {
        Err(Error::Spawn {
            path: p,
            source,
            attempts,
            plugin_type,
            command,
        }) => {
            assert_eq!(p, path);
            assert_eq!(plugin_type, "fake");
            assert_eq!(command, Command::Add);
            (source, attempts)
        }
        other => panic!("expected a spawn error, got {other:?}"),
    }
}

#[tokio::test]
async fn spawn_failures_are_typed_and_name_the_path() {
    let dir = PluginDir::new();
    let (e, _) = spawn_error(dir.bin().join("missing")).await;
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);

    let (e, _) = spawn_error(dir.file("noexec", b"#!/bin/sh\nexit 0\n", 0o644)).await;
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);

    let (e, _) = spawn_error(dir.file("notbinary", b"\x7fELF garbage", 0o755)).await;
    assert_eq!(e.raw_os_error(), Some(libc::ENOEXEC));

    let path = dir.bin().join("missing");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req = ExecRequest::new(
        &path,
        "fake",
        Command::Add,
        &vars,
        b"{}",
        Duration::from_secs(2),
    );
    let err = RawExec::new().exec(req).await.expect_err("missing");
    assert_eq!(err.code(), 5);
    let msg = cni_core::error::Chain(&err).to_string();
    assert!(
        msg.starts_with(&format!(
            "cannot execute plugin {} (fake ADD): ",
            path.display()
        )),
        "{msg}"
    );
}

#[tokio::test]
async fn a_bare_name_is_not_searched_in_path() {
    // "sh" exists in PATH but not in the current dir.
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req = ExecRequest::new(
        "sh".as_ref(),
        "sh",
        Command::Add,
        &vars,
        b"",
        Duration::from_secs(2),
    );
    let err = RawExec::new()
        .exec(req)
        .await
        .expect_err("not looked up in PATH");
    assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
}

/// `docs/decisions.md` D3: "text file busy" is retried with a fresh spawn until it works.
#[tokio::test]
async fn text_file_busy_is_retried_until_the_writer_closes() {
    let dir = PluginDir::new();
    let path = dir.script("busy", "printf ran");
    let writer = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for write");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req = ExecRequest::new(
        &path,
        "busy",
        Command::Add,
        &vars,
        b"",
        Duration::from_secs(30),
    );
    let exec = RawExec::new();
    let mut run = exec.exec(req);
    // The first poll spawns at once; the file is busy, so it fails and
    // waits before the next attempt.
    assert!(
        poll_once(&mut run).await.is_pending(),
        "it cannot have run while the file was open for writing"
    );
    drop(writer);
    let out = run.await.expect("succeeds once the file is closed");
    assert_eq!(out.stdout, b"ran");
}

#[tokio::test]
async fn text_file_busy_until_the_deadline_is_a_spawn_error() {
    let dir = PluginDir::new();
    let path = dir.script("busy", "exit 0");
    let _writer = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for write");
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let timeout = Duration::from_secs(1);
    let req = ExecRequest::new(&path, "busy", Command::Add, &vars, b"", timeout);
    let start = Instant::now();
    let err = RawExec::new().exec(req).await.expect_err("busy throughout");
    let elapsed = start.elapsed();
    match &err {
        Error::Spawn {
            source, attempts, ..
        } => {
            assert_eq!(source.raw_os_error(), Some(libc::ETXTBSY));
            assert!(*attempts > 2, "{attempts}");
        }
        other => panic!("expected a spawn error, got {other:?}"),
    }
    assert!(err.to_string().contains("attempts"), "{err}");
    // It retries up to the deadline (the last wait between attempts is at
    // most 100 ms), and gives up there.
    assert!(
        elapsed >= timeout - Duration::from_millis(100),
        "gave up early: {elapsed:?}"
    );
    assert!(elapsed < timeout + LOAD_MARGIN, "{elapsed:?}");
    // The file is still there and fine.
    assert!(fs::metadata(&path).expect("stat").permissions().mode() & 0o111 != 0);
}
