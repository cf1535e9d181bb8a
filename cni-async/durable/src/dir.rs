//! Private dirs (0700) and the moving aside of unreadable files into one.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::Failure;
use crate::storage::Storage;
use crate::write::{name_with_room, unique_suffix};

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
    // SAFETY: geteuid cannot fail and touches no memory.
    if meta.uid() != unsafe { libc::geteuid() } {
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

/// Moves `path` into `dir` (made private, [`ensure_private_dir`]) as
/// `<name>.<pid>-<n>` (`<name>` cut short to fit), so that two moves of
/// files of the same name keep both. Returns where it went and what
/// [`ensure_private_dir`] found of `dir` (for the caller to warn about).
/// A symbolic link is moved as the link.
#[track_caller]
pub fn move_into(
    storage: &(impl Storage + ?Sized),
    path: &Path,
    dir: &Path,
) -> Result<(PathBuf, PrivateDir), Failure> {
    let suffix = unique_suffix();
    let name = name_with_room(path, 1 + suffix.len());
    let target = dir.join(format!("{name}.{suffix}"));
    let found = ensure_private_dir(dir).map_err(|e| Failure::new("create directory", dir, e))?;
    storage
        .rename(path, &target)
        .map_err(|e| Failure::new("move aside", path, e))?;
    Ok((target, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Disk;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn corrupt_files_move_aside_into_a_private_dir_under_distinct_names() {
        let tmp = tempfile::tempdir().unwrap();
        let corrupt = tmp.path().join("corrupt");
        let p = tmp.path().join("n-c-eth0");
        std::fs::write(&p, b"{bad").unwrap();
        let (first, _) = move_into(&Disk, &p, &corrupt).unwrap();
        std::fs::write(&p, b"{bad again").unwrap();
        let (second, _) = move_into(&Disk, &p, &corrupt).unwrap();
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
        let (moved, _) = move_into(&Disk, &p, &corrupt).unwrap();
        assert!(std::fs::symlink_metadata(&moved).unwrap().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"t");
        // Nothing to move: the error names the file.
        let e = move_into(&Disk, &p, &corrupt).unwrap_err();
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
        assert_eq!(e.path, p);
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
