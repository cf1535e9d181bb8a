//! Atomic writes and the flushes that make them durable, and the names of
//! their temp files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Failure;
use crate::storage::{Disk, Storage};

/// Marks a temp file: `.<name>.tmp-<pid>-<n>`.
pub(crate) const TEMP_MARK: &str = ".tmp-";

/// `<pid>-<n>`, unique on this host for as long as the pid is: `n` is the
/// time in nanoseconds, made strictly increasing within the process.
pub(crate) fn unique_suffix() -> String {
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
pub(crate) const NAME_MAX: usize = 255;

/// `path`'s file name, cut (at a character boundary) so that `extra`
/// more bytes still make a valid file name: the suffix carries the
/// uniqueness, the name is for the reader.
pub(crate) fn name_with_room(path: &Path, extra: usize) -> String {
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
/// cni-async's `ensure_private_dir_durable`). Without `fsync` the write is still
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
    // Held until the rename is done: the proof that this writer is alive
    // for `remove_abandoned`, whatever pid namespace it is in. On its own
    // open file description, read-only: `f` is closed before the rename
    // (an executable with a descriptor open for writing cannot be run).
    let _alive = hold_temp(tmp);
    storage
        .write(&f, bytes)
        .map_err(|e| Failure::new("write", tmp, e))?;
    if fsync {
        // fdatasync, not fsync: it flushes the data and what reading
        // it back needs (the size, the blocks); a new file's times
        // are all it leaves out, and nothing reads those.
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

/// The writer's hold on its temp file ([`hold_temp`]), for the sweep's
/// tests.
#[cfg(test)]
pub(crate) fn tests_hold(tmp: &Path) -> std::fs::File {
    hold_temp(tmp).expect("a hold on the temp file")
}

/// A shared `flock` on the temp file `tmp`, on a read-only descriptor of
/// its own; `None` when it cannot be taken (the write goes on: the sweep
/// then has the pid and the age to go by).
fn hold_temp(tmp: &Path) -> Option<std::fs::File> {
    let f = crate::no_follow().read(true).open(tmp).ok()?;
    f.try_lock_shared().ok()?;
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::names;
    use std::os::unix::fs::PermissionsExt;

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
        let (moved, _) = crate::move_into(&Disk, &p, &tmp.path().join("corrupt")).unwrap();
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
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
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
}
