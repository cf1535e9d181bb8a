//! What identifies a network namespace and the processes around it, read
//! from `/proc` and `stat`: the boot id, a namespace's nsfs device and
//! inode and its nsfs file handle, a process's start time, and whether
//! anything on the host still holds a namespace. The latter is asked of
//! the kernel where it can answer (Linux 6.18+: an nsfs file handle
//! reopens a namespace while anything holds it, and fails with `ESTALE`
//! once it is gone; the handle holds the namespace's 64-bit id, never
//! reused), and otherwise searched for in `/proc` (a process or thread in
//! it, a bind mount of it in any mount namespace, an open descriptor of
//! it or a socket made in it).
//!
//! # Caveats
//! - What is not visible from here is not evidence: a `/proc` entry that
//!   cannot be read (no permission), or a caller outside the initial pid
//!   namespace (whose `/proc` does not list every process), makes a holder
//!   search [`Holders::Unknown`], never "none".
//! - A process can open or enter a namespace between two reads of the
//!   search: a caller deletes only what a later check finds still gone.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cni_core::cache::{NetnsIdentity, proc_netns_pid};

use super::boot::boot_id;

/// The inode of the initial pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The nsfs device and inode of the network namespace at `path` (symbolic
/// links followed): `Ok(None)` when the path is not one (missing, another
/// kind of file), `Err` when it cannot be looked at.
pub(crate) fn netns_id(path: &Path) -> io::Result<Option<(u64, u64)>> {
    if !super::nsfs::network_namespace(path)? {
        return Ok(None);
    }
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some((m.dev(), m.ino()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The nsfs file handle of the namespace at `path` (`name_to_handle_at`,
/// a final link followed): its type and bytes; `None` before Linux 6.18
/// or when the path cannot be looked at.
pub(crate) fn ns_handle(path: &Path) -> Option<(i32, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut h = Handle {
        bytes: HANDLE_MAX as u32,
        kind: 0,
        data: [0; HANDLE_MAX],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a file_handle header followed by HANDLE_MAX bytes, as
    // `bytes` says; the path is NUL-terminated; both outlive the call.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&raw mut h).cast::<libc::file_handle>(),
            &raw mut mount_id,
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r != 0 {
        return None;
    }
    let n = (h.bytes as usize).min(HANDLE_MAX);
    Some((h.kind, h.data[..n].to_vec()))
}

/// Whether the namespace of nsfs file handle `handle` still exists
/// (anything holds it: a task, a mount in any mount namespace, a
/// descriptor): `Ok(false)` only on `ESTALE`, the kernel's word that it is
/// gone; `Err` when the kernel cannot tell (no nsfs handles, no
/// privilege).
pub(crate) fn ns_alive(handle: &(i32, Vec<u8>)) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let (kind, data) = handle;
    if data.len() > HANDLE_MAX {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut h = Handle {
        bytes: data.len() as u32,
        kind: *kind,
        data: [0; HANDLE_MAX],
    };
    h.data[..data.len()].copy_from_slice(data);
    // Any descriptor on nsfs names the file system the handle is for.
    let mount = std::fs::File::open("/proc/self/ns/net")?;
    // SAFETY: as in `ns_handle`; the descriptor returned is owned below.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut h).cast::<libc::file_handle>(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor just returned to us, closed once.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESTALE) {
        Ok(false)
    } else {
        Err(e)
    }
}

const HANDLE_MAX: usize = 128;

/// `FILEID_NSFS`: the type of an nsfs file handle.
const FILEID_NSFS: i32 = 0xf1;

/// Whether `handle` is an nsfs file handle of the network namespace with
/// inode `ino` (`struct nsfs_file_handle`: the namespace's 64-bit id, its
/// type, its inode number). Only such a handle's `ESTALE` says anything
/// of that namespace: the kernel refuses a handle whose type or inode is
/// not its namespace's with `ESTALE` too, so a damaged or forged one
/// would make a live namespace look gone.
pub(crate) fn handle_is_of(handle: &(i32, Vec<u8>), ino: u64) -> bool {
    let (kind, data) = handle;
    if *kind != FILEID_NSFS || data.len() != 16 {
        return false;
    }
    let word = |at: usize| u32::from_ne_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    word(8) == libc::CLONE_NEWNET as u32 && u64::from(word(12)) == ino
}

/// `struct file_handle` with room for its bytes.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: libc::c_int,
    data: [u8; HANDLE_MAX],
}

/// The start time of process (or thread) `pid`: field 22 of
/// `/proc/PID/stat`, clock ticks since boot. `Ok(None)` when there is no
/// such process.
pub(crate) fn start_time(pid: u32) -> io::Result<Option<u64>> {
    Ok(super::procstat::proc_stat(pid)?.map(|s| s.start_time))
}

/// What `netns` (a record's path) is now, as [`NetnsIdentity`] records it:
/// this boot's id, the namespace's device and inode, and for a
/// `/proc/PID/...` path the process's start time (read before and after
/// the `stat`: a process that changed in between gives none). `None`
/// when the boot id cannot be read.
pub(crate) fn identity_of(netns: &str) -> Option<NetnsIdentity> {
    let boot_id = boot_id()?.to_owned();
    let mut id = NetnsIdentity {
        boot_id,
        ..NetnsIdentity::default()
    };
    if netns.is_empty() {
        return Some(id);
    }
    let pid = proc_netns_pid(netns);
    let before = pid.and_then(|p| start_time(p).ok().flatten());
    id.ns = netns_id(Path::new(netns)).ok().flatten();
    if id.ns.is_some() {
        id.handle = ns_handle(Path::new(netns));
    }
    if let Some(p) = pid {
        let after = start_time(p).ok().flatten();
        if before.is_none() || before != after {
            // Not one process throughout: nothing proves which namespace.
            id.ns = None;
            id.handle = None;
        } else {
            id.pid_start_time = before;
        }
    }
    // The handle must be of the namespace stat saw (a path switched in
    // between gives none).
    if id.ns.is_some() && netns_id(Path::new(netns)).ok().flatten() != id.ns {
        id.ns = None;
        id.handle = None;
    }
    Some(id)
}

/// `id`, taken before the plugins ran, if `netns` is still that namespace
/// (and process) after them; otherwise `id` without a namespace: the
/// namespace was replaced at the path meanwhile, and the attachment may be
/// in either, so the record names neither (its path decides).
pub(crate) fn unchanged(id: Option<NetnsIdentity>, netns: &str) -> Option<NetnsIdentity> {
    let mut id = id?;
    if id.ns.is_some() {
        let now = identity_of(netns);
        if now.map(|n| (n.ns, n.pid_start_time)) != Some((id.ns, id.pid_start_time)) {
            id.ns = None;
            id.handle = None;
            id.pid_start_time = None;
        }
    }
    Some(id)
}

/// Whether the caller sees what the host sees: it is in the initial pid
/// namespace and in the mount namespace of pid 1, compared by inode or,
/// where pid 1's is not ours to look at, by their mount tables (mount ids
/// are unique across namespaces). `false` when neither can be read.
pub fn sees_host_mounts() -> bool {
    if !sees_all_processes() {
        return false;
    }
    let ino = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let own = ino("/proc/self/ns/mnt");
    if own.is_some() && own == ino("/proc/1/ns/mnt") {
        return true;
    }
    // A mount or unmount between the two reads: read again.
    (0..3).any(|_| {
        let a = std::fs::read("/proc/self/mountinfo").ok();
        a.is_some() && a == std::fs::read("/proc/1/mountinfo").ok()
    })
}

/// What a search for a namespace's holders found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holders {
    /// Something holds it: a process or thread in it, a bind mount of it,
    /// an open descriptor of it.
    Held,
    /// Nothing that could be seen holds it, and everything could be seen.
    None,
    /// Nothing seen holds it, but not everything could be seen.
    Unknown,
}

/// Searches `/proc` for anything holding the namespace `(dev, ino)`:
/// every process's and thread's `ns/net`, the nsfs mounts in the
/// `mountinfo` of each distinct mount namespace, every open descriptor.
pub(crate) fn holders(ns: (u64, u64)) -> Holders {
    let mut search = Search {
        ns,
        complete: sees_all_processes(),
        mnt_seen: std::collections::HashSet::new(),
        proc_net: std::collections::HashMap::new(),
        unplaced: Vec::new(),
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Holders::Unknown;
    };
    let pids: Vec<String> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    // Cheapest first: one stat per process and thread.
    for pid in &pids {
        if search.in_netns(pid) {
            return Holders::Held;
        }
    }
    // Tasks whose namespace link was not ours to read: placed by their
    // /proc/PID/net (its entries' inodes are per network namespace) among
    // the namespaces of the tasks that could be read.
    for net in std::mem::take(&mut search.unplaced) {
        match search.proc_net.get(&net) {
            Some(ino) if *ino == search.ns.1 => return Holders::Held,
            Some(_) => {}
            None => search.complete = false,
        }
    }
    for pid in &pids {
        if search.mounted(pid) || search.open(pid) {
            return Holders::Held;
        }
    }
    if search.complete {
        Holders::None
    } else {
        Holders::Unknown
    }
}

fn sees_all_processes() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INIT_PID_NS_INO)
}

