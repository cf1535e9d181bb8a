//! Network namespaces for runtimes and test harnesses (feature `netns`):
//! create and delete named ones exactly as `ip netns add`/`del` do, open
//! existing ones, run code and commands inside them.
//!
//! Namespaces made here and by `ip netns add` are interchangeable (no `ip`
//! binary is needed). Everything here needs `CAP_SYS_ADMIN` (root) except
//! opening and reading.
//!
//! ```no_run
//! use std::process::Command;
//! use cni_async::netns::{Netns, NetnsGuard};
//!
//! # fn main() -> Result<(), cni_async::Error> {
//! // Deleted again when `ns` goes out of scope, even on a panic.
//! let ns = NetnsGuard::create("demo")?;
//! assert_eq!(ns.path().to_str(), Some("/run/netns/demo"));
//!
//! // Closures and commands run on a dedicated thread inside the namespace.
//! let mut up = Command::new("ip");
//! up.args(["link", "set", "lo", "up"]);
//! assert!(ns.exec_in(up)?.status.success());
//!
//! // The same namespace, opened by path (as a plugin gets it in CNI_NETNS).
//! let again = Netns::open("/run/netns/demo")?;
//! assert_eq!(again.inode()?, ns.inode()?);
//! # Ok(())
//! # }
//! ```
//!
//! # Caveats
//!
//! - **Namespaces belong to threads.** `setns(2)` moves only the calling
//!   thread; a tokio worker that switched would run every later task in the
//!   wrong namespace. So each switch happens on a new OS thread made for
//!   it, which exits when the work is done: none is held across an
//!   `.await`. A thread costs some tens of microseconds: not for hot paths.
//!   A command spawned from that thread ([`Netns::exec_in`]) starts in the
//!   namespace, with no `pre_exec` hook.
//! - **`/proc/self/net` shows the main thread's namespace**, not the current
//!   thread's: code inside [`Netns::run`] must read `/proc/thread-self/net/...`.
//!   Likewise `/sys/class/net` shows the namespace of whoever mounted sysfs;
//!   use netlink (`ip`) or `/proc/thread-self/net` instead.
//! - **Mount propagation.** A named namespace is a bind mount onto
//!   `/run/netns/NAME`, which [`Netns::create`] first makes a shared mount
//!   point, as iproute2 does, so that mount namespaces sharing it see the
//!   mount and its unmount. Private or slave copies made earlier keep their
//!   own view (the namespace can outlive [`Netns::delete`] there); a
//!   process in a private mount namespace (systemd `PrivateMounts=`) makes
//!   namespaces only it can see.
//! - **Lifetime.** A named namespace lives as long as its bind mount, any
//!   open fd, or any process inside it. A process killed before
//!   [`NetnsGuard`]'s `Drop` leaves the mount (or, killed inside
//!   [`Netns::create`], an empty file) until `ip netns del NAME` or
//!   [`Netns::delete_named`].
//! - Only `/run/netns` is used (iproute2's `/var/run/netns`, which on current
//!   systems is the same directory through the `/var/run` symlink).

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, PoisonError};

use nix::errno::Errno;

use crate::Error;
use crate::sys::netns as sys;

/// Where named network namespaces live, as with `ip netns`.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Longest namespace name accepted: a file name (`NAME_MAX`).
pub const NETNS_NAME_MAX: usize = 255;

/// Name given to the threads that switch namespaces.
const THREAD_NAME: &str = "cni-netns";

/// An open network namespace: an owned fd on its namespace file, and the
/// path it was opened from.
///
/// The fd keeps the namespace alive (even after [`Netns::delete`] of another
/// handle) until this value is dropped.
#[derive(Debug)]
pub struct Netns {
    fd: OwnedFd,
    path: PathBuf,
    name: Option<String>,
}

