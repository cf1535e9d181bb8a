//! Pure CNI logic: everything about the Container Network Interface that does
//! not run a process.
//!
//! - [`command`]: the CNI operations.
//! - [`version`]: spec versions, selection, the `VERSION` reply.
//! - [`error`]: the CNI error object, well-known codes, this crate's [`Error`].
//! - [`validate`]: container IDs, network names, interface names, plugin types.
//! - [`result`]: results of every version (0.1.0 to 1.1.0) and conversion between them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod command;
pub mod error;
pub mod result;
pub mod validate;
pub mod version;

pub use command::Command;
pub use error::{Error, ErrorObject};
pub use version::Version;
