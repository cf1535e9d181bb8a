//! Helpers shared by the integration tests: the workspace's test support
//! package (`cni-test-support`: fake plugins, gates, process checks, JSON
//! diffs, namespaces and subnets, the root check), plus what needs this
//! crate's types ([`fake::Rig`], [`netns::TestNet`], the conf-dir
//! watcher's [`confwatch`]).
#![allow(dead_code, unreachable_pub, unused_imports)]

pub use cni_test_support::{gate, require_root};

#[cfg(feature = "watch")]
pub mod confwatch;
pub mod fake;
pub mod netns;
