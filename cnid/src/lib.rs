//! cnid, a CNI runtime daemon on a Unix socket: [`daemon`] (HTTP/1.1 +
//! JSON, per-container serialization, crash-safe ADD, reload, metrics),
//! which the `cnid` binary runs. The packages around it are re-exported:
//! [`client`] (`cnid-client`: what an embedder that only talks to a running
//! cnid depends on), [`api`] (`cnid-api`: the wire types, and [`decode`],
//! the daemon's pure request decoding), [`generate`] and [`logfmt`]
//! (`cnid-cli`, shared with cnitool) and [`shim`] (`cnid-shim`).
//! `cnid/API.md` documents the endpoints, `ARCHITECTURE.md` the path of a
//! request.
#![warn(missing_docs)]

pub use cnid_api as api;
pub use cnid_api::decode;
pub use cnid_cli::{generate, logfmt};
pub use cnid_client as client;
pub mod daemon;
pub use cnid_shim as shim;
