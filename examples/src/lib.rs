//! What the examples share: `common` (defaults, signal handling, the
//! bridge they create beforehand, host-local's data dir, ping) for
//! `in-process`, `harness`, `daemon-client` and `demo`; `daemon_flow` (two
//! sandboxes through a running cnid) for `daemon-client` and `demo`. Each
//! binary uses a part of it.

pub mod common;
pub mod daemon_flow;
