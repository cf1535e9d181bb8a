//! Helpers shared by the integration tests: fake plugins written into temp
//! dirs ([`fake`]) and real network namespaces ([`netns`]).
#![allow(dead_code, unreachable_pub)]

pub mod fake;
pub mod netns;
