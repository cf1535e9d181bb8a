//! Runs CNI plugins from async Rust.
//!
//! Work in progress: the executor (`exec`), the syscall module (`sys`) and
//! the network-namespace helpers (`netns`, feature `netns`) come first.
#![warn(missing_docs)]

#[cfg(feature = "netns")]
pub mod batch;
pub mod cache;
#[cfg(feature = "watch")]
pub mod confwatch;
pub mod durable;
pub mod error;
pub mod exec;
pub mod multi;
#[cfg(feature = "netns")]
pub mod netns;
pub mod nscheck;
pub mod ops;
pub mod sys;

#[cfg(feature = "netns")]
pub use batch::{Batch, BatchBuilder, BatchEvent, BatchEventKind};
/// Typed capability arguments, defined in [`cni_core::caps`].
pub use cni_core::caps;
pub use error::{Error, ErrorKind, PluginExit};
pub use exec::{ExecOutput, ExecRequest, OutputLimits, PluginExec, RawExec, Timeouts};
pub use multi::{
    KubernetesPod, MultiNetwork, MultiNetworkBuilder, MultiResult, NetworkGc, NetworkRequest,
    Sandbox, SetupMode,
};
pub use nscheck::check_netns;
pub use ops::{
    AddRequest, CallOptions, CheckRequest, Cni, CniBuilder, DelRequest, GcFailure, GcRequest,
    GcSummary, StatusRequest,
};
