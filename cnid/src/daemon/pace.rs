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
//! took its network's gate and its `--max-parallel` permit (a sandbox
//! operation's steps each take one after their gate and permit: a step
//! waiting for a GC's gate never holds the slot the GC waits for). The daemon's
//! own background work (reaps, periodic CHECKs) takes a slot as it takes
//! a `--max-parallel` one (`slots`): at most a quarter of them, and never
//! one a runtime operation waits for.
//!
//! The burst's share of the CPUs stays what it would be unpaced: a plugin
//! started while operations wait for a slot runs with a larger CPU weight
//! (a lower nice value, `PacedExec`): with 16 operations on 4 slots,
//! each slot's plugins weigh what four unpaced ones would. Operations that
//! run without a slot (they gave up waiting, or a lease ended) count as
//! running: the weight spreads what wants to run over what runs, so a
//! burst never weighs more than it would unpaced. Without it a paced burst
//! loses to the node's other work:
//! the scheduler shares the CPUs by runnable process, and pacing leaves
//! fewer of the burst's runnable (measured: BENCHMARKS.md).
//!
//! Pacing holds operations back only while the CPUs are busy: it is
//! work-conserving. While operations wait, `Pace::lend` looks every
//! [`LEND_TICK`] at how many CPUs idled since its last look (`idle`) and
//! lets as many waiting runtime operations run without a slot, the
//! longest waiting first (background work once promoted: a runtime
//! request of its container waits behind it). Slots held by plugins that
//! wait (DHCP, an IPAM server across the network, a hung plugin) so hold
//! back nobody while a CPU has room; in a burst of chains that compute,
//! the CPUs stay busy and the slots hold.
//!
//! # Caveats
//!
//! - A cancelled operation's future gives its slot back when dropped.
//! - An operation waiting for a slot has run no plugin: when every request
//!   for it leaves (clients disconnected), it ends without running, as a
//!   queued one is cancelled. Once it has its slot (or gave up waiting) it
//!   runs to its end. `/v1/operations` lists one waiting as `running`.
//! - The weight is the nice value a plugin starts with, for its life and
//!   that of what it forks; it acts against the processes of the same
//!   cgroup (where cnid runs in a cgroup of its own, as under systemd, the
//!   burst's share against other services is the cgroup's). cnid needs
//!   `CAP_SYS_NICE` to give it; without, plugins run at cnid's own.
//! - 0 slots turns pacing off; the default is twice the CPUs
//!   ([`default_slots`]).
//! - Lending reads the whole node's CPUs: when other work keeps them busy,
//!   slots held by plugins that wait still hold operations back, each at
//!   most [`SLOT_WAIT`] (a slot's lease, [`SLOT_LEASE`], bounds what one
//!   holds). A lent operation runs to its end without a slot, and counts as
//!   running for the weight.
//! - Without CPU times (`/proc/stat` unreadable, as when cnid is out of
//!   descriptors) a look lends nothing; lending resumes at the second look
//!   that reads them.
//! - The daemon lends until its end (`run`), through the shutdown's
//!   drain: an operation that still waits for a slot then is lent a run as
//!   before it.
//! - STATUS is not paced (`Engine::run`): a readiness probe answers during
//!   a burst.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use cni_async::exec::{ExecOutput, ExecRequest, PluginExec};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use tokio::sync::{Notify, Semaphore};

use super::idle::{CpuProbe, ProcStat};
use super::metrics::Metrics;
use super::slots::Slots;
use super::tuning::with_thread_boost;

/// The longest an operation waits for a slot (less when a quarter of its
/// deadline is less).
pub const SLOT_WAIT: Duration = Duration::from_secs(15);

/// The longest an operation keeps its slot. Longer than a chain takes in a
/// burst on a busy node (2–3 s for bridge + portmap at a load of 40 on 2
/// CPUs): a shorter lease lets the burst run unpaced again.
pub const SLOT_LEASE: Duration = Duration::from_secs(10);

