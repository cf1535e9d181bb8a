//! A batch's progress: the events its callback gets and the running counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::BatchBuilder;
use crate::Error;

/// The progress callback of a batch.
pub type EventCallback = dyn Fn(&BatchEvent<'_>) + Send + Sync;

/// What happened to one namespace of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchEventKind {
    /// The namespace was created.
    Created,
    /// It is attached to every network.
    Attached,
    /// Creating it or attaching it failed (`error` says why); what was set
    /// up for it was rolled back.
    Failed,
    /// Teardown: its networks were removed and the namespace deleted (for
    /// an adopted member, also when its namespace was gone already;
    /// [`BatchCounts::deleted`] counts only deletions).
    Deleted,
    /// Teardown: removing a network or deleting the namespace failed
    /// (`error` says why); the namespace was deleted when possible (an
    /// adopted one is kept when a DEL failed).
    TeardownFailed,
}

/// Running totals of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BatchCounts {
    /// Namespaces in the batch.
    pub total: usize,
    /// Namespaces created so far.
    pub created: usize,
    /// Namespaces attached to every network so far.
    pub attached: usize,
    /// Namespaces whose setup failed so far.
    pub failed: usize,
    /// Namespaces deleted so far (teardown).
    pub deleted: usize,
    /// Namespaces whose teardown failed so far.
    pub teardown_failed: usize,
}

/// A progress report, passed to the [`BatchBuilder::on_event`] callback.
#[derive(Debug, Clone, Copy)]
pub struct BatchEvent<'a> {
    /// What happened.
    pub kind: BatchEventKind,
    /// The namespace's index in the batch.
    pub index: usize,
    /// The namespace's name.
    pub name: &'a str,
    /// The error, for [`BatchEventKind::Failed`] and
    /// [`BatchEventKind::TeardownFailed`].
    pub error: Option<&'a Error>,
    /// The totals, this event included.
    pub counts: BatchCounts,
    /// Time since the setup or teardown started.
    pub elapsed: Duration,
}

pub(super) struct Progress {
    total: usize,
    created: AtomicUsize,
    attached: AtomicUsize,
    failed: AtomicUsize,
    deleted: AtomicUsize,
    teardown_failed: AtomicUsize,
    clock: Mutex<Instant>,
    callback: Option<Arc<EventCallback>>,
}

impl Progress {
    pub(super) fn new(total: usize, callback: Option<Arc<EventCallback>>) -> Self {
        Progress {
            total,
            created: AtomicUsize::new(0),
            attached: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            deleted: AtomicUsize::new(0),
            teardown_failed: AtomicUsize::new(0),
            clock: Mutex::new(Instant::now()),
            callback,
        }
    }

    pub(super) fn restart_clock(&self) {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    pub(super) fn counts(&self) -> BatchCounts {
        BatchCounts {
            total: self.total,
            created: self.created.load(Ordering::Relaxed),
            attached: self.attached.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            deleted: self.deleted.load(Ordering::Relaxed),
            teardown_failed: self.teardown_failed.load(Ordering::Relaxed),
        }
    }

    /// Counts the event (and, with `deleted`, the namespace's deletion),
    /// then reports it.
    pub(super) fn emit(
        &self,
        kind: BatchEventKind,
        index: usize,
        name: &str,
        error: Option<&Error>,
        deleted: bool,
    ) {
        let counter = match kind {
            BatchEventKind::Created => Some(&self.created),
            BatchEventKind::Attached => Some(&self.attached),
            BatchEventKind::Failed => Some(&self.failed),
            BatchEventKind::Deleted => None,
            BatchEventKind::TeardownFailed => Some(&self.teardown_failed),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if deleted {
            self.deleted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(cb) = &self.callback {
            let elapsed = self
                .clock
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .elapsed();
            cb(&BatchEvent {
                kind,
                index,
                name,
                error,
                counts: self.counts(),
                elapsed,
            });
        }
    }
}
