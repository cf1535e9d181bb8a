//! Helpers shared by the integration tests: the cnid daemon as a real
//! process ([`daemon`]), fake plugins
//! ([`fake`]), gates that order a test's events ([`gate`]), running the
//! built binary in a sandbox ([`tool`]), real network namespaces, bridges
//! and subnets ([`netns`]), and `cnid-shim` as a runtime runs it, with the
//! Go clients ([`shim`]).
#![allow(dead_code, unreachable_pub)]

pub mod daemon;
pub mod fake;
/// One implementation for both crates' tests.
#[path = "../../../cni-async/tests/support/gate.rs"]
pub mod gate;
pub mod netns;
/// The benchmark plugin `cni-noop`, built on demand (it is not a binary of cnid).
#[path = "../../benches/noop/locate.rs"]
pub mod noop;
pub mod shim;
pub mod tool;
