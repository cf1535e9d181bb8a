//! Crash-safe files: the one implementation behind the result cache, cnid's
//! ADD intents and the shim's installed conf list.
//!
//! Every write, flush, rename and removal goes through a
//! [`Storage`] (the caller's; [`write_atomic`]
//! uses the real [`Disk`]), and every function here that makes one is
//! `#[track_caller]`, so a simulated disk names the caller's line.
//!
//! - [`write_atomic`] ([`write_atomic_on`] through a given storage): a temp
//!   file in the target's dir (see [`temp_path`]),
//!   written, `fsync`ed, renamed over the target, then the dir `fsync`ed.
//!   A crash at any point leaves the old file or the new one, never half of
//!   one; with `fsync` on, the new one also survives a power loss once the
//!   call returned.
//! - [`read_nofollow`]: reads a regular file, refusing a symbolic link at
//!   the last component ([`is_symlink_refusal`]) and anything not a regular
//!   file (a FIFO planted there does not hang the reader).
//! - [`move_aside`]: moves an unreadable file into a private dir for
//!   corrupt files, under a name no other move takes, so it is neither
//!   trusted nor silently lost.
//! - [`remove_leftovers`]: removes the temp files of writes a crash
//!   interrupted ([`is_temp_name`]).
//! - [`remove_abandoned`]: the same in a dir shared with other writers,
//!   for the temp files whose writer is dead.
//! - [`ensure_private_dir`]: the 0700 rule for every private dir;
//!   [`ensure_private_dir_durable`] also flushes the dirs it had to create,
//!   [`ensure_private_dir_durable_once`] also those it found, once per
//!   writer ([`DurableDirs`]; [`sync_entries_once`] for a writer that
//!   flushes later).
//! - [`sync_dir_above`]: the flush of a dir above a writer's own, which a
//!   non-root writer may not be able to open (warned about once).
//! - [`sync_file`]: a later `fsync` of a file written without one (for
//!   writers that defer their flushes); [`sync_dir`].
//!
//! Removals are not `fsync`ed here: every user of this module makes a file
//! that reappears after a power loss harmless (a repeated DEL).
//!
//! # Caveats
//! - Everything here blocks (file system calls); async callers run it on
//!   tokio's blocking pool.
//! - [`remove_leftovers`] removes *every* temp file in the dir: call it only
//!   when no writer can be active there (cnid's intents dir, at start). Not
//!   for a dir shared with other processes, such as the result cache:
//!   there [`remove_abandoned`] removes only what no live writer can own.
//!
//! ```no_run
//! use cni_async::durable;
//! let path = std::path::Path::new("/var/lib/app/state.json");
//! durable::write_atomic(path, b"{}", 0o600, true)?;
//! assert_eq!(durable::read_nofollow(path)?, b"{}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::storage::{Disk, Storage};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Marks a temp file: `.<name>.tmp-<pid>-<n>`.
const TEMP_MARK: &str = ".tmp-";

/// A step of a durable operation that failed: what was done, to which
/// path, and the system's error. Callers put it in their own error type
/// (the result cache's [`crate::Error::Cache`] has the same three fields).
#[derive(Debug)]
pub struct Failure {
    /// What was being done (`"fsync directory"`, ...).
    pub op: &'static str,
    /// The file or dir it was done to.
    pub path: PathBuf,
    /// The underlying error.
    pub source: io::Error,
}