/// The default `--plugin-slots`: twice the CPUs cnid may run on. Measured
/// through containerd's CRI (4 slots on 2 CPUs, BENCHMARKS.md, "Pod
/// sandboxes through containerd's CRI"): 100 RunPodSandbox at concurrency
/// 16 and 32 against the chain run by containerd itself. Safe as a default
/// because pacing lends a run to a waiting operation while a CPU idles
/// (`Pace::lend`): slots held by plugins that wait (a slow DHCP server, a
/// hung plugin) do not hold the node's other operations back while the
/// CPUs have room.
pub fn default_slots() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most a plugin's nice value is lowered (a weight of about 9 times).
pub const MAX_BOOST: i32 = 10;

/// How often the lender looks at the CPUs while operations wait.
pub const LEND_TICK: Duration = Duration::from_millis(100);

/// The slots.
#[derive(Debug)]
pub(crate) struct Pace {
    slots: Option<Arc<Slots>>,
    /// Operations in [`Pace::run`]: waiting for a slot, or running (in a
    /// slot or without one).
    wanting: AtomicUsize,
    /// Operations waiting for a slot.
    waiting: AtomicUsize,
    /// Runs lent while CPUs idle (`Pace::lend`): a runtime operation
    /// waiting for a slot that takes one runs without a slot.
    lent: Semaphore,
    /// An operation began to wait (wakes the lender).
    began_waiting: Notify,
    probe: Arc<dyn CpuProbe>,
    /// Where how each operation ran is counted.
    metrics: Arc<Metrics>,
}

impl Pace {
    /// `slots` 0: no pacing.
    pub(crate) fn new(slots: usize, metrics: Arc<Metrics>) -> Pace {
        Pace::with_probe(slots, Arc::new(ProcStat), metrics)
    }

    /// With the CPU times read from `probe`.
    pub(crate) fn with_probe(
        slots: usize,
        probe: Arc<dyn CpuProbe>,
        metrics: Arc<Metrics>,
    ) -> Pace {
        Pace {
            slots: (slots > 0).then(|| Slots::new(slots)),
            wanting: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            lent: Semaphore::new(0),
            began_waiting: Notify::new(),
            probe,
            metrics,
        }
    }

    /// Keeps pacing work-conserving until `stop`: while operations wait
    /// for a slot, looks every [`LEND_TICK`] at how many CPUs idled since
    /// the last look and lets that many (rounded) of the waiting runtime
    /// operations run without a slot, the longest waiting first. Runs
    /// lent and not taken within a tick lapse. Without CPU times (no
    /// `/proc/stat`) it lends nothing: pacing as without it; once they
    /// can be read again, it lends from the second look on. Background
    /// work is lent a run once promoted (a runtime request of its
    /// container waits behind it), as the runtime operation would be.
    pub(crate) async fn lend(self: Arc<Self>, stop: CancellationToken) {
        if self.slots.is_some() {
            stop.run_until_cancelled(self.lend_while_idle()).await;
        }
    }

    async fn lend_while_idle(&self) {
        loop {
            let began = self.began_waiting.notified();
            if self.waiting.load(Ordering::SeqCst) == 0 {
                began.await;
                continue;
            }
            let mut last = self.probe.read();
            loop {
                tokio::time::sleep(LEND_TICK).await;
                self.lent.forget_permits(usize::MAX);
                let waiting = self.waiting.load(Ordering::SeqCst);
                if waiting == 0 {
                    break;
                }
                // A failed read (out of descriptors in a flood) lends
                // nothing until two in a row succeed: it never ends lending.
                let now = self.probe.read();
                if let (Some(last), Some(now)) = (last, now) {
                    let idle = last.idle_cpus_until(now).round() as usize;
                    self.lent.add_permits(idle.min(waiting));
                }
                last = now;
            }
        }
    }

    /// How much lower than cnid's own the nice value of a plugin started
    /// now is: the weight of the operations that want to run spread over
    /// those that run. A nice step is a factor of 1.25 in the scheduler's
    /// weight, so `n` operations of which `r` run give log₁.₂₅(n / r)
    /// steps, at most [`MAX_BOOST`]; 0 while none waits (those that gave
    /// up waiting, or whose slot's lease ended, run as many as unpaced).
    pub(crate) fn boost(&self) -> i32 {
        boost(
            self.wanting.load(Ordering::Relaxed),
            self.waiting.load(Ordering::Relaxed),
        )
    }

