//! The few raw system calls this crate makes, each behind a small safe
//! wrapper (nix). Everything that signals processes or switches namespaces
//! lives here and nowhere else.
//!
//! - [`process`]: signalling process groups, the executable check of plugin lookup.
//! - `netns` (feature `netns`): setns, unshare, mount for network namespaces.
//! - `inotify` (feature `watch`): the conf-dir watcher's inotify instance.
//! - [`nsfs`]: whether a path is a network namespace (statfs, `NS_GET_NSTYPE`).

#[cfg(feature = "watch")]
pub(crate) mod inotify;
#[cfg(feature = "netns")]
pub(crate) mod netns;
pub(crate) mod nsfs;
pub(crate) mod process;