impl Failure {
    fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        Failure {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.source)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<Failure> for io::Error {
    fn from(f: Failure) -> io::Error {
        io::Error::new(f.source.kind(), f.to_string())
    }
}

/// `<pid>-<n>`, unique on this host for as long as the pid is: `n` is the
/// time in nanoseconds, made strictly increasing within the process.
fn unique_suffix() -> String {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default();
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or_default();
    format!("{}-{}", std::process::id(), now.max(prev + 1))
}

/// The longest file name Linux file systems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// `path`'s file name, cut (at a character boundary) so that `extra`
/// more bytes still make a valid file name: the suffix carries the
/// uniqueness, the name is for the reader.
fn name_with_room(path: &Path, extra: usize) -> String {
    let mut name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let room = NAME_MAX.saturating_sub(extra);
    if name.len() > room {
        let mut cut = room;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name
}

/// The temp file [`write_atomic`] writes before renaming it to `path`:
/// `.<name>.tmp-<pid>-<n>` in the same dir (`<name>` cut short where the
/// whole would pass 255 bytes). The leading dot hides it from every reader
/// of the dir (libcni's cache listing, runtimes loading conf files, cnid's
/// scans), and no two writers ever share one.
pub fn temp_path(path: &Path) -> PathBuf {
    let suffix = unique_suffix();
    let name = name_with_room(path, 1 + TEMP_MARK.len() + suffix.len());
    path.with_file_name(format!(".{name}{TEMP_MARK}{suffix}"))
}

/// Whether `name` (a file name) is a temp file of [`write_atomic`] (also
/// of older versions of it, `.<name>.tmp-<anything>`).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARK)
}

#[cfg(test)]
thread_local! {
    /// The steps of the durable calls made on this thread, for the tests
    /// of their order.
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The steps traced on this thread since the last call (tests only).
#[cfg(test)]
pub(crate) fn take_trace() -> Vec<String> {
    TRACE.with(|t| std::mem::take(&mut *t.borrow_mut()))
}

fn trace(_step: &str, _path: &Path) {
    #[cfg(test)]
    TRACE.with(|t| t.borrow_mut().push(format!("{_step} {}", _path.display())));
}

/// `fsync`s a dir through `storage`, making the renames and creations in
/// it durable.
#[track_caller]
pub fn sync_dir(storage: &(impl Storage + ?Sized), dir: &Path) -> Result<(), Failure> {
    trace("fsync-dir", dir);
    storage
        .sync_dir(dir)
        .map_err(|e| Failure::new("fsync directory", dir, e))
}

/// `fsync`s the regular file at `path` if there is one (`Ok(false)` when
/// there is none), never through a symbolic link: for records written
/// without `fsync` whose writer now wants them durable (then
/// [`sync_dir`] for the renames that put them there).
#[track_caller]
pub fn sync_file(storage: &(impl Storage + ?Sized), path: &Path) -> Result<bool, Failure> {
    trace("fsync-file", path);
    storage
        .sync_file(path)
        .map_err(|e| Failure::new("fsync", path, e))
}

/// Writes `path` whole or not at all, on the real disk: [`write_atomic_on`]
/// with [`Disk`].
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32, fsync: bool) -> Result<(), Failure> {
    write_atomic_on(&Disk, path, bytes, mode, fsync)
}

/// Writes `path` whole or not at all, through `storage`.
///
/// The bytes go to [`temp_path`] (created new with `mode`, subject to the
/// umask, never through a symbolic link), which is renamed over `path`.
/// With `fsync`, the file is `fdatasync`ed before the rename (its data and
/// size; not its times) and its dir `fsync`ed after it: the order that
/// makes the new content, not an empty file, what a power loss leaves.
/// The dir itself must be durable already (see
/// [`ensure_private_dir_durable`]). Without `fsync` the write is still
/// atomic for any crash of the process, just not across a power loss. On
/// failure the temp file is removed (through `storage`: a process that
/// died there leaves it, as a `kill -9` does) and `path` is as it was.
#[track_caller]
pub fn write_atomic_on(
    storage: &(impl Storage + ?Sized),
    path: &Path,
    bytes: &[u8],
    mode: u32,
    fsync: bool,
) -> Result<(), Failure> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = temp_path(path);
    let result = write_steps(storage, dir, &tmp, path, bytes, mode, fsync);
    if result.is_err() {
        let _ = storage.remove(&tmp);
    }
    result
}

/// The steps of [`write_atomic_on`] (a function, not a closure: the call
/// site is tracked through it).
#[track_caller]
fn write_steps(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    tmp: &Path,
    path: &Path,
    bytes: &[u8],
    mode: u32,
    fsync: bool,
) -> Result<(), Failure> {
    trace("create", tmp);
    let f = storage
        .create_new(tmp, mode)
        .map_err(|e| Failure::new("create temp file", tmp, e))?;
    storage
        .write(&f, bytes)
        .map_err(|e| Failure::new("write", tmp, e))?;
    if fsync {
        // fdatasync, not fsync: it flushes the data and what reading
        // it back needs (the size, the blocks); a new file's times
        // are all it leaves out, and nothing reads those (issue 25).
        trace("fdatasync", tmp);
        storage
            .sync_data(&f)
            .map_err(|e| Failure::new("fdatasync", tmp, e))?;
    }
    drop(f);
    trace("rename", path);
    storage
        .rename(tmp, path)
        .map_err(|e| Failure::new("rename temp file into place", path, e))?;
    if fsync {
        sync_dir(storage, dir)?;
    }
    Ok(())
}