struct Search {
    ns: (u64, u64),
    complete: bool,
    /// Mount namespaces whose mountinfo was read: by nsfs inode, or by the
    /// first mount id of their table.
    mnt_seen: std::collections::HashSet<(u64, u64)>,
    /// The inode of `net/dev` in `/proc/TASK/` → the task's network
    /// namespace inode, for every task whose namespace link was read.
    proc_net: std::collections::HashMap<u64, u64>,
    /// The `net/dev` inodes of tasks whose namespace link was not.
    unplaced: Vec<u64>,
}

impl Search {
    /// Records what cannot be read. A process gone meanwhile is no loss:
    /// `ENOENT`, `ESRCH`, and `EINVAL` (a task exiting has dropped its
    /// namespaces, after its descriptors) hold nothing.
    fn unreadable(&mut self, e: &io::Error) {
        let gone = e.kind() == io::ErrorKind::NotFound
            || matches!(e.raw_os_error(), Some(libc::ESRCH | libc::EINVAL));
        if !gone {
            self.complete = false;
        }
    }

    /// `r`'s value, or `None` with its error recorded ([`Search::unreadable`]).
    fn read<T>(&mut self, r: io::Result<T>) -> Option<T> {
        r.map_err(|e| self.unreadable(&e)).ok()
    }

