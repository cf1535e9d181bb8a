//! Running one plugin: the [`PluginExec`] seam and its default, [`RawExec`].
//!
//! The operations layer builds an [`ExecRequest`] (plain data) and gets back
//! an [`ExecOutput`] (raw stdout and stderr) or an [`Error`]: a failure is
//! decoded here ([`Error::Plugin`]), a result by the caller. An embedder
//! can swap in its own `Arc<dyn PluginExec>` (a sandbox, a remote channel,
//! in-process fakes), as libcni's `invoke.Exec` allows.
//!
//! # Caveats
//!
//! - **Deadlines.** Every run has one ([`ExecRequest::timeout`]; per-verb
//!   defaults in [`Timeouts`]). When it expires, [`RawExec`] sends SIGTERM to
//!   the plugin's whole process group, SIGKILL after [`RawExec::kill_grace`],
//!   reaps the plugin and returns [`Error::Timeout`], also when a grandchild
//!   still holds the stdout or stderr pipe: we never wait for pipe EOF once
//!   the plugin itself is gone (libcni does, and hangs).
//! - **Leftover pipe holders.** After a plugin exits we read for
//!   [`RawExec::drain_window`], then take what was read as its output and
//!   kill the group. A process it left with its stdio redirected, or that
//!   left the group with `setsid` (a daemon on purpose), is left alone, as
//!   in libcni.
//! - **Cancellation.** Dropping the future of [`PluginExec::exec`] kills
//!   the group the same way (SIGTERM from the drop, which never blocks,
//!   SIGKILL after the grace) and reaps the plugin from a task on the
//!   current runtime (a thread when there is none, or when the runtime
//!   shuts down first: then SIGKILL at once).
//! - **Zombies.** The plugin (the direct child) is always reaped; what it
//!   forked is re-parented to init (or the nearest subreaper).
//! - **Spawn.** [`RawExec`] starts plugins with a `clone3` of its own
//!   (vfork style, `CLONE_CLEAR_SIGHAND`, a pidfd), and falls back to
//!   `tokio::process` where `clone3` is refused or the target is not
//!   x86_64 ([`RawExec::with_posix_spawn`]). Either way the plugin gets our
//!   environment with the request's variables over it, SIGPIPE at its
//!   default, no blocked signal, and its own process group.
//! - **Runtime.** [`RawExec`] needs a tokio runtime with the I/O and time
//!   drivers enabled (`enable_all`), as `tokio::process` does.
//! - **stdin** is written while stdout and stderr are read, so a plugin that
//!   never reads cannot deadlock us; one that exits without reading it is
//!   fine (EPIPE ignored: this relies on SIGPIPE being ignored in our
//!   process, as the Rust runtime does for every binary).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cni_core::{Command, ErrorObject};
use futures::future::BoxFuture;

use crate::error::{ERROR_STDERR_MAX, ERROR_STDOUT_MAX, Error, PluginExit, lossy_capped};

mod child;
mod raw;
mod stderr;

pub use raw::RawExec;
pub(crate) use stderr::SinkSlot;
pub use stderr::{LOG_STDERR_MAX, PluginStderr, StderrSink};

/// Runs plugins. Object safe: store it as `Arc<dyn PluginExec>`.
pub trait PluginExec: Send + Sync + fmt::Debug {
    /// Runs one plugin to completion or deadline.
    ///
    /// Returns the raw output of a plugin that exited with status 0.
    /// A plugin that exits non-zero or dies of a signal is an
    /// [`Error::Plugin`]; a plugin still running at the deadline is an
    /// [`Error::Timeout`]. Dropping the future must stop the plugin.
    fn exec<'a>(&'a self, req: ExecRequest<'a>) -> BoxFuture<'a, Result<ExecOutput, Error>>;

    /// Finds the plugin binary for `plugin_type` in `dirs`: in order, the
    /// first regular file of that name that we may execute; files that are
    /// not executable are skipped. The default is [`find_plugin`].
    fn find_plugin(&self, plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
        find_plugin(plugin_type, dirs)
    }
}