/// Reads a regular file without following a symbolic link at its last
/// component: a link fails with `ELOOP` ([`is_symlink_refusal`]), a FIFO
/// or device with [`io::ErrorKind::InvalidData`] (opened non-blocking, so
/// a FIFO cannot hang the reader).
pub fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Whether a [`read_nofollow`] error is its refusal of a symbolic link.
pub fn is_symlink_refusal(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// Moves `path` into `corrupt_dir` (made private, [`ensure_private_dir`])
/// as `<name>.<pid>-<n>` (`<name>` cut short to fit), so that two moves of files of the same name keep
/// both. Returns where it went. A symbolic link is moved as the link.
#[track_caller]
pub fn move_aside(
    storage: &(impl Storage + ?Sized),
    path: &Path,
    corrupt_dir: &Path,
) -> Result<PathBuf, Failure> {
    let suffix = unique_suffix();
    let name = name_with_room(path, 1 + suffix.len());
    let target = corrupt_dir.join(format!("{name}.{suffix}"));
    match ensure_private_dir(corrupt_dir) {
        Ok(PrivateDir::Private) => {}
        Ok(PrivateDir::Tightened { was }) => tracing::warn!(
            dir = %corrupt_dir.display(),
            was = %format_args!("{was:04o}"),
            "directory of corrupt files was open to other users; made it 0700"
        ),
        Ok(PrivateDir::Foreign { owner, mode }) => tracing::warn!(
            dir = %corrupt_dir.display(),
            owner,
            mode = %format_args!("{mode:04o}"),
            "directory of corrupt files belongs to another user; left as it is"
        ),
        Err(e) => return Err(Failure::new("create directory", corrupt_dir, e)),
    }
    storage
        .rename(path, &target)
        .map_err(|e| Failure::new("move aside", path, e))?;
    Ok(target)
}

/// Removes the temp files ([`is_temp_name`]) a crash left in `dir`, and
/// returns how many. Only when no writer is active in `dir` (see the
/// module's caveats). A missing dir has none.
#[track_caller]
pub fn remove_leftovers(storage: &(impl Storage + ?Sized), dir: &Path) -> Result<usize, Failure> {
    remove_picked(storage, dir, |name, entry| {
        is_temp_name(name) && entry.file_type().is_ok_and(|t| t.is_file())
    })
}

/// In a dir shared with other writers (the result cache's `results/`):
/// removes the temp files of [`write_atomic`] whose writer died, and
/// returns how many. Only a regular file named exactly as [`temp_path`]
/// names them (`.<name>.tmp-<pid>-<n>`), whose `pid` names no process
/// ([`crate::sys::pid_alive`]), and last modified at least `min_age` ago: a
/// writer in another pid namespace shows a pid that may name no process
/// here, but no write takes `min_age`. Every other file is left alone,
/// other tools' temp files too. A missing dir has none.
#[track_caller]
pub fn remove_abandoned(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    min_age: std::time::Duration,
) -> Result<usize, Failure> {
    remove_picked(storage, dir, |name, entry| {
        let Some(pid) = temp_writer(name) else {
            return false;
        };
        // Not followed: a link or a dir is not ours.
        let Ok(meta) = entry.metadata() else {
            return false;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        meta.is_file() && old && !crate::sys::pid_alive(pid)
    })
}

/// Removes the files of `dir` that `pick` picks (by name and entry), and
/// returns how many. A missing dir has none.
#[track_caller]
fn remove_picked(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    pick: impl Fn(&str, &std::fs::DirEntry) -> bool,
) -> Result<usize, Failure> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Failure::new("read directory", dir, e)),
    };
    let mut n = 0;
    for entry in entries {
        let entry = entry.map_err(|e| Failure::new("read directory", dir, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !pick(&name, &entry) {
            continue;
        }
        let path = dir.join(&name);
        match storage.remove(&path) {
            Ok(()) => n += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Failure::new("remove", &path, e)),
        }
    }
    Ok(n)
}

/// The writer's pid of a temp file named as [`temp_path`] names them
/// (`.<name>.tmp-<pid>-<n>`, both numbers decimal), `None` for any other
/// name.
fn temp_writer(name: &str) -> Option<u32> {
    if !name.starts_with('.') {
        return None;
    }
    let (_, suffix) = name.rsplit_once(TEMP_MARK)?;
    let (pid, n) = suffix.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

/// What [`ensure_private_dir`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PrivateDir {
    /// Ours and 0700 (or stricter), or just created so.
    Private,
    /// Ours but open to group or others (`was`, the permission bits): now 0700.
    Tightened {
        /// The permission bits it had.
        was: u32,
    },
    /// Owned by another user: left as it is (whoever owns it can change
    /// its mode back and write into it).
    Foreign {
        /// Its owner's uid.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
}

/// Makes `dir` (and missing parents) with mode 0700, as libcni does, and,
/// when it exists already, tightens it to 0700 if it is ours and open to
/// group or others: libcni and older versions of us leave an existing dir
/// as they find it (0755 is common). Only `dir` itself is changed, never a
/// parent. A symbolic link to a dir is followed (a cache on another disk).
///
/// Used for the cache's `results/`, `locks/` and `corrupt/` and for cnid's
/// state dir, so that every private dir follows one rule.
pub fn ensure_private_dir(dir: &Path) -> io::Result<PrivateDir> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.mode() & 0o7777;
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Ok(PrivateDir::Foreign {
            owner: meta.uid(),
            mode,
        });
    }
    if mode & 0o077 == 0 {
        return Ok(PrivateDir::Private);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(PrivateDir::Tightened { was: mode })
}

