//! A batch's progress: the events its callback gets and the running counts.

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
    counts: Mutex<BatchCounts>,
    clock: Mutex<Instant>,
    callback: Option<Arc<EventCallback>>,
}

impl Progress {
    pub(super) fn new(total: usize, callback: Option<Arc<EventCallback>>) -> Self {
        Progress {
            counts: Mutex::new(BatchCounts {
                total,
                ..BatchCounts::default()
            }),
            clock: Mutex::new(Instant::now()),
            callback,
        }
    }

    pub(super) fn restart_clock(&self) {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    pub(super) fn counts(&self) -> BatchCounts {
        *self.counts.lock().unwrap_or_else(PoisonError::into_inner)
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
        let counts = {
            let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            match kind {
                BatchEventKind::Created => c.created += 1,
                BatchEventKind::Attached => c.attached += 1,
                BatchEventKind::Failed => c.failed += 1,
                BatchEventKind::Deleted => {}
                BatchEventKind::TeardownFailed => c.teardown_failed += 1,
            }
            c.deleted += usize::from(deleted);
            *c
        };
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
                counts,
                elapsed,
            });
        }
    }
}
