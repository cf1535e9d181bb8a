//! cnid, a CNI runtime daemon on a Unix socket, and cnitool.
//!
//! - [`daemon`]: the daemon (HTTP/1.1 + JSON on a Unix socket, per-container
//!   serialization, crash-safe ADD, reload, metrics); the `cnid` binary runs it.
//! - [`client`]: a typed async client of the daemon.
//! - [`api`]: the wire types both share (`API.md` documents the endpoints);
//!   the package `cnid-api` (`cnid/api`), re-exported.
//! - [`decode`]: the daemon's decoding and validation of requests (pure;
//!   `cnid_api::decode`, re-exported).
//! - [`generate`]: man pages and shell completions from the binaries' clap
//!   definitions (`--generate`, for `make install`).
//! - [`shim`]: `cnid-shim`, the CNI plugin that hands a runtime's calls to
//!   the daemon (blocking, no async runtime).
#![warn(missing_docs)]

pub use cnid_api as api;
pub use cnid_api::decode;
pub mod client;
pub mod daemon;
pub mod generate;
pub mod logfmt;
pub mod shim;