/// [`ensure_private_dir`] for the dir a durable write is about to put a
/// file in: with `fsync`, each dir it had to create (`dir` and missing
/// parents) is made durable by an `fsync` of its parent, so that a power
/// loss cannot take the new dir, and the file written into it, away once
/// the write returned. A dir that was there already is not flushed here
/// (see [`ensure_private_dir_durable_once`] for a writer that must not
/// trust one); so when a flush fails, the dirs made are removed
/// again (when empty) before the error returns, for the next write to
/// make and flush them. The parent of the outermost dir made is not ours:
/// when it cannot be opened ([`sync_dir_above`]), that is warned about
/// once and the dirs stay. Costs one `stat` more than
/// [`ensure_private_dir`].
#[track_caller]
pub fn ensure_private_dir_durable(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    fsync: bool,
) -> io::Result<PrivateDir> {
    if !fsync {
        return ensure_private_dir(dir);
    }
    make_durable(storage, dir).map(|m| m.found)
}

/// What [`make_durable`] found and did.
struct Made {
    found: PrivateDir,
    /// `dir`'s identity.
    id: DirId,
    /// How many dirs it made (`dir` first, then its missing parents).
    created: usize,
}

#[track_caller]
fn make_durable(storage: &(impl Storage + ?Sized), dir: &Path) -> io::Result<Made> {
    // The outermost missing dir, if any (a link to a dir counts as one).
    let mut first_missing = None;
    let mut id = None;
    let mut d = dir;
    while !d.as_os_str().is_empty() {
        match std::fs::metadata(d) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => first_missing = Some(d),
            Ok(m) if d == dir => {
                id = Some(DirId::of(&m));
                break;
            }
            _ => break,
        }
        match d.parent() {
            Some(p) => d = p,
            None => break,
        }
    }
    let found = ensure_private_dir(dir)?;
    let mut created = 0;
    if let Some(first) = first_missing {
        let made: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| *a != first)
            .chain(std::iter::once(first))
            .collect();
        created = made.len();
        // The parents of the created dirs, outermost first.
        let mut parents: Vec<&Path> = made
            .iter()
            .copied()
            .filter_map(Path::parent)
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .collect();
        parents.reverse();
        for (k, p) in parents.into_iter().enumerate() {
            // The outermost is a dir that was there (not ours, maybe not
            // open to us); the others were made here.
            let flushed = if k == 0 {
                sync_dir_above(storage, p)
            } else {
                sync_dir(storage, p)
            };
            if let Err(e) = flushed {
                // Not durable: the dirs made are removed again (innermost
                // first; one another writer put a file in meanwhile
                // stays), so that the next write makes them and flushes
                // them, instead of finding them there and trusting them
                // (found by cnid's crash-point enumeration: a record
                // restored next was lost with its dir at a power loss).
                // Through the seam: a process killed at the flush leaves
                // them (a simulated crash too).
                for d in &made {
                    let _ = storage.remove_dir(d);
                }
                return Err(e.into());
            }
        }
    }
    let id = match id {
        Some(id) => id,
        None => std::fs::metadata(dir).map(|m| DirId::of(&m))?,
    };
    Ok(Made { found, id, created })
}

/// A dir's identity: device, inode and birth time (where the file system
/// keeps one: a dir removed and made again often gets the same inode
/// number, never the same birth time). From the `statx` a `stat` of the
/// dir makes anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirId(u64, u64, Option<SystemTime>);

impl DirId {
    fn of(meta: &std::fs::Metadata) -> Self {
        DirId(meta.dev(), meta.ino(), meta.created().ok())
    }
}

/// The dirs whose entries a writer made durable (or found durable), for
/// [`ensure_private_dir_durable_once`]: by identity (device, inode, birth
/// time), so that a dir removed and made again (by anyone) is not taken
/// for the one flushed. Shared by the clones of one writer (the result
/// cache holds one in an `Arc`). Holds the last such dir only: one writer
/// has one dir to write in. A dir whose file system keeps no birth time is
/// never known (its flushes are made on every write, unless its parent is
/// older than the boot).
#[derive(Debug, Default)]
pub struct DurableDirs {
    last: std::sync::Mutex<Option<DirId>>,
}

impl DurableDirs {
    /// Never a dir without a birth time: where the file system keeps none
    /// (ext4 with 128-byte inodes, ext2/ext3, NFS), a dir removed and made
    /// again by another tool gets the same inode number and so the same
    /// identity (found by an attack on the once rule: the first write into
    /// the new, unflushed dir flushed nothing above it).
    fn knows(&self, id: DirId) -> bool {
        id.2.is_some() && *self.last.lock().unwrap_or_else(|e| e.into_inner()) == Some(id)
    }

    fn learn(&self, id: DirId) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
    }
}

