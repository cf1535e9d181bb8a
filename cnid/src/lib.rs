//! cnid, a CNI runtime daemon on a Unix socket, and cnitool.
//!
//! - [`daemon`]: the daemon (HTTP/1.1 + JSON on a Unix socket, per-container
//!   serialization, crash-safe ADD, reload, metrics); the `cnid` binary runs it.
//! - [`client`]: a typed async client of the daemon.
//! - [`api`]: the wire types both share (`API.md` documents the endpoints).
#![warn(missing_docs)]

pub mod api;
pub mod client;
pub mod daemon;
