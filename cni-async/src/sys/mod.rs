//! The few raw system calls of this workspace, each behind a small safe
//! wrapper (nix). Everything that signals processes or switches namespaces
//! lives here and nowhere else; cnid calls the part it needs through the
//! daemon API (`crate::daemon`, feature `daemon`: process-group signals
//! for its orphaned plugins, whether its state dir is in memory, the boot
//! id, `/proc/PID/stat`) rather than making such system calls of its own. What a program tunes
//! of its own process (umask, open-file limit, allocator) is its own
//! business, not this library's: cnid's is in `cnid::daemon`.
//!
//! - `process`: signalling process groups ([`signal_group`],
//!   [`group_alive`], [`own_process_group`]), the executable check of
//!   plugin lookup.
//! - `fs`: whether a path is on a file system held in memory
//!   ([`on_memory_fs`]).
//! - `netns` (feature `netns`): setns, unshare, mount for network namespaces.
//! - `inotify` (feature `watch`): the conf-dir watcher's inotify instance.
//! - `spawn`: starting a plugin (`clone3`, vfork style, with a pidfd) and
//!   reaping it by its pidfd.
//! - `nsfs`: whether a path is a network namespace (statfs, `NS_GET_NSTYPE`).
//! - `boot`: this boot's id ([`boot_id`]) and when it began ([`boot_time`]).
//! - `procstat`: the one reader of `/proc/PID/stat` ([`proc_stat`]: state,
//!   process group, session, start time).
//! - `identity`: a namespace's nsfs device and inode, a process's start
//!   time, whether the caller sees the host's mounts ([`sees_host_mounts`])
//!   and whether anything holds a namespace.

// Without the feature `daemon`, the helpers only a daemon calls are
// compiled but not public.
#![cfg_attr(
    not(feature = "daemon"),
    allow(dead_code, unreachable_pub, unused_imports)
)]

mod boot;
mod fs;
pub(crate) mod identity;
#[cfg(feature = "watch")]
pub(crate) mod inotify;
#[cfg(feature = "netns")]
pub(crate) mod netns;
pub(crate) mod nsfs;
pub(crate) mod process;
mod procstat;
pub(crate) mod spawn;

pub use boot::{boot_id, boot_time};
pub use fs::on_memory_fs;
pub use identity::sees_host_mounts;
pub use nix::sys::signal::Signal;
pub use process::{group_alive, own_process_group, signal_group};
pub use procstat::{ProcStat, proc_stat};