impl Netns {
    /// Creates the named network namespace `/run/netns/NAME`, as
    /// `ip netns add NAME` does, and opens it.
    ///
    /// Fails with [`Error::NetnsName`] for an invalid name, and with
    /// [`Error::Netns`] whose source is of kind
    /// [`io::ErrorKind::AlreadyExists`] when the name is taken.
    pub fn create(name: &str) -> Result<Netns, Error> {
        validate_name(name)?;
        Self::prepare_named()?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        sys::create_empty_exclusive(&path)
            .map_err(|e| netns_err(&path, "create mount target", e))?;

        // A new thread enters a new namespace and pins it with the bind
        // mount; the namespace outlives the thread, which then exits.
        let outcome: Result<(), (&str, io::Error)> = std::thread::scope(|s| {
            let spawned = std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn_scoped(s, || {
                    sys::unshare_net().map_err(|e| ("unshare(CLONE_NEWNET)", e))?;
                    sys::bind_mount(Path::new("/proc/thread-self/ns/net"), &path)
                        .map_err(|e| ("bind-mount /proc/thread-self/ns/net", e))
                });
            match spawned {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(("unshare", io::Error::other("thread panicked")))),
                Err(e) => Err(("spawn thread", e)),
            }
        });
        if let Err((op, source)) = outcome {
            let _ = fs::remove_file(&path);
            return Err(netns_err(&path, op, source));
        }
        match Netns::open(&path) {
            Ok(ns) => Ok(ns),
            Err(e) => {
                let _ = sys::umount_detach(&path);
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Makes [`NETNS_RUN_DIR`] a shared mount point, as [`Netns::create`]
    /// does first: to fail early, with one error, when the caller may not.
    pub fn prepare_named() -> Result<(), Error> {
        prepare_run_dir(Path::new(NETNS_RUN_DIR))
    }

    /// Opens the network namespace file at `path`: `/run/netns/NAME`,
    /// `/proc/PID/ns/net`, `/proc/PID/task/TID/ns/net`, or a bind mount of
    /// one of these.
    ///
    /// Fails when the file does not exist or is not a network namespace
    /// (an empty file left in `/run/netns` by an interrupted create is not).
    pub fn open(path: impl AsRef<Path>) -> Result<Netns, Error> {
        let given = path.as_ref();
        let path = std::path::absolute(given).unwrap_or_else(|_| given.to_owned());
        let fd = sys::open_ns(&path).map_err(|e| netns_err(&path, "open", e))?;
        let is_net =
            sys::is_net_ns(fd.as_fd()).map_err(|e| netns_err(&path, "ioctl(NS_GET_NSTYPE)", e))?;
        if !is_net {
            return Err(netns_err(
                &path,
                "open",
                io::Error::new(io::ErrorKind::InvalidInput, "not a network namespace"),
            ));
        }
        let name = name_in_run_dir(&path);
        Ok(Netns { fd, path, name })
    }

    /// Opens the named namespace `/run/netns/NAME`.
    pub fn open_named(name: &str) -> Result<Netns, Error> {
        validate_name(name)?;
        Netns::open(Path::new(NETNS_RUN_DIR).join(name))
    }

    /// Deletes the named namespace `/run/netns/NAME`, as `ip netns del NAME`
    /// does (a lazy unmount, then unlink), also the empty file an
    /// interrupted create leaves. The namespace itself goes once nothing
    /// else holds it. Fails with an [`io::ErrorKind::NotFound`] source when
    /// there is no such name.
    pub fn delete_named(name: &str) -> Result<(), Error> {
        validate_name(name)?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        match sys::umount_detach(&path) {
            // EINVAL: not a mount point (an empty file); ENOENT: the unlink
            // below reports it.
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(netns_err(&path, "umount", e.into())),
        }
        fs::remove_file(&path).map_err(|e| netns_err(&path, "unlink", e))
    }

    /// The names in `/run/netns` (what `ip netns list` shows), sorted; empty
    /// when the directory does not exist.
    pub fn list_named() -> Result<Vec<String>, Error> {
        let dir = Path::new(NETNS_RUN_DIR);
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(netns_err(dir, "list", e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let name = entry.map_err(|e| netns_err(dir, "list", e))?.file_name();
            names.extend(name.to_str().map(str::to_owned));
        }
        names.sort();
        Ok(names)
    }

    /// Deletes this named namespace (see [`Netns::delete_named`]) and closes
    /// the fd.
    ///
    /// Fails without deleting anything when this namespace was not opened
    /// from `/run/netns`, or when its name now refers to a different
    /// namespace (deleted and made again by someone else).
    pub fn delete(self) -> Result<(), Error> {
        let Some(name) = self.name.as_deref() else {
            return Err(netns_err(
                &self.path,
                "delete",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not a named network namespace in {NETNS_RUN_DIR}"),
                ),
            ));
        };
        let ours =
            sys::fd_identity(self.fd.as_fd()).map_err(|e| netns_err(&self.path, "fstat", e))?;
        if let Ok((dev, ino)) = sys::path_identity(&self.path) {
            // Same filesystem (nsfs) but another inode: another namespace.
            if dev == ours.0 && ino != ours.1 {
                return Err(netns_err(
                    &self.path,
                    "delete",
                    io::Error::other("the name now refers to another network namespace"),
                ));
            }
        }
        let name = name.to_owned();
        drop(self.fd);
        Netns::delete_named(&name)
    }

    /// The path this namespace was opened from (absolute): what to pass as
    /// `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name, when this is a named namespace in `/run/netns`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The namespace's inode number: its identity, as `lsns` and
    /// `readlink /proc/PID/ns/net` (`net:[INODE]`) show it.
    pub fn inode(&self) -> Result<u64, Error> {
        sys::fd_identity(self.fd.as_fd())
            .map(|(_, ino)| ino)
            .map_err(|e| netns_err(&self.path, "fstat", e))
    }

    /// Another handle on the same namespace (a duplicated fd).
    pub fn try_clone(&self) -> Result<Netns, Error> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| netns_err(&self.path, "dup", e))?;
        Ok(Netns {
            fd,
            path: self.path.clone(),
            name: self.name.clone(),
        })
    }

