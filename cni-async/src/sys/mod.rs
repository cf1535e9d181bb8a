//! The few raw system calls of this workspace, each behind a small safe
//! wrapper (nix), one concern per file. Everything that signals processes
//! or switches namespaces lives here and nowhere else; cnid calls the part
//! it needs through the daemon API (`crate::daemon`, feature `daemon`)
//! rather than making such system calls of its own.

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

pub(crate) use boot::before_boot;
pub use boot::{boot_id, boot_time};
pub use fs::on_memory_fs;
pub use identity::sees_host_mounts;
pub use nix::sys::signal::Signal;
pub use process::{group_alive, own_process_group, signal_group};
pub use procstat::{ProcStat, proc_stat};
