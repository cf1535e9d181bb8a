//! The few raw system calls of this workspace, each behind a small safe
//! wrapper (nix). Everything that signals processes or switches namespaces
//! lives here and nowhere else; cnid calls the public part (process-group
//! signals for its orphaned plugins, the umask of its socket, its open-file
//! limit, allocator tuning) rather than making system calls of its own.
//!
//! - `process`: signalling process groups ([`signal_group`],
//!   [`group_alive`], [`own_process_group`]), whether a pid is taken
//!   ([`pid_alive`]), the executable check of
//!   plugin lookup.
//! - `daemon`: what a long-running process tunes of itself: [`with_umask`],
//!   [`raise_nofile_limit`], [`release_free_heap`], [`set_mmap_threshold`].
//! - `netns` (feature `netns`): setns, unshare, mount for network namespaces.
//! - `inotify` (feature `watch`): the conf-dir watcher's inotify instance.
//! - `spawn`: starting a plugin (`clone3`, vfork style, with a pidfd) and
//!   reaping it by its pidfd.
//! - `nsfs`: whether a path is a network namespace (statfs, `NS_GET_NSTYPE`).

mod daemon;
#[cfg(feature = "watch")]
pub(crate) mod inotify;
#[cfg(feature = "netns")]
pub(crate) mod netns;
pub(crate) mod nsfs;
pub(crate) mod process;
pub(crate) mod spawn;

pub use daemon::{
    on_memory_fs, raise_nofile_limit, release_free_heap, set_mmap_threshold, with_umask,
};
pub use nix::sys::signal::Signal;
pub use process::{group_alive, own_process_group, pid_alive, signal_group};