impl<T: PluginExec + ?Sized> PluginExec for Arc<T> {
    fn exec<'a>(&'a self, req: ExecRequest<'a>) -> BoxFuture<'a, Result<ExecOutput, Error>> {
        (**self).exec(req)
    }

    fn find_plugin(&self, plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
        (**self).find_plugin(plugin_type, dirs)
    }
}

/// One plugin run, as plain data.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExecRequest<'a> {
    /// The binary to run (from [`PluginExec::find_plugin`]).
    pub plugin_path: &'a Path,
    /// The plugin type, for errors and logs.
    pub plugin_type: &'a str,
    /// The verb; the caller also passes it as `CNI_COMMAND` in `env`.
    pub command: Command,
    /// Variables set for the plugin (`CNI_*`): the plugin inherits our
    /// environment, and these override it.
    pub env: &'a [(String, String)],
    /// The bytes written to the plugin's stdin.
    pub stdin: &'a [u8],
    /// The deadline, from the start of the run.
    pub timeout: Duration,
    /// Caps on what is read from stdout and stderr.
    pub limits: OutputLimits,
}

impl<'a> ExecRequest<'a> {
    /// A request with the default [`OutputLimits`].
    pub fn new(
        plugin_path: &'a Path,
        plugin_type: &'a str,
        command: Command,
        env: &'a [(String, String)],
        stdin: &'a [u8],
        timeout: Duration,
    ) -> Self {
        ExecRequest {
            plugin_path,
            plugin_type,
            command,
            env,
            stdin,
            timeout,
            limits: OutputLimits::default(),
        }
    }

    setters! {
        /// The same request with other output limits.
        pub fn with_limits(limits: OutputLimits);
    }
}

/// What a successful plugin run produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// What it wrote to stderr (at most [`OutputLimits::stderr`] bytes, the first ones).
    pub stderr: Vec<u8>,
    /// Wall time from spawn to exit.
    pub elapsed: Duration,
}

/// Caps on the output read from a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Most stdout bytes accepted; more is [`Error::OutputTooLarge`]. Default 16 MiB.
    pub stdout: usize,
    /// Most stderr bytes kept; the rest is read and dropped. Default 1 MiB.
    pub stderr: usize,
}

impl OutputLimits {
    /// Default stdout cap: 16 MiB.
    pub const DEFAULT_STDOUT: usize = 16 * 1024 * 1024;
    /// Default stderr cap: 1 MiB.
    pub const DEFAULT_STDERR: usize = 1024 * 1024;
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            stdout: Self::DEFAULT_STDOUT,
            stderr: Self::DEFAULT_STDERR,
        }
    }
}

/// Per-verb deadlines for a plugin run (`docs/decisions.md` D1).
///
/// ```
/// use std::time::Duration;
/// use cni_async::exec::Timeouts;
/// use cni_core::Command;
///
/// let t = Timeouts::default();
/// assert_eq!(t.for_command(Command::Add), Duration::from_secs(60));
/// assert_eq!(t.for_command(Command::Version), Duration::from_secs(10));
/// let fast = Timeouts { add: Duration::from_secs(5), ..Timeouts::default() };
/// assert_eq!(fast.for_command(Command::Add), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// ADD, default 60 s.
    pub add: Duration,
    /// DEL, default 60 s.
    pub del: Duration,
    /// CHECK, default 60 s.
    pub check: Duration,
    /// STATUS, default 10 s.
    pub status: Duration,
    /// GC, default 60 s.
    pub gc: Duration,
    /// VERSION, default 10 s.
    pub version: Duration,
}

impl Timeouts {
    /// The default for ADD, DEL, CHECK and GC.
    pub const DEFAULT_LONG: Duration = Duration::from_secs(60);
    /// The default for STATUS and VERSION.
    pub const DEFAULT_SHORT: Duration = Duration::from_secs(10);

    /// The same deadline for every verb.
    pub fn uniform(timeout: Duration) -> Self {
        Timeouts {
            add: timeout,
            del: timeout,
            check: timeout,
            status: timeout,
            gc: timeout,
            version: timeout,
        }
    }