/// [`ensure_private_dir_durable`] for a writer that trusts no dir it
/// finds: the first time `known` sees `dir` (by identity: device, inode and birth time), the
/// entry of `dir` in its parent and the parent's in the grandparent (the
/// result cache's `results/` in the cache dir, the cache dir in its
/// parent) are made durable too, each one not just made (and flushed)
/// here by an `fsync` of the dir that holds it, outermost first; from then
/// on, as long as `dir` is the same, nothing more than
/// [`ensure_private_dir_durable`] does (no system call more).
///
/// Why: a dir found there may have been made by a process killed before
/// it flushed it, or by a writer that never flushes (libcni, a cache
/// [`with_durable(false)`](crate::cache::ResultCache::with_durable),
/// cnid's): the kernel keeps it until a power loss, which would take it
/// away with every record written into it since, each one flushed into a
/// dir that was not durable itself (found by cnid's crash-point
/// enumeration, a `kill -9`, a restart and a power loss combined).
///
/// The dirs above the grandparent are flushed the same way (their entries
/// in the dir above), as far up as they changed since the boot, not past a
/// mount point nor the root: a killed writer's `mkdir -p` may have made
/// the cache dir's parents too.
///
/// Neither flush is needed, and none is made, when the parent's inode has
/// not changed since this boot began (its ctime, [`crate::sys::boot_time`]):
/// no entry was made, removed or renamed in it since, and the parent itself
/// was neither made nor renamed; what a reboot left is on disk (the same
/// rule stops the walk up). That keeps
/// a one-shot writer (cnitool: one write per process) at its two flushes
/// per record on a cache dir older than the boot. A clock stepped forward
/// by more than two seconds after the boot can make a dir made before the
/// step look older than the boot (a machine without a real-time clock
/// before NTP): then it is trusted as before this fix, which a file
/// system's own write-back (ext4: every 5 s) makes durable soon after.
///
/// A dir above `dir` that cannot be opened ([`sync_dir_above`]: a non-root
/// writer without read permission on it) is warned about once and counts
/// as flushed. On another failure the error returns and nothing is
/// remembered: the next write tries again.
#[track_caller]
pub fn ensure_private_dir_durable_once(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    fsync: bool,
    known: &DurableDirs,
) -> io::Result<PrivateDir> {
    if !fsync {
        return ensure_private_dir(dir);
    }
    let made = make_durable(storage, dir)?;
    entries_durable(storage, dir, made.id, made.created, known)?;
    Ok(made.found)
}

/// For a writer that wrote into `dir` without flushing it (a cache
/// [`with_durable(false)`](crate::cache::ResultCache::with_durable)) and now
/// makes its writes durable: the entries of `dir` and of its parent, as
/// [`ensure_private_dir_durable_once`] makes them durable (once per dir
/// `known` sees); nothing when `dir` is missing.
#[track_caller]
pub fn sync_entries_once(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    known: &DurableDirs,
) -> Result<(), Failure> {
    match std::fs::metadata(dir) {
        Ok(m) => entries_durable(storage, dir, DirId::of(&m), 0, known),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Failure::new("stat", dir, e)),
    }
}

/// The flushes of [`ensure_private_dir_durable_once`] for `dir` (`id`),
/// whose `created` innermost levels were made and flushed already.
#[track_caller]
fn entries_durable(
    storage: &(impl Storage + ?Sized),
    dir: &Path,
    id: DirId,
    created: usize,
    known: &DurableDirs,
) -> Result<(), Failure> {
    if known.knows(id) {
        return Ok(());
    }
    // The dirs holding `dir` and each dir above it, innermost first, up to
    // the first one unchanged since the boot (its entries, and its own
    // entry above, are what the reboot found on disk). Not only two
    // levels: a writer killed before its flushes (or one that never
    // flushes) may have made the cache dir's parents too, and a power loss
    // takes those with the cache dir (found by an attack on the once
    // rule). The `created` innermost ones were flushed by `make_durable`.
    // Not past a mount point: the dir mounted on is not the writer's (nor
    // made by one), and the file system above may be one whose dirs
    // cannot be flushed (erofs, squashfs: EINVAL). Up to the root at most:
    // a path ending in `..` is walked up by more `..`, and the root's `..`
    // is the root (same inode). A dir that cannot be stat'ed stops it too.
    let stop = |holder: &Path, d: &Path| match (std::fs::metadata(holder), std::fs::metadata(d)) {
        (Ok(h), Ok(d)) => h.dev() != d.dev() || h.ino() == d.ino(),
        _ => true,
    };
    let mut holders = Vec::new();
    let mut d = dir.to_owned();
    while let Some(holder) = dir_above(&d) {
        if (holders.len() >= created && unchanged_since_boot(&holder)) || stop(&holder, &d) {
            break;
        }
        holders.push(holder.clone());
        d = holder;
    }
    for h in holders.iter().skip(created).rev() {
        sync_dir_above(storage, h)?;
    }
    known.learn(id);
    Ok(())
}

