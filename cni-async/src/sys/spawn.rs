//! Starting a plugin without glibc's `posix_spawn`, and reaping it by pidfd.
//!
//! [`spawn`] makes one `clone3` with `CLONE_VM | CLONE_VFORK |
//! CLONE_CLEAR_SIGHAND | CLONE_PIDFD` (Linux 5.5+; x86_64 only), vfork
//! style: the child runs on our stack while this thread is suspended, and
//! makes only raw system calls from registers and a plan prepared in advance
//! (`dup2` of the three pipe ends, `setpgid(0, 0)`, SIGPIPE back to its
//! default, an empty signal mask, `execve`), never touching the stack. The
//! kernel resets every signal handler in the child (`CLONE_CLEAR_SIGHAND`),
//! so no handler of ours can run on the shared stack before `execve`: that
//! is what glibc's `posix_spawn` does by hand with about 120 `rt_sigaction`
//! calls per spawn. The pidfd comes with the clone (no `pidfd_open`), and
//! the plugin is reaped through it (`waitid(P_PIDFD)`), so a pid reused
//! after the reap is never waited for or signalled by mistake.
//!
//! Where `clone3` is refused (a seccomp filter answering ENOSYS or EPERM, an
//! older kernel: EINVAL or E2BIG) [`spawn`] returns
//! [`Spawn::Unsupported`] and the caller falls back to `tokio::process`.
//!
//! Why a spawner of our own: 45–81 µs less per plugin run than
//! `tokio::process` (BENCHMARKS.md, "The plugins' spawn").

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once `clone3` was refused: every later spawn falls back at once.
static CLONE3_REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether [`spawn`] may start anything here (x86_64, and `clone3` not
/// refused before).
pub(crate) fn available() -> bool {
    cfg!(target_arch = "x86_64") && !CLONE3_REFUSED.load(Ordering::Relaxed)
}

/// A started plugin.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub pid: u32,
    /// Its pidfd (close-on-exec).
    pub pidfd: OwnedFd,
}

/// What [`spawn`] did.
#[derive(Debug)]
pub(crate) enum Spawn {
    Started(Spawned),
    /// `clone3` is not available here; nothing was started.
    Unsupported,
}

/// The child's three standard streams, each an fd of ours (any number;
/// those below 3 are moved up first).
pub(crate) struct Stdio<'a> {
    pub stdin: BorrowedFd<'a>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
}

/// A pipe, both ends close-on-exec and blocking: `(read, write)`.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both fds are open and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Puts `fd`, a pipe end from [`pipe`], in non-blocking mode. One
/// `F_SETFL` without the `F_GETFL`: of the flags `F_SETFL` changes such a
/// pipe end has none set.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_SETFL on an fd we borrow; no memory is passed.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Starts `path` (argv: the path alone) in a process group of its own, with
/// our environment overridden by `env` and `stdio` as its fds 0, 1, 2.
///
/// An `execve` failure (ENOENT, EACCES, ETXTBSY...) is the `Err` with the
/// errno of the child, which was reaped already.
pub(crate) fn spawn(path: &Path, env: &[(String, String)], stdio: Stdio<'_>) -> io::Result<Spawn> {
    if !available() {
        return Ok(Spawn::Unsupported);
    }
    let path = cstring(path.as_os_str().as_bytes())?;
    let env = environment(env)?;
    let argv = [path.as_ptr(), std::ptr::null()];
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // The child's dup2 would leave close-on-exec set on an fd it dups onto
    // itself: give it fds above 2.
    let stdin = above_stdio(stdio.stdin)?;
    let stdout = above_stdio(stdio.stdout)?;
    let stderr = above_stdio(stdio.stderr)?;
    let mut plan = Plan {
        fds: [
            raw(&stdin, stdio.stdin),
            raw(&stdout, stdio.stdout),
            raw(&stderr, stdio.stderr),
        ],
        err: 0,
        path: path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        sigpipe_default: KernelSigaction::default(),
        empty_mask: 0,
    };
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_VM | CLONE_VFORK | CLONE_CLEAR_SIGHAND | CLONE_PIDFD,
        pidfd: &raw mut pidfd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    let ret = clone3_exec(&args, &mut plan);
    if ret < 0 {
        let errno = (-ret) as i32;
        return match errno {
            libc::ENOSYS | libc::EPERM | libc::EINVAL | libc::E2BIG => {
                CLONE3_REFUSED.store(true, Ordering::Relaxed);
                Ok(Spawn::Unsupported)
            }
            _ => Err(io::Error::from_raw_os_error(errno)),
        };
    }
    // SAFETY: clone3 succeeded with CLONE_PIDFD: the kernel stored a new
    // pidfd, ours alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // CLONE_VFORK: the child has exec'd or exited by now, and wrote its
    // errno into the plan if it failed.
    let err = plan.err;
    if err != 0 {
        let _ = reap(pidfd.as_fd(), true);
        return Err(io::Error::from_raw_os_error(err));
    }
    Ok(Spawn::Started(Spawned {
        pid: ret as u32,
        pidfd,
    }))
}

