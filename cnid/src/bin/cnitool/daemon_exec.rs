//! `cnitool --socket PATH add|check|del|gc|status ...` (or with
//! `CNID_SOCKET`): runs the `cnitool-daemon` binary in place of this process
//! (`execve`) with the same arguments; it sends the command to cnid.
//!
//! Why a binary of its own: cnitool's whole executable is mapped on every
//! run (see `batch_exec.rs`), and cnid's HTTP client (hyper, its connection
//! handling, the API types) adds about 0.6 MB of code, which `cnitool add`
//! without a daemon would pay in peak RSS on every run. With the exec, only
//! the runs that talk to cnid pay it, with one process start.
//!
//! `cnitool-daemon` is looked for next to the running `cnitool`
//! (`cargo build` and `cargo install` put them together), then in `PATH`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use cni_core::error::code;

use crate::report::ToolError;

/// The binary's name.
pub(crate) const DAEMON_BIN: &str = "cnitool-daemon";

/// Replaces this process with `cnitool-daemon`, given the arguments this
/// process got; returns only when that fails.
pub(crate) fn exec() -> anyhow::Error {
    let program = locate();
    let err = Command::new(&program)
        .args(std::env::args_os().skip(1))
        .exec();
    ToolError::new(
        code::IO_FAILURE,
        format!(
            "cannot run {}: {err} (cnitool --socket runs the {DAEMON_BIN} binary, \
             expected next to cnitool or in PATH)",
            program.display()
        ),
    )
    .into()
}

/// `cnitool-daemon` next to this executable if it is there, else the bare
/// name (looked up in `PATH` by exec).
fn locate() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(DAEMON_BIN)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(DAEMON_BIN))
}
