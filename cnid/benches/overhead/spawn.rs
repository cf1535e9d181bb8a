//! The cheapest way to run a program with bytes on stdin and collect its
//! stdout: `posix_spawn` (glibc: `clone(CLONE_VM|CLONE_VFORK)`) with argv and
//! envp built once, two pipes, one `writev`, a read to EOF, `wait4`. The
//! floor runs plugins with it, and the cnitool runner runs cnitool with it,
//! so the spawn of cnitool costs what a runtime's spawn would.

use std::ffi::{CString, OsStr, OsString, c_char};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::stats::{Order, rounds, secs};

/// An environment, `KEY=VALUE` pairs.
pub(crate) type Env = Vec<(OsString, OsString)>;

/// A program with its argv and envp ready for `posix_spawn`.
pub(crate) struct Prepared {
    /// argv (argv[0] is the path), then envp, each NULL-terminated.
    _strings: Vec<CString>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    pub(crate) label: String,
}

// SAFETY: the pointers point into the CStrings owned alongside them, whose
// heap buffers never move or change; nothing writes through them.
unsafe impl Send for Prepared {}
// SAFETY: as above; `run` only reads them.
unsafe impl Sync for Prepared {}

/// How a run ended: the raw wait status, and the user + system CPU of the
/// child (and of its reaped children).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit(pub(crate) i32, pub(crate) Duration);

impl Exit {
    pub(crate) fn success(&self) -> bool {
        libc::WIFEXITED(self.0) && libc::WEXITSTATUS(self.0) == 0
    }

    pub(crate) fn describe(&self) -> String {
        match self.0 {
            s if libc::WIFEXITED(s) => format!("exit status {}", libc::WEXITSTATUS(s)),
            s if libc::WIFSIGNALED(s) => format!("signal {}", libc::WTERMSIG(s)),
            s => format!("wait status {s:#x}"),
        }
    }
}

/// The environment of this process with `overrides` applied (set, or
/// removed when the value is `None`).
pub(crate) fn env_with(overrides: &[(&str, Option<&OsStr>)]) -> Env {
    let mut env: Env = std::env::vars_os()
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| OsStr::new(o) == k))
        .collect();
    let set = overrides
        .iter()
        .filter_map(|(k, v)| Some((k.into(), (*v)?.to_os_string())));
    env.extend(set);
    env
}

/// [`env_with`] of `(KEY, VALUE)` string pairs, all set.
pub(crate) fn env_set(pairs: &[(&str, &str)]) -> Env {
    env_with(
        &pairs
            .iter()
            .map(|(k, v)| (*k, Some(OsStr::new(v))))
            .collect::<Vec<_>>(),
    )
}