/// Whether the calling thread blocks any signal (a plugin started from it
/// by `posix_spawn` would inherit that mask).
pub(crate) fn signals_blocked() -> bool {
    // SAFETY: an all-zero sigset_t is valid; pthread_sigmask with a null
    // new set only reads this thread's mask into it.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask) == 0
            && (1..=libc::SIGRTMAX()).any(|sig| libc::sigismember(&mask, sig) == 1)
    }
}

/// Unblocks every signal of the calling thread. Async-signal-safe: for a
/// forked child before `execve`.
pub(crate) fn unblock_all_signals() -> io::Result<()> {
    // SAFETY: an all-zero sigset_t is valid; sigemptyset and pthread_sigmask
    // only read and write it and this thread's mask.
    let rc = unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `pidfd` registered with tokio's reactor, readable once the process
/// exited; on failure (the runtime is shutting down) the pidfd back.
pub(crate) fn watch(
    pidfd: OwnedFd,
) -> Result<tokio::io::unix::AsyncFd<OwnedFd>, (OwnedFd, io::Error)> {
    // SAFETY: the AsyncFd owns the OwnedFd, so the fd stays open (and is not
    // replaced) for as long as it is registered, and is closed only after
    // the AsyncFd deregistered it on drop.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }
    .map_err(tokio::io::unix::AsyncFdRegisterError::into_parts)
}

/// Reaps the process of `pidfd` (`waitid(P_PIDFD, WEXITED)`): `None` while
/// it runs when `block` is false.
pub(crate) fn reap(pidfd: BorrowedFd<'_>, block: bool) -> io::Result<Option<ExitStatus>> {
    const P_PIDFD: libc::idtype_t = 3;
    let options = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: an all-zero siginfo_t is valid; the kernel fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a pidfd we borrow and a siginfo_t of ours.
        let rc =
            unsafe { libc::waitid(P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, options) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        // SAFETY: waitid filled a SIGCHLD siginfo (or left it zeroed).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        let raw = match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => status | 0x80,
            _ => status,
        };
        return Ok(Some(ExitStatus::from_raw(raw)));
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte in a plugin's path or environment",
        )
    })
}

/// Our environment with `env` set over it (the last of a repeated name wins).
fn environment(env: &[(String, String)]) -> io::Result<Vec<CString>> {
    let overridden = |name: &OsStr| env.iter().any(|(k, _)| OsStr::new(k) == name);
    let mut out = Vec::with_capacity(env.len() + 32);
    for (k, v) in std::env::vars_os() {
        if !overridden(&k) {
            out.push(pair(&k, &v)?);
        }
    }
    for (i, (k, v)) in env.iter().enumerate() {
        if !env[i + 1..].iter().any(|(later, _)| later == k) {
            out.push(pair(&OsString::from(k), &OsString::from(v))?);
        }
    }
    Ok(out)
}

fn pair(k: &OsStr, v: &OsStr) -> io::Result<CString> {
    let mut s = Vec::with_capacity(k.len() + v.len() + 1);
    s.extend_from_slice(k.as_bytes());
    s.push(b'=');
    s.extend_from_slice(v.as_bytes());
    cstring(&s)
}

/// A duplicate above fd 2 when `fd` is one of 0, 1, 2.
fn above_stdio(fd: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    if fd.as_raw_fd() > 2 {
        return Ok(None);
    }
    // SAFETY: F_DUPFD_CLOEXEC of an fd we borrow; the result is ours.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd, ours alone.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(dup) }))
}

fn raw(dup: &Option<OwnedFd>, fd: BorrowedFd<'_>) -> RawFd {
    dup.as_ref().map_or(fd.as_raw_fd(), AsRawFd::as_raw_fd)
}

const CLONE_VM: u64 = 0x100;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_PIDFD: u64 = 0x1000;
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

/// `struct clone_args` up to `tls` (`CLONE_ARGS_SIZE_VER0`, 64 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// The kernel's `struct sigaction` on x86_64 (SIG_DFL when all zero).
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// What the child reads (and writes: `err`) between clone and exec.
#[repr(C)]
struct Plan {
    fds: [RawFd; 3],
    /// The errno of the child's failed step; 0 when it reached exec.
    err: i32,
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    sigpipe_default: KernelSigaction,
    empty_mask: u64,
}

