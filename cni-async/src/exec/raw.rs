//! [`RawExec`]: plugins as child processes of our own spawn (`clone3`, see
//! `sys::spawn`), or of `tokio::process` where that is refused.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use cni_core::error::Chain;
use cni_core::validate::Escaped;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tracing::Instrument;

use super::child::{self, Child, Reader, Started, Writer};
use super::{ExecOutput, ExecRequest, PluginExec, plugin_failure};
use crate::error::{ERROR_STDERR_MAX, Error, PluginExit, lossy_capped};
use crate::sys::process::{SIGKILL, SIGTERM, group_alive, signal_group};

/// How often the group is checked for survivors while waiting out the grace.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long we wait for a SIGKILLed plugin to be reaped before handing it to
/// a reaping thread (tokio's orphan queue for `tokio::process`; only a process stuck in uninterruptible sleep takes long).
const REAP_LIMIT: Duration = Duration::from_secs(2);
/// First and longest pause between spawns that failed with "text file busy".
const ETXTBSY_BACKOFF_FIRST: Duration = Duration::from_millis(5);
const ETXTBSY_BACKOFF_MAX: Duration = Duration::from_millis(100);
/// Read buffer sizes, once per plugin in flight: small, since a result is
/// a few KiB (64 + 16 KiB cost cnid 80 MiB of RSS with 1,000 plugins
/// running; BENCHMARKS.md).
const STDOUT_CHUNK: usize = 16 * 1024;
const STDERR_CHUNK: usize = 4 * 1024;

/// The default [`PluginExec`]: runs each plugin as a child process in its own
/// process group, with a deadline, output caps and a kill-on-drop of the
/// whole group. See the [module docs](super) for the caveats.
///
/// ```no_run
/// use std::time::Duration;
/// use cni_async::exec::{ExecRequest, OutputLimits, PluginExec, RawExec};
/// use cni_core::Command;
///
/// # async fn demo() -> Result<(), cni_async::Error> {
/// let exec = RawExec::new().with_kill_grace(Duration::from_millis(500));
/// let path = exec.find_plugin("loopback", &["/usr/lib/cni".into()])?;
/// let env = [("CNI_COMMAND".to_owned(), "VERSION".to_owned())];
/// let req = ExecRequest::new(&path, "loopback", Command::Version, &env, b"{}", Duration::from_secs(10))
///     .with_limits(OutputLimits { stdout: 1 << 20, ..OutputLimits::default() });
/// match exec.exec(req).await {
///     Ok(out) => println!("{}", String::from_utf8_lossy(&out.stdout)),
///     Err(e) => eprintln!("{e} (CNI code {})", e.code()),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RawExec {
    kill_grace: Duration,
    drain_window: Duration,
    posix_spawn: bool,
}

impl RawExec {
    /// Default time between SIGTERM and SIGKILL: 1 s.
    pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(1);
    /// Default time we keep reading a plugin's pipes after it exited: 100 ms.
    pub const DEFAULT_DRAIN_WINDOW: Duration = Duration::from_millis(100);

    /// An executor with the default grace and drain window.
    pub fn new() -> Self {
        RawExec {
            kill_grace: Self::DEFAULT_KILL_GRACE,
            drain_window: Self::DEFAULT_DRAIN_WINDOW,
            posix_spawn: false,
        }
    }

    setters! {
        /// Sets the time between SIGTERM and SIGKILL to the plugin's group on
        /// timeout, cancellation or output overflow.
        pub fn with_kill_grace(kill_grace: Duration);

        /// Sets how long we keep reading stdout and stderr after the plugin
        /// exited (see the module's caveats).
        pub fn with_drain_window(drain_window: Duration);

        /// Starts plugins through `tokio::process` (std's `posix_spawn`)
        /// instead of our own `clone3` spawn (off by default; the fallback
        /// anyway where `clone3` is refused): for a seccomp filter that kills a
        /// process calling `clone3` instead of refusing the call.
        pub fn with_posix_spawn(posix_spawn: bool);
    }

