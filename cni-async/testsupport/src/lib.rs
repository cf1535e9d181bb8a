//! Helpers for the tests of every crate of the workspace (dev-only, never
//! published): one implementation of each, instead of a copy per crate.
//!
//! - [`fake`]: fake plugins, real `#!/bin/sh` executables in a temp dir that
//!   answer per `CNI_COMMAND` and record their stdin and environment.
//! - [`executable`]: executables a test writes (fake plugins, copies of
//!   binaries), never "text file busy" when other threads fork.
//! - [`isolated`]: a network and mount namespace of the test's own, for
//!   tests that use host-global names (the bundled networks, the examples).
//! - [`gate`]: ordering a test's events without sleeps (a fake plugin blocks
//!   until the test opens its gate), and [`gate::LOAD_MARGIN`].
//! - [`process`]: whether processes and process groups are gone (`/proc`),
//!   killing what a failed test left behind.
//! - [`json`]: JSON compared as values, with a line diff when they differ.
//! - [`netns`]: real network namespaces (`ip netns`), links, bridges and
//!   subnets unique to each test, removed by guards on drop; what tests ask
//!   about a namespace (its links, addresses, whether it can ping).
//! - [`require_root!`] / [`root_or_skip`]: the root check of root-only tests.
//! - [`noop`]: the benchmark plugin `cni-noop` (cnid's), built on demand.
//!
//! The package depends on no crate of the workspace: `cni-async`'s own
//! integration tests use it, and `cni-async` types reached through here
//! would be a second copy of the crate under test. What needs a crate's
//! types (a `Cni` over fake plugins, a `TestNet` holding `cni-async`
//! namespaces) lives in that crate's `tests/support/mod.rs`, on top of this.
//!
//! # Root-only tests
//!
//! Tests that create network namespaces or bridges, run the real plugins or
//! change user IDs need root. They start with
//!
//! ```text
//! support::require_root!();            // or require_root!("creates bridges")
//! ```
//!
//! which returns from the test early, and says so on stderr, when the test
//! process is not root: `cargo test` as another user runs everything else
//! and reports those tests as passed (libtest has no "skipped" outcome;
//! the stderr line, shown with `--nocapture`, names each one).
//!
//! A skip must never hide a suite that did not run. So a non-root run
//! **fails** these tests instead of skipping them when
//! - the environment has `CI` set (to anything but empty, `0` or `false`),
//!   as CI services do, or
//! - `CNIRS_TEST_REQUIRE_ROOT=1` (`make test` sets it: it is the whole suite,
//!   run as root).
#![warn(missing_docs)]

pub mod executable;
pub mod fake;
pub mod gate;
pub mod isolated;
pub mod json;
pub mod log;
pub mod netns;
pub mod noop;
pub mod process;
pub mod tmpfs;

/// Environment variable that turns a root-only test's skip into a failure.
pub const REQUIRE_ROOT_VAR: &str = "CNIRS_TEST_REQUIRE_ROOT";

/// Whether this process runs as root (effective UID 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// This process's effective UID.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether a root-only test should run: `true` as root; otherwise prints
/// why the test `test` is skipped on stderr and returns `false`, or panics
/// when skipping is forbidden (`CI` set, or `CNIRS_TEST_REQUIRE_ROOT=1`; see
/// the crate docs). `why` says what the test needs root for.
#[track_caller]
pub fn root_or_skip(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    let forbidden = skipping_forbidden(|k| std::env::var(k).ok());
    if let Some(reason) = forbidden {
        panic!(
            "{test} needs root ({why}) and is not skipped here: {reason}; run the tests as root"
        );
    }
    eprintln!("skipped: {test} needs root ({why}); run the tests as root to run it");
    false
}

/// Panics unless this process runs as root. For constructors of root-only
/// test set-ups, as a backstop behind the test's own [`require_root!`].
#[track_caller]
pub fn assert_root(why: &str) {
    assert!(
        is_root(),
        "this test needs root ({why}); it should start with support::require_root!()"
    );
}

/// Why a non-root run may not skip (`None`: it may), from the environment
/// `var` reads.
fn skipping_forbidden(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(v) = var("CI")
        && !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false")
    {
        return Some(format!("CI={v} is set"));
    }
    if var(REQUIRE_ROOT_VAR).as_deref() == Some("1") {
        return Some(format!("{REQUIRE_ROOT_VAR}=1 is set"));
    }
    None
}

/// The name of the running test: libtest names each test's thread after it.
#[doc(hidden)]
pub fn current_test(fallback: &str) -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => fallback.to_owned(),
    }
}

/// Returns from the enclosing test (a function returning `()`) unless it
/// runs as root; see [`root_or_skip`] and the crate docs. The optional
/// argument says what the test needs root for.
///
/// ```text
/// #[test]
/// fn bridge_between_two_namespaces() {
///     support::require_root!("creates namespaces and a bridge");
///     // ...
/// }
/// ```
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require_root!(
            "it creates network namespaces or bridges, runs the real plugins or changes user IDs"
        )
    };
    ($why:expr) => {
        if !$crate::root_or_skip(&$crate::current_test(module_path!()), $why) {
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_and_the_variable_forbid_skipping() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(skipping_forbidden(env(&[])), None);
        assert_eq!(skipping_forbidden(env(&[("CI", "")])), None);
        assert_eq!(skipping_forbidden(env(&[("CI", "false")])), None);
        assert_eq!(skipping_forbidden(env(&[("CI", "0")])), None);
        assert_eq!(skipping_forbidden(env(&[(REQUIRE_ROOT_VAR, "0")])), None);
        assert!(skipping_forbidden(env(&[("CI", "true")])).is_some());
        assert!(skipping_forbidden(env(&[("CI", "1")])).is_some());
        assert!(skipping_forbidden(env(&[(REQUIRE_ROOT_VAR, "1")])).is_some());
    }
}
