//! What cnid tunes of its own process: the file mode creation mask around
//! one call, the open-file limit, glibc's allocator, a thread's CPU weight
//! around one call. cnid's, not the
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

/// Runs `f` with the calling thread's nice value lowered by `boost` (a
/// larger share of the CPUs), then puts it back. Processes the thread
/// starts meanwhile keep the lowered value for their life (a child
/// inherits its parent thread's). Linux keeps a nice value per thread, so
/// the rest of the process is untouched. Without the right to lower it
/// (`CAP_SYS_NICE`), `f` runs as is.
pub(crate) fn with_thread_boost<T>(boost: i32, f: impl FnOnce() -> T) -> T {
    let Some(old) = thread_nice().filter(|_| boost > 0) else {
        return f();
    };
    let tid = own_tid();
    if !set_nice(tid, (old - boost).max(-20)) {
        return f();
    }
    // Put back also when `f` unwinds. Raising a nice value back is always
    // allowed.
    struct Back(libc::id_t, i32);
    impl Drop for Back {
        fn drop(&mut self) {
            set_nice(self.0, self.1);
        }
    }
    let _back = Back(tid, old);
    f()
}

/// The calling thread's nice value (Linux keeps one per thread); `None`
/// when it cannot be read.
pub(crate) fn thread_nice() -> Option<i32> {
    nix::errno::Errno::clear();
    // SAFETY: getpriority reads the nice value of one of our threads; -1
    // is also a nice value, told apart from an error by errno.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS as _, own_tid()) };
    (nice != -1 || nix::errno::Errno::last_raw() == 0).then_some(nice)
}

fn own_tid() -> libc::id_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as libc::id_t }
}

fn set_nice(tid: libc::id_t, nice: i32) -> bool {
    // SAFETY: setpriority on one of our own threads; a refusal changes nothing.
    unsafe { libc::setpriority(libc::PRIO_PROCESS as _, tid, nice) == 0 }
}

// No unit test of `with_umask`: the mask is process-wide, and the other
// tests of this binary create files in parallel (cnid's security_modes
// tests pin the socket's mode).
#[cfg(test)]
mod tests {
    use super::*;

    fn own_nice() -> i32 {
        thread_nice().expect("the thread's nice value")
    }

    #[test]
    fn tuning_a_boost_lowers_the_nice_of_the_thread_and_its_children_then_puts_it_back() {
        std::thread::spawn(|| {
            let before = own_nice();
            let (during, child) = with_thread_boost(3, || {
                let out = std::process::Command::new("sh")
                    .args(["-c", "cut -d' ' -f19 /proc/self/stat"])
                    .output()
                    .unwrap();
                (own_nice(), String::from_utf8(out.stdout).unwrap())
            });
            if nix::unistd::geteuid().is_root() {
                assert_eq!(during, (before - 3).max(-20));
                assert_eq!(child.trim(), during.to_string(), "a child keeps it");
            }
            assert_eq!(own_nice(), before, "put back");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn nofile_limit_is_readable() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let now = raise_nofile_limit().unwrap();
        assert!(now >= soft && now <= hard, "{soft} {now} {hard}");
    }
}