/// `clone3`, and in the child the steps up to `execve`. Returns the
/// syscall's result in the parent (pid, or -errno).
#[cfg(target_arch = "x86_64")]
fn clone3_exec(args: &CloneArgs, plan: &mut Plan) -> i64 {
    let ret: i64;
    // SAFETY: clone3 with CLONE_VM | CLONE_VFORK and no stack of its own
    // runs the child on this stack while this thread is suspended until the
    // child's execve or exit, as vfork does. The child code below never
    // returns to Rust: it makes raw syscalls only (registers, no push, no
    // call, so nothing of ours on the stack or in the red zone is written),
    // reads the plan and the strings it points to, which stay alive and
    // unchanged until clone3 returns in the parent, writes `plan.err` (the
    // asm is declared to write memory), and ends in execve or exit_group.
    // CLONE_CLEAR_SIGHAND resets every handler in the child, so no signal
    // handler of ours runs on the shared stack. In the parent this is one
    // syscall; rcx and r11 are clobbered by it, declared below.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            // Child: stdin, stdout, stderr.
            "mov eax, 33",
            "mov edi, dword ptr [r12 + {fds}]",
            "xor esi, esi",
            "syscall",
            "test rax, rax",
            "js 3f",
            "mov eax, 33",
            "mov edi, dword ptr [r12 + {fds} + 4]",
            "mov esi, 1",
            "syscall",
            "test rax, rax",
            "js 3f",
            "mov eax, 33",
            "mov edi, dword ptr [r12 + {fds} + 8]",
            "mov esi, 2",
            "syscall",
            "test rax, rax",
            "js 3f",
            // setpgid(0, 0): a group of its own.
            "mov eax, 109",
            "xor edi, edi",
            "xor esi, esi",
            "syscall",
            "test rax, rax",
            "js 3f",
            // rt_sigaction(SIGPIPE, SIG_DFL): we ignore it, the plugin must not.
            "mov eax, 13",
            "mov edi, 13",
            "lea rsi, [r12 + {sigpipe}]",
            "xor edx, edx",
            "mov r10d, 8",
            "syscall",
            "test rax, rax",
            "js 3f",
            // rt_sigprocmask(SIG_SETMASK, empty): nothing blocked.
            "mov eax, 14",
            "mov edi, 2",
            "lea rsi, [r12 + {mask}]",
            "xor edx, edx",
            "mov r10d, 8",
            "syscall",
            "test rax, rax",
            "js 3f",
            // execve(path, argv, envp): returns only on failure.
            "mov eax, 59",
            "mov rdi, qword ptr [r12 + {path}]",
            "mov rsi, qword ptr [r12 + {argv}]",
            "mov rdx, qword ptr [r12 + {envp}]",
            "syscall",
            "3:",
            "neg eax",
            "mov dword ptr [r12 + {err}], eax",
            // exit_group(127)
            "mov eax, 231",
            "mov edi, 127",
            "syscall",
            "ud2",
            "2:",
            fds = const std::mem::offset_of!(Plan, fds),
            err = const std::mem::offset_of!(Plan, err),
            path = const std::mem::offset_of!(Plan, path),
            argv = const std::mem::offset_of!(Plan, argv),
            envp = const std::mem::offset_of!(Plan, envp),
            sigpipe = const std::mem::offset_of!(Plan, sigpipe_default),
            mask = const std::mem::offset_of!(Plan, empty_mask),
            inlateout("rax") 435i64 => ret,
            inout("rdi") std::ptr::from_ref(args) => _,
            inout("rsi") std::mem::size_of::<CloneArgs>() => _,
            inout("rdx") 0u64 => _,
            inout("r10") 0u64 => _,
            in("r12") std::ptr::from_mut(plan),
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
fn clone3_exec(_args: &CloneArgs, _plan: &mut Plan) -> i64 {
    -i64::from(libc::ENOSYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn starts_in_its_own_group_with_our_environment_overridden() {
        let (r, w) = pipe().unwrap();
        let n = null();
        let env = [
            ("CNI_X".to_owned(), "a".to_owned()),
            ("CNI_X".to_owned(), "b".to_owned()),
        ];
        // env(1) without arguments prints its environment.
        let stdio = Stdio {
            stdin: n.as_fd(),
            stdout: w.as_fd(),
            stderr: n.as_fd(),
        };
        let spawned = match spawn(Path::new("/usr/bin/env"), &env, stdio).unwrap() {
            Spawn::Started(s) => s,
            Spawn::Unsupported => return,
        };
        drop(w);
        let mut out = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
        // Not reaped yet: its /proc entry (a zombie's) still tells its group.
        let stat = crate::sys::proc_stat(spawned.pid).unwrap().unwrap();
        assert_eq!(stat.pgrp, spawned.pid);
        let status = reap(spawned.pidfd.as_fd(), true).unwrap().unwrap();
        assert!(status.success());
        let x: Vec<_> = out.lines().filter(|l| l.starts_with("CNI_X=")).collect();
        assert_eq!(x, ["CNI_X=b"]);
        assert!(out.lines().any(|l| l.starts_with("PATH=")), "{out}");
    }

    #[test]
    fn exec_failure_is_the_childs_errno_and_it_is_reaped() {
        let n = null();
        let e = spawn(
            Path::new("/nonexistent/plugin"),
            &[],
            Stdio {
                stdin: n.as_fd(),
                stdout: n.as_fd(),
                stderr: n.as_fd(),
            },
        );
        match e {
            Ok(Spawn::Unsupported) => {}
            Ok(Spawn::Started(_)) => panic!("started a missing binary"),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT)),
        }
    }
}
