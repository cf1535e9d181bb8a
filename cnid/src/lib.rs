//! cnid, a CNI runtime daemon on a Unix socket, and cnitool.
//!
//! - [`daemon`]: the daemon (HTTP/1.1 + JSON on a Unix socket, per-container
//!   serialization, crash-safe ADD, reload, metrics); the `cnid` binary runs it.
//! - [`client`]: a typed async client of the daemon.
//! - [`api`]: the wire types both share (`API.md` documents the endpoints).
//! - [`decode`]: the daemon's decoding and validation of requests (pure).
//! - [`generate`]: man pages and shell completions from the binaries' clap
//!   definitions (`--generate`, for `make install`).
//! - [`shim`]: `cnid-shim`, the CNI plugin that hands a runtime's calls to
//!   the daemon (blocking, no async runtime).
//!
//! # Features
//! - `runtime` (default): [`daemon`], [`client`] and the binaries, with
//!   their dependencies (tokio, hyper, cni-async, clap, ...). Without it the
//!   crate is [`api`], [`decode`] and [`shim`] only, on `cni-core`, `serde` and
//!   `serde_json` (what the fuzz targets in `cni-core/fuzz` build).
#![warn(missing_docs)]
// The docs link `daemon` and `client`, which need `runtime`.
#![cfg_attr(not(feature = "runtime"), allow(rustdoc::broken_intra_doc_links))]

pub mod api;
#[cfg(feature = "runtime")]
pub mod client;
#[cfg(feature = "runtime")]
pub mod daemon;
pub mod decode;
#[cfg(feature = "runtime")]
pub mod generate;
#[cfg(feature = "runtime")]
pub mod logfmt;
pub mod shim;