    /// The time between SIGTERM and SIGKILL.
    pub fn kill_grace(&self) -> Duration {
        self.kill_grace
    }

    /// How long pipes are read after the plugin exited.
    pub fn drain_window(&self) -> Duration {
        self.drain_window
    }
}

impl Default for RawExec {
    fn default() -> Self {
        Self::new()
    }
}

impl PluginExec for RawExec {
    fn exec<'a>(&'a self, req: ExecRequest<'a>) -> BoxFuture<'a, Result<ExecOutput, Error>> {
        let span = tracing::info_span!(
            "cni_plugin",
            plugin_type = req.plugin_type,
            command = %req.command,
            path = %Escaped(req.plugin_path.display()),
        );
        Box::pin(self.run(req).instrument(span))
    }
}

/// Why the I/O loop ended.
enum End {
    /// The plugin exited and both pipes reached EOF.
    Done,
    /// The plugin exited; a pipe was still open at the end of the drain window.
    Drained,
    /// The deadline passed while the plugin ran.
    Timeout,
    /// stdout went over its cap.
    TooLarge,
    /// Reading stdout or waiting failed.
    Io(&'static str, io::Error),
}

/// What the I/O loop collected.
struct Pumped {
    end: End,
    out: Vec<u8>,
    err: Vec<u8>,
    /// The exit status, when the plugin exited within the deadline.
    status: Option<ExitStatus>,
    /// From the start to the plugin's exit.
    elapsed: Duration,
}

/// The plugin's pipes; `None` once closed.
struct Pipes {
    stdin: Option<Writer>,
    /// How much of stdin is written already.
    written: usize,
    stdout: Option<Reader>,
    stderr: Option<Reader>,
}

impl RawExec {
    /// Spawn, I/O until exit or deadline, end the group if needed, decode.
    async fn run(&self, req: ExecRequest<'_>) -> Result<ExecOutput, Error> {
        let start = Instant::now();
        // A timeout too large for the clock is no deadline at all.
        let deadline = start
            .checked_add(req.timeout)
            .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 86_400));

