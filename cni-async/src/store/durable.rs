//! Durable writes as the store makes them: the primitives of
//! [`cni_durable`] (re-exported here), and what a writer owes the dirs its
//! files go in: made durable in their parents when made
//! ([`ensure_private_dir_durable`]) or, for a writer that trusts no dir it
//! finds, once per dir ([`ensure_private_dir_durable_once`]).
//!
//! # Caveats
//! - A dir whose inode has not changed since the boot (its ctime before
//!   the boot time) is trusted without a flush: what a reboot left is on
//!   disk. A clock stepped forward by more than two seconds after the boot
//!   can make a younger dir look older; the file system's own write-back
//!   makes it durable soon after.
//! - Removals are never flushed (see [`cni_durable`]).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use cni_durable::*;

/// Moves `path` into `corrupt_dir` ([`move_into`]), warning about what was
/// wrong with that dir. Returns where it went.
#[track_caller]
pub fn move_aside(
    storage: &(impl Storage + ?Sized),
    path: &Path,
    corrupt_dir: &Path,
) -> Result<PathBuf, Failure> {
    let (target, found) = move_into(storage, path, corrupt_dir)?;
    super::report_private_dir("directory of corrupt files", corrupt_dir, found);
    Ok(target)
}

/// [`ensure_private_dir`] for the dir a durable write is about to put a
/// file in: with `fsync`, each dir it had to create (`dir` and missing
/// parents) is made durable by an `fsync` of its parent, so that a power
/// loss cannot take it with the file written into it. A dir that was there
/// already is not flushed here, so when a flush fails, the dirs made are
/// removed again (when empty) for the next write to make and flush them.
/// The outermost parent is flushed with [`sync_dir_above`].
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
        let parents = made.iter().rev().filter_map(|d| d.parent()).map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        });
        for (k, p) in parents.enumerate() {
            // The outermost is a dir that was there (not ours, maybe not
            // open to us); the others were made here.
            let flushed = if k == 0 {
                sync_dir_above(storage, p)
            } else {
                sync_dir(storage, p)
            };
            if let Err(e) = flushed {
                // Innermost first; one another writer put a file in
                // meanwhile stays. Through the seam: a process killed at
                // the flush leaves them.
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

/// The dir whose entries a writer made durable (or found durable), for
/// [`ensure_private_dir_durable_once`], by identity (device, inode, birth
/// time), so that a dir removed and made again is not taken for the one
/// flushed. Holds the last such dir only: one writer has one dir to write
/// in.
#[derive(Debug, Default)]
pub struct DurableDirs {
    last: std::sync::Mutex<Option<DirId>>,
}

impl DurableDirs {
    /// Never a dir without a birth time (ext4 with 128-byte inodes,
    /// ext2/ext3, NFS): made again, it gets the same inode number and so
    /// the same identity.
    fn knows(&self, id: DirId) -> bool {
        id.2.is_some() && *self.last.lock().unwrap_or_else(|e| e.into_inner()) == Some(id)
    }

    fn learn(&self, id: DirId) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
    }
}

/// [`ensure_private_dir_durable`] for a writer that trusts no dir it
/// finds: the first time `known` sees `dir`, the entry of `dir` in its
/// parent and of each dir above in the next (`results/` in the cache dir,
/// the cache dir in its parent, ...) are made durable too, outermost first,
/// as far up as they changed since the boot (not past a mount point nor
/// the root); from then on, for the same `dir`, no system call more.
///
/// Why: a dir found there may have been made by a process killed before
/// it flushed it, or by a writer that never flushes (libcni, a cache
/// [`with_durable(false)`](crate::cache::ResultCache::with_durable)): a
/// power loss would take it away with every record written into it since.
///
/// A parent whose inode has not changed since this boot (see the module's
/// caveats) needs no flush: that keeps a one-shot writer (cnitool) at two
/// flushes per record. On a failure other than [`sync_dir_above`]'s
/// EACCES the error returns and nothing is remembered.
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

/// The flushes of [`ensure_private_dir_durable_once`] for a writer that
/// wrote into `dir` without them and now makes its writes durable; nothing
/// when `dir` is missing.
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
    // the first one unchanged since the boot; the `created` innermost ones
    // were flushed by `make_durable`. Not past a mount point (the file
    // system above may not flush dirs: erofs, squashfs), nor the root (its
    // `..` is itself), nor a dir that cannot be stat'ed.
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
    crate::sys::before_boot(changed, crate::sys::boot_time())
}

/// `fsync`s a dir above the ones a writer owns: as [`sync_dir`], except
/// that a dir the process may not open (`EACCES`, `EPERM`: a non-root
/// writer) is warned about once per dir and left to the file system's
/// write-back, not an error (which would stop a non-root cnid from
/// starting).
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
    use crate::store::traced::Traced;
    use std::time::UNIX_EPOCH;

    /// A durable write into a dir that had to be created flushes
    /// the parents of the dirs created (else a power loss can take the dir
    /// and the record away after the write returned); into a dir that was
    /// there, only the dir the file went into.
    #[test]
    fn created_dirs_are_flushed_once() {
        let tmp = tempfile::tempdir().unwrap();
        let results = tmp.path().join("cache/results");
        let disk = Traced::default();
        disk.take();
        ensure_private_dir_durable(&disk, &results, true).unwrap();
        assert_eq!(
            disk.take(),
            [
                format!("fsync-dir {}", tmp.path().display()),
                format!("fsync-dir {}", tmp.path().join("cache").display()),
            ]
        );
        assert!(results.is_dir());
        // There already: nothing to flush.
        assert_eq!(
            ensure_private_dir_durable(&disk, &results, true).unwrap(),
            PrivateDir::Private
        );
        assert_eq!(disk.take(), Vec::<String>::new());
        // Without fsync, never.
        ensure_private_dir_durable(&disk, &tmp.path().join("other"), false).unwrap();
        assert_eq!(disk.take(), Vec::<String>::new());
    }

    /// A dir whose inode has not changed since the boot (its ctime more
    /// than the boot time's rounding before it) needs no flush of its
    /// entries; one changed since, or a boot time not known, does.
    #[test]
    fn dirs_unchanged_since_the_boot_are_durable_already() {
        use std::time::Duration;
        let boot = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        assert!(crate::sys::before_boot(at(999_997), Some(boot)));
        assert!(
            !crate::sys::before_boot(at(999_998), Some(boot)),
            "the rounding"
        );
        assert!(!crate::sys::before_boot(at(1_000_100), Some(boot)));
        assert!(!crate::sys::before_boot(at(0), None), "no boot time");
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
}
