//! What a file system is: whether a path is on one held in memory.

/// Whether `path` is on a file system held in memory (tmpfs, ramfs), whose
/// content a reboot loses whatever was flushed.
pub fn on_memory_fs(path: &std::path::Path) -> std::io::Result<bool> {
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let st = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    let t = st.filesystem_type();
    Ok(t == nix::sys::statfs::TMPFS_MAGIC || t.0 as i64 == RAMFS_MAGIC)
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_file_systems_are_told_apart() {
        // tmpfs on every Linux we run on; procfs lives in memory too but is
        // neither tmpfs nor ramfs.
        assert!(super::on_memory_fs(std::path::Path::new("/dev/shm")).unwrap());
        assert!(!super::on_memory_fs(std::path::Path::new("/proc")).unwrap());
        assert!(super::on_memory_fs(std::path::Path::new("/nonexistent-dir")).is_err());
    }
}
