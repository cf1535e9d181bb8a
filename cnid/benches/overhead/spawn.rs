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

/// A program with its argv and envp ready for `posix_spawn`.
pub(crate) struct Prepared {
    path: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const c_char>,
    label: String,
}

// SAFETY: the pointers point into the CStrings owned alongside them, whose
// heap buffers never move or change; nothing writes through them.
unsafe impl Send for Prepared {}
// SAFETY: as above; `run` only reads them.
unsafe impl Sync for Prepared {}

/// What a run produced besides stdout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exit {
    /// The raw wait status.
    pub(crate) status: i32,
    /// User + system CPU of the child (and of its reaped children).
    pub(crate) cpu: Duration,
    /// `ru_maxrss` in KiB. With a vfork-based spawn it includes the
    /// spawner's RSS at exec time: never use it for peak RSS.
    #[allow(dead_code)]
    pub(crate) maxrss_kib: i64,
}

impl Exit {
    pub(crate) fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub(crate) fn describe(&self) -> String {
        if libc::WIFEXITED(self.status) {
            format!("exit status {}", libc::WEXITSTATUS(self.status))
        } else if libc::WIFSIGNALED(self.status) {
            format!("signal {}", libc::WTERMSIG(self.status))
        } else {
            format!("wait status {:#x}", self.status)
        }
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::other("NUL byte in argument or environment"))
}

/// The environment of this process with `overrides` applied (set, or
/// removed when the value is `None`), as `KEY=VALUE` pairs.
pub(crate) fn env_with(overrides: &[(&str, Option<&OsStr>)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| OsStr::new(o) == k))
        .collect();
    for (k, v) in overrides {
        if let Some(v) = v {
            env.push((OsString::from(k), v.to_os_string()));
        }
    }
    env
}

impl Prepared {
    /// `path` run with `args` (argv[0] is the path) and exactly `env`.
    pub(crate) fn new(
        path: &Path,
        args: &[&OsStr],
        env: &[(OsString, OsString)],
        label: impl Into<String>,
    ) -> io::Result<Prepared> {
        let path_c = cstring(path.as_os_str().as_bytes())?;
        let mut argv = vec![path_c.clone()];
        for a in args {
            argv.push(cstring(a.as_bytes())?);
        }
        let mut envp = Vec::with_capacity(env.len());
        for (k, v) in env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(cstring(&kv)?);
        }
        let argv_ptrs = argv
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp_ptrs = envp
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        Ok(Prepared {
            path: path_c,
            _argv: argv,
            argv_ptrs,
            _envp: envp,
            envp_ptrs,
            label: label.into(),
        })
    }

    /// What it runs, for messages.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Runs it: writes the concatenation of `stdin` (one `writev`), appends
    /// its stdout to `out`, discards its stderr, reaps it. Writes stdin
    /// before reading stdout: fine for programs that read all their input
    /// before writing more than a pipe's worth (64 KiB), as plugins do.
    pub(crate) fn run(&self, stdin: &[&[u8]], out: &mut Vec<u8>) -> io::Result<Exit> {
        let (in_r, in_w) = pipe()?;
        let (out_r, out_w) = pipe()?;
        let null = dev_null()?;
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
            let rc = libc::posix_spawn(
                &mut pid,
                self.path.as_ptr(),
                &fa,
                std::ptr::null(),
                self.argv_ptrs.as_ptr().cast::<*mut c_char>(),
                self.envp_ptrs.as_ptr().cast::<*mut c_char>(),
            );
            libc::posix_spawn_file_actions_destroy(&mut fa);
            rc
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        drop((in_r, out_w));
        let mut input = File::from(in_w);
        let written = write_all_vectored(&mut input, stdin);
        drop(input);
        let mut output = File::from(out_r);
        let read = output.read_to_end(out);
        drop(output);
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

fn write_all_vectored(f: &mut File, parts: &[&[u8]]) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total == 0 {
        return Ok(());
    }
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr().cast_mut().cast(),
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: the iovecs point into live slices for the duration of the call.
    let n = unsafe { libc::writev(f.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // A short write (more than a pipe's worth): the rest, plainly.
    let mut skip = n as usize;
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        f.write_all(&p[skip..])?;
        skip = 0;
    }
    Ok(())
}

/// Reaps `pid`, with its resource usage.
pub(crate) fn wait(pid: libc::pid_t) -> io::Result<Exit> {
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: valid pointers to a status int and an rusage struct.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    Ok(Exit {
        status,
        cpu: tv(ru.ru_utime) + tv(ru.ru_stime),
        maxrss_kib: ru.ru_maxrss,
    })
}

/// CPU time (user + system) of this process and of its reaped children.
pub(crate) fn cpu_times() -> (Duration, Duration) {
    let get = |who| {
        // SAFETY: rusage is plain data; getrusage fills it.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer.
        unsafe { libc::getrusage(who, &mut ru) };
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
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
    let t = rounds(progs.len(), 20, n, Order::Rotate, label, |r, _| {
        out.clear();
        let s = Instant::now();
        let exit = progs[r].run(&[stdin], &mut out)?;
        let (wall, cpu) = (secs(s), exit.cpu.as_secs_f64());
        let (what, said) = (progs[r].label(), || String::from_utf8_lossy(&out));
        let why = || format!("{what} failed ({}): {}", exit.describe(), said());
        anyhow::ensure!(ok(r, &exit, &out), why());
        Ok([wall, cpu])
    })?;
    let column = |v: &Vec<[f64; 2]>, i: usize| v.iter().map(|x| x[i]).collect();
    Ok(t.iter().map(|v| [column(v, 0), column(v, 1)]).collect())
}
