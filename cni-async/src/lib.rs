//! Runs CNI plugins from async Rust.
//!
//! Work in progress: the executor (`exec`), the syscall module (`sys`) and
//! the network-namespace helpers (`netns`, feature `netns`) come first.
#![warn(missing_docs)]