/// The dir that holds `dir` (`.` for a bare name, `<dir>/..` for a path
/// ending in `.` or `..`); `None` for the root.
fn dir_above(dir: &Path) -> Option<PathBuf> {
    use std::path::Component;
    match dir.components().next_back()? {
        Component::Normal(_) => Some(match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        }),
        Component::CurDir | Component::ParentDir => Some(dir.join("..")),
        Component::RootDir | Component::Prefix(_) => None,
    }
}

/// Whether `dir`'s inode is unchanged since this boot began: its ctime
/// (which a `touch` cannot set back) more than two seconds before the
/// boot time (whole seconds, moved by clock adjustments). `false` when
/// either cannot be read.
fn unchanged_since_boot(dir: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(dir) else {
        return false;
    };
    let changed = std::time::UNIX_EPOCH
        + std::time::Duration::new(
            u64::try_from(meta.ctime()).unwrap_or(0),
            u32::try_from(meta.ctime_nsec()).unwrap_or(0),
        );
    older_than_boot(changed, crate::sys::boot_time())
}

/// `changed` more than two seconds before `boot`.
fn older_than_boot(changed: SystemTime, boot: Option<SystemTime>) -> bool {
    const MARGIN: std::time::Duration = std::time::Duration::from_secs(2);
    boot.is_some_and(|b| changed + MARGIN < b)
}

