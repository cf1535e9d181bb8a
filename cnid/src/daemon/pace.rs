//! Pacing of operations in a burst: at most `--plugin-slots` operations
//! run their plugins at once; the others wait for a slot, each a bounded
//! while ([`SLOT_WAIT`]), in arrival order (tokio's semaphore is fair).
//!
//! Why: when many pods land on a node at once, every ADD runs the same
//! chain, and the plugins fight over the same locks: host-local's file
//! lock, the kernel's rtnl lock for the bridge, and portmap's iptables,
//! which re-reads the whole ruleset for each of its calls and retries when
//! another process changed it meanwhile. Sixteen or thirty-two chains at
//! once on a 2-CPU node spend more CPU per pod than a few at a time, and
//! the node's other work gets what they waste. A runtime running the
//! plugins itself cannot know; cnid sees every operation of the node and
//! lets a few chains run at once, each to its end. `--max-parallel` is the
//! hard limit (a slot is a soft one, below it).
//!
//! What it keeps: a slot is never held for longer than [`SLOT_LEASE`]
//! after its operation started, so a slow or hung plugin (or a plugin that
//! is itself a client of cnid) delays others by a bounded while and never
//! blocks the node; no operation waits more than [`SLOT_WAIT`] or a
//! quarter of its deadline for a slot, and the wait counts against its
//! deadline (the plugins run with what is left, as after any queueing).
//! Per-container order, the journal and the owner checks are unchanged:
//! the slot is taken after the operation left its container's queue and
//! took its network's gate and its `--max-parallel` permit.
//!
//! # Caveats
//!
//! - A cancelled operation's future gives its slot back when dropped.
//! - 0 slots (the default, [`DEFAULT_SLOTS`]) turns pacing off.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

/// The longest an operation waits for a slot (less when a quarter of its
/// deadline is less).
pub const SLOT_WAIT: Duration = Duration::from_secs(15);

/// The longest an operation keeps its slot. Longer than a chain takes in a
/// burst on a busy node (2–3 s for bridge + portmap at a load of 40 on 2
/// CPUs): a shorter lease lets the burst run unpaced again.
pub const SLOT_LEASE: Duration = Duration::from_secs(10);

/// The default `--plugin-slots`: off. Pacing cuts the chains' CPU per
/// pod in a burst, and through containerd's CRI on a node whose CPUs were
/// the burst's it made RunPodSandbox faster than direct (4 slots on 2
/// CPUs: p95 0.79, total 0.91 at concurrency 32); but where other work
/// takes the CPUs it leaves idle, the paced burst took longer (1.16 at 32).
/// Until a default can tell the two apart, it is an operator's choice
/// (`2 × CPUs`; BENCHMARKS.md, "Pod sandboxes through containerd's CRI").
pub const DEFAULT_SLOTS: usize = 0;

/// The slots.
#[derive(Debug)]
pub(crate) struct Pace {
    slots: Option<Arc<Semaphore>>,
}

impl Pace {
    /// `slots` 0: no pacing.
    pub(crate) fn new(slots: usize) -> Pace {
        Pace {
            slots: (slots > 0).then(|| Arc::new(Semaphore::new(slots))),
        }
    }

    /// Runs `work()` in a slot: waits for one (at most [`SLOT_WAIT`] or a
    /// quarter of `remaining()`, then runs without), calls `work` (which
    /// reads its deadline then, after the wait), and gives the slot back
    /// when the work ends or [`SLOT_LEASE`] passed, whichever comes first.
    pub(crate) async fn run<F: Future>(
        &self,
        remaining: impl FnOnce() -> Duration,
        work: impl FnOnce() -> F,
    ) -> F::Output {
        let Some(slots) = &self.slots else {
            return work().await;
        };
        let wait = SLOT_WAIT.min(remaining() / 4);
        let slot = tokio::time::timeout(wait, slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok);
        let run = work();
        tokio::pin!(run);
        if let Some(slot) = slot {
            tokio::select! {
                out = &mut run => return out,
                () = tokio::time::sleep(SLOT_LEASE) => drop(slot),
            }
        }
        run.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::time::Instant;

    /// Work that records its start and waits for the gate.
    #[derive(Debug, Default)]
    struct Gated {
        started: AtomicUsize,
        gate: tokio::sync::Notify,
    }

    fn run(
        pace: &Arc<Pace>,
        gated: &Arc<Gated>,
        deadline: Instant,
    ) -> tokio::task::JoinHandle<Duration> {
        let (pace, gated) = (pace.clone(), gated.clone());
        tokio::spawn(async move {
            pace.run(
                || deadline - Instant::now(),
                || async {
                    // What an operation reads for its plugins.
                    let left = deadline - Instant::now();
                    gated.started.fetch_add(1, Ordering::SeqCst);
                    gated.gate.notified().await;
                    left
                },
            )
            .await
        })
    }

    /// Lets the spawned tasks run until they wait again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn started(g: &Gated) -> usize {
        g.started.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn pace_a_full_set_of_slots_makes_the_next_operation_wait_until_one_ends() {
        let gated = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(2));
        let deadline = Instant::now() + Duration::from_secs(60);
        let runs: Vec<_> = (0..3).map(|_| run(&pace, &gated, deadline)).collect();
        settle().await;
        assert_eq!(started(&gated), 2, "two slots");
        // One ends (no time passes): the third starts.
        gated.gate.notify_one();
        settle().await;
        assert_eq!(started(&gated), 3);
        gated.gate.notify_waiters();
        for r in runs {
            assert_eq!(r.await.unwrap(), Duration::from_secs(60));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pace_a_hung_operation_keeps_its_slot_no_longer_than_the_lease_and_the_wait_counts_against_the_deadline()
     {
        let gated = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(1));
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = run(&pace, &gated, deadline);
        settle().await;
        let second = run(&pace, &gated, deadline);
        settle().await;
        assert_eq!(started(&gated), 1);
        tokio::time::advance(SLOT_LEASE - Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(started(&gated), 1, "still waiting");
        tokio::time::advance(Duration::from_millis(2)).await;
        settle().await;
        assert_eq!(
            started(&gated),
            2,
            "the first one's slot is free after the lease, though it still runs"
        );
        gated.gate.notify_waiters();
        assert_eq!(first.await.unwrap(), Duration::from_secs(60));
        let left = second.await.unwrap();
        assert_eq!(
            left,
            Duration::from_secs(60) - SLOT_LEASE - Duration::from_millis(1),
            "the wait is deducted from the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pace_a_short_deadline_waits_a_quarter_of_it_at_most_and_zero_slots_is_no_pacing() {
        let gated = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(1));
        let first = run(&pace, &gated, Instant::now() + Duration::from_secs(60));
        settle().await;
        let second = run(&pace, &gated, Instant::now() + Duration::from_millis(400));
        settle().await;
        tokio::time::advance(Duration::from_millis(99)).await;
        settle().await;
        assert_eq!(started(&gated), 1);
        tokio::time::advance(Duration::from_millis(2)).await;
        settle().await;
        assert_eq!(started(&gated), 2, "ran without a slot after 100 ms");
        gated.gate.notify_waiters();
        first.await.unwrap();
        second.await.unwrap();

        let free = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(0));
        let deadline = Instant::now() + Duration::from_secs(60);
        let runs: Vec<_> = (0..8).map(|_| run(&pace, &free, deadline)).collect();
        settle().await;
        assert_eq!(started(&free), 8);
        free.gate.notify_waiters();
        for r in runs {
            r.await.unwrap();
        }
    }
}