        let started = self.spawn(&req, deadline).await?;
        let Some(pgid) = started.child.id() else {
            // Only after a completed wait; never right after spawn.
            return Err(io_error(&req, "starting", io::Error::other("no pid")));
        };
        tracing::debug!(pid = pgid, "plugin started");
        let pipes = Pipes {
            // None: nothing (left) to write; closed, the plugin sees EOF.
            stdin: started.stdin,
            written: started.stdin_written,
            stdout: Some(started.stdout),
            stderr: Some(started.stderr),
        };
        let mut guard = RunGuard(Some(Reaper {
            child: Some(started.child),
            pgid,
            grace: self.kill_grace,
            done: false,
        }));
        let pumped = self.pump(&req, &mut guard, pipes, start, deadline).await;
        end_run(&req, &mut guard, pgid, pumped.end, &pumped.err, start).await?;
        // Done and Drained both have the exit status.
        let Some(status) = pumped.status else {
            return Err(io_error(
                &req,
                "waiting for its exit",
                io::Error::other("no exit status"),
            ));
        };
        decode(&req, status, pumped.out, pumped.err, pumped.elapsed)
    }

    /// Writes stdin and reads stdout and stderr (with their caps) until the
    /// plugin exited and both pipes are at EOF, or the drain window after
    /// its exit, the deadline, stdout's cap or an I/O error ends it. Our
    /// pipe ends are closed on return: a writer left behind gets EPIPE.
    async fn pump(
        &self,
        req: &ExecRequest<'_>,
        guard: &mut RunGuard,
        mut pipes: Pipes,
        start: Instant,
        deadline: Instant,
    ) -> Pumped {
        let mut written = pipes.written;
        let mut out: Vec<u8> = Vec::new();
        let mut err: Vec<u8> = Vec::new();
        let mut err_dropped = 0usize;
        let mut out_chunk = vec![0u8; STDOUT_CHUNK];
        let mut err_chunk = vec![0u8; STDERR_CHUNK];
        let mut status: Option<ExitStatus> = None;
        let mut elapsed = Duration::ZERO;

        let deadline_sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(deadline_sleep);
        // Armed when the plugin exits.
        let drain_sleep = tokio::time::sleep_until(deadline);
        tokio::pin!(drain_sleep);

        let end = loop {
            if status.is_some() && pipes.stdout.is_none() && pipes.stderr.is_none() {
                break End::Done;
            }
            let child = guard.child();
            // Biased: the deadline first, so a plugin flooding its pipes
            // cannot starve it.
            tokio::select! {
                biased;
                () = &mut deadline_sleep, if status.is_none() => break End::Timeout,
                () = &mut drain_sleep, if status.is_some() => break End::Drained,
                r = child.wait(), if status.is_none() => match r {
                    Ok(s) => {
                        elapsed = start.elapsed();
                        status = Some(s);
                        // Nobody will read the rest of stdin.
                        pipes.stdin = None;
                        drain_sleep.as_mut().reset(Instant::now() + self.drain_window);
                    }
                    Err(e) => break End::Io("waiting for its exit", e),
                },
                r = read_some(&mut pipes.stdout, &mut out_chunk) => match r {
                    Ok(0) => pipes.stdout = None,
                    Ok(n) => {
                        if out.len() + n > req.limits.stdout {
                            break End::TooLarge;
                        }
                        out.extend_from_slice(&out_chunk[..n]);
                    }
                    Err(e) => break End::Io("reading its stdout", e),
                },
                r = read_some(&mut pipes.stderr, &mut err_chunk) => match r {
                    Ok(0) => pipes.stderr = None,
                    Ok(n) => {
                        let keep = n.min(req.limits.stderr.saturating_sub(err.len()));
                        err.extend_from_slice(&err_chunk[..keep]);
                        err_dropped += n - keep;
                    }
                    Err(e) => {
                        // stderr is informational: stop reading it, carry on.
                        tracing::debug!(error = %e, "cannot read plugin stderr");
                        pipes.stderr = None;
                    }
                },
                r = write_some(&mut pipes.stdin, &req.stdin[written..]) => match r {
                    Ok(n) => {
                        written += n;
                        if written >= req.stdin.len() {
                            // Dropping the pipe closes it: the plugin sees EOF.
                            pipes.stdin = None;
                        }
                    }
                    Err(e) => {
                        // EPIPE: the plugin closed stdin or exited without
                        // reading it all. Its exit status decides.
                        tracing::debug!(error = %e, written, "plugin did not take all of stdin");
                        pipes.stdin = None;
                    }
                },
            }
        };
        drop(pipes);
        if err_dropped > 0 {
            tracing::debug!(
                kept = err.len(),
                dropped = err_dropped,
                "plugin stderr over its cap"
            );
        }
        Pumped {
            end,
            out,
            err,
            status,
            elapsed,
        }
    }

    /// Spawns the plugin in its own process group, retrying "text file busy"
    /// with a fresh spawn each time until the deadline (`docs/decisions.md` D3).
    async fn spawn(&self, req: &ExecRequest<'_>, deadline: Instant) -> Result<Started, Error> {
        let path = spawnable_path(req.plugin_path);
        let mut attempts = 0u32;
        let mut backoff = ETXTBSY_BACKOFF_FIRST;
        loop {
            attempts += 1;
            match child::start(&path, req.env, req.stdin, self.posix_spawn) {
                Ok(started) => return Ok(started),
                Err(e)
                    if e.raw_os_error() == Some(libc::ETXTBSY)
                        && Instant::now() + backoff < deadline =>
                {
                    tracing::debug!(attempts, "plugin binary busy (text file busy); retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ETXTBSY_BACKOFF_MAX);
                }
                Err(source) => {
                    return Err(Error::Spawn {
                        plugin_type: req.plugin_type.to_owned(),
                        command: req.command,
                        path: req.plugin_path.to_owned(),
                        attempts,
                        source,
                    });
                }
            }
        }
    }
}

