//! What cnid tunes of its own process: the file mode creation mask around
//! one call, the open-file limit, glibc's allocator. cnid's, not the
//! library's: a program that links `cni-async` keeps its own process
//! settings.
//!
//! Process-wide settings: call them from the start-up path, before other
//! threads create files ([`with_umask`] changes the mask of every thread
//! while `f` runs).

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::stat::{Mode, umask};

/// Runs `f` with the file mode creation mask `mask` (e.g. `0o177`, so that
/// a socket is created without any permission for others), then restores
/// the previous mask.
pub(crate) fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    let old = umask(Mode::from_bits_truncate(mask));
    let out = f();
    umask(old);
    out
}

/// Raises the soft open-file limit (`RLIMIT_NOFILE`) to the hard one and
/// returns the limit in force afterwards; `None` when it cannot be read.
/// A refused raise is logged (debug) and leaves the soft limit.
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::debug!(error = %e, "cannot raise RLIMIT_NOFILE");
            return Some(soft);
        }
        return Some(hard);
    }
    Some(soft)
}

/// Returns the free pages of every glibc arena to the system
/// (`malloc_trim(0)`); a no-op elsewhere. Costs a few ms of CPU.
pub(crate) fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixes glibc's mmap threshold (`mallopt(M_MMAP_THRESHOLD, bytes)`):
/// allocations from `bytes` on get a mapping of their own, unmapped when
/// freed. By default the threshold grows to the largest mapped block freed
/// (up to 32 MiB), after which blocks of that size come from the heap and
/// stay resident once freed. A no-op elsewhere; a refused value changes
/// nothing.
pub(crate) fn set_mmap_threshold(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt has no preconditions; a refused value changes nothing.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

// No unit test of `with_umask`: the mask is process-wide, and the other
// tests of this binary create files in parallel (cnid's security_modes
// tests pin the socket's mode).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nofile_limit_is_readable() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let now = raise_nofile_limit().unwrap();
        assert!(now >= soft && now <= hard, "{soft} {now} {hard}");
    }
}
