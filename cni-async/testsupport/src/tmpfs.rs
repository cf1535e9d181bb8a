//! A small tmpfs mounted over a test's dir (a cache or state dir), to
//! fill it up (ENOSPC) or make it read-only; unmounted on drop.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

/// A tmpfs (64 KiB) mounted over a dir, unmounted on drop.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a 64 KiB tmpfs (mode 0700) over `dir`, made if missing.
    /// Needs root.
    pub fn mount(dir: &Path) -> Tmpfs {
        fs::create_dir_all(dir).expect("create mount point");
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("size=64k,mode=0700"),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {}: {e}", dir.display()));
        Tmpfs(dir.to_owned())
    }

    /// Remounts it read-only.
    pub fn read_only(&self) {
        nix::mount::mount(
            None::<&str>,
            &self.0,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("remount {} read-only: {e}", self.0.display()));
        assert!(fs::write(self.0.join("probe"), b"x").is_err());
    }

    /// Fills it up (directories and empty files still fit: they take no
    /// blocks on tmpfs).
    pub fn fill(&self) {
        let mut f = fs::File::create(self.0.join("filler")).expect("create filler");
        let chunk = [0u8; 4096];
        loop {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
        assert!(
            fs::write(self.0.join("probe"), [0u8; 4096]).is_err(),
            "the tmpfs is not full"
        );
        let _ = fs::remove_file(self.0.join("probe"));
    }

    /// Frees what [`Tmpfs::fill`] took.
    pub fn free(&self) {
        fs::remove_file(self.0.join("filler")).expect("remove filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Err(e) = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH) {
            eprintln!("cleanup: umount {}: {e}", self.0.display());
        }
    }
}
