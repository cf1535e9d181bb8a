//! The listening socket: bound by us (mode, group, stale-socket handling)
//! or passed by systemd (socket activation), and `sd_notify`.
//!
//! Both systemd protocols are a few lines and hand-written here:
//! - socket activation: when `LISTEN_PID` is our pid and `LISTEN_FDS` is at
//!   least 1, fd 3 is a listening socket (sd_listen_fds(3));
//! - readiness: a datagram `READY=1` (later `STOPPING=1`) to the Unix socket
//!   named by `NOTIFY_SOCKET` (`@` = abstract namespace) (sd_notify(3)).

use std::ffi::OsString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::Path;

use tokio::net::UnixListener;

/// The first fd systemd passes (`SD_LISTEN_FDS_START`).
const SD_LISTEN_FDS_START: i32 = 3;

/// What systemd passed in the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemdEnv {
    /// `LISTEN_PID` and `LISTEN_FDS`, when both parse.
    pub listen: Option<(u32, u32)>,
    /// `NOTIFY_SOCKET`.
    pub notify_socket: Option<OsString>,
}

impl SystemdEnv {
    /// Reads `LISTEN_PID`, `LISTEN_FDS` and `NOTIFY_SOCKET`, then removes
    /// them (and `LISTEN_FDNAMES`) from the environment so that plugins,
    /// which inherit it, do not see them.
    ///
    /// # Safety
    /// Changes the process environment: call it before any other thread
    /// exists (first thing in `main`, before the tokio runtime starts).
    pub unsafe fn take_from_env() -> Self {
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u32>().ok());
        let listen = match (num("LISTEN_PID"), num("LISTEN_FDS")) {
            (Some(pid), Some(n)) => Some((pid, n)),
            _ => None,
        };
        let notify_socket = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty());
        for k in [
            "LISTEN_PID",
            "LISTEN_FDS",
            "LISTEN_FDNAMES",
            "NOTIFY_SOCKET",
        ] {
            // SAFETY: the caller guarantees no other thread runs.
            unsafe { std::env::remove_var(k) };
        }
        SystemdEnv {
            listen,
            notify_socket,
        }
    }

    /// The socket passed by systemd, if this process was socket-activated.
    pub(crate) fn activated_listener(&self) -> io::Result<Option<UnixListener>> {
        let Some((pid, n)) = self.listen else {
            return Ok(None);
        };
        if pid != std::process::id() || n == 0 {
            return Ok(None);
        }
        if n > 1 {
            tracing::warn!(
                fds = n,
                "systemd passed more than one socket; using the first"
            );
        }
        // SAFETY: systemd passed fd 3 to this process (LISTEN_PID is ours)
        // and nothing else in the process owns it; `take_from_env` removed
        // the variables, so this runs at most once per activation.
        let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START) };
        let ty = nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SockType)
            .map_err(|e| io::Error::other(format!("fd 3 from systemd is not a socket: {e}")))?;
        if ty != nix::sys::socket::SockType::Stream {
            return Err(io::Error::other(
                "fd 3 from systemd is not a stream socket (use ListenStream= with a path)",
            ));
        }
        let std_listener = std::os::unix::net::UnixListener::from(fd);
        std_listener.set_nonblocking(true)?;
        UnixListener::from_std(std_listener).map(Some)
    }
}

/// The pid of the process that listened on the socket `conn` reached
/// (`SO_PEERCRED` of a connection gives the listener's, from `listen`).
fn listener_pid(conn: &std::os::unix::net::UnixStream) -> Option<u32> {
    let cred =
        nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok().filter(|p| *p > 0)
}

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped), by
/// the library's one reader of `/proc/PID/stat`; one that cannot be read
/// is taken as gone.
fn process_gone(pid: u32) -> bool {
    cni_async::daemon::proc_stat(pid).map_or(true, |s| s.is_none_or(|s| s.is_dead()))
}

/// Binds the socket at `path` with `mode`, owned by our uid and `group`.
///
/// A socket file nobody listens on (left by a killed daemon) is replaced; a
/// live one is an error (another daemon runs), and so is any other kind of
/// file (never deleted). A socket still listening whose listener process
/// is dead (a copy of its descriptor outlived it, in a child between fork
/// and exec) is stale too.
pub(crate) fn bind(path: &Path, mode: u32, group: Option<u32>) -> io::Result<UnixListener> {
    let ctx =
        |op: &str, e: io::Error| io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()));
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| ctx("create the directory of", e))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if let Ok(probe) = std::os::unix::net::UnixStream::connect(path) {
                // Someone still holds the listening socket. When the process
                // that listened on it is dead, what holds it is a copy of
                // its descriptor (a child of a killed cnid between fork and
                // exec, for a moment): stale all the same.
                match listener_pid(&probe) {
                    Some(pid) if process_gone(pid) => {
                        tracing::info!(socket = %path.display(), pid,
                            "the socket's listener is dead; a copy of its descriptor still held it");
                    }
                    pid => {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!(
                                "another process{} is listening on {}; is cnid already running?",
                                pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                                path.display()
                            ),
                        ));
                    }
                }
            }
            tracing::info!(socket = %path.display(), "removing a stale socket");
            std::fs::remove_file(path).map_err(|e| ctx("remove stale socket", e))?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(ctx("stat", e)),
    }
    // No window where the socket is more open than asked: it is created
    // with no permission for others.
    let bound = super::tuning::with_umask(0o177, || std::os::unix::net::UnixListener::bind(path));
    let listener = bound.map_err(|e| ctx("bind", e))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| ctx("chown", e))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ctx("chmod", e))?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// Sends `msg` (`READY=1`, `STOPPING=1`, `STATUS=...`) to systemd.
pub(crate) fn notify(socket: &std::ffi::OsStr, msg: &str) -> io::Result<()> {
    let sock = std::os::unix::net::UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(msg.as_bytes(), &addr)?;
    } else {
        sock.send_to(msg.as_bytes(), Path::new(socket))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_replaces_stale_refuses_live_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cnid.sock");
        let l = bind(&path, 0o660, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        // Live: refused.
        let e = bind(&path, 0o660, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
        // Stale: replaced.
        let _l = bind(&path, 0o600, None).unwrap();
        let other = dir.path().join("file");
        std::fs::write(&other, b"x").unwrap();
        assert_eq!(
            bind(&other, 0o660, None).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(other.exists());
    }

    #[test]
    fn notify_reaches_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        notify(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