    /// Runs `f` inside this namespace, on a new OS thread, and returns
    /// what it returns; blocking (from async code: [`Netns::run_async`]).
    /// A panic in `f` is resumed in the caller.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cni_async::Error> {
    /// let ns = cni_async::netns::Netns::open("/run/netns/blue")?;
    /// // /proc/thread-self, not /proc/self: see the module's caveats.
    /// let dev = ns.run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn run<F, T>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let fd = self.fd.as_fd();
        let joined = std::thread::scope(|s| {
            let handle = std::thread::Builder::new()
                .name(THREAD_NAME.into())
                .spawn_scoped(s, move || {
                    sys::setns_net(fd)?;
                    Ok(f())
                })
                .map_err(|e| netns_err(&self.path, "spawn thread", e))?;
            Ok::<_, Error>(handle.join())
        })?;
        match joined {
            Ok(result) => result.map_err(|e| netns_err(&self.path, "setns", e)),
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    /// [`Netns::run`] without blocking the async caller (a new OS thread,
    /// not the blocking pool, whose threads are reused). A panic in `f` is
    /// resumed in the awaiting task.
    ///
    /// # Cancellation
    ///
    /// Dropping the future does not stop `f`: the thread runs it to the end
    /// and its result is discarded.
    pub async fn run_async<F, T>(&self, f: F) -> Result<T, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let fd = self.try_clone()?.fd;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                let outcome = match sys::setns_net(fd.as_fd()) {
                    Ok(()) => {
                        drop(fd);
                        Ok(panic::catch_unwind(AssertUnwindSafe(f)))
                    }
                    Err(e) => Err(e),
                };
                let _ = tx.send(outcome);
            })
            .map_err(|e| netns_err(&self.path, "spawn thread", e))?;
        match rx.await {
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(payload))) => panic::resume_unwind(payload),
            Ok(Err(e)) => Err(netns_err(&self.path, "setns", e)),
            Err(_) => Err(netns_err(
                &self.path,
                "run",
                io::Error::other("namespace thread ended without a result"),
            )),
        }
    }

    /// Runs `cmd` inside this namespace and waits for it, as
    /// [`Command::output`] does. A non-zero exit is not an error here: look
    /// at `status`.
    pub fn exec_in(&self, mut cmd: Command) -> Result<Output, Error> {
        let shown = show_command(&cmd);
        self.run(move || cmd.output())?
            .map_err(|e| netns_err(&self.path, format!("run `{shown}`"), e))
    }

    /// [`Netns::exec_in`] without blocking the async caller (needs a tokio
    /// runtime with I/O enabled); stdout and stderr are always captured and
    /// stdin is always `/dev/null`, whatever `cmd` set.
    ///
    /// # Cancellation
    ///
    /// Dropping the future kills the command (`SIGKILL`, the command only,
    /// not what it forked).
    pub async fn exec_in_async(&self, mut cmd: Command) -> Result<Output, Error> {
        let shown = show_command(&cmd);
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| netns_err(&self.path, format!("run `{shown}`"), io::Error::other(e)))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let child = self
            .run_async(move || {
                // Registers the child's pipes and exit with our runtime.
                let _entered = runtime.enter();
                cmd.spawn()
            })
            .await?
            .map_err(|e| netns_err(&self.path, format!("spawn `{shown}`"), e))?;
        child
            .wait_with_output()
            .await
            .map_err(|e| netns_err(&self.path, format!("wait for `{shown}`"), e))
    }
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl fmt::Display for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())
    }
}

/// A named network namespace that is deleted when this guard is dropped,
/// also during a panic's unwinding.
///
/// Dereferences to the [`Netns`]. Deletion errors on drop are logged
/// (`tracing` warning) and otherwise ignored; call [`NetnsGuard::delete`] to
/// see them.
#[derive(Debug)]
pub struct NetnsGuard {
    netns: Option<Netns>,
}

