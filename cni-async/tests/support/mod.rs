//! Helpers shared by the integration tests: fake plugins written into temp
//! dirs ([`fake`]), gates that order a test's events ([`gate`]) and real
//! network namespaces ([`netns`]).
#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod gate;
pub mod netns;
