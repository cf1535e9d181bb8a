//! inotify for the conf-dir watcher (feature `watch`): an instance
//! registered with tokio, and its watches.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// What a watch reports: changes of entries, and the watched dir itself
/// going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchKind {
    /// A conf dir or one of its subdirs: entries and their contents.
    Contents,
    /// The conf dir's parent: entries only (the conf dir appearing, going,
    /// being renamed or re-linked).
    Entries,
}

impl WatchKind {
    fn flags(self) -> AddWatchFlags {
        let entries = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_ONLYDIR;
        match self {
            WatchKind::Entries => entries,
            WatchKind::Contents => {
                entries
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
            }
        }
    }
}

/// An inotify instance and the dirs it watches.
///
/// A watch is on an inode, not a path: each path's watch remembers the
/// inode (device, inode number) the path led to when it was added, so a
/// path that now leads elsewhere (a symlink repointed, as when a conf dir
/// link or a ConfigMap's `..data` is swapped) is watched anew.
pub(crate) struct DirWatches {
    fd: AsyncFd<InotifyFd>,
    watches: HashMap<PathBuf, (WatchDescriptor, (u64, u64))>,
}

impl std::fmt::Debug for DirWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirWatches")
            .field("dirs", &self.watches.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl DirWatches {
    /// A new instance (non-blocking, close-on-exec) registered with the
    /// current tokio runtime.
    pub(crate) fn new() -> io::Result<DirWatches> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(io::Error::from)?;
        // SAFETY: the Inotify owns its fd, which stays open (and the same)
        // until the AsyncFd, and with it the Inotify, is dropped.
        let fd = unsafe {
            AsyncFd::register_with_interest(InotifyFd(ino), tokio::io::Interest::READABLE)
        }?;
        Ok(DirWatches {
            fd,
            watches: HashMap::new(),
        })
    }

    /// Whether `dir` is watched.
    pub(crate) fn watches(&self, dir: &Path) -> bool {
        self.watches.contains_key(dir)
    }

    /// Watches `dir` unless its watch is on the inode `dir` leads to now;
    /// errors (a missing dir) are left to the caller, who retries later.
    pub(crate) fn add(&mut self, dir: &Path, kind: WatchKind) -> io::Result<()> {
        let meta = std::fs::metadata(dir)?;
        let id = (meta.dev(), meta.ino());
        if let Some((old, was)) = self.watches.get(dir).cloned() {
            if was == id {
                return Ok(());
            }
            self.watches.remove(dir);
            // The old inode's watch goes unless another path still uses it
            // (the kernel gives one descriptor per inode).
            if !self.watches.values().any(|(wd, _)| *wd == old) {
                let _ = self.fd.get_ref().0.rm_watch(old);
            }
        }
        let wd = self
            .fd
            .get_ref()
            .0
            .add_watch(dir, kind.flags())
            .map_err(io::Error::from)?;
        self.watches.insert(dir.to_owned(), (wd, id));
        Ok(())
    }

    /// Forgets the watches of dirs that no longer exist (the kernel
    /// dropped them).
    pub(crate) fn forget_missing(&mut self) {
        self.watches.retain(|p, _| p.exists());
    }

    /// Waits until at least one event arrived, and consumes every event
    /// queued.
    pub(crate) async fn wait(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                Ok(Ok(events)) => {
                    self.note(&events);
                    return Ok(());
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Consumes the events queued now, without waiting.
    pub(crate) fn drain(&mut self) {
        while let Ok(events) = self.fd.get_ref().0.read_events() {
            if events.is_empty() {
                break;
            }
            self.note(&events);
        }
    }

    fn note(&mut self, events: &[nix::sys::inotify::InotifyEvent]) {
        for ev in events {
            if ev.mask.intersects(
                AddWatchFlags::IN_IGNORED
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF,
            ) {
                // The watched dir is gone: forget its watch.
                self.watches.retain(|_, (wd, _)| *wd != ev.wd);
            }
        }
    }
}
