//! Plugins' stderr passed through to cnitool's stderr, as libcni does
//! (`docs/decisions.md` D20): the library hands the stderr of every plugin that
//! succeeds to [`sink`] (a failing plugin's stderr is part of the error
//! cnitool prints). The bytes go out whole and as written, up to the
//! library's capture cap (`OutputLimits::stderr`, 1 MiB per plugin run; the
//! rest is read and dropped), in one write per plugin run, so concurrent
//! runs of `batch` do not interleave mid-line.
//!
//! With `--json-errors`, stderr is the channel of the error JSON: what the
//! plugins wrote is held back and written when the command succeeds
//! ([`finish`]), and dropped when it fails, so that stderr then holds the
//! error JSON alone. stdout is never written here.
//!
//! With `--socket`, the plugins run in cnid, which logs their stderr and
//! does not send it back: nothing comes through.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cni_async::exec::{PluginStderr, StderrSink};

/// Whether plugins' stderr is held back until the command's outcome.
static HOLD: AtomicBool = AtomicBool::new(false);
/// What was held back.
static HELD: Mutex<Vec<u8>> = Mutex::new(Vec::new());

/// Holds plugins' stderr back until [`finish`] (with `--json-errors`).
pub(crate) fn hold(on: bool) {
    HOLD.store(on, Ordering::Relaxed);
}

/// The sink set on every [`cni_async::Cni`] cnitool builds.
pub(crate) fn sink() -> StderrSink {
    Arc::new(|s: &PluginStderr<'_>| {
        if HOLD.load(Ordering::Relaxed) {
            HELD.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(s.bytes);
        } else {
            write_stderr(s.bytes);
        }
    })
}

/// Writes what was held back if the command succeeded, drops it otherwise.
pub(crate) fn finish(succeeded: bool) {
    let held = std::mem::take(&mut *HELD.lock().unwrap_or_else(|e| e.into_inner()));
    if succeeded && !held.is_empty() {
        write_stderr(&held);
    }
}

fn write_stderr(bytes: &[u8]) {
    // A closed or full stderr is not a reason to fail the operation.
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes).and_then(|()| err.flush());
}
