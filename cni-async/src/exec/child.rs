//! A running plugin process and its pipes: started by our own spawn
//! (`sys::spawn`: `clone3` vfork style, a pidfd for the wait) or, where that
//! is refused or [`RawExec::with_posix_spawn`](super::RawExec::with_posix_spawn)
//! asks for it, by `tokio::process` (std's `posix_spawn`).

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

use crate::sys::process::{SIGKILL, signal_group};
use crate::sys::spawn::{self, Spawn};

pub(super) type Writer = Box<dyn AsyncWrite + Send + Unpin>;
pub(super) type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// A started plugin: the leader of a process group of its own.
pub(super) struct Started {
    pub(super) child: Child,
    /// The rest of stdin goes here; `None` when there is no rest (all of it
    /// was in the pipe before the plugin started, or there was none) and
    /// the pipe is closed: the plugin reads to EOF.
    pub(super) stdin: Option<Writer>,
    /// How much of stdin was put in the pipe before the plugin started.
    pub(super) stdin_written: usize,
    pub(super) stdout: Reader,
    pub(super) stderr: Reader,
}

pub(super) enum Child {
    Own(Own),
    Tokio(tokio::process::Child),
}

/// A child of our own spawn, waited for through its pidfd.
pub(super) struct Own {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

/// Starts `path` with our environment overridden by `env`, stdin, stdout
/// and stderr piped, in a process group of its own. `portable`: through
/// `tokio::process` even where our own spawn works. With our own spawn, as
/// much of `stdin` as the pipe takes is written before the plugin starts
/// (a stdin that fits needs no reactor and no wake-up); the caller writes
/// the rest ([`Started::stdin_written`] on).
pub(super) fn start(
    path: &Path,
    env: &[(String, String)],
    stdin: &[u8],
    portable: bool,
) -> io::Result<Started> {
    if !portable && spawn::available() {
        let (in_r, in_w) = spawn::pipe()?;
        spawn::set_nonblocking(in_w.as_fd())?;
        let (stdin_written, in_w) = prefill(in_w, stdin)?;
        let (out_r, out_w) = spawn::pipe()?;
        let (err_r, err_w) = spawn::pipe()?;
        let stdio = spawn::Stdio {
            stdin: in_r.as_fd(),
            stdout: out_w.as_fd(),
            stderr: err_w.as_fd(),
        };
        match spawn::spawn(path, env, stdio)? {
            Spawn::Started(s) => {
                drop((in_r, out_w, err_w));
                let pidfd = match spawn::watch(s.pidfd) {
                    Ok(pidfd) => pidfd,
                    Err((pidfd, e)) => {
                        // Nothing here can wait for it: end it now.
                        let _ = signal_group(s.pid, SIGKILL);
                        let _ = spawn::reap(pidfd.as_fd(), true);
                        return Err(e);
                    }
                };
                let child = Own {
                    pid: s.pid,
                    pidfd,
                    status: None,
                };
                return match own_pipes(in_w, out_r, err_r) {
                    Ok((stdin, stdout, stderr)) => Ok(Started {
                        child: Child::Own(child),
                        stdin,
                        stdin_written,
                        stdout,
                        stderr,
                    }),
                    Err(e) => {
                        // The child is dropped with the error: reaped by a thread.
                        let _ = signal_group(child.pid, SIGKILL);
                        Err(e)
                    }
                };
            }
            Spawn::Unsupported => {}
        }
    }
    start_tokio(path, env, stdin.is_empty())
}

/// Writes as much of `data` into the (non-blocking) pipe `w` as it takes
/// now. Returns how much, and the pipe when some is left: `None` (the pipe
/// closed) when all of it went in.
fn prefill(w: OwnedFd, data: &[u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut file = std::fs::File::from(w);
    let mut written = 0;
    while written < data.len() {
        match file.write(&data[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let rest = (written < data.len()).then(|| OwnedFd::from(file));
    Ok((written, rest))
}

/// Registers our pipe ends with the reactor (stdin only when some is left
/// to write; it is non-blocking already).
fn own_pipes(
    in_w: Option<OwnedFd>,
    out_r: OwnedFd,
    err_r: OwnedFd,
) -> io::Result<(Option<Writer>, Reader, Reader)> {
    for fd in [&out_r, &err_r] {
        spawn::set_nonblocking(fd.as_fd())?;
    }
    let stdin = in_w
        .map(pipe::Sender::from_owned_fd_unchecked)
        .transpose()?;
    Ok((
        stdin.map(|w| Box::new(w) as Writer),
        Box::new(pipe::Receiver::from_owned_fd_unchecked(out_r)?),
        Box::new(pipe::Receiver::from_owned_fd_unchecked(err_r)?),
    ))
}

/// `no_stdin`: close stdin at once (the plugin reads EOF).
fn start_tokio(path: &Path, env: &[(String, String)], no_stdin: bool) -> io::Result<Started> {
    // tokio registers the pipes after std started the child; where that
    // fails (the runtime is shutting down) the child would be left running
    // and never reaped: find out before starting it.
    drop(pipe::pipe()?);
    let mut cmd = tokio::process::Command::new(path);
    cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so one killpg reaches everything it forks.
        // No pre_exec unless needed (below): std keeps using posix_spawn.
        .process_group(0)
        // Our guard kills the whole group; kill_on_drop would kill the child only.
        .kill_on_drop(false);
    if spawn::signals_blocked() {
        // posix_spawn would leave the plugin this thread's blocked signals
        // (SIGTERM blocked: our kill waits out the grace); our own spawn
        // empties the mask, so does this child, forked (std gives up
        // posix_spawn for a pre_exec, hence only when a signal is blocked).
        // SAFETY: the closure only makes one async-signal-safe call.
        unsafe { cmd.pre_exec(spawn::unblock_all_signals) };
    }
    let mut child = cmd.spawn()?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(io::Error::other("no pipes"));
    };
    Ok(Started {
        child: Child::Tokio(child),
        stdin: (!no_stdin).then(|| Box::new(stdin) as Writer),
        stdin_written: 0,
        stdout: Box::new(stdout),
        stderr: Box::new(stderr),
    })
}

impl Child {
    /// Its pid (its process group's id), `None` only after a wait of
    /// `tokio::process`.
    pub(super) fn id(&self) -> Option<u32> {
        match self {
            Child::Own(c) => Some(c.pid),
            Child::Tokio(c) => c.id(),
        }
    }

    /// Waits for its exit and reaps it. Cancel safe.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Child::Tokio(c) => c.wait().await,
            Child::Own(c) => loop {
                if let Some(s) = c.status {
                    return Ok(s);
                }
                let mut ready = c.pidfd.readable().await?;
                match spawn::reap(c.pidfd.get_ref().as_fd(), false)? {
                    Some(s) => c.status = Some(s),
                    None => ready.clear_ready(),
                }
            },
        }
    }

    /// Reaps it if it exited.
    pub(super) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Child::Tokio(c) => c.try_wait(),
            Child::Own(c) => {
                if c.status.is_none() {
                    c.status = spawn::reap(c.pidfd.get_ref().as_fd(), false)?;
                }
                Ok(c.status)
            }
        }
    }
}

impl Drop for Own {
    /// Never leaves a zombie: one still running (it was SIGKILLed, or
    /// is in uninterruptible sleep) is reaped by a thread of its own, as
    /// tokio's orphan queue does for its children.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        if let Ok(Some(_)) = spawn::reap(self.pidfd.get_ref().as_fd(), false) {
            return;
        }
        let Ok(pidfd) = self.pidfd.get_ref().try_clone() else {
            tracing::warn!(
                pid = self.pid,
                "cannot keep the plugin's pidfd; it stays a zombie"
            );
            return;
        };
        let pid = self.pid;
        let spawned = std::thread::Builder::new()
            .name("cni-plugin-reaper".into())
            .spawn(move || {
                let _ = spawn::reap(pidfd.as_fd(), true);
            });
        if spawned.is_err() {
            tracing::warn!(pid, "no thread to reap the plugin; it stays a zombie");
        }
    }
}
