//! Runs CNI plugins from async Rust.
//!
//! Work in progress: the executor (`exec`), the syscall module (`sys`) and
//! the network-namespace helpers (`netns`, feature `netns`) come first.
#![warn(missing_docs)]

pub mod cache;
pub mod error;
pub mod exec;
#[cfg(feature = "netns")]
pub mod netns;
pub mod ops;
pub(crate) mod sys;

pub use error::{Error, PluginExit};
pub use ops::{CallOptions, Cni, CniBuilder, GcSummary};
pub use exec::{ExecOutput, ExecRequest, OutputLimits, PluginExec, RawExec, Timeouts};
