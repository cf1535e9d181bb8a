//! An inotify watch on `results/` for [`super::scan::RecordScan::watched`]
//! (feature `watch`): which record files changed since the last scan, so
//! that a scan reads those instead of listing the whole dir.
//!
//! Not the dir's mtime: cnid's own ADDs and DELs change it on every
//! request, and it comes from a coarse clock. inotify names the entries
//! that changed, queued by the writer's own syscall before it returns, so a
//! scan costs the number of changes, not the number of records.
//!
//! # Invariants
//! - The watch is added before the listing that starts from it, so a
//!   change after the listing's start is in the listing or queued (or
//!   both: a name is read as it is now, whatever the event said).
//! - Events are not trusted for what they say happened: each named file is
//!   looked at again, so their order and coalescing do not matter.
//! - Whenever events may have been lost (queue overflow, a read error, the
//!   watched dir deleted, moved or replaced), the next scan lists the dir
//!   again from a new watch and reads every entry again.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The live watch, and what it reported since the last scan.
pub(crate) struct ResultsWatch {
    /// `None`: no live watch (not set up yet, the dir missing, inotify
    /// failing, or events lost); the next scan lists the dir.
    live: Option<(Inotify, (u64, u64))>,
    /// Names of entries changed since the last scan.
    pending: BTreeSet<OsString>,
    /// A failure to set up a watch was reported (once is enough: it
    /// repeats at every scan).
    warned: bool,
    /// A live watch ended since the last listing: events were lost, so
    /// the next listing reads every entry again (an entry kept with its
    /// inode may have been rewritten in place meanwhile).
    lost: bool,
}

/// What [`ResultsWatch::take`] says a scan must look at.
#[derive(Debug)]
pub(crate) enum Since {
    /// The live watch's reports: the names changed since the last scan.
    Changed(BTreeSet<OsString>),
    /// List the dir whole; with `reread`, read every entry again, not only
    /// those whose inode changed (events were lost: an entry rewritten in
    /// place, or read half written, looks unchanged).
    List { reread: bool },
}

impl std::fmt::Debug for ResultsWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultsWatch")
            .field("live", &self.live.as_ref().map(|(_, id)| id))
            .field("pending", &self.pending.len())
            .finish()
    }
}

/// What the dir's entries do that a scan must see; the dir itself going
/// away ends the watch.
fn flags() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        // A record rewritten in place (libcni truncates and writes).
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

fn dir_id(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

impl ResultsWatch {
    pub(crate) fn new() -> Self {
        ResultsWatch {
            live: None,
            pending: BTreeSet::new(),
            warned: false,
            lost: false,
        }
    }

    /// Consumes the queued events (without waiting); when the watch is live and at most
    /// `max` names changed, takes them (the scan then rereads only those).
    /// `None` leaves them pending for [`ResultsWatch::take`].
    pub(crate) fn take_few(&mut self, dir: &Path, max: usize) -> Option<BTreeSet<OsString>> {
        self.drain(dir);
        (self.live.is_some() && self.pending.len() <= max)
            .then(|| std::mem::take(&mut self.pending))
    }

    /// Puts back names taken by [`ResultsWatch::take_few`] that the caller
    /// did not read after all: the next scan reads them.
    pub(crate) fn give_back(&mut self, names: BTreeSet<OsString>) {
        self.pending.extend(names);
    }

    /// A name the last scan could not read: the next scan of a live watch
    /// reads it again (without one, the next scan lists anyway).
    pub(crate) fn retry(&mut self, name: OsString) {
        if self.live.is_some() {
            self.pending.insert(name);
        }
    }

    /// Ends the watch as if events were lost: the next scan lists the dir
    /// again, reading every entry (a listing that failed after its watch
    /// was set up; its changes were never applied).
    pub(crate) fn lose(&mut self) {
        self.live = None;
        self.pending.clear();
        self.lost = true;
    }

    /// Drains the queue; the watch ends when events may have been lost.
    fn drain(&mut self, dir: &Path) {
        let Some((ino, id)) = &self.live else {
            return;
        };
        // `results/` replaced by another dir (or the cache dir moved): the
        // watch is on an inode the path no longer leads to.
        let mut lost = dir_id(dir) != Some(*id);
        while !lost {
            match ino.read_events() {
                Ok(events) if events.is_empty() => break,
                Ok(events) => {
                    for ev in events {
                        if ev.mask.intersects(
                            AddWatchFlags::IN_Q_OVERFLOW
                                | AddWatchFlags::IN_IGNORED
                                | AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF,
                        ) {
                            lost = true;
                        } else if let Some(name) = ev.name
                            && name.as_encoded_bytes().first() != Some(&b'.')
                        {
                            self.pending.insert(name);
                        }
                    }
                }
                Err(Errno::EAGAIN) => break,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot read the cache's inotify events; listing the dir again");
                    lost = true;
                }
            }
        }
        if lost {
            // The names reported so far go too: the listing after reads
            // every entry again (`Since::List { reread }`), theirs with them.
            self.lose();
        }
    }

    /// Before a scan: the names to look at again, or a listing of the
    /// whole dir (a new watch is then set up first, when it can be: `dir`
    /// missing or inotify refusing leaves none, and the scan after lists
    /// again), which reads every entry again after a lost watch.
    pub(crate) fn take(&mut self, dir: &Path) -> Since {
        self.drain(dir);
        if self.live.is_some() {
            return Since::Changed(std::mem::take(&mut self.pending));
        }
        let list = Since::List {
            reread: std::mem::take(&mut self.lost),
        };
        let ino = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => i,
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(error = %e, "no inotify instance for the cache; listing it at every scan");
                }
                return list;
            }
        };
        match ino.add_watch(dir, flags()) {
            Ok(_) => {
                // The identity of what was watched: a stat after the
                // watch, so a swap in between shows as a mismatch later.
                if let Some(id) = dir_id(dir) {
                    self.live = Some((ino, id));
                }
            }
            Err(Errno::ENOENT) => {}
            Err(e) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the cache dir; listing it at every scan");
                }
            }
        }
        list
    }
}