    /// Whether the task at `/proc/{task}` is in the namespace. Its link
    /// is read (`net:[INO]`), which needs less than following it; a task
    /// whose link is not ours to read is placed later by its `net/dev`.
    fn same(&mut self, task: &str) -> bool {
        let proc_net = std::fs::metadata(format!("{task}/net/dev")).map(|m| m.ino());
        match std::fs::read_link(format!("{task}/ns/net")) {
            Ok(l) => {
                let ino = l
                    .to_str()
                    .and_then(|l| l.strip_prefix("net:["))
                    .and_then(|l| l.strip_suffix(']'))
                    .and_then(|l| l.parse::<u64>().ok());
                match (ino, proc_net) {
                    (Some(ino), Ok(pn)) => {
                        self.proc_net.insert(pn, ino);
                        ino == self.ns.1
                    }
                    (Some(ino), Err(_)) => ino == self.ns.1,
                    (None, _) => {
                        self.complete = false;
                        false
                    }
                }
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EACCES)
                    || e.raw_os_error() == Some(libc::EPERM) =>
            {
                if let Some(pn) = self.read(proc_net) {
                    self.unplaced.push(pn);
                }
                false
            }
            Err(e) => {
                self.unreadable(&e);
                false
            }
        }
    }

    /// The process or one of its threads is in the namespace.
    fn in_netns(&mut self, pid: &str) -> bool {
        if self.same(&format!("/proc/{pid}")) {
            return true;
        }
        let Some(tasks) = self.read(std::fs::read_dir(format!("/proc/{pid}/task"))) else {
            return false;
        };
        for t in tasks.filter_map(Result::ok) {
            let tid = t.file_name();
            if tid.to_str() == Some(pid) {
                continue;
            }
            if self.same(&format!("/proc/{pid}/task/{}", tid.to_string_lossy())) {
                return true;
            }
        }
        false
    }

    /// The namespace is bind-mounted in the process's mount namespace
    /// (read once per mount namespace).
    fn mounted(&mut self, pid: &str) -> bool {
        let mnt = std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
            .map(|m| (m.dev(), m.ino()))
            .ok();
        if mnt.is_some_and(|m| self.mnt_seen.contains(&m)) {
            return false;
        }
        let Some(info) = self.read(std::fs::read_to_string(format!("/proc/{pid}/mountinfo")))
        else {
            return false;
        };
        // Mount ids are unique across mount namespaces: the first one
        // names the table where the namespace's inode is not ours to read.
        let first = info
            .split(' ')
            .next()
            .and_then(|id| id.parse::<u64>().ok())
            .map(|id| (u64::MAX, id));
        let key = mnt.or(first);
        if key.is_some_and(|k| !self.mnt_seen.insert(k)) {
            return false;
        }
        mountinfo_holds(&info, self.ns.1)
    }

    /// The process has a descriptor of the namespace open, or a socket
    /// made in it (a socket holds its namespace: a tool that entered it,
    /// opened one and left).
    fn open(&mut self, pid: &str) -> bool {
        let Some(fds) = self.read(std::fs::read_dir(format!("/proc/{pid}/fd"))) else {
            return false;
        };
        let want = format!("net:[{}]", self.ns.1);
        for fd in fds.filter_map(Result::ok) {
            match std::fs::read_link(fd.path()) {
                Ok(l) if l.as_os_str() == want.as_str() => return true,
                Ok(l) if l.as_os_str().as_encoded_bytes().starts_with(b"socket:[") => {
                    let num = |s: &std::ffi::OsStr| s.to_str().and_then(|s| s.parse().ok());
                    let (Some(p), Some(f)) = (num(pid.as_ref()), num(&fd.file_name())) else {
                        continue;
                    };
                    match socket_netns(p, f) {
                        Ok(ns) if ns.1 == self.ns.1 => return true,
                        Ok(_) => {}
                        // Closed meanwhile: holds nothing.
                        Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
                        Err(e) => self.unreadable(&e),
                    }
                }
                Ok(_) => {}
                Err(e) => self.unreadable(&e),
            }
        }
        false
    }
}

