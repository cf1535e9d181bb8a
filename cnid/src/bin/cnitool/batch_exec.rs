//! `cnitool batch ARGS`: runs the `cnitool-batch` binary in place of this
//! process (`execve`, as git runs `git-NAME`), with cnitool's global options
//! in front: `cnitool-batch [--ifname NAME] [--json-errors] ARGS`.
//!
//! Why a binary of its own: on current kernels every run of cnitool maps
//! most of its executable (the page cache hands out large folios), so code
//! in the `cnitool` binary costs RSS on every `cnitool add`, which is
//! benchmarked, whether it runs or not. The batch command (namespace
//! handling, concurrency, progress, JSON summaries) would add about a
//! quarter of a megabyte to each of them; exec'ing costs `cnitool batch`
//! one process start instead.
//!
//! `cnitool-batch` is looked for next to the running `cnitool`
//! (`cargo build` and `cargo install` put them together), then in `PATH`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use cni_core::error::code;

use crate::cli::{BatchArgs, GlobalArgs};
use crate::report::ToolError;

/// The binary's name.
pub(crate) const BATCH_BIN: &str = "cnitool-batch";

/// Replaces this process with `cnitool-batch`; returns only when that fails.
pub(crate) fn exec(global: &GlobalArgs, args: &BatchArgs) -> anyhow::Result<()> {
    let program = locate();
    let mut cmd = Command::new(&program);
    if let Some(ifname) = &global.ifname {
        cmd.arg("--ifname").arg(ifname);
    }
    if global.json_errors {
        cmd.arg("--json-errors");
    }
    cmd.args(&args.args);
    let err = cmd.exec();
    Err(ToolError::new(
        code::IO_FAILURE,
        format!(
            "cannot run {}: {err} (cnitool batch is the {BATCH_BIN} binary, \
             expected next to cnitool or in PATH)",
            program.display()
        ),
    )
    .into())
}

/// `cnitool-batch` next to this executable if it is there, else the bare
/// name (looked up in `PATH` by exec).
fn locate() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(BATCH_BIN)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(BATCH_BIN))
}