    /// The deadline for one verb.
    pub fn for_command(&self, command: Command) -> Duration {
        match command {
            Command::Add => self.add,
            Command::Del => self.del,
            Command::Check => self.check,
            Command::Status => self.status,
            Command::Gc => self.gc,
            Command::Version => self.version,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            status: Self::DEFAULT_SHORT,
            version: Self::DEFAULT_SHORT,
            ..Self::uniform(Self::DEFAULT_LONG)
        }
    }
}

/// Finds the binary of `plugin_type` in `dirs`: for each dir in order, the
/// first regular file of that name that we may execute. Files of that name
/// that are not executable are skipped (and named in the error if nothing is
/// found), unlike libcni which picks them and fails at exec (`docs/decisions.md` D11).
///
/// The type is validated first ([`cni_core::validate::plugin_type`]): a type
/// with a path separator is refused, never looked up.
pub fn find_plugin(plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
    cni_core::validate::plugin_type(plugin_type)?;
    let mut skipped = Vec::new();
    for dir in dirs {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let candidate = dir.join(plugin_type);
        // metadata follows symlinks: a link to a binary is fine.
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && crate::sys::process::is_executable(&candidate) => {
                return Ok(candidate);
            }
            Ok(meta) if meta.is_file() => skipped.push(candidate),
            _ => {}
        }
    }
    Err(Error::PluginNotFound {
        plugin_type: plugin_type.to_owned(),
        dirs: dirs.to_vec(),
        skipped,
    })
}

/// Checks the output of a plugin that exited 0, on every verb: a CNI error
/// object on stdout is the plugin's error all the same, with exit status 0
/// ([`ErrorObject::decode_on_success`]; `docs/decisions.md` D18).
pub(crate) fn check_success(
    plugin_type: &str,
    command: Command,
    out: &ExecOutput,
) -> Result<(), Error> {
    if ErrorObject::decode_on_success(&out.stdout).is_none() {
        return Ok(());
    }
    let e = plugin_failure(
        plugin_type,
        command,
        PluginExit::Code(0),
        &out.stdout,
        &out.stderr,
    );
    tracing::debug!(error = %cni_core::validate::Escaped(&e.to_string()), "plugin exited 0 but printed an error object");
    Err(e)
}

/// The error for a plugin that exited unsuccessfully.
pub(crate) fn plugin_failure(
    plugin_type: &str,
    command: Command,
    status: PluginExit,
    stdout: &[u8],
    stderr: &[u8],
) -> Error {
    let error = ErrorObject::decode(stdout).map(Box::new);
    let stdout = if error.is_some() || stdout.iter().all(u8::is_ascii_whitespace) {
        String::new()
    } else {
        lossy_capped(stdout, ERROR_STDOUT_MAX)
    };
    Error::Plugin {
        plugin_type: plugin_type.to_owned(),
        command,
        status,
        error,
        stdout,
        stderr: lossy_capped(stderr, ERROR_STDERR_MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_decoding() {
        let e = plugin_failure(
            "x",
            Command::Add,
            PluginExit::Code(1),
            br#"{"cniVersion":"1.0.0","code":7,"msg":"bad","details":"d"}"#,
            b"",
        );
        assert_eq!(e.code(), 7);
        let e = plugin_failure("x", Command::Add, PluginExit::Code(1), b" \n", b"err");
        match e {
            Error::Plugin { stdout, error, .. } => {
                assert!(stdout.is_empty());
                assert!(error.is_none());
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn timeouts_per_verb() {
        let t = Timeouts::default();
        for c in [Command::Add, Command::Del, Command::Check, Command::Gc] {
            assert_eq!(t.for_command(c), Duration::from_secs(60));
        }
        for c in [Command::Status, Command::Version] {
            assert_eq!(t.for_command(c), Duration::from_secs(10));
        }
        assert_eq!(
            Timeouts::uniform(Duration::from_secs(3)).for_command(Command::Gc),
            Duration::from_secs(3)
        );
    }

    #[test]
    fn find_rejects_bad_types_before_lookup() {
        let e = find_plugin("../bin/sh", &["/bin".into()]).unwrap_err();
        assert!(matches!(e, Error::Core(_)), "{e:?}");
        assert_eq!(e.code(), 7);
    }
}