impl Prepared {
    /// `path` run with `args` and exactly `env`.
    pub(crate) fn new(
        path: &Path,
        args: &[&OsStr],
        env: &[(OsString, OsString)],
        label: impl Into<String>,
    ) -> io::Result<Prepared> {
        let c = |b: &[u8]| {
            CString::new(b).map_err(|_| io::Error::other("NUL byte in argument or environment"))
        };
        let mut strings = vec![c(path.as_os_str().as_bytes())?];
        for a in args {
            strings.push(c(a.as_bytes())?);
        }
        for (k, v) in env {
            strings.push(c(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
        }
        let ptrs = |s: &[CString]| {
            s.iter()
                .map(|c| c.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        let (argv, envp) = (
            ptrs(&strings[..=args.len()]),
            ptrs(&strings[args.len() + 1..]),
        );
        Ok(Prepared {
            _strings: strings,
            argv,
            envp,
            label: label.into(),
        })
    }

    /// Runs it: writes the concatenation of `stdin` (one `writev`), appends
    /// its stdout to `out`, discards its stderr, reaps it. Writes stdin
    /// before reading stdout: fine for programs that read all their input
    /// before writing more than a pipe's worth (64 KiB), as plugins do.
    pub(crate) fn run(&self, stdin: &[&[u8]], out: &mut Vec<u8>) -> io::Result<Exit> {
        let ((in_r, in_w), (out_r, out_w), null) = (pipe()?, pipe()?, dev_null()?);
        let mut pid: libc::pid_t = 0;
        // SAFETY: the file actions object is initialised before use and
        // destroyed after; every pointer passed to posix_spawn is valid
        // (NUL-terminated strings, NULL-terminated arrays) for the call.
        let rc = unsafe {
            let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            libc::posix_spawn_file_actions_init(&mut fa);
            libc::posix_spawn_file_actions_adddup2(&mut fa, in_r.as_raw_fd(), 0);
            libc::posix_spawn_file_actions_adddup2(&mut fa, out_w.as_raw_fd(), 1);
            libc::posix_spawn_file_actions_adddup2(&mut fa, null, 2);
            let (argv, envp) = (self.argv.as_ptr().cast(), self.envp.as_ptr().cast());
            let rc = libc::posix_spawn(&mut pid, self.argv[0], &fa, std::ptr::null(), argv, envp);
            libc::posix_spawn_file_actions_destroy(&mut fa);
            rc
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        drop((in_r, out_w));
        let written = write_all_vectored(File::from(in_w), stdin);
        let read = File::from(out_r).read_to_end(out);
        let exit = wait(pid)?;
        // A program may exit without reading its stdin (EPIPE): its exit
        // status decides.
        if let Err(e) = written
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            return Err(e);
        }
        read?;
        Ok(exit)
    }

    /// [`Prepared::run`] into a cleared `out`, failing unless it exits 0;
    /// the wall time in seconds.
    pub(crate) fn run_ok(&self, stdin: &[&[u8]], out: &mut Vec<u8>) -> anyhow::Result<(f64, Exit)> {
        out.clear();
        let s = Instant::now();
        let exit = self.run(stdin, out)?;
        let wall = secs(s);
        let said = String::from_utf8_lossy(out);
        anyhow::ensure!(
            exit.success(),
            "{} failed ({}): {said}",
            self.label,
            exit.describe()
        );
        Ok((wall, exit))
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `/dev/null`, opened once (close-on-exec; dup2 in the child clears it).
fn dev_null() -> io::Result<i32> {
    static NULL: OnceLock<File> = OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f.as_raw_fd());
    }
    let f = File::options().write(true).open("/dev/null")?;
    Ok(NULL.get_or_init(|| f).as_raw_fd())
}

fn write_all_vectored(mut f: File, parts: &[&[u8]]) -> io::Result<()> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    if parts.iter().all(|p| p.is_empty()) {
        return Ok(());
    }
    // SAFETY: the iovecs point into live slices for the duration of the call.
    let n = unsafe { libc::writev(f.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
    // A short write (more than a pipe's worth): the rest, plainly.
    let mut skip = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    for p in parts {
        f.write_all(&p[skip.min(p.len())..])?;
        skip = skip.saturating_sub(p.len());
    }
    Ok(())
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000)
}

/// Reaps `pid`, with its CPU time.
fn wait(pid: libc::pid_t) -> io::Result<Exit> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to a status int and an rusage struct.
    while unsafe { libc::wait4(pid, &mut status, 0, &mut ru) } != pid {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(Exit(status, tv(ru.ru_utime) + tv(ru.ru_stime)))
}

/// CPU time (user + system) of this process and of its reaped children.
pub(crate) fn cpu_times() -> (Duration, Duration) {
    let get = |who| {
        // SAFETY: rusage is plain data; getrusage fills it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer.
        unsafe { libc::getrusage(who, &mut ru) };
        tv(ru.ru_utime) + tv(ru.ru_stime)
    };
    (get(libc::RUSAGE_SELF), get(libc::RUSAGE_CHILDREN))
}

/// Runs `progs` spawn to reap with `stdin` in rotating rounds, 20 of
/// warm-up then `n`: per program its wall and child CPU times (seconds).
/// A run fails unless `ok(program, exit, stdout)`.
pub(crate) fn rotate(
    progs: &[Prepared],
    stdin: &[u8],
    n: usize,
    label: &str,
    ok: impl Fn(usize, &Exit, &[u8]) -> bool,
) -> anyhow::Result<Vec<[Vec<f64>; 2]>> {
    let mut out = Vec::new();
    let t = rounds((progs.len(), 20, n), Order::Rotate, label, |r, _| {
        out.clear();
        let s = Instant::now();
        let exit = progs[r].run(&[stdin], &mut out)?;
        let (wall, said) = (secs(s), String::from_utf8_lossy(&out));
        let why = || format!("{} failed ({}): {said}", progs[r].label, exit.describe());
        anyhow::ensure!(ok(r, &exit, &out), why());
        Ok([wall, exit.1.as_secs_f64()])
    })?;
    let column = |v: &Vec<[f64; 2]>, i: usize| v.iter().map(|x| x[i]).collect();
    Ok(t.iter().map(|v| [column(v, 0), column(v, 1)]).collect())
}
