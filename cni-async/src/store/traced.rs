//! A [`Storage`] for the store's tests: the real [`Disk`], with the steps
//! of the durable calls recorded (`create`, `fdatasync`, `rename`,
//! `fsync-dir`, `fsync-file`, each with its path) for the tests of their
//! order.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::durable::{Disk, Storage};

/// The real disk, its flushes and renames recorded.
#[derive(Debug, Default)]
pub(crate) struct Traced {
    steps: Mutex<Vec<String>>,
}

impl Traced {
    /// The steps recorded since the last call.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.steps.lock().unwrap())
    }

    fn push(&self, step: &str, path: &Path) {
        self.steps
            .lock()
            .unwrap()
            .push(format!("{step} {}", path.display()));
    }
}

/// Where an open file is (its descriptor's link in `/proc/self/fd`).
fn path_of(file: &File) -> PathBuf {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap_or_default()
}

impl Storage for Traced {
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.push("create", path);
        Disk.create_new(path, mode)
    }
    fn open_append(&self, path: &Path) -> io::Result<File> {
        Disk.open_append(path)
    }
    fn open_write(&self, path: &Path) -> io::Result<File> {
        Disk.open_write(path)
    }
    fn open_lock(&self, path: &Path) -> io::Result<File> {
        Disk.open_lock(path)
    }
    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        Disk.write(file, bytes)
    }
    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        Disk.truncate(file, len)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.push("fdatasync", &path_of(file));
        Disk.sync_data(file)
    }
    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.push("fsync", &path_of(file));
        Disk.sync_all(file)
    }
    fn sync_file(&self, path: &Path) -> io::Result<bool> {
        self.push("fsync-file", path);
        Disk.sync_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.push("fsync-dir", dir);
        Disk.sync_dir(dir)
    }
    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.push("syncfs", dir);
        Disk.sync_fs(dir)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.push("rename", to);
        Disk.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        Disk.remove(path)
    }
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        Disk.remove_dir(path)
    }
}
