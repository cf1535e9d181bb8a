//! `cnitool`: see the library ([`cnitool`]) for what it does.
//!
//! cnitool runs once per CNI operation, so it skips std's runtime set-up
//! (`no_main`, as `cni-noop` and `cnid-shim`): no stack-guard probe, which
//! reads and parses `/proc/self/maps`, no signal stack; about 0.1 ms a run
//! (BENCHMARKS.md, "cnitool's fixed cost"). What of that set-up cnitool relies on is
//! done here: SIGPIPE ignored (a plugin that exits without reading its
//! stdin must give an error, not kill cnitool; std's spawn resets it to
//! the default in the plugins), and stdout flushed at exit
//! (`std::process::exit` does).
#![cfg_attr(not(test), no_main)]

/// The C entry point.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    // SAFETY: setting a signal's disposition to SIG_IGN, before any other
    // thread exists; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let code = cnitool::main();
    std::process::exit(status(code))
}

/// The number behind an `ExitCode` (std has no stable accessor):
/// `ExitCode::from(n)` for the `n` it equals, 1 for anything else.
#[cfg(not(test))]
fn status(code: std::process::ExitCode) -> i32 {
    (0..=u8::MAX)
        .find(|n| std::process::ExitCode::from(*n) == code)
        .map_or(1, i32::from)
}
