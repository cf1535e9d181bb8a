//! The limit on operations running plugins at once (`--max-parallel`),
//! shared by runtime requests and the daemon's own background work (the
//! stale-attachment reaper's DELs):
//!
//! - **Runtime operations** take a slot in the order they ask for one (a
//!   fair semaphore).
//! - **Background work** takes a slot only while no runtime operation
//!   waits for one (it never queues in the semaphore, so a slot that
//!   frees goes to a waiting runtime operation first), and at most
//!   [`background_share`] of the slots at once: a quarter of the limit, at
//!   least one. So reaps whose DEL hangs (a plugin stuck on a namespace
//!   that is gone) hold at most that share, and the rest stays for the
//!   runtime.
//!
//! # Caveats
//! With `--max-parallel` 1 to 7 the share is one slot: with a limit of 1
//! a hanging reap holds the only slot until its DEL deadline. A waiting
//! background operation is woken whenever a slot is freed or the last
//! runtime waiter got one, and tries again; it holds its share's permit
//! meanwhile (so the share bounds what waits, too).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

/// How many of `max_parallel` slots background work may hold at once: a
/// quarter, at least one.
pub(crate) fn background_share(max_parallel: usize) -> usize {
    (max_parallel / 4).max(1)
}

/// The slots (see the module docs).
#[derive(Debug)]
pub(crate) struct Slots {
    permits: Arc<Semaphore>,
    background: Arc<Semaphore>,
    /// Runtime operations waiting for a slot.
    waiting: AtomicUsize,
    /// A slot was freed, or no runtime operation waits any more.
    freed: Notify,
}

/// A slot held: freed when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    _share: Option<OwnedSemaphorePermit>,
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The permit first (a runtime waiter queued in the semaphore gets
        // it), then the background waiters look.
        drop(self.permit.take());
        self.slots.freed.notify_waiters();
    }
}

/// A runtime operation counted as waiting while it waits.
struct Waiting<'a>(&'a Slots);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.0.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.freed.notify_waiters();
        }
    }
}

impl Slots {
    pub(crate) fn new(max_parallel: usize) -> Arc<Self> {
        let max_parallel = max_parallel.max(1);
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(max_parallel)),
            background: Arc::new(Semaphore::new(background_share(max_parallel))),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    /// A slot for a runtime operation, in the order asked. `None` only
    /// once closed.
    pub(crate) async fn runtime(self: &Arc<Self>) -> Option<Slot> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(self);
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        drop(waiting);
        Some(Slot {
            permit: Some(permit),
            _share: None,
            slots: self.clone(),
        })
    }

    /// A slot for an operation: a runtime one's ([`Slots::runtime`]) when
    /// `background` is `None`; else background work's
    /// ([`Slots::background`]) until the token is cancelled (a runtime
    /// request waits behind it: promoted), then a runtime one's.
    pub(crate) async fn for_op(
        self: &Arc<Self>,
        background: Option<&CancellationToken>,
    ) -> Option<Slot> {
        match background {
            None => self.runtime().await,
            Some(promoted) => tokio::select! {
                slot = self.background() => slot,
                () = promoted.cancelled() => self.runtime().await,
            },
        }
    }

    /// A slot for background work: within the background share, and only
    /// while no runtime operation waits for one. `None` only once closed.
    pub(crate) async fn background(self: &Arc<Self>) -> Option<Slot> {
        let share = self.background.clone().acquire_owned().await.ok()?;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a slot freed in between wakes it.
            freed.as_mut().enable();
            if self.waiting.load(Ordering::SeqCst) == 0 {
                match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        return Some(Slot {
                            permit: Some(permit),
                            _share: Some(share),
                            slots: self.clone(),
                        });
                    }
                    Err(TryAcquireError::Closed) => return None,
                    Err(TryAcquireError::NoPermits) => {}
                }
            }
            freed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use cni_test_support::gate::poll_once;

    #[test]
    fn share_is_a_quarter_at_least_one() {
        assert_eq!(background_share(1), 1);
        assert_eq!(background_share(4), 1);
        assert_eq!(background_share(7), 1);
        assert_eq!(background_share(8), 2);
        assert_eq!(background_share(64), 16);
    }

    #[tokio::test]
    async fn background_holds_at_most_its_share() {
        let s = Slots::new(4);
        let b1 = s.background().await.unwrap();
        let mut b2 = Box::pin(s.background());
        assert!(poll_once(&mut b2).await.is_pending());
        // Three slots stay for the runtime.
        let r: Vec<Slot> = futures_collect(&s, 3).await;
        drop(r);
        assert!(poll_once(&mut b2).await.is_pending());
        drop(b1);
        let b2 = tokio::time::timeout(Duration::from_secs(10), b2)
            .await
            .expect("the share freed")
            .unwrap();
        drop(b2);
    }

    async fn futures_collect(s: &Arc<Slots>, n: usize) -> Vec<Slot> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(s.runtime().await.unwrap());
        }
        v
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_a_waiting_runtime_operation_first() {
        let s = Slots::new(1);
        let held = s.runtime().await.unwrap();
        // Background asked first, the runtime second.
        let mut bg = Box::pin(s.background());
        assert!(poll_once(&mut bg).await.is_pending());
        let mut rt = Box::pin(s.runtime());
        assert!(poll_once(&mut rt).await.is_pending());
        drop(held);
        let rt = tokio::time::timeout(Duration::from_secs(10), rt)
            .await
            .expect("the runtime gets the slot")
            .unwrap();
        assert!(poll_once(&mut bg).await.is_pending());
        drop(rt);
        let bg = tokio::time::timeout(Duration::from_secs(10), bg)
            .await
            .expect("then background")
            .unwrap();
        drop(bg);
    }
}
