//! Pure CNI logic: everything about the Container Network Interface that does
//! not run a process.
//!
//! - [`version`]: spec versions, selection, the `VERSION` reply.
//! - [`command`]: the CNI operations.
//! - [`error`]: the CNI error object, well-known codes, this crate's [`Error`].
//! - [`config`]: network configuration lists and plugin configurations.
//! - [`confdir`]: finding networks in a conf dir.
//! - [`args`]: `CNI_ARGS`, capability arguments, [`RuntimeConf`].
//! - [`caps`]: typed capability arguments (`portMappings`, `bandwidth`, ...).
//! - [`validate`]: container IDs, network names, interface names, plugin types.
//! - [`stdin`]: the per-plugin JSON on stdin for every verb.
//! - [`env`](mod@env): the `CNI_*` environment for every verb.
//! - [`result`]: results of every version (0.1.0 to 1.1.0) and conversion between them.
//! - [`cache`]: the libcni-compatible result cache record.
//!
//! No process is executed and nothing is async here; file reading is limited
//! to the conf dir and cache files the caller names. Running plugins is
//! `cni-async`'s (its `Cni` type); where both differ from libcni on purpose
//! is listed, with the reasons, in the repository's `docs/decisions.md`.
//!
//! ```
//! use cni_core::{NetworkConfigList, RuntimeConf, Version};
//! use cni_core::result::CniResult;
//!
//! let list = NetworkConfigList::from_bytes(br#"{
//!     "cniVersion": "1.0.0", "name": "mynet",
//!     "plugins": [{"type": "bridge"}, {"type": "portmap", "capabilities": {"portMappings": true}}]
//! }"#, None)?;
//! assert_eq!(list.version(), Version::V1_0_0);
//! RuntimeConf::new("c1", "/run/netns/c1", "eth0").validate()?;
//!
//! // A plugin's result of an older version, read in the list's version.
//! let result = CniResult::parse(br#"{"cniVersion": "0.4.0",
//!     "ips": [{"version": "4", "address": "10.1.0.5/24"}]}"#, list.version())?;
//! let current = result.convert(list.version())?;
//! assert_eq!(current.version(), Version::V1_0_0);
//! assert_eq!(current.addresses()[0].to_string(), "10.1.0.5/24");
//! # Ok::<(), cni_core::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod cache;
pub mod caps;
pub mod command;
pub mod confdir;
pub mod config;
pub mod env;
pub mod error;
pub mod result;
pub mod stdin;
pub mod trace;
pub mod validate;
pub mod version;

pub use args::{CapabilityArgs, CniArgs, RuntimeConf};
pub use command::Command;
pub use config::{NetworkConfigList, PluginConfig};
pub use error::{Error, ErrorObject};
pub use version::Version;