impl NetnsGuard {
    /// Creates the named namespace (see [`Netns::create`]) under a guard.
    pub fn create(name: &str) -> Result<NetnsGuard, Error> {
        Netns::create(name).map(NetnsGuard::new)
    }

    /// Puts an open named namespace under a guard. If `netns` was not opened
    /// from `/run/netns`, dropping the guard only closes it.
    pub fn new(netns: Netns) -> NetnsGuard {
        NetnsGuard { netns: Some(netns) }
    }

    /// Deletes the namespace now, reporting errors.
    pub fn delete(mut self) -> Result<(), Error> {
        self.netns.take().map_or(Ok(()), Netns::delete)
    }

    /// Disarms the guard: the namespace is kept, and returned.
    pub fn into_inner(mut self) -> Netns {
        // `netns` is only taken by methods that consume the guard.
        self.netns.take().expect("NetnsGuard without a namespace")
    }

    fn get(&self) -> &Netns {
        self.netns.as_ref().expect("NetnsGuard without a namespace")
    }
}

impl std::ops::Deref for NetnsGuard {
    type Target = Netns;

    fn deref(&self) -> &Netns {
        self.get()
    }
}

impl AsFd for NetnsGuard {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.get().as_fd()
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Some(netns) = self.netns.take()
            && netns.name.is_some()
        {
            let path = netns.path.clone();
            if let Err(e) = netns.delete() {
                tracing::warn!(path = %path.display(), error = %cni_core::error::Chain(&e), "cannot delete network namespace");
            }
        }
    }
}

/// Checks a namespace name: a single file name in `/run/netns`.
fn validate_name(name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "empty"
    } else if name == "." || name == ".." {
        "not a file name"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains a NUL byte"
    } else if name.len() > NETNS_NAME_MAX {
        "longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(Error::NetnsName {
        name: name.to_owned(),
        reason,
    })
}

/// Makes `dir` exist and be a shared mount point, as iproute2 does before
/// every `ip netns add`: `mount --make-rshared dir`, and when that fails
/// because `dir` is not a mount point, `mount --rbind dir dir` and again.
fn prepare_run_dir(dir: &Path) -> Result<(), Error> {
    // Two threads of ours racing here would stack two bind mounts.
    static SETUP: Mutex<()> = Mutex::new(());
    let _lock = SETUP.lock().unwrap_or_else(PoisonError::into_inner);

    match fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(netns_err(dir, "create directory", e)),
    }
    let mut bound = false;
    loop {
        match sys::make_rshared(dir) {
            Ok(()) => return Ok(()),
            Err(Errno::EINVAL) if !bound => {
                sys::rbind_onto_itself(dir)
                    .map_err(|e| netns_err(dir, "bind-mount onto itself", e))?;
                bound = true;
            }
            Err(e) => return Err(netns_err(dir, "make shared mount", e.into())),
        }
    }
}

/// The name, when `path` is a file directly in [`NETNS_RUN_DIR`].
fn name_in_run_dir(path: &Path) -> Option<String> {
    let name = path.file_name().and_then(OsStr::to_str)?;
    let parent = fs::canonicalize(path.parent()?).ok()?;
    let run_dir = fs::canonicalize(NETNS_RUN_DIR).ok()?;
    (parent == run_dir && validate_name(name).is_ok()).then(|| name.to_owned())
}

fn netns_err(path: &Path, op: impl Into<String>, source: io::Error) -> Error {
    Error::Netns {
        path: path.to_owned(),
        op: op.into(),
        source,
    }
}

/// `program arg arg` for messages.
fn show_command(cmd: &Command) -> String {
    let words = std::iter::once(cmd.get_program()).chain(cmd.get_args());
    words
        .map(OsStr::to_string_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for good in ["a", "cnt-1", "x.y", "..a", &"n".repeat(255)] {
            assert!(validate_name(good).is_ok(), "{good:?}");
        }
        for (bad, why) in [
            ("", "empty"),
            (".", "not a file name"),
            ("..", "not a file name"),
            ("a/b", "contains '/'"),
            ("/abs", "contains '/'"),
            ("a\0b", "contains a NUL byte"),
        ] {
            match validate_name(bad) {
                Err(Error::NetnsName { name, reason }) => {
                    assert_eq!(name, bad);
                    assert_eq!(reason, why);
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(validate_name(&"n".repeat(256)).is_err());
    }
}
