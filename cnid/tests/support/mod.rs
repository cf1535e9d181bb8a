//! Helpers shared by the integration tests: the cnid daemon as a real
//! process ([`daemon`]), fake plugins
//! ([`fake`]), running the built binary in a sandbox ([`tool`]) and real
//! network namespaces, bridges and subnets ([`netns`]), and `cnid-shim` as a
//! runtime runs it, with the Go clients ([`shim`]).
#![allow(dead_code, unreachable_pub)]

pub mod daemon;
pub mod fake;
pub mod netns;
pub mod shim;
pub mod tool;