    /// Runs `work()` in a slot: waits for one (at most [`SLOT_WAIT`] or a
    /// quarter of `remaining()`, then runs without), calls `work` (which
    /// reads its deadline then, after the wait), and gives the slot back
    /// when the work ends or [`SLOT_LEASE`] passed, whichever comes first.
    /// `background`: the daemon's own work, which takes a slot as it takes
    /// a `--max-parallel` one ([`Slots::for_op`]): never one a runtime
    /// operation waits for. [`Abandoned`], without calling `work`, when
    /// `abandoned` completes while it waits (nobody waits for the
    /// operation any more: none of its plugins has run).
    pub(crate) async fn run<F: Future>(
        &self,
        background: Option<&CancellationToken>,
        remaining: impl FnOnce() -> Duration,
        abandoned: impl Future<Output = ()>,
        work: impl FnOnce() -> F,
    ) -> Result<F::Output, Abandoned> {
        let Some(slots) = &self.slots else {
            return Ok(work().await);
        };
        let _wanting = Counted::enter(&self.wanting);
        let wait = SLOT_WAIT.min(remaining() / 4);
        let waiting = Counted::enter(&self.waiting);
        self.began_waiting.notify_one();
        let lent = async {
            if let Some(promoted) = background {
                // The daemon's own work waits for its slot, until a runtime
                // request of its container waits behind it.
                promoted.cancelled().await;
            }
            self.lent.acquire().await.map(|run| run.forget())
        };
        // How it runs: in a slot, lent a run, or without once its wait is up.
        let (slot, how) = tokio::select! {
            slot = tokio::time::timeout(wait, slots.for_op(background)) => {
                let slot = slot.ok().flatten();
                let how = if slot.is_some() { 0 } else { 2 };
                (slot, how)
            }
            _ = lent => (None, 1),
            () = abandoned => return Err(Abandoned),
        };
        drop(waiting);
        self.metrics.paced[how].fetch_add(1, Ordering::Relaxed);
        let run = work();
        tokio::pin!(run);
        if let Some(slot) = slot {
            tokio::select! {
                out = &mut run => return Ok(out),
                () = tokio::time::sleep(SLOT_LEASE) => drop(slot),
            }
        }
        Ok(run.await)
    }
}

/// An operation nobody waits for any more left before its slot came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Abandoned;

/// An operation counted in `Pace::wanting` or `Pace::waiting` until it
/// leaves, however it leaves.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn boost(wanting: usize, waiting: usize) -> i32 {
    if waiting == 0 {
        return 0;
    }
    // The two counts are read apart: at least the caller runs.
    let running = wanting.saturating_sub(waiting).max(1);
    let steps = (wanting as f64 / running as f64).ln() / 1.25f64.ln();
    (steps.round() as i32).min(MAX_BOOST)
}

/// A [`PluginExec`] that starts each plugin with the weight [`Pace::boost`]
/// gives at that moment: the thread that starts it runs with that nice
/// value while it polls the run (spawning is part of a poll), and back at
/// its own in between.
#[derive(Debug)]
pub(crate) struct PacedExec {
    inner: Arc<dyn PluginExec>,
    pace: Arc<Pace>,
}

impl PacedExec {
    pub(crate) fn new(inner: Arc<dyn PluginExec>, pace: Arc<Pace>) -> Self {
        PacedExec { inner, pace }
    }
}

impl PluginExec for PacedExec {
    fn exec<'a>(
        &'a self,
        req: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, cni_async::Error>> {
        let run = self.inner.exec(req);
        match self.pace.boost() {
            0 => run,
            boost => Box::pin(Boosted { run, boost }),
        }
    }