/// The network namespace (device, inode) of socket `fd` of process
/// `pid`: the socket is duplicated (`pidfd_getfd`, which needs the right
/// to ptrace the process) and asked (`SIOCGSKNS`).
fn socket_netns(pid: i32, fd: i32) -> io::Result<(u64, u64)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const SIOCGSKNS: libc::c_ulong = 0x894C;
    let owned = |r: libc::c_long| -> io::Result<OwnedFd> {
        let r = i32::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned to us, owned from here on.
        Ok(unsafe { OwnedFd::from_raw_fd(r) })
    };
    // SAFETY: plain syscalls on integers; the descriptors are owned above.
    let pidfd = owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    let sock = owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor.
    let ns = owned(libc::c_long::from(unsafe {
        libc::ioctl(sock.as_raw_fd(), SIOCGSKNS as _)
    }))?;
    let m = std::fs::File::from(ns).metadata()?;
    Ok((m.dev(), m.ino()))
}

/// Whether a `mountinfo` lists an nsfs mount of network namespace `ino`
/// (its root is `net:[INO]`).
fn mountinfo_holds(info: &str, ino: u64) -> bool {
    let root = format!("net:[{ino}]");
    info.lines().any(|l| {
        let mut f = l.split(' ');
        let root_field = f.nth(3);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        root_field == Some(root.as_str()) && fstype == Some("nsfs")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_a_process() {
        let me = start_time(std::process::id()).unwrap().unwrap();
        assert!(me > 0);
        assert_eq!(start_time(u32::MAX).unwrap(), None);
    }

    /// A namespace held only by a socket made in it (no task in it, no
    /// mount or descriptor of its nsfs file) is held.
    #[test]
    fn a_socket_holds_its_namespace() {
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let (sock, ns) = std::thread::spawn(|| {
            // SAFETY: unshare on this thread only (CLONE_NEWNET).
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            let ns = netns_id(Path::new("/proc/thread-self/ns/net"))
                .unwrap()
                .unwrap();
            (std::net::UdpSocket::bind("0.0.0.0:0").unwrap(), ns)
        })
        .join()
        .unwrap();
        use std::os::fd::AsRawFd;
        let me = i32::try_from(std::process::id()).unwrap();
        assert_eq!(socket_netns(me, sock.as_raw_fd()).unwrap(), ns);
        assert_eq!(holders(ns), Holders::Held);
        drop(sock);
    }

    #[test]
    fn mountinfo_nsfs_roots() {
        let info = "36 25 0:4 net:[4026532290] /run/netns/x rw,relatime shared:5 - nsfs nsfs rw\n\
                    37 25 0:4 net:[4026532291] /run/netns/y rw - tmpfs nsfs rw\n";
        assert!(mountinfo_holds(info, 4026532290));
        assert!(!mountinfo_holds(info, 4026532291));
        assert!(!mountinfo_holds(info, 429));
    }

    #[test]
    fn own_namespace_is_held_and_identified() {
        let id = identity_of(&format!("/proc/{}/ns/net", std::process::id())).unwrap();
        assert_eq!(Some(id.boot_id.as_str()), boot_id());
        let ns = id.ns.unwrap();
        assert!(id.pid_start_time.is_some());
        assert_eq!(netns_id(Path::new("/proc/self/ns/net")).unwrap(), Some(ns));
        assert_eq!(holders(ns), Holders::Held);
        if let Some(h) = &id.handle {
            assert!(handle_is_of(h, ns.1));
            assert!(!handle_is_of(h, ns.1 + 1));
            assert!(!handle_is_of(&(h.0 + 1, h.1.clone()), ns.1));
            assert!(!handle_is_of(&(h.0, h.1[..12].to_vec()), ns.1));
            assert!(ns_alive(h).unwrap());
            let mut gone = h.clone();
            // Another namespace id (the first 8 bytes): none by that id.
            gone.1[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            assert!(!matches!(ns_alive(&gone), Ok(true)));
        }
        assert_eq!(netns_id(Path::new("/proc/stat")).unwrap(), None);
        assert_eq!(netns_id(Path::new("/nonexistent")).unwrap(), None);
    }
}
