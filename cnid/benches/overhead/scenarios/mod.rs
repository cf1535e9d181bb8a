//! One file per section of the report (`--only` names them).

pub(crate) mod batch;
pub(crate) mod batch1000;
pub(crate) mod burst;
pub(crate) mod core;
pub(crate) mod hop;
pub(crate) mod memory;
pub(crate) mod noop;
pub(crate) mod plugin;
pub(crate) mod real;
pub(crate) mod scale;
pub(crate) mod shim;
pub(crate) mod trace;