    fn find_plugin(
        &self,
        plugin_type: &str,
        dirs: &[std::path::PathBuf],
    ) -> Result<std::path::PathBuf, cni_async::Error> {
        self.inner.find_plugin(plugin_type, dirs)
    }
}

/// A run polled with its thread's nice value lowered by `boost`.
struct Boosted<'a> {
    run: BoxFuture<'a, Result<ExecOutput, cni_async::Error>>,
    boost: i32,
}

impl Future for Boosted<'_> {
    type Output = Result<ExecOutput, cni_async::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let boost = self.boost;
        with_thread_boost(boost, || self.run.as_mut().poll(cx))
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
                None,
                || deadline - Instant::now(),
                std::future::pending(),
                || async {
                    // What an operation reads for its plugins.
                    let left = deadline - Instant::now();
                    gated.started.fetch_add(1, Ordering::SeqCst);
                    gated.gate.notified().await;
                    left
                },
            )
            .await
            .expect("never abandoned")
        })
    }

    /// Lets the spawned tasks run until they wait again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// How the paced operations ran: in a slot, lent, waited out.
    fn paced(pace: &Pace) -> [u64; 3] {
        pace.metrics
            .paced
            .each_ref()
            .map(|n| n.load(Ordering::SeqCst))
    }

    fn started(g: &Gated) -> usize {
        g.started.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn pace_a_full_set_of_slots_makes_the_next_operation_wait_until_one_ends() {
        let gated = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(2, Arc::default()));
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
        let pace = Arc::new(Pace::new(1, Arc::default()));
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
        let pace = Arc::new(Pace::new(1, Arc::default()));
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
        assert_eq!(paced(&pace), [1, 0, 1], "one in its slot, one waited out");
        gated.gate.notify_waiters();
        first.await.unwrap();
        second.await.unwrap();

        let free = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(0, Arc::default()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let runs: Vec<_> = (0..8).map(|_| run(&pace, &free, deadline)).collect();
        settle().await;
        assert_eq!(started(&free), 8);
        free.gate.notify_waiters();
        for r in runs {
            r.await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pace_an_operation_abandoned_while_it_waits_never_runs() {
        let gated = Arc::new(Gated::default());
        let pace = Arc::new(Pace::new(1, Arc::default()));
        let first = run(&pace, &gated, Instant::now() + Duration::from_secs(60));
        settle().await;
        let gone = CancellationToken::new();
        let second = {
            let (pace, gone) = (pace.clone(), gone.clone());
            tokio::spawn(async move {
                let abandoned = gone.cancelled_owned();
                pace.run(None, || Duration::from_secs(60), abandoned, || async { 1 })
                    .await
            })
        };
        settle().await;
        assert_eq!(pace.waiting.load(Ordering::SeqCst), 1);
        gone.cancel();
        assert_eq!(second.await.unwrap(), Err(Abandoned), "its work never ran");
        assert_eq!(pace.waiting.load(Ordering::SeqCst), 0);
        assert_eq!(pace.wanting.load(Ordering::SeqCst), 1, "the first runs");
        gated.gate.notify_waiters();
        first.await.unwrap();
    }

    /// CPU times that advance by a step the test sets at each read.
    #[derive(Debug)]
    struct FakeCpus {
        now: std::sync::Mutex<crate::daemon::idle::CpuTimes>,
        /// (idle, total) ticks added per read, over 2 CPUs.
        step: std::sync::Mutex<(u64, u64)>,
        /// Reads fail (as `/proc/stat` unreadable) while set.
        unreadable: std::sync::atomic::AtomicBool,
    }

    impl FakeCpus {
        fn new() -> Arc<Self> {
            Arc::new(FakeCpus {
                now: std::sync::Mutex::new(crate::daemon::idle::CpuTimes {
                    idle: 0,
                    total: 0,
                    cpus: 2,
                }),
                step: std::sync::Mutex::new((0, 20)),
                unreadable: std::sync::atomic::AtomicBool::new(false),
            })
        }

        /// From the next read on, `cpus` of the 2 idle.
        fn idle(&self, cpus: u64) {
            *self.step.lock().unwrap() = (cpus * 10, 20);
        }

        /// Reads fail from now on while `unreadable`.
        fn unreadable(&self, unreadable: bool) {
            self.unreadable.store(unreadable, Ordering::SeqCst);
        }
    }

    impl CpuProbe for FakeCpus {
        fn read(&self) -> Option<crate::daemon::idle::CpuTimes> {
            if self.unreadable.load(Ordering::SeqCst) {
                return None;
            }
            let (idle, total) = *self.step.lock().unwrap();
            let mut now = self.now.lock().unwrap();
            now.idle += idle;
            now.total += total;
            Some(*now)
        }
    }

    /// A pace with `slots` and its lender, the CPUs busy until told.
    fn lending(slots: usize) -> (Arc<Pace>, Arc<FakeCpus>, CancellationToken) {
        let cpus = FakeCpus::new();
        let pace = Arc::new(Pace::with_probe(slots, cpus.clone(), Arc::default()));
        let stop = CancellationToken::new();
        tokio::spawn(pace.clone().lend(stop.clone()));
        (pace, cpus, stop)
    }

    async fn tick() {
        tokio::time::advance(LEND_TICK).await;
        settle().await;
    }

    #[tokio::test(start_paused = true)]
    async fn pace_a_waiting_operation_runs_without_a_slot_once_a_cpu_idles_and_not_before() {
        let (pace, cpus, stop) = lending(1);
        let gated = Arc::new(Gated::default());
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = run(&pace, &gated, deadline);
        settle().await;
        let second = run(&pace, &gated, deadline);
        settle().await;
        for _ in 0..5 {
            tick().await;
        }
        assert_eq!(started(&gated), 1, "the CPUs are busy: the slot holds");
        cpus.idle(1);
        tick().await;
        assert_eq!(started(&gated), 2, "a CPU idled: the waiter runs");
        assert_eq!(paced(&pace), [1, 1, 0], "one in its slot, one lent");
        assert_eq!(pace.waiting.load(Ordering::SeqCst), 0);
        assert_eq!(pace.boost(), 0, "it counts as running");
        gated.gate.notify_waiters();
        first.await.unwrap();
        assert_eq!(
            second.await.unwrap(),
            Duration::from_secs(60) - 6 * LEND_TICK,
            "it waited six ticks"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn pace_each_look_lends_as_many_runs_as_cpus_idled_the_longest_waiting_first() {
        let (pace, cpus, stop) = lending(1);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let runs: Vec<_> = (0..5)
            .map(|i| {
                let (pace, order, gate) = (pace.clone(), order.clone(), gate.clone());
                tokio::spawn(async move {
                    pace.run(
                        None,
                        || Duration::from_secs(60),
                        std::future::pending(),
                        || async move {
                            order.lock().unwrap().push(i);
                            gate.notified().await;
                        },
                    )
                    .await
                })
            })
            .collect();
        // One at a time, so that the order they wait in is theirs.
        settle().await;
        assert_eq!(*order.lock().unwrap(), [0], "one slot");
        cpus.idle(1);
        tick().await;
        assert_eq!(*order.lock().unwrap(), [0, 1], "one CPU idled: one run");
        cpus.idle(2);
        tick().await;
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3], "two: two runs");
        cpus.idle(0);
        tick().await;
        assert_eq!(order.lock().unwrap().len(), 4, "busy again: none");
        gate.notify_waiters();
        settle().await;
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4], "the slot freed");
        gate.notify_waiters();
        for r in runs {
            r.await.unwrap().unwrap();
        }
        stop.cancel();
    }

    /// One slot, held by a gated runtime operation (`first`); background
    /// work (`background`, promoted by `token`) waiting for it three looks
    /// while both CPUs idle.
    struct BackgroundWaits {
        pace: Arc<Pace>,
        cpus: Arc<FakeCpus>,
        stop: CancellationToken,
        gated: Arc<Gated>,
        first: tokio::task::JoinHandle<Duration>,
        token: CancellationToken,
        background: tokio::task::JoinHandle<Result<(), Abandoned>>,
    }

    async fn background_waits() -> BackgroundWaits {
        let (pace, cpus, stop) = lending(1);
        let gated = Arc::new(Gated::default());
        let first = run(&pace, &gated, Instant::now() + Duration::from_secs(60));
        settle().await;
        cpus.idle(2);
        let token = CancellationToken::new();
        let background = run_background(&pace, &gated, &token);
        settle().await;
        for _ in 0..3 {
            tick().await;
        }
        assert_eq!(started(&gated), 1, "background work is lent no run");
        BackgroundWaits {
            pace,
            cpus,
            stop,
            gated,
            first,
            token,
            background,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pace_background_work_is_lent_no_run_and_runs_lent_to_nobody_lapse() {
        let BackgroundWaits {
            pace,
            cpus,
            stop,
            gated,
            first,
            background,
            ..
        } = background_waits().await;
        let deadline = Instant::now() + Duration::from_secs(60);
        // Runs lent meanwhile went to nobody and lapse at the next look: a
        // runtime operation arriving after it, the CPUs busy, waits.
        cpus.idle(0);
        tick().await;
        let late = run(&pace, &gated, deadline);
        settle().await;
        assert_eq!(started(&gated), 1, "no run left over");
        tick().await;
        assert_eq!(started(&gated), 1);
        gated.gate.notify_waiters();
        first.await.unwrap();
        settle().await;
        gated.gate.notify_waiters();
        late.await.unwrap();
        background.await.unwrap().unwrap();
        assert_eq!(started(&gated), 3);
        stop.cancel();
    }

    /// Background work with `token` as its promotion token, counted in
    /// `gated` when it starts.
    fn run_background(
        pace: &Arc<Pace>,
        gated: &Arc<Gated>,
        token: &CancellationToken,
    ) -> tokio::task::JoinHandle<Result<(), Abandoned>> {
        let (pace, token, gated) = (pace.clone(), token.clone(), gated.clone());
        tokio::spawn(async move {
            pace.run(
                Some(&token),
                || Duration::from_secs(60),
                std::future::pending(),
                || async {
                    gated.started.fetch_add(1, Ordering::SeqCst);
                },
            )
            .await
        })
    }

    #[tokio::test(start_paused = true)]
    async fn pace_background_work_promoted_while_it_waits_is_lent_a_run_as_a_runtime_operation() {
        let BackgroundWaits {
            stop,
            gated,
            first,
            token,
            background,
            ..
        } = background_waits().await;
        // A runtime request of its container now waits behind it.
        token.cancel();
        settle().await;
        tick().await;
        assert_eq!(
            started(&gated),
            2,
            "promoted, it is lent a run while the CPUs idle, as the runtime operation behind it would be"
        );
        background.await.unwrap().unwrap();
        gated.gate.notify_waiters();
        first.await.unwrap();
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn pace_cpu_times_unreadable_for_a_while_lend_nothing_meanwhile_and_lending_resumes_after()
     {
        let (pace, cpus, stop) = lending(1);
        let gated = Arc::new(Gated::default());
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = run(&pace, &gated, deadline);
        settle().await;
        cpus.unreadable(true);
        cpus.idle(2);
        let second = run(&pace, &gated, deadline);
        settle().await;
        for _ in 0..5 {
            tick().await;
        }
        assert_eq!(started(&gated), 1, "no CPU times: nothing lent");
        // Readable again (a read failed for a while: out of descriptors).
        cpus.unreadable(false);
        tick().await;
        tick().await;
        assert_eq!(started(&gated), 2, "lending resumed once readable");
        // Unreadable while a burst waits, then readable: the same.
        let third = run(&pace, &gated, deadline);
        cpus.unreadable(true);
        settle().await;
        for _ in 0..3 {
            tick().await;
        }
        assert_eq!(started(&gated), 2);
        cpus.unreadable(false);
        tick().await;
        tick().await;
        assert_eq!(started(&gated), 3, "lending resumed again");
        gated.gate.notify_waiters();
        first.await.unwrap();
        second.await.unwrap();
        third.await.unwrap();
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn pace_the_lender_wakes_for_each_burst_leaves_no_run_between_them_and_ends_when_stopped()
    {
        let cpus = FakeCpus::new();
        cpus.idle(2);
        let pace = Arc::new(Pace::with_probe(1, cpus.clone(), Arc::default()));
        let stop = CancellationToken::new();
        let lender = tokio::spawn(pace.clone().lend(stop.clone()));
        let gated = Arc::new(Gated::default());
        for burst in 0..3 {
            let deadline = Instant::now() + Duration::from_secs(60);
            let first = run(&pace, &gated, deadline);
            settle().await;
            let second = run(&pace, &gated, deadline);
            settle().await;
            assert_eq!(started(&gated), 2 * burst + 1);
            tick().await;
            tick().await;
            assert_eq!(started(&gated), 2 * burst + 2, "burst {burst}: lent");
            gated.gate.notify_waiters();
            first.await.unwrap();
            second.await.unwrap();
            // Nobody waits: the lender waits for the next burst, and no
            // run is left over for it.
            for _ in 0..5 {
                tick().await;
            }
            assert_eq!(pace.lent.available_permits(), 0, "after burst {burst}");
            assert_eq!(pace.boost(), 0);
        }
        stop.cancel();
        settle().await;
        assert!(lender.is_finished(), "the lender ended when stopped");
    }

    #[test]
    fn pace_the_boost_spreads_the_waiting_operations_weight_over_the_slots() {
        // (wanting, waiting): on 4 slots, 4 run and the rest wait.
        assert_eq!(boost(0, 0), 0);
        assert_eq!(boost(4, 0), 0, "all fit");
        assert_eq!(boost(5, 1), 1, "1.25 times");
        assert_eq!(boost(8, 4), 3, "2 times: 1.25^3 = 1.95");
        assert_eq!(boost(16, 12), 6, "4 times: 1.25^6 = 3.8");
        assert_eq!(boost(32, 28), 9, "8 times: 1.25^9 = 7.5");
        assert_eq!(boost(10_000, 9_996), MAX_BOOST);
        assert_eq!(boost(100, 0), 0, "none waits (no pacing): no boost");
        // 1 slot: one holds it, two gave up waiting and run without; the
        // burst runs as wide as it is, no weight to make up.
        assert_eq!(boost(3, 0), 0, "slotless runners are no waiters");
        // One still waits: 4 want, 3 run.
        assert_eq!(boost(4, 1), 1);
    }

    /// The nice value of the thread that calls it (Linux: per thread).
    fn thread_nice() -> i32 {
        crate::daemon::tuning::thread_nice().expect("the thread's nice value")
    }

    #[tokio::test]
    async fn pace_a_plugin_started_while_operations_wait_runs_with_the_boost_and_the_thread_gets_its_own_back()
     {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("nice");
        // Prints its own nice value (field 19 of /proc/PID/stat).
        std::fs::write(&plugin, "#!/bin/sh\ncut -d' ' -f19 /proc/$$/stat\n").unwrap();
        std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let pace = Arc::new(Pace::new(4, Arc::default()));
        let exec = PacedExec::new(Arc::new(cni_async::exec::RawExec::new()), pace.clone());
        let nice_of_run = || async {
            let req = ExecRequest::new(
                &plugin,
                "nice",
                cni_core::Command::Add,
                &[],
                b"",
                Duration::from_secs(60),
            );
            let out = exec.exec(req).await.unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse::<i32>()
                .unwrap()
        };
        let own = thread_nice();
        assert_eq!(nice_of_run().await, own, "no operation waits: no boost");
        // 16 operations want to run on 4 slots: each slot weighs 4.
        pace.wanting.store(16, Ordering::Relaxed);
        pace.waiting.store(12, Ordering::Relaxed);
        let boosted = nice_of_run().await;
        if nix::unistd::geteuid().is_root() {
            assert_eq!(boosted, (own - 6).max(-20));
        }
        assert_eq!(thread_nice(), own, "the thread is back at its own");
    }
}
