//! Executables written by tests (fake plugins, copies of binaries), free of
//! "text file busy".
//!
//! `execve` fails with `ETXTBSY` while any process holds the file open for
//! writing. A test process is multi-threaded: if one thread writes a file
//! while another forks (to spawn a daemon, a plugin, `ip`), the child gets a
//! copy of the write descriptor and keeps it until it calls `exec` (close-on-
//! exec closes it only then; after a `fork` with a `pre_exec` closure that
//! can take milliseconds). Executing the file in that window fails. Writing
//! to a temp name and renaming does not help: the inode is the same.
//!
//! So no descriptor of the test process is ever open for writing on an
//! executable: [`write_executable`] and [`copy_executable`] have a
//! short-lived child process (`cat`, `cp`) create the file under a temp
//! name. That child is single-threaded and forks nothing, so when it exits
//! no writer is left anywhere; the test process then sets the mode and
//! renames the file into place (neither opens it). A file replaced this way
//! is a new inode, so a plugin still running from the old one does not
//! block the write either.
//!
//! Every test in the workspace that writes a file it (or a process it
//! starts) executes goes through here; `PluginDir::file`, `script` and
//! `fake` do. The cost is one short process per executable (about a
//! millisecond).
//!
//! # Caveats
//!
//! Data files (configs, fake responses) are written directly: they are never
//! executed, so a leaked write descriptor does them no harm.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` with exactly `contents` and `mode` (not masked by the
/// umask), replacing any file there, such that executing it can never fail
/// with "text file busy" (module docs). Panics, naming the path, on failure.
pub fn write_executable(path: &Path, contents: &[u8], mode: u32) -> PathBuf {
    let tmp = temp_beside(path);
    let mut child = Command::new("/bin/sh")
        .args(["-c", r#"exec cat > "$1""#, "sh"])
        .arg(&tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the writer of {}: {e}", path.display()));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let written = stdin.write_all(contents);
    drop(stdin);
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for the writer of {}: {e}", path.display()));
    if let Err(e) = written {
        panic!("write {} through cat: {e}", tmp.display());
    }
    finish(&tmp, path, mode, "cat", &out)
}

/// Copies the file `from` to `to` with `mode`, such that executing `to` can
/// never fail with "text file busy" (module docs). Panics, naming both
/// paths, on failure.
pub fn copy_executable(from: &Path, to: &Path, mode: u32) -> PathBuf {
    let tmp = temp_beside(to);
    let out = Command::new("cp")
        .arg("--")
        .arg(from)
        .arg(&tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("run cp {} {}: {e}", from.display(), tmp.display()));
    finish(&tmp, to, mode, "cp", &out)
}

/// A unique temp name in `path`'s directory (so the rename stays on one
/// filesystem).
fn temp_beside(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .unwrap_or_else(|| panic!("{} has no file name", path.display()))
        .to_string_lossy();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.exe-tmp", std::process::id()))
}

/// Checks the writer's exit, sets `mode` on `tmp` and renames it to `path`.
fn finish(tmp: &Path, path: &Path, mode: u32, writer: &str, out: &std::process::Output) -> PathBuf {
    if !out.status.success() {
        let _ = fs::remove_file(tmp);
        panic!(
            "{writer} could not write {}: {}: {}",
            tmp.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // The mode the writer created it with is masked by the umask; set it
    // exactly. chmod and rename open nothing for writing.
    fs::set_permissions(tmp, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", tmp.display()));
    fs::rename(tmp, path)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), path.display()));
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// Writers that each write and at once execute `ROUNDS` scripts while
    /// spawners fork (a `pre_exec` closure makes std fork rather than
    /// posix_spawn, as the daemon tests' spawns do) in a loop. With a writer
    /// that opens the file in this process (`fs::write`, `fs::copy`), some
    /// exec fails with ETXTBSY within these rounds (measured: see the
    /// commit); with [`write_executable`] none may.
    #[test]
    fn executables_written_while_other_threads_fork_always_run() {
        const WRITERS: usize = 4;
        const SPAWNERS: usize = 4;
        const ROUNDS: usize = 100;
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let spawners: Vec<_> = (0..SPAWNERS)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let mut cmd = Command::new("/bin/true");
                        // SAFETY: the closure does nothing; it only makes std fork.
                        unsafe { cmd.pre_exec(|| Ok(())) };
                        cmd.status().expect("spawn /bin/true");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        // A large script (a long comment) keeps each write's window open long
        // enough for forks to land in it.
        let padding = format!("# {}\n", "x".repeat(256 * 1024));
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let dir = dir.path().to_owned();
                let padding = padding.clone();
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        let path = dir.join(format!("exe-{w}-{round}"));
                        let text = format!("#!/bin/sh\n{padding}echo {w}-{round}\n");
                        write_executable(&path, text.as_bytes(), 0o755);
                        let out = Command::new(&path)
                            .output()
                            .unwrap_or_else(|e| panic!("exec {}: {e}", path.display()));
                        assert_eq!(
                            String::from_utf8_lossy(&out.stdout),
                            format!("{w}-{round}\n")
                        );
                    }
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|t| t.join()).collect();
        stop.store(true, Ordering::Relaxed);
        let forks: u64 = spawners.into_iter().map(|t| t.join().unwrap()).sum();
        for r in results {
            if let Err(e) = r {
                std::panic::resume_unwind(e);
            }
        }
        assert!(forks > 0, "the spawners forked while the writers ran");
    }

    #[test]
    fn replacing_a_running_executable_works_and_sets_the_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin");
        // `exec`: the killed process is the sleep itself, so no orphaned
        // child outlives the test holding its output open.
        write_executable(&path, b"#!/bin/sh\nexec sleep 5\n", 0o755);
        // The old file is running (open for exec): a write in place would
        // fail with ETXTBSY; a new inode does not.
        let mut running = Command::new(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        write_executable(&path, b"#!/bin/sh\necho new\n", 0o750);
        let out = Command::new(&path).output().unwrap();
        running.kill().unwrap();
        running.wait().unwrap();
        assert_eq!(out.stdout, b"new\n");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750);
        let copy = copy_executable(&path, &dir.path().join("copy"), 0o700);
        assert_eq!(fs::read(&copy).unwrap(), b"#!/bin/sh\necho new\n");
        assert_eq!(
            fs::metadata(&copy).unwrap().permissions().mode() & 0o7777,
            0o700
        );
        // No temp file left beside them.
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["copy", "plugin"]);
    }
}