/// Ends the run the way the I/O loop ended: `Ok` when the plugin exited
/// (its group is killed first if a process it left behind held a pipe),
/// the error otherwise, after killing the group (TERM, grace, KILL, reap).
async fn end_run(
    req: &ExecRequest<'_>,
    guard: &mut RunGuard,
    pgid: u32,
    end: End,
    stderr: &[u8],
    start: Instant,
) -> Result<(), Error> {
    let outcome = match end {
        End::Done => {
            guard.settle();
            return Ok(());
        }
        End::Drained => {
            tracing::warn!(
                pgid,
                "plugin exited but a process it left behind holds its stdout or stderr open; \
                 killing its process group"
            );
            Ok(())
        }
        End::Timeout => {
            let elapsed = start.elapsed();
            tracing::warn!(
                elapsed_ms = elapsed.as_millis() as u64,
                "plugin timed out; killing its process group"
            );
            Err(Error::Timeout {
                plugin_type: req.plugin_type.to_owned(),
                command: req.command,
                elapsed,
                timeout: req.timeout,
                stderr_so_far: lossy_capped(stderr, ERROR_STDERR_MAX),
            })
        }
        End::TooLarge => {
            tracing::warn!(
                limit = req.limits.stdout,
                "plugin stdout over its cap; killing its process group"
            );
            Err(Error::OutputTooLarge {
                plugin_type: req.plugin_type.to_owned(),
                command: req.command,
                limit: req.limits.stdout,
            })
        }
        End::Io(during, e) => Err(io_error(req, during, e)),
    };
    guard.terminate().await;
    outcome
}

/// The result of a plugin that exited: its output, or its failure decoded.
fn decode(
    req: &ExecRequest<'_>,
    status: ExitStatus,
    out: Vec<u8>,
    err: Vec<u8>,
    elapsed: Duration,
) -> Result<ExecOutput, Error> {
    match PluginExit::from_status(status) {
        None => {
            if err.is_empty() {
                tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, "plugin succeeded");
            } else {
                tracing::debug!(
                    elapsed_ms = elapsed.as_millis() as u64,
                    stderr = %Escaped(String::from_utf8_lossy(&err).trim_end()),
                    "plugin succeeded"
                );
            }
            Ok(ExecOutput {
                stdout: out,
                stderr: err,
                elapsed,
            })
        }
        Some(exit) => {
            let e = plugin_failure(req.plugin_type, req.command, exit, &out, &err);
            tracing::debug!(elapsed_ms = elapsed.as_millis() as u64, error = %Escaped(Chain(&e)), "plugin failed");
            Err(e)
        }
    }
}

fn io_error(req: &ExecRequest<'_>, during: &'static str, source: io::Error) -> Error {
    Error::Io {
        plugin_type: req.plugin_type.to_owned(),
        command: req.command,
        during,
        source,
    }
}

/// A bare file name would be searched in `PATH` by exec; a plugin path never is.
fn spawnable_path(path: &Path) -> PathBuf {
    let mut components = path.components();
    match (components.next(), components.next()) {
        (Some(std::path::Component::Normal(_)), None) => Path::new(".").join(path),
        _ => path.to_owned(),
    }
}

/// Reads from a pipe that may be closed already (then never ready).
async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Writes to a pipe that may be closed already (then never ready).
async fn write_some<W: AsyncWrite + Unpin>(pipe: &mut Option<W>, data: &[u8]) -> io::Result<usize> {
    match pipe {
        Some(p) if !data.is_empty() => p.write(data).await,
        _ => std::future::pending().await,
    }
}

/// Owns the running plugin. Dropped before [`RunGuard::settle`] or
/// [`RunGuard::terminate`] (the caller dropped our future), it sends SIGTERM
/// to the group at once and leaves the rest (grace, SIGKILL, reaping) to a
/// task on the current runtime, or to a thread when there is none.
struct RunGuard(Option<Reaper>);

