//! Reads that follow no link and hang on no FIFO.

use std::io::{self, Read};
use std::path::Path;

/// Reads a regular file without following a symbolic link at its last
/// component: a link fails with `ELOOP` ([`is_symlink_refusal`]), a FIFO
/// or device with [`io::ErrorKind::InvalidData`] (opened non-blocking, so
/// a FIFO cannot hang the reader).
pub fn read_nofollow(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = crate::storage::open_nonblocking(path)?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path for the duration of the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o700) }, 0);
        let e = read_nofollow(&fifo).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(!is_symlink_refusal(&e));
        let e = read_nofollow(&tmp.path().join("missing")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
