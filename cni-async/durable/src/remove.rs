//! Removal of the temp files of writes a crash interrupted.

use std::io;
use std::path::Path;

use crate::Failure;
use crate::storage::Storage;
use crate::write::{TEMP_MARK, is_temp_name};

/// Removes the temp files ([`is_temp_name`]) a crash left in `dir`, and
/// returns how many. Only when no writer is active in `dir` (see the
/// module's caveats). A missing dir has none.
#[track_caller]
pub fn remove_leftovers(storage: &(impl Storage + ?Sized), dir: &Path) -> Result<usize, Failure> {
    remove_picked(storage, dir, |name, entry| {
        is_temp_name(name) && entry.file_type().is_ok_and(|t| t.is_file())
    })
}

/// How old a temp file whose writer's pid names no process must be
/// before [`remove_abandoned`] may take it: no durable write takes that
/// long, even by a writer in another pid namespace, whose pid may name no
/// process here. The sweeps of cnid's cache and of cnid-shim's install use it.
pub const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// In a dir shared with other writers (the result cache's `results/`):
/// removes the temp files of [`write_atomic`](crate::write_atomic) whose
/// writer died, and returns how many: only a regular file named exactly as
/// [`temp_path`](crate::temp_path) names them, whose `pid` names no process
/// (`kill(pid, 0)`), last modified at least `min_age` ago, and that no
/// writer holds (a writer keeps a `flock` on its temp file until its
/// rename). A missing dir has none.
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
        meta.is_file() && old && !pid_alive(pid) && !held(&dir.join(name))
    })
}

/// Whether a writer holds the temp file at `path` ([`write_atomic_on`](crate::write_atomic_on)
/// keeps a `flock` on it until its rename): the proof of a live writer in
/// another pid namespace, or whose pid was reused. In doubt, held.
fn held(path: &Path) -> bool {
    let Ok(f) = crate::no_follow().read(true).open(path) else {
        return true;
    };
    f.try_lock().is_err()
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

/// Whether process `pid` exists (`kill(pid, 0)`; a process we may not
/// signal counts, and so does a zombie). Pid 0 names none.
fn pid_alive(pid: u32) -> bool {
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => {
            // SAFETY: signal 0 sends nothing; it only checks the pid.
            let sent = unsafe { libc::kill(raw, 0) } == 0;
            sent || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Disk;
    use crate::tests::names;
    use std::fs::File;
    use std::time::SystemTime;

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

    /// Defect: a killed cache writer's temp file stayed
    /// in the shared `results/` forever. Removed now when its writer is
    /// dead and it is old enough; a live writer's, a recent one, another
    /// tool's name, a link and a dir are left alone.
    #[test]
    fn temp_files_of_killed_cache_writers_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        // A pid that names no process (above pid_max).
        let dead = cni_test_support::process::unused_pid();
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

    /// A writer in another pid namespace (or whose pid names another
    /// process's by now) shows a pid `kill(pid, 0)` cannot find; a write
    /// stalled past `min_age` (a frozen cgroup, a stopped process, a hung
    /// disk) lost its temp file to the sweep, and its rename failed. A
    /// writer holds a lock on its temp file until the rename: a held one
    /// stays, whatever its pid and age.
    #[test]
    fn a_temp_file_a_writer_holds_is_kept_whatever_its_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let dead = cni_test_support::process::unused_pid();
        let name = format!(".n-c-eth0.tmp-{dead}-1");
        let p = d.join(&name);
        std::fs::write(&p, b"half").unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(SystemTime::now() - std::time::Duration::from_secs(3600))
            .unwrap();
        // As a writer holds it between its create and its rename.
        let writer = crate::write::tests_hold(&p);
        let min_age = std::time::Duration::from_secs(600);
        assert_eq!(remove_abandoned(&Disk, d, min_age).unwrap(), 0);
        assert_eq!(names(d), [name.as_str()]);
        drop(writer);
        assert_eq!(remove_abandoned(&Disk, d, min_age).unwrap(), 1);
        assert!(names(d).is_empty());
    }
}