/// `fsync`s a dir above the ones a writer owns (the parent of its state or
/// cache dir): as [`sync_dir`], except that a dir the process may not open
/// (`EACCES`, `EPERM`: a writer not root, without read permission on it)
/// is not an error. Nothing better can be done for it (the entries in it
/// are left to the file system's write-back), and failing for it would
/// stop a non-root cnid from starting, or keep its journal's lines
/// forever. Warned about once per dir and process.
#[track_caller]
pub fn sync_dir_above(storage: &(impl Storage + ?Sized), dir: &Path) -> Result<(), Failure> {
    match sync_dir(storage, dir) {
        Err(f) if matches!(f.source.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
            let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
            if !warned.iter().any(|d| d == dir) {
                warned.push(dir.to_owned());
                tracing::warn!(
                    dir = %dir.display(),
                    error = %f.source,
                    "cannot open this directory to flush it; the entries of the directories made in it are left to the file system's write-back (a power loss soon after they were made may take them)"
                );
            }
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn temp_names_are_hidden_unique_and_recognised() {
        let p = Path::new("/d/net-c1-eth0");
        let a = temp_path(p);
        let b = temp_path(p);
        assert_ne!(a, b, "two writes share a temp file");
        assert_eq!(a.parent(), Some(Path::new("/d")));
        let name = a.file_name().unwrap().to_str().unwrap();
        let rest = name
            .strip_prefix(".net-c1-eth0.tmp-")
            .unwrap_or_else(|| panic!("{name}"));
        let (pid, n) = rest.split_once('-').unwrap();
        assert_eq!(pid, std::process::id().to_string());
        assert!(n.parse::<u64>().is_ok(), "{name}");
        assert!(is_temp_name(name));
        // Older writers' names (cnid's `.tmp-<ms>`, the shim's `.tmp-<pid>`).
        assert!(is_temp_name(".n:c:eth0.json.tmp-1"));
        assert!(!is_temp_name("net-c1-eth0"));
        assert!(!is_temp_name("x.tmp-1"), "not hidden: someone's file");
        assert!(!is_temp_name(".hidden"));
    }

    /// The longest names callers accept (cnid's intents: 227 bytes) still
    /// get a temp file and a place in `corrupt/`: the name is cut, the
    /// unique suffix kept.
    #[test]
    fn long_names_are_cut_to_fit() {
        let tmp = tempfile::tempdir().unwrap();
        let long = format!("{}é{}", "n".repeat(200), "x".repeat(52));
        assert_eq!(long.len(), 254);
        let p = tmp.path().join(&long);
        let t = temp_path(&p);
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(name.len() <= NAME_MAX && name.len() > 240, "{}", name.len());
        assert!(is_temp_name(name) && name.starts_with(".nnn"), "{name}");
        write_atomic(&p, b"x", 0o600, true).unwrap();
        let moved = move_aside(&Disk, &p, &tmp.path().join("corrupt")).unwrap();
        assert!(moved.file_name().unwrap().len() <= NAME_MAX);
        assert_eq!(std::fs::read(&moved).unwrap(), b"x");
    }

    #[test]
    fn write_replaces_whole_file_with_its_mode_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        write_atomic(&p, b"one", 0o600, true).unwrap();
        write_atomic(&p, b"two", 0o600, false).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(names(tmp.path()), ["f"]);
    }

    /// The order that makes a write durable: data fsynced before the
    /// rename publishes it, the dir fsynced after the rename (and not
    /// before); without fsync, neither.
    #[test]
    fn fsyncs_come_in_order_around_the_rename() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("rec");
        take_trace();
        write_atomic(&p, b"x", 0o600, true).unwrap();
        let steps = take_trace();
        let ops: Vec<&str> = steps.iter().map(|s| s.split_once(' ').unwrap().0).collect();
        assert_eq!(
            ops,
            ["create", "fdatasync", "rename", "fsync-dir"],
            "{steps:?}"
        );
        assert!(steps[1].contains(".rec.tmp-"), "{steps:?}");
        assert_eq!(steps[3], format!("fsync-dir {}", tmp.path().display()));

        write_atomic(&p, b"y", 0o600, false).unwrap();
        let ops: Vec<String> = take_trace()
            .into_iter()
            .map(|s| s.split_once(' ').unwrap().0.to_owned())
            .collect();
        assert_eq!(ops, ["create", "rename"]);
    }

    /// Issue 25: a durable write into a dir that had to be created flushes
    /// the parents of the dirs created (else a power loss can take the dir
    /// and the record away after the write returned); into a dir that was
    /// there, only the dir the file went into.
    #[test]
    fn created_dirs_are_flushed_once() {
        let tmp = tempfile::tempdir().unwrap();
        let results = tmp.path().join("cache/results");
        take_trace();
        ensure_private_dir_durable(&Disk, &results, true).unwrap();
        assert_eq!(
            take_trace(),
            [
                format!("fsync-dir {}", tmp.path().display()),
                format!("fsync-dir {}", tmp.path().join("cache").display()),
            ]
        );
        assert!(results.is_dir());
        // There already: nothing to flush.
        assert_eq!(
            ensure_private_dir_durable(&Disk, &results, true).unwrap(),
            PrivateDir::Private
        );
        assert_eq!(take_trace(), Vec::<String>::new());
        // Without fsync, never.
        ensure_private_dir_durable(&Disk, &tmp.path().join("other"), false).unwrap();
        assert_eq!(take_trace(), Vec::<String>::new());
    }

    /// A dir whose inode has not changed since the boot (its ctime more
    /// than the boot time's rounding before it) needs no flush of its
    /// entries; one changed since, or a boot time not known, does.
    #[test]
    fn dirs_unchanged_since_the_boot_are_durable_already() {
        use std::time::Duration;
        let boot = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        assert!(older_than_boot(at(999_997), Some(boot)));
        assert!(!older_than_boot(at(999_998), Some(boot)), "the rounding");
        assert!(!older_than_boot(at(1_000_100), Some(boot)));
        assert!(!older_than_boot(at(0), None), "no boot time");
        let tmp = tempfile::tempdir().unwrap();
        assert!(!unchanged_since_boot(tmp.path()), "made now");
        assert!(!unchanged_since_boot(&tmp.path().join("missing")));
    }

    #[test]
    fn the_dir_above() {
        let above = |p: &str| dir_above(Path::new(p)).map(|d| d.display().to_string());
        assert_eq!(above("/var/lib/cni").as_deref(), Some("/var/lib"));
        assert_eq!(above("/cni").as_deref(), Some("/"));
        assert_eq!(above("/"), None);
        assert_eq!(above("cni").as_deref(), Some("."));
        assert_eq!(above(".").as_deref(), Some("./.."));
        assert_eq!(above("a/..").as_deref(), Some("a/../.."));
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, b"old").unwrap();
        // A dir at the target: the rename fails after the temp was written.
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("inside"), b"").unwrap();
        let e = write_atomic(&d, b"new", 0o600, true).unwrap_err();
        assert_eq!(e.op, "rename temp file into place", "{e}");
        assert!(e.to_string().contains(&d.display().to_string()), "{e}");
        assert_eq!(names(tmp.path()), ["d", "f"]);
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
    }

    #[test]
    fn reads_refuse_symlinks_and_fifos() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, b"secret").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = read_nofollow(&link).unwrap_err();
        assert!(is_symlink_refusal(&e), "{e}");
        assert_eq!(read_nofollow(&target).unwrap(), b"secret");

        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_nofollow(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(!is_symlink_refusal(&e));
        let e = read_nofollow(&tmp.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    /// A write never goes through a symbolic link: not one planted at the
    /// temp file's name (created new, `O_NOFOLLOW`), nor one at the target
    /// (replaced by the rename, its target untouched).
    #[test]
    fn writes_never_follow_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let planted = tmp.path().join(".f.tmp-planted");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let e = Disk.create_new(&planted, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        let dangling = tmp.path().join(".g.tmp-planted");
        std::os::unix::fs::symlink(tmp.path().join("new-victim"), &dangling).unwrap();
        assert!(Disk.create_new(&dangling, 0o600).is_err());
        assert!(!tmp.path().join("new-victim").exists());

        let p = tmp.path().join("f");
        std::os::unix::fs::symlink(&victim, &p).unwrap();
        write_atomic(&p, b"new", 0o600, true).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&p).unwrap().is_file());
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
    }

    #[test]
    fn corrupt_files_move_aside_into_a_private_dir_under_distinct_names() {
        let tmp = tempfile::tempdir().unwrap();
        let corrupt = tmp.path().join("corrupt");
        let p = tmp.path().join("n-c-eth0");
        std::fs::write(&p, b"{bad").unwrap();
        let first = move_aside(&Disk, &p, &corrupt).unwrap();
        std::fs::write(&p, b"{bad again").unwrap();
        let second = move_aside(&Disk, &p, &corrupt).unwrap();
        assert_ne!(first, second);
        assert!(!p.exists());
        assert_eq!(std::fs::read(&first).unwrap(), b"{bad");
        assert_eq!(std::fs::read(&second).unwrap(), b"{bad again");
        assert!(
            first
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("n-c-eth0.")
        );
        assert_eq!(
            std::fs::metadata(&corrupt).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // A link is moved as the link, its target untouched.
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, b"t").unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let moved = move_aside(&Disk, &p, &corrupt).unwrap();
        assert!(std::fs::symlink_metadata(&moved).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"t");
        // Nothing to move: the error names the file.
        let e = move_aside(&Disk, &p, &corrupt).unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        assert_eq!(e.path, p);
    }

    #[test]
    fn leftovers_are_temp_files_only() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(d.join(".a.tmp-1-2"), b"half").unwrap();
        std::fs::write(d.join(".b.json.tmp-17"), b"half").unwrap();
        std::fs::write(d.join("a"), b"whole").unwrap();
        std::fs::write(d.join(".hidden"), b"not ours").unwrap();
        std::fs::create_dir(d.join(".dir.tmp-3")).unwrap();
        assert_eq!(remove_leftovers(&Disk, d).unwrap(), 2);
        assert_eq!(names(d), [".dir.tmp-3", ".hidden", "a"]);
        assert_eq!(remove_leftovers(&Disk, &d.join("missing")).unwrap(), 0);
    }

    /// Issue 21's fourth defect: a killed cache writer's temp file stayed
    /// in the shared `results/` forever. Removed now when its writer is
    /// dead and it is old enough; a live writer's, a recent one, another
    /// tool's name, a link and a dir are left alone.
    #[test]
    fn temp_files_of_killed_cache_writers_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        // A pid that names no process: a child that was reaped.
        let dead = {
            let mut c = std::process::Command::new("/bin/true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            pid
        };
        let me = std::process::id();
        let old = SystemTime::now() - std::time::Duration::from_secs(3600);
        let write = |name: &str, age: Option<SystemTime>| {
            let p = d.join(name);
            std::fs::write(&p, b"half").unwrap();
            if let Some(t) = age {
                File::options()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_modified(t)
                    .unwrap();
            }
        };
        let abandoned = format!(".neta-w2-eth0.tmp-{dead}-1764700000000000000");
        write(&abandoned, Some(old));
        write(&format!(".live-c-eth0.tmp-{me}-1"), Some(old));
        write(&format!(".young-c-eth0.tmp-{dead}-2"), None);
        write(&format!(".other.tmp-{dead}"), Some(old));
        write(&format!(".other.tmp-{dead}-x"), Some(old));
        write(&format!("n-c-eth0.tmp-{dead}-3"), Some(old));
        write("n-c-eth0", Some(old));
        std::os::unix::fs::symlink("n-c-eth0", d.join(format!(".l.tmp-{dead}-4"))).unwrap();
        std::fs::create_dir(d.join(format!(".d.tmp-{dead}-5"))).unwrap();
        let before = names(d);
        let min_age = std::time::Duration::from_secs(600);
        assert_eq!(remove_abandoned(&Disk, d, min_age).unwrap(), 1);
        let mut want = before.clone();
        want.retain(|n| *n != abandoned);
        assert_eq!(names(d), want);
        // Again: nothing more (restartable).
        assert_eq!(remove_abandoned(&Disk, d, min_age).unwrap(), 0);
        assert_eq!(
            remove_abandoned(&Disk, &d.join("missing"), min_age).unwrap(),
            0
        );
        assert_eq!(temp_writer(".a.tmp-12-34"), Some(12));
        assert_eq!(temp_writer(".a.tmp-0-34"), None);
        assert_eq!(temp_writer(".a.tmp--34"), None);
    }

    #[test]
    fn private_dirs_are_made_and_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        assert_eq!(ensure_private_dir(&d).unwrap(), PrivateDir::Private);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            ensure_private_dir(&d).unwrap(),
            PrivateDir::Tightened { was: 0o755 }
        );
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
