//! `cnid-shim`: the CNI plugin that hands every call to cnid (see
//! the `cnid_shim` library). It runs once per CNI call, so it skips std's runtime
//! set-up (`no_main`, as `cni-noop`): no stack-guard probe of
//! `/proc/self/maps`, no signal stack. stdout is flushed by hand.
#![cfg_attr(not(test), no_main)]

/// The C entry point.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    cnid_shim::main()
}