impl RunGuard {
    fn child(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .and_then(|r| r.child.as_mut())
            .expect("the guard holds the child until it is settled or terminated")
    }

    /// The plugin exited, was reaped and its pipes are closed: nothing to kill.
    fn settle(&mut self) {
        if let Some(mut r) = self.0.take() {
            r.done = true;
        }
    }

    /// TERM the group, wait out the grace, KILL, reap.
    async fn terminate(&mut self) {
        if let Some(r) = self.0.take() {
            r.run(false).await;
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let Some(reaper) = self.0.take() else {
            return;
        };
        tracing::debug!(
            pgid = reaper.pgid,
            "plugin run cancelled; killing its process group"
        );
        let _ = signal_group(reaper.pgid, SIGTERM);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            // If the runtime is shutting down the task is dropped
            // unpolled, and the Reaper's own Drop sends SIGKILL.
            drop(handle.spawn(reaper.run(true)));
        } else {
            let spawned = std::thread::Builder::new()
                .name("cni-plugin-reaper".into())
                .spawn(move || reaper.run_blocking());
            // When no thread can be made, the Reaper is dropped with the
            // closure: SIGKILL at once.
            drop(spawned);
        }
    }
}

/// Ends a plugin's process group: SIGTERM, grace, SIGKILL, reap. Dropped
/// before it is done, it sends SIGKILL at once.
struct Reaper {
    /// The plugin; `None` once handed over.
    child: Option<Child>,
    pgid: u32,
    grace: Duration,
    done: bool,
}

impl Reaper {
    async fn run(mut self, term_sent: bool) {
        if !term_sent {
            let _ = signal_group(self.pgid, SIGTERM);
        }
        let grace_end = Instant::now() + self.grace;
        if let Some(child) = self.child.as_mut() {
            let _ = tokio::time::timeout_at(grace_end, child.wait()).await;
        }
        while Instant::now() < grace_end && group_alive(self.pgid) {
            tokio::time::sleep(GROUP_POLL).await;
        }
        if group_alive(self.pgid) {
            tracing::debug!(
                pgid = self.pgid,
                "process group survived SIGTERM; sending SIGKILL"
            );
            let _ = signal_group(self.pgid, SIGKILL);
        }
        if let Some(child) = self.child.as_mut()
            && tokio::time::timeout(REAP_LIMIT, child.wait())
                .await
                .is_err()
        {
            tracing::warn!(
                pgid = self.pgid,
                "plugin not reaped after SIGKILL; leaving it to a reaper"
            );
        }
        self.done = true;
    }

    /// [`Reaper::run`] for a plain thread, after SIGTERM was sent.
    fn run_blocking(mut self) {
        let grace_end = std::time::Instant::now() + self.grace;
        let exited = |child: &mut Option<Child>| match child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        };
        while std::time::Instant::now() < grace_end
            && (!exited(&mut self.child) || group_alive(self.pgid))
        {
            std::thread::sleep(GROUP_POLL);
        }
        if group_alive(self.pgid) {
            let _ = signal_group(self.pgid, SIGKILL);
        }
        let reap_end = std::time::Instant::now() + REAP_LIMIT;
        while !exited(&mut self.child) && std::time::Instant::now() < reap_end {
            std::thread::sleep(GROUP_POLL);
        }
        self.done = true;
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if group_alive(self.pgid) {
            let _ = signal_group(self.pgid, SIGKILL);
        }
        if let Some(child) = self.child.as_mut() {
            // Reaps it if it is gone already; otherwise a thread of its own
            // (or tokio's orphan queue) will, when the child is dropped.
            let _ = child.try_wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_names_are_not_searched_in_path() {
        assert_eq!(spawnable_path(Path::new("bridge")), Path::new("./bridge"));
        assert_eq!(
            spawnable_path(Path::new("/opt/cni/bin/bridge")),
            Path::new("/opt/cni/bin/bridge")
        );
        assert_eq!(
            spawnable_path(Path::new("bin/bridge")),
            Path::new("bin/bridge")
        );
    }
}
