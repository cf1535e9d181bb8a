//! Helpers shared by the integration tests: the workspace's test support
//! package (`cni-test-support`: fake plugins [`fake`], gates [`gate`],
//! real network namespaces, bridges and subnets [`netns`], the root check
//! [`require_root!`]), plus what is cnid's own: the daemon as a real process
//! ([`daemon`]), running the built cnitool in a sandbox ([`tool`]), and
//! `cnid-shim` as a runtime runs it, with the Go clients ([`shim`]), and
//! what the crash soaks share ([`soak`]), cnitool as `nobody` ([`nobody`]),
//! the CPU times a cnid's pacing sees ([`cpus`]).
#![allow(dead_code, unreachable_pub, unused_imports)]

pub use cni_test_support::{executable, fake, gate, netns, noop, require_root};

pub mod cpus;
pub mod daemon;
pub mod nobody;
pub mod reaper;
pub mod shim;
pub mod soak;
pub mod tmpfs;
pub mod tool;

/// Fails, saying what to run, unless every reference plugin of `names` is
/// in `/usr/lib/cni` (Debian's containernetworking-plugins).
pub fn require_plugins(names: &[&str]) {
    for p in names {
        assert!(
            std::path::Path::new("/usr/lib/cni").join(p).exists(),
            "the reference plugin /usr/lib/cni/{p} is missing: run `make setup` (apt-get install containernetworking-plugins)"
        );
    }
}
