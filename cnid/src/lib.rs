//! cnid, a CNI runtime daemon on a Unix socket, and cnitool.
//!
//! - [`daemon`]: the daemon (HTTP/1.1 + JSON on a Unix socket, per-container
//!   serialization, crash-safe ADD, reload, metrics); the `cnid` binary runs it.
//! - [`client`]: a typed async client of the daemon; the package
//!   `cnid-client` (`cnid/client`), re-exported. An embedder that only
//!   talks to a running cnid depends on `cnid-client` alone.
//! - [`api`]: the wire types both share (`API.md` documents the endpoints);
//!   the package `cnid-api` (`cnid/api`), re-exported.
//! - [`decode`]: the daemon's decoding and validation of requests (pure;
//!   `cnid_api::decode`, re-exported).
//! - [`generate`]: man pages and shell completions from the binaries' clap
//!   definitions (`--generate`, for `make install`), and [`logfmt`], how
//!   the binaries write log fields; the package `cnid-cli` (`cnid/cli`),
//!   re-exported, which cnitool shares.
//! - [`shim`]: `cnid-shim`, the CNI plugin that hands a runtime's calls to
//!   the daemon (blocking, no async runtime); the package `cnid-shim`
//!   (`cnid/shim`), re-exported.
//!
//! The binaries: `cnid` (the daemon), `cnitool` (package `cnitool`,
//! `cnid/cnitool`: the command line, locally or through the daemon with
//! `--socket`; it depends on `cnid-client` and `cnid-cli`, not on this
//! crate) and `cnid-shim` (package `cnid-shim`, `cnid/shim`). The
//! library the daemon runs plugins with is `cni-async` (its `Cni` and
//! `MultiNetwork`); `cnid/API.md` documents the endpoints and
//! `ARCHITECTURE.md` the path of a request.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cnid::client::ClientError> {
//! use cnid::api::AttachmentRequest;
//! use cnid::client::Client;
//!
//! // A running cnid, reached on its socket.
//! let client = Client::connect("/run/cnid/cnid.sock").await?;
//! let req = AttachmentRequest::new("c1", "/run/netns/c1", "eth0");
//! let result = client.add("mynet", &req).await?;
//! println!("{result}");
//! client.del("mynet", &req).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub use cnid_api as api;
pub use cnid_api::decode;
pub use cnid_cli::{generate, logfmt};
pub use cnid_client as client;
pub mod daemon;
pub use cnid_shim as shim;
