//! How a plugin's exit is reported: output on success, and every shape of failure.

use std::time::Duration;

use crate::support::fake::{Fake, PluginDir, Response, env};
use cni_async::exec::{ExecOutput, ExecRequest, OutputLimits, PluginExec, RawExec};
use cni_async::{Error, PluginExit};
use cni_core::{Command, ErrorObject};
use pretty_assertions::assert_eq;

const TIMEOUT: Duration = Duration::from_secs(10);

async fn run_fake(response: Response) -> Result<ExecOutput, Error> {
    let dir = PluginDir::new();
    let path = dir.fake("fake", &Fake::new(response));
    let vars = env(&[("CNI_COMMAND", "ADD")]);
    let req = ExecRequest::new(&path, "fake", Command::Add, &vars, b"{}", TIMEOUT);
    RawExec::new().exec(req).await
}

async fn run_script(
    body: &str,
    command: Command,
    limits: OutputLimits,
) -> Result<ExecOutput, Error> {
    let dir = PluginDir::new();
    let path = dir.script("fake", body);
    let vars = env(&[("CNI_COMMAND", command.as_str())]);
    let req = ExecRequest::new(&path, "fake", command, &vars, b"{}", TIMEOUT).with_limits(limits);
    RawExec::new().exec(req).await
}

#[tokio::test]
async fn success_returns_stdout_and_stderr() {
    let result =
        r#"{"cniVersion":"1.1.0","ips":[{"address":"10.1.2.3/24"}],"big":18446744073709551617}"#;
    let out = run_fake(Response {
        stderr: b"some debug line\n".to_vec(),
        ..Response::ok(result)
    })
    .await
    .expect("plugin succeeds");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), result);
    assert_eq!(out.stderr, b"some debug line\n");
    assert!(out.elapsed > Duration::ZERO && out.elapsed < TIMEOUT);
}

#[tokio::test]
async fn exit_1_with_cni_error_keeps_code_msg_details_status_and_stderr() {
    let err = run_fake(Response {
        stderr: b"diagnostics here\n".to_vec(),
        ..Response::cni_error(101, "no addresses left", "range 10.200.0.0/24 is full")
    })
    .await
    .expect_err("plugin fails");
    match &err {
        Error::Plugin {
            plugin_type,
            command,
            status,
            error,
            stdout,
            stderr,
        } => {
            assert_eq!(plugin_type, "fake");
            assert_eq!(*command, Command::Add);
            assert_eq!(*status, PluginExit::Code(1));
            assert_eq!(
                error.as_deref(),
                Some(&ErrorObject::new(
                    "1.1.0",
                    101,
                    "no addresses left",
                    "range 10.200.0.0/24 is full"
                ))
            );
            assert_eq!(stdout, "");
            assert_eq!(stderr, "diagnostics here\n");
        }
        other => panic!("expected a plugin error, got {other:?}"),
    }
    assert_eq!(err.code(), 101);
    assert_eq!(
        err.to_string(),
        "plugin fake ADD failed (exit status 1): no addresses left; range 10.200.0.0/24 is full \
         (CNI code 101); stderr: \"diagnostics here\""
    );
    assert_eq!(
        err.to_error_object("1.0.0"),
        ErrorObject::new(
            "1.0.0",
            101,
            "no addresses left",
            "range 10.200.0.0/24 is full"
        )
    );
}

#[tokio::test]
async fn exit_1_with_empty_stdout_uses_stderr_as_message() {
    let err = run_fake(Response::fail(
        1,
        "",
        "cannot open /run/thing: no such file\n",
    ))
    .await
    .expect_err("plugin fails");
    assert!(
        matches!(
            &err,
            Error::Plugin {
                error: None,
                status: PluginExit::Code(1),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "plugin fake ADD failed (exit status 1): cannot open /run/thing: no such file"
    );
    let obj = err.to_error_object("1.1.0");
    assert_eq!(obj.code, 999);
    assert_eq!(obj.details, "cannot open /run/thing: no such file");
}

#[tokio::test]
async fn exit_3_with_empty_stdout_and_stderr_uses_exit_status() {
    let err = run_fake(Response::fail(3, "", ""))
        .await
        .expect_err("plugin fails");
    assert!(
        matches!(
            &err,
            Error::Plugin {
                status: PluginExit::Code(3),
                error: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "plugin fake ADD failed: exit status 3");
}

#[tokio::test]
async fn garbage_stdout_with_exit_1_is_kept_as_evidence() {
    let err = run_fake(Response::fail(
        1,
        "panic: runtime error\ngoroutine 1",
        "boom",
    ))
    .await
    .expect_err("plugin fails");
    match &err {
        Error::Plugin {
            error,
            stdout,
            stderr,
            ..
        } => {
            assert_eq!(*error, None);
            assert_eq!(stdout, "panic: runtime error\ngoroutine 1");
            assert_eq!(stderr, "boom");
        }
        other => panic!("expected a plugin error, got {other:?}"),
    }
    assert_eq!(err.code(), 6);
    let msg = err.to_string();
    assert!(
        msg.contains("(exit status 1) with undecodable output"),
        "{msg}"
    );
    assert!(msg.contains("panic: runtime error"), "{msg}");
    assert!(msg.contains("stderr: \"boom\""), "{msg}");
}

#[tokio::test]
async fn json_without_a_code_on_failure_is_not_an_error_object() {
    let err = run_fake(Response::fail(1, r#"{"msg":"no code"}"#, ""))
        .await
        .expect_err("plugin fails");
    assert!(
        matches!(&err, Error::Plugin { error: None, stdout, .. } if stdout == r#"{"msg":"no code"}"#),
        "{err:?}"
    );
}

#[tokio::test]
async fn killed_by_sigkill() {
    let err = run_script(
        "echo partial; kill -KILL $$",
        Command::Del,
        OutputLimits::default(),
    )
    .await
    .expect_err("plugin dies");
    assert!(
        matches!(
            &err,
            Error::Plugin {
                status: PluginExit::Signal(9),
                command: Command::Del,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("killed by signal 9 (SIGKILL)"), "{msg}");
    assert!(msg.contains("plugin fake DEL failed"), "{msg}");
}

#[tokio::test]
async fn killed_by_sigsegv() {
    let err = run_script(
        "echo oops >&2; kill -SEGV $$",
        Command::Check,
        OutputLimits::default(),
    )
    .await
    .expect_err("plugin dies");
    assert!(
        matches!(
            &err,
            Error::Plugin {
                status: PluginExit::Signal(11),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "plugin fake CHECK failed (killed by signal 11 (SIGSEGV)): oops"
    );
}

#[tokio::test]
async fn stderr_over_its_cap_is_truncated_not_an_error() {
    let limits = OutputLimits {
        stderr: 1000,
        ..OutputLimits::default()
    };
    let out = run_script(
        "head -c 300000 /dev/zero | tr '\\0' e >&2; printf done",
        Command::Add,
        limits,
    )
    .await
    .expect("plugin succeeds");
    assert_eq!(out.stdout, b"done");
    assert_eq!(out.stderr, vec![b'e'; 1000]);
}

#[tokio::test]
async fn stdout_exactly_at_the_cap_is_fine() {
    let limits = OutputLimits {
        stdout: 100_000,
        ..OutputLimits::default()
    };
    let out = run_script("head -c 100000 /dev/zero", Command::Add, limits)
        .await
        .expect("plugin succeeds");
    assert_eq!(out.stdout.len(), 100_000);
}
