//! The node's CPU times as a cnid started by a test sees them, set by the
//! test: whether its pacing finds the CPUs idle (and lends a waiting
//! operation a run) or busy (and the slots hold) depends on the test, not
//! on how busy the machine is.
//!
//! cnid reads `/proc/stat` (`cnid/src/daemon/idle.rs`). [`FakeCpus::install`]
//! starts cnid in a mount namespace of its own (propagation to the host
//! off) where a FIFO is bind-mounted over `/proc/stat`; a thread of the
//! test answers every open of it with counters of 2 CPUs that advance by
//! one tick per CPU and answer, all idle, all busy, or unreadable as the
//! test last said ([`Cpus`]).
//!
//! # Caveats
//! - Every process cnid starts (its plugins) sees the same `/proc/stat`,
//!   and the mounts of the host made after cnid's start (a namespace a
//!   test binds under `/run/netns` later) are not seen inside: for tests of
//!   fake plugins. cnid, no longer in pid 1's mount namespace, warns that
//!   its reaper reaps only attachments of an earlier boot.
//! - The FIFO blocks a reader until the test's thread opens it (it tries
//!   every millisecond): keep the [`FakeCpus`] until the daemon is gone.
//! - Needs root (`unshare`, `mount`).

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

/// What the CPUs do, as `/proc/stat` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cpus {
    /// Both busy: pacing's slots hold.
    Busy,
    /// Both idle: pacing lends waiting operations a run.
    Idle,
    /// No `cpu` line: cnid cannot read its CPU times.
    Unreadable,
}

/// `/proc/stat` of a cnid, set by the test (see the module docs).
#[derive(Debug)]
pub struct FakeCpus {
    fifo: PathBuf,
    cpus: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl FakeCpus {
    /// A FIFO in `dir`, answering as `cpus` until told otherwise.
    pub fn new(dir: &Path, cpus: Cpus) -> FakeCpus {
        let fifo = dir.join("proc-stat");
        let path = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        let r = unsafe { libc::mkfifo(path.as_ptr(), 0o644) };
        assert_eq!(r, 0, "mkfifo {}", fifo.display());
        let state = Arc::new(AtomicU8::new(cpus as u8));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (fifo, state, stop) = (fifo.clone(), state.clone(), stop.clone());
            std::thread::spawn(move || answer(&fifo, &state, &stop))
        };
        FakeCpus {
            fifo,
            cpus: state,
            stop,
            writer: Some(writer),
        }
    }

    /// From the next read on, the CPUs do `cpus`.
    pub fn set(&self, cpus: Cpus) {
        self.cpus.store(cpus as u8, Ordering::SeqCst);
    }

    /// Makes `cmd` (cnid) see this `/proc/stat`: a `pre_exec` hook that
    /// unshares its mount namespace and binds the FIFO over it.
    pub fn install(&self, cmd: &mut Command) {
        let fifo = CString::new(self.fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: async-signal-safe calls on the child only, with strings
        // made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let null = std::ptr::null();
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        null,
                        c"/".as_ptr(),
                        null,
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        fifo.as_ptr(),
                        c"/proc/stat".as_ptr(),
                        null,
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl Drop for FakeCpus {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Answers each open of `fifo` for reading with the counters, advanced by
/// a tick per CPU each time, until `stop`. Copies written while one reader
/// still reads follow the first (its `intr` line ends what cnid reads).
fn answer(fifo: &Path, state: &AtomicU8, stop: &AtomicBool) {
    let (mut busy, mut idle) = (0u64, 0u64);
    while !stop.load(Ordering::SeqCst) {
        // Non-blocking: fails (ENXIO) while no reader has it open.
        let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let text = match state.load(Ordering::SeqCst) {
            s if s == Cpus::Unreadable as u8 => "intr 0\n".to_owned(),
            s => {
                if s == Cpus::Idle as u8 {
                    idle += 2;
                } else {
                    busy += 2;
                }
                format!(
                    "cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\nintr 0\n"
                )
            }
        };
        // A reader that left meanwhile: the next one gets the next copy.
        let _ = f.write_all(text.as_bytes());
        drop(f);
        // The reader sees its end of file before the next copy comes.
        std::thread::sleep(Duration::from_millis(1));
    }
}
