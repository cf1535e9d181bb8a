//! Who runs when: per-container FIFO queues, per-network gates for GC, a
//! global limit on parallel operations, coalescing of duplicate DELs.
//!
//! - **One container at a time, in arrival order.** Every ADD, DEL and CHECK
//!   goes into its container's queue when it arrives (under one mutex, so
//!   arrival order is the order in which requests were accepted). One
//!   driver task per container with work pops the queue and runs the
//!   operations one after the other, across all networks and interfaces of
//!   the container. Different containers run in parallel.
//! - **GC is exclusive with ADD, DEL and CHECK on its network.** Each network
//!   has a fair (FIFO) reader-writer gate: attachment operations take it
//!   shared when they leave their container's queue, GC takes it exclusive
//!   *when it arrives*. So GC waits for the operations running on the
//!   network, and every operation that starts after GC arrived waits until
//!   GC ends. CHECK is included because GC may delete what it would check.
//! - **A global limit**: at most `max_parallel` operations run plugins at
//!   once (a slot, taken after the gate; a sandbox operation takes one
//!   for each network's step, after that step's gate, so that it never
//!   holds a slot while it waits for a gate a GC holds, nor a GC's
//!   gate while it waits for a slot). The daemon's own background work
//!   (the reaper's DELs, periodic CHECKs) takes at most a quarter of the
//!   slots and never one a runtime operation waits for (`slots`). Not
//!   started yet when a runtime request of its container arrives (which
//!   would wait behind it for a background slot), a periodic CHECK is
//!   dropped and a reap takes a runtime slot instead: the runtime request
//!   may depend on it (an ADD of the reaped attachment). Either, once it
//!   took its turn, is promoted: it takes a runtime pacing slot, and is
//!   lent a run as runtime operations are (`pace`).
//! - **Coalescing**: a DEL identical to the last queued operation of its
//!   container (also a DEL, same network, interface, netns and arguments,
//!   not started yet) does not queue again; it waits for that one and gets
//!   its result. Only the tail is joined, so no operation ever overtakes
//!   another.
//! - **Cancellation**: an operation leaves the queue when every request
//!   waiting for it is gone (client disconnected) or timed out. Once it has
//!   started it runs to the end (ADD: to its end or its rollback), unless
//!   every request left while it still waits for a pacing slot (`pace`).
//! - **Holds**: at a start after a crash, the containers whose operation a
//!   plugin of the dead daemon still runs (`orphans`) are held: their
//!   operations queue, and none starts, until the start releases them
//!   (the orphan is gone and its ADD's rollback was put first in the
//!   queue, [`Scheduler::enqueue_at`]). A request of another container
//!   on a held orphan's netns and ifname holds its container too, until
//!   that orphan's release. Every other container runs meanwhile.
//!
//! Every wait is on an operation that arrived earlier (container queue,
//! gate) or on a running operation (semaphore), so there is no cycle and no
//! deadlock.
//!
//! # Caveats
//! The DELs GC makes of stale attachments hold the network's gate and the
//! attachment's cache lock, not the container's queue slot: a container GC
//! deems stale has, by definition, no live operations. They are bounded by
//! the GC request's one deadline (see `Engine::gc`), so a hanging plugin
//! holds the gate until that deadline at most, not once per attachment.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cni_async::multi::{GateKind, GateTicket, NetworkGates};
use cni_core::{Command, RuntimeConf, Version};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::lock;
use super::metrics::Metrics;
use super::operation::{NewOp, Outcome, Work};
use super::slots::{Slot, Slots};
use crate::api::OperationInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpPhase {
    Queued,
    Running,
    Finished,
    Cancelled,
}

#[derive(Debug)]
struct OpState {
    phase: OpPhase,
    waiters: u32,
    /// The latest deadline of the requests waiting for it.
    deadline: Instant,
}

/// One queued or running operation.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) id: u64,
    pub(crate) request_id: String,
    pub(crate) verb: Command,
    pub(crate) network: String,
    /// The network's version (for error objects).
    pub(crate) version: Version,
    /// (container ID, ifname) of attachment operations (ifnames joined by
    /// `,` for a sandbox's).
    pub(crate) attachment: Option<(String, String)>,
    /// A sandbox operation: no gate when it leaves the queue (each step
    /// takes its network's).
    sandbox: bool,
    /// The daemon's background work (a reap, a periodic CHECK): a
    /// background slot.
    background: bool,
    /// A periodic CHECK: dropped while queued when a runtime request of
    /// its container arrives.
    periodic: bool,
    /// For DEL: what makes two DELs identical.
    del_key: Option<RuntimeConf>,
    pub(crate) arrived: Instant,
    /// The trace context its plugins get (of the first request, for DELs
    /// that share one run).
    pub(crate) trace: Arc<cni_core::trace::TraceContext>,
    work: Mutex<Option<Work>>,
    claim: Mutex<Option<super::owners::Claim>>,
    state: Mutex<OpState>,
    result: watch::Sender<Option<Arc<Outcome>>>,
    cancel: CancellationToken,
    /// Background work a runtime request of its container waits behind:
    /// it takes a runtime slot from then on, not a background one.
    promoted: CancellationToken,
}

impl Op {
    /// Completes once every request waiting for it has left: before it
    /// started (it is cancelled then), or after (a running operation goes
    /// on, unless it still waits for a pacing slot: `pace`).
    pub(crate) fn abandoned(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// A sandbox operation (its steps take their gates and slots).
    pub(crate) fn sandbox(&self) -> bool {
        self.sandbox
    }

    /// Background work's promotion token (cancelled once a runtime request
    /// of its container waits behind it): how it takes a slot
    /// ([`Slots::for_op`]); `None` for a runtime operation.
    pub(crate) fn background(&self) -> Option<&CancellationToken> {
        self.background.then_some(&self.promoted)
    }

    /// Takes the work out (once).
    pub(crate) fn take_work(&self) -> Option<Work> {
        lock(&self.work).take()
    }

    /// The claims of its admission; taken when it runs, dropped when it is
    /// cancelled or answered before it ran.
    pub(crate) fn take_claim(&self) -> Option<super::owners::Claim> {
        lock(&self.claim).take()
    }

    fn publish(&self, outcome: Outcome) {
        self.result.send_replace(Some(Arc::new(outcome)));
    }

    /// Time left until the deadline.
    pub(crate) fn remaining(&self) -> Duration {
        lock(&self.state)
            .deadline
            .saturating_duration_since(Instant::now())
    }
}

#[derive(Debug, Default)]
struct SchedState {
    accepting: bool,
    /// Queued attachment operations per container; an entry exists while
    /// the container's driver runs.
    containers: HashMap<String, VecDeque<Arc<Op>>>,
    /// Queued and running operations, by id (arrival order).
    ops: BTreeMap<u64, Arc<Op>>,
    /// The background operations of `ops` by container, kept with `ops`
    /// ([`SchedState::insert`], [`SchedState::remove`]): what a runtime
    /// request of the container supersedes, found without a scan of `ops`.
    background: HashMap<String, Vec<Arc<Op>>>,
    /// The containers whose driver runs.
    driving: std::collections::HashSet<String>,
    /// Held containers: their queue waits for [`Scheduler::release`].
    held: std::collections::HashSet<String>,
    /// The containers an orphan of their own holds, until their release:
    /// one also held with another orphan's slot stays held until both
    /// are released.
    holders: std::collections::HashSet<String>,
    /// Held (netns, ifname) slots and the container holding each: a
    /// request of another container there is held with it.
    held_slots: Vec<HeldSlot>,
    /// Everything held (an orphan whose attachment is unknown: a GC).
    hold_all: bool,
}

/// A netns and ifname an orphan works on, and the containers held with it.
#[derive(Debug)]
struct HeldSlot {
    netns: String,
    ifname: String,
    holder: String,
    with: Vec<String>,
}

impl SchedState {
    fn insert(&mut self, op: &Arc<Op>) {
        self.ops.insert(op.id, op.clone());
        if let (true, Some((cid, _))) = (op.background, &op.attachment) {
            self.background
                .entry(cid.clone())
                .or_default()
                .push(op.clone());
        }
    }

    fn remove(&mut self, op: &Op) {
        self.ops.remove(&op.id);
        if let (true, Some((cid, _))) = (op.background, &op.attachment)
            && let Some(ops) = self.background.get_mut(cid)
        {
            ops.retain(|o| o.id != op.id);
            if ops.is_empty() {
                self.background.remove(cid);
            }
        }
    }

    fn is_held(&self, container_id: &str) -> bool {
        self.hold_all || self.held.contains(container_id)
    }

    /// Holds `cid` too when `rt` is on a held slot of another container.
    fn hold_on_slot(&mut self, cid: &str, rt: &RuntimeConf) {
        if rt.netns.is_empty() {
            return;
        }
        let mut hold = false;
        for slot in &mut self.held_slots {
            if slot.holder != cid && slot.netns == rt.netns && slot.ifname == rt.ifname {
                if !slot.with.iter().any(|c| c == cid) {
                    slot.with.push(cid.to_owned());
                }
                hold = true;
            }
        }
        if hold {
            self.held.insert(cid.to_owned());
        }
    }
}

/// The scheduler (see the module docs).
#[derive(Debug)]
pub(crate) struct Scheduler {
    st: Mutex<SchedState>,
    /// The networks' GC gates (requested under `st`, so in arrival order).
    gates: NetworkGates,
    slots: Arc<Slots>,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
}

/// What the caller of [`Scheduler::enqueue`] must start.
#[derive(Debug)]
pub(crate) enum Start {
    /// Nothing: the operation joined a queue whose driver runs.
    Nothing,
    /// A driver for this container.
    Driver(String),
    /// A task for this network operation, with its gate ticket (GC).
    Network(Arc<Op>, Option<GateTicket>),
}

impl Scheduler {
    pub(crate) fn new(max_parallel: usize, metrics: Arc<Metrics>) -> Self {
        Scheduler {
            st: Mutex::new(SchedState {
                accepting: true,
                ..Default::default()
            }),
            gates: NetworkGates::new(),
            slots: Slots::new(max_parallel),
            metrics,
            next_id: AtomicU64::new(1),
        }
    }

    /// The networks' GC gates (a sandbox operation's steps take theirs).
    pub(crate) fn gates(&self) -> &NetworkGates {
        &self.gates
    }

    /// A slot to run plugins, for a step of a sandbox operation, taken
    /// after the step's gate (as every other operation takes its slot
    /// after its gate). `None` only once the scheduler is closed.
    pub(crate) async fn permit(&self) -> Option<Slot> {
        self.slots.runtime().await
    }

    fn state(&self) -> MutexGuard<'_, SchedState> {
        lock(&self.st)
    }

    /// [`Scheduler::enqueue_at`] last in the container's queue.
    #[cfg(test)]
    pub(crate) fn enqueue(self: &Arc<Self>, new: NewOp) -> Result<(Waiter, Start), ApiError> {
        self.enqueue_at(new, false)
    }

    /// [`Scheduler::enqueue_at`] first in the container's queue.
    #[cfg(test)]
    pub(crate) fn enqueue_first(self: &Arc<Self>, new: NewOp) -> Result<(Waiter, Start), ApiError> {
        self.enqueue_at(new, true)
    }

    /// Queues an operation; returns the waiter for its outcome and what to
    /// start. Refused with 503 once shutdown began. `first`: first in its
    /// container's queue, ahead of what is queued there (the rollback of an orphan's ADD at
    /// its release: the container is held, so nothing of its queue has
    /// started).
    pub(crate) fn enqueue_at(
        self: &Arc<Self>,
        new: NewOp,
        first: bool,
    ) -> Result<(Waiter, Start), ApiError> {
        let slots: Vec<Option<RuntimeConf>> = match &new.work {
            Work::Sandbox { networks, .. } => networks.iter().map(|n| Some(n.rt.clone())).collect(),
            w => vec![w.runtime_conf().cloned()],
        };
        let mut st = self.state();
        if !st.accepting {
            return Err(ApiError::shutting_down());
        }
        let verb = new.work.verb();
        let rt = new.work.runtime_conf().cloned();
        let attachment = new.work.attachment();
        let sandbox = matches!(new.work, Work::Sandbox { .. });
        let background = new.work.background();
        let periodic = matches!(new.work, Work::PeriodicCheck { .. });
        let coalescable = matches!(new.work, Work::Del { .. });
        // Coalesce a DEL with an identical DEL at the tail of its queue.
        if let (Command::Del, Some(rt), true, false) = (verb, rt.as_ref(), coalescable, first)
            && let Some(tail) = st
                .containers
                .get(&rt.container_id)
                .and_then(|q| q.back())
                .filter(|t| t.verb == Command::Del && t.network == new.network)
                .filter(|t| t.del_key.as_ref() == Some(rt))
        {
            let mut ts = lock(&tail.state);
            if ts.phase == OpPhase::Queued {
                ts.waiters += 1;
                ts.deadline = ts.deadline.max(new.deadline);
                drop(ts);
                self.metrics.coalesced(Command::Del);
                let waiter = Waiter::new(self.clone(), tail.clone(), new.deadline, true);
                return Ok((waiter, Start::Nothing));
            }
        }
        let (tx, _rx) = watch::channel(None);
        let op = Arc::new(Op {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            request_id: new.request_id,
            verb,
            network: new.network,
            version: new.version,
            attachment,
            sandbox,
            background,
            periodic,
            del_key: if coalescable { rt } else { None },
            arrived: Instant::now(),
            trace: new.trace,
            work: Mutex::new(Some(new.work)),
            claim: Mutex::new(new.claim),
            state: Mutex::new(OpState {
                phase: OpPhase::Queued,
                waiters: 1,
                deadline: new.deadline,
            }),
            result: tx,
            cancel: CancellationToken::new(),
            promoted: CancellationToken::new(),
        });
        st.insert(&op);
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        let waiter = Waiter::new(self.clone(), op.clone(), new.deadline, false);
        let mut superseded = Vec::new();
        let start = match &op.attachment {
            Some((cid, _)) => {
                if !st.held_slots.is_empty() {
                    for rt in slots.iter().flatten() {
                        st.hold_on_slot(cid, rt);
                    }
                }
                // The runtime request must not wait behind background work
                // for a background slot (the reaps may all be waiting for
                // one): a periodic CHECK still queued is dropped, a reap
                // takes a runtime slot. Also the one the driver took and
                // waits a slot for (out of the queue, not started).
                if !background && let Some(ops) = st.background.get(cid) {
                    superseded.extend(ops.iter().cloned());
                }
                let q = st.containers.entry(cid.clone()).or_default();
                if first {
                    q.push_front(op.clone());
                } else {
                    q.push_back(op.clone());
                }
                if st.is_held(cid) || !st.driving.insert(cid.clone()) {
                    Start::Nothing
                } else {
                    Start::Driver(cid.clone())
                }
            }
            None if verb == Command::Gc => {
                // The gate is requested now, on arrival: operations that
                // start after this point wait for GC.
                let ticket = self.gates.request(&op.network, GateKind::Exclusive);
                Start::Network(op.clone(), Some(ticket))
            }
            None => Start::Network(op.clone(), None),
        };
        drop(st);
        for o in superseded {
            // A periodic CHECK that took its turn (it may still wait for a
            // pacing slot) is promoted as a reap is.
            let dropped = o.periodic
                && self.cancel_queued(&o, || {
                    ApiError::internal(
                        "periodic CHECK dropped: a runtime request of its container arrived",
                    )
                });
            if !dropped {
                o.promoted.cancel();
            }
        }
        Ok((waiter, start))
    }

    /// Cancels `op` if it is still queued, answering `error`; returns
    /// whether it was.
    fn cancel_queued(&self, op: &Arc<Op>, error: impl FnOnce() -> ApiError) -> bool {
        let mut s = lock(&op.state);
        if s.phase != OpPhase::Queued {
            return false;
        }
        s.phase = OpPhase::Cancelled;
        drop(s);
        op.cancel.cancel();
        self.finish_queued(op);
        op.publish(Err(error().in_version(op.version)));
        true
    }

    /// The next operation of a container's queue with its (shared) gate
    /// ticket (none for a sandbox operation, whose steps take theirs);
    /// `None` when the queue is empty (the driver then ends).
    pub(crate) fn next_for(
        self: &Arc<Self>,
        container_id: &str,
    ) -> Option<(Arc<Op>, Option<GateTicket>)> {
        let mut st = self.state();
        loop {
            if st.is_held(container_id) {
                // Its queue waits for the release, which starts a driver.
                st.driving.remove(container_id);
                return None;
            }
            let Some(q) = st.containers.get_mut(container_id) else {
                st.driving.remove(container_id);
                return None;
            };
            let Some(op) = q.pop_front() else {
                st.containers.remove(container_id);
                st.driving.remove(container_id);
                return None;
            };
            if lock(&op.state).phase != OpPhase::Queued {
                continue;
            }
            if op.sandbox {
                return Some((op, None));
            }
            let ticket = self.gates.request(&op.network, GateKind::Shared);
            return Some((op, Some(ticket)));
        }
    }

    /// Whether `container_id` is held (an orphaned plugin of a killed
    /// daemon may still work on it).
    pub(crate) fn held(&self, container_id: &str) -> bool {
        self.state().is_held(container_id)
    }

    /// Holds a container (an orphaned plugin runs its operation) and the
    /// orphan's netns and ifname (`netns` empty: none); with no container
    /// (an orphan of a GC), everything is held.
    pub(crate) fn hold(&self, container_id: &str, netns: &str, ifname: &str) {
        let mut st = self.state();
        if container_id.is_empty() {
            st.hold_all = true;
            return;
        }
        st.held.insert(container_id.to_owned());
        st.holders.insert(container_id.to_owned());
        if !netns.is_empty() {
            st.held_slots.push(HeldSlot {
                netns: netns.to_owned(),
                ifname: ifname.to_owned(),
                holder: container_id.to_owned(),
                with: Vec::new(),
            });
        }
    }

    /// Holds `container_id` with the orphan holding `holder` (an unfinished
    /// ADD of it on that orphan's netns and ifname): released with it.
    pub(crate) fn hold_with(&self, holder: &str, container_id: &str) {
        let mut st = self.state();
        let slot = match st.held_slots.iter_mut().find(|s| s.holder == holder) {
            Some(s) => s,
            None => {
                st.held_slots.push(HeldSlot {
                    netns: String::new(),
                    ifname: String::new(),
                    holder: holder.to_owned(),
                    with: Vec::new(),
                });
                st.held_slots.last_mut().expect("just pushed")
            }
        };
        if !slot.with.iter().any(|c| c == container_id) {
            slot.with.push(container_id.to_owned());
        }
        st.held.insert(container_id.to_owned());
    }

    /// Releases a held container (`""`: the hold of everything): returns
    /// the containers whose driver must start now, and those held with it
    /// on its slots, which [`Scheduler::release_with`] releases (after
    /// the container's rollbacks, which come first on those slots).
    pub(crate) fn release(&self, container_id: &str) -> (Vec<String>, Vec<String>) {
        let mut st = self.state();
        if container_id.is_empty() {
            st.hold_all = false;
            let all: Vec<String> = st.containers.keys().cloned().collect();
            return (Self::startable(&mut st, all), Vec::new());
        }
        st.holders.remove(container_id);
        let (mine, others): (Vec<HeldSlot>, Vec<HeldSlot>) = std::mem::take(&mut st.held_slots)
            .into_iter()
            .partition(|s| s.holder == container_id);
        st.held_slots = others;
        // Held with another orphan's slot too (a request of it on that
        // orphan's netns and ifname): that orphan's release frees it.
        if !st
            .held_slots
            .iter()
            .any(|s| s.with.iter().any(|c| c == container_id))
        {
            st.held.remove(container_id);
        }
        let mut with: Vec<String> = mine.into_iter().flat_map(|s| s.with).collect();
        with.sort();
        with.dedup();
        (
            Self::startable(&mut st, vec![container_id.to_owned()]),
            with,
        )
    }

    /// Releases the containers [`Scheduler::release`] returned as held
    /// with it, unless another orphan's slot holds them still; returns
    /// those whose driver must start now.
    pub(crate) fn release_with(&self, with: Vec<String>) -> Vec<String> {
        let mut st = self.state();
        let mut freed = Vec::new();
        for c in with {
            // Its own orphan (with or without a slot) or another slot
            // still holds it.
            let still = st.holders.contains(&c)
                || st
                    .held_slots
                    .iter()
                    .any(|s| s.holder == c || s.with.contains(&c));
            if !still {
                st.held.remove(&c);
                freed.push(c);
            }
        }
        Self::startable(&mut st, freed)
    }

    /// Of `candidates`, those not held, with queued operations and no
    /// driver: marked driven, to be started by the caller.
    fn startable(st: &mut SchedState, candidates: Vec<String>) -> Vec<String> {
        let mut start = Vec::new();
        for c in candidates {
            if st.is_held(&c) || st.driving.contains(&c) {
                continue;
            }
            if st.containers.get(&c).is_some_and(|q| !q.is_empty()) {
                st.driving.insert(c.clone());
                start.push(c);
            }
        }
        start
    }

    /// Waits for the gate and a permit while the operation is queued, then
    /// takes its turn. `None` when it was cancelled meanwhile or its deadline
    /// passed (then its outcome has been published).
    pub(crate) async fn acquire(&self, op: &Arc<Op>, ticket: Option<GateTicket>) -> Option<Turn> {
        let waited = async {
            let ticket = match ticket {
                Some(mut t) => {
                    t.granted().await;
                    Some(t)
                }
                None => None,
            };
            // A sandbox operation takes a permit per step, after that
            // step's gate (`Scheduler::permit`): holding one while a step
            // waits for a gate would wait for a GC that waits for it.
            let permit = if op.sandbox {
                None
            } else {
                Some(self.slots.for_op(op.background()).await?)
            };
            Some((ticket, permit))
        };
        let (ticket, permit) = tokio::select! {
            r = waited => r?,
            () = op.cancel.cancelled() => return None,
        };
        // Take its turn: Queued -> Running, unless cancelled or out of time.
        let mut s = lock(&op.state);
        if s.phase != OpPhase::Queued {
            return None;
        }
        let now = Instant::now();
        if now >= s.deadline {
            s.phase = OpPhase::Finished;
            drop(s);
            self.finish_queued(op);
            op.publish(Err(ApiError::queued_too_long(
                now.duration_since(op.arrived).as_millis(),
            )
            .in_version(op.version)));
            return None;
        }
        s.phase = OpPhase::Running;
        drop(s);
        self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
        self.metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Turn {
            _ticket: ticket,
            _permit: permit,
            started: now,
        })
    }

    /// Publishes the outcome of an operation that had its turn.
    pub(crate) fn complete(&self, op: &Arc<Op>, turn: Turn, outcome: Outcome) {
        let code = outcome.as_ref().err().map(|e| e.error.code);
        let ran = turn.started.elapsed();
        let queued = turn.started.duration_since(op.arrived);
        let nobody_waits = {
            let mut st = lock(&op.state);
            st.phase = OpPhase::Finished;
            st.waiters == 0
        };
        if nobody_waits {
            tracing::warn!(id = op.id, request_id = ?op.request_id, verb = %op.verb,
                network = ?op.network,
                container = ?op.attachment.as_ref().map(|a| a.0.as_str()).unwrap_or(""),
                ok = outcome.is_ok(),
                "operation finished but its client went away: nobody got the answer");
        }
        self.state().remove(op);
        self.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.metrics.operation_done(op.verb, queued, ran, code);
        op.publish(outcome);
        // The gate and the permit go with the turn.
        drop(turn);
    }

    /// A queued operation that will not run (cancelled, out of time, shut
    /// down): it leaves the table, and its claims go now, not when its
    /// container's queue reaches it.
    fn finish_queued(&self, op: &Op) {
        drop(op.take_claim());
        self.state().remove(op);
        self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// A request stops waiting for `op`. When it was the last one and the
    /// operation has not started, the operation is cancelled. Returns
    /// whether the operation had not started. With `only_queued` (a
    /// request whose deadline passed), a running operation is not left
    /// (decided under the same lock as the leaving).
    fn leave(&self, op: &Arc<Op>, only_queued: bool) -> bool {
        let mut s = lock(&op.state);
        let queued = s.phase == OpPhase::Queued;
        if only_queued && !queued {
            return false;
        }
        s.waiters = s.waiters.saturating_sub(1);
        if queued && s.waiters == 0 {
            s.phase = OpPhase::Cancelled;
            drop(s);
            op.cancel.cancel();
            self.finish_queued(op);
            tracing::debug!(id = op.id, request_id = %op.request_id, verb = %op.verb, "operation cancelled before it started");
        } else if s.waiters == 0 && s.phase == OpPhase::Running {
            drop(s);
            op.cancel.cancel();
        }
        queued
    }

    /// Shutdown: refuse new operations and answer the queued ones with 503.
    /// Running operations go on. Returns how many were cancelled.
    pub(crate) fn stop_accepting(&self) -> usize {
        let queued: Vec<Arc<Op>> = {
            let mut st = self.state();
            st.accepting = false;
            st.ops.values().cloned().collect()
        };
        queued
            .iter()
            .filter(|op| self.cancel_queued(op, ApiError::shutting_down))
            .count()
    }

    pub(crate) fn accepting(&self) -> bool {
        self.state().accepting
    }

    /// `GET /v1/operations`.
    pub(crate) fn list(&self, container_id: Option<&str>) -> Vec<OperationInfo> {
        let ops: Vec<Arc<Op>> = self.state().ops.values().cloned().collect();
        ops.iter()
            .filter(|op| {
                container_id.is_none()
                    || op.attachment.as_ref().map(|a| a.0.as_str()) == container_id
            })
            .filter_map(|op| {
                let s = lock(&op.state);
                let state = match s.phase {
                    OpPhase::Queued => "queued",
                    OpPhase::Running => "running",
                    _ => return None,
                };
                Some(OperationInfo {
                    id: op.id,
                    request_id: op.request_id.clone(),
                    verb: op.verb.to_string(),
                    network: op.network.clone(),
                    container_id: op.attachment.as_ref().map(|a| a.0.clone()),
                    ifname: op.attachment.as_ref().map(|a| a.1.clone()),
                    state: state.to_owned(),
                    waiters: s.waiters,
                    age_ms: u64::try_from(op.arrived.elapsed().as_millis()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }
}

/// An operation's turn to run: holds its gate and permit until completed (a
/// sandbox operation neither: its steps take theirs).
#[derive(Debug)]
pub(crate) struct Turn {
    _ticket: Option<GateTicket>,
    _permit: Option<Slot>,
    started: Instant,
}

/// A request waiting for an operation's outcome. Dropping it (the client
/// went away) leaves the operation, which is cancelled if nobody else waits
/// and it has not started.
#[derive(Debug)]
pub(crate) struct Waiter {
    sched: Arc<Scheduler>,
    op: Arc<Op>,
    rx: watch::Receiver<Option<Arc<Outcome>>>,
    deadline: Instant,
    coalesced: bool,
    left: bool,
}

impl Waiter {
    fn new(sched: Arc<Scheduler>, op: Arc<Op>, deadline: Instant, coalesced: bool) -> Self {
        let rx = op.result.subscribe();
        Waiter {
            sched,
            op,
            rx,
            deadline,
            coalesced,
            left: false,
        }
    }

    /// Whether this request joined an identical DEL.
    pub(crate) fn coalesced(&self) -> bool {
        self.coalesced
    }

    /// Waits for the outcome. At the request's deadline an operation that
    /// has not started is left (504); one that runs is waited for, since it
    /// is bounded by its own deadline and then finished or rolled back.
    pub(crate) async fn wait(mut self) -> Arc<Outcome> {
        let mut deadline = Some(self.deadline);
        loop {
            let timer = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = self.rx.wait_for(Option::is_some) => {
                    self.left = true;
                    return match r {
                        Ok(v) => v.clone().unwrap_or_else(|| Arc::new(Err(ApiError::internal("operation ended without an outcome")))),
                        Err(_) => Arc::new(Err(ApiError::internal("operation was dropped"))),
                    };
                }
                () = timer => {
                    // Queued: leave it (504). Running: keep listening, and
                    // stay counted as a listener until the answer comes.
                    if self.sched.leave(&self.op, true) {
                        self.left = true;
                        let waited = self.op.arrived.elapsed().as_millis();
                        let op = &self.op;
                        tracing::warn!(id = op.id, request_id = ?op.request_id, verb = %op.verb,
                            network = ?op.network,
                            container = ?op.attachment.as_ref().map(|a| a.0.as_str()).unwrap_or(""),
                            waited_ms = u64::try_from(waited).unwrap_or(u64::MAX),
                            "deadline expired while queued; answered 504, nothing ran");
                        return Arc::new(Err(ApiError::queued_too_long(waited).in_version(self.op.version)));
                    }
                    // Running: wait for its end.
                    deadline = None;
                }
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.left {
            self.sched.leave(&self.op, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::operation::Done;

    fn sched(n: usize) -> Arc<Scheduler> {
        Arc::new(Scheduler::new(n, Arc::new(Metrics::default())))
    }

    fn del(cid: &str, net: &str) -> NewOp {
        NewOp {
            request_id: "r".into(),
            network: net.into(),
            version: Version::V1_0_0,
            work: Work::Del {
                list: None,
                rt: RuntimeConf::new(cid, "", "eth0"),
            },
            deadline: Instant::now() + Duration::from_secs(30),
            claim: None,
            trace: Default::default(),
        }
    }

    #[tokio::test]
    async fn queue_order_coalescing_and_driver_end() {
        let s = sched(4);
        let (_w1, start) = s.enqueue(del("c1", "n")).unwrap();
        assert!(matches!(start, Start::Driver(ref c) if c == "c1"));
        // Identical DEL at the tail: joined.
        let (w2, start) = s.enqueue(del("c1", "n")).unwrap();
        assert!(matches!(start, Start::Nothing));
        assert!(w2.coalesced());
        // Another network: queued behind.
        let (w3, _) = s.enqueue(del("c1", "m")).unwrap();
        assert!(!w3.coalesced());
        assert_eq!(s.list(Some("c1")).len(), 2);
        assert_eq!(s.list(None)[0].waiters, 2);

        let (op1, t1) = s.next_for("c1").unwrap();
        assert_eq!(op1.network, "n");
        let turn = s.acquire(&op1, t1).await.unwrap();
        s.complete(&op1, turn, Ok(Done::Nothing));
        assert!(w2.wait().await.is_ok());
        // The client of the third one went away: it is skipped.
        drop(w3);
        assert!(s.next_for("c1").is_none());
        assert!(s.list(None).is_empty());
    }

    #[tokio::test]
    async fn a_queued_periodic_check_gives_way_to_a_runtime_request() {
        let s = sched(4);
        let list = list();
        let (_running, _) = s.enqueue(del("c1", "n")).unwrap();
        let mut check = del("c1", "n");
        check.work = Work::PeriodicCheck {
            list,
            rt: RuntimeConf::new("c1", "/x", "eth0"),
        };
        let (periodic, _) = s.enqueue(check).unwrap();
        // Another periodic one would not drop it; a runtime request does.
        assert_eq!(s.list(Some("c1")).len(), 2);
        let (_runtime, _) = s.enqueue(del("c1", "m")).unwrap();
        let out = periodic.wait().await;
        let e = out.as_ref().as_ref().unwrap_err();
        assert!(e.error.msg.contains("periodic CHECK dropped"), "{e:?}");
        let verbs: Vec<String> = s.list(Some("c1")).into_iter().map(|o| o.verb).collect();
        assert_eq!(verbs, ["DEL", "DEL"]);
    }

    fn list() -> Arc<cni_core::NetworkConfigList> {
        Arc::new(
            cni_core::NetworkConfigList::from_bytes(
                br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"}]}"#,
                None,
            )
            .unwrap(),
        )
    }

    fn periodic(cid: &str) -> NewOp {
        let mut op = del(cid, "n");
        op.work = Work::PeriodicCheck {
            list: list(),
            rt: RuntimeConf::new(cid, "/x", "eth0"),
        };
        op
    }

    /// The background operations a runtime request looks for, by container.
    fn background_of(s: &Scheduler, cid: &str) -> usize {
        s.state().background.get(cid).map_or(0, Vec::len)
    }

    /// A periodic CHECK out of its queue (it took its turn, and may wait
    /// for a pacing slot, its plugins not run) is promoted by a runtime
    /// request of its container, as a reap is: the request waits behind it,
    /// so it takes a runtime slot and pacing may lend it a run (`pace`).
    #[tokio::test]
    async fn a_periodic_check_that_took_its_turn_is_promoted_by_a_runtime_request() {
        let s = sched(4);
        let (_w, _) = s.enqueue(periodic("c1")).unwrap();
        let (op, ticket) = s.next_for("c1").unwrap();
        let _turn = s.acquire(&op, ticket).await.unwrap();
        assert!(!op.promoted.is_cancelled());
        let (_runtime, _) = s.enqueue(del("c1", "m")).unwrap();
        assert!(
            op.promoted.is_cancelled(),
            "a runtime request waits behind it: promoted"
        );
    }

    /// The count of background operations per container follows every way
    /// an operation leaves: dropped by a runtime request, cancelled by its
    /// waiter, out of time while queued, run to its end, refused at
    /// shutdown; and one the driver took out of the queue (not started)
    /// is still found by a runtime request.
    #[tokio::test]
    async fn background_count_follows_every_way_out() {
        let s = sched(4);
        // Dropped by a runtime request of its container.
        let (dropped, _) = s.enqueue(periodic("c1")).unwrap();
        assert_eq!(background_of(&s, "c1"), 1);
        let (_runtime, _) = s.enqueue(del("c1", "m")).unwrap();
        assert!(dropped.wait().await.is_err());
        assert_eq!(background_of(&s, "c1"), 0);
        // Its waiter went away.
        let (gone, _) = s.enqueue(periodic("c2")).unwrap();
        assert_eq!(background_of(&s, "c2"), 1);
        drop(gone);
        assert_eq!(background_of(&s, "c2"), 0);
        // Ran to its end.
        let (w, _) = s.enqueue(periodic("c3")).unwrap();
        let (op, ticket) = s.next_for("c3").unwrap();
        let turn = s.acquire(&op, ticket).await.unwrap();
        assert_eq!(background_of(&s, "c3"), 1, "running: still counted");
        s.complete(&op, turn, Ok(Done::Nothing));
        assert!(w.wait().await.is_ok());
        assert_eq!(background_of(&s, "c3"), 0);
        // Out of time while queued.
        let mut late = periodic("c4");
        late.deadline = Instant::now();
        let (w, _) = s.enqueue(late).unwrap();
        let (op, ticket) = s.next_for("c4").unwrap();
        assert!(s.acquire(&op, ticket).await.is_none());
        assert!(w.wait().await.is_err());
        assert_eq!(background_of(&s, "c4"), 0);
        // Taken by its driver, not started: a runtime request drops it.
        let (taken, _) = s.enqueue(periodic("c5")).unwrap();
        let (_op, _ticket) = s.next_for("c5").unwrap();
        let (_runtime, _) = s.enqueue(del("c5", "m")).unwrap();
        let out = taken.wait().await;
        let e = out.as_ref().as_ref().unwrap_err();
        assert!(e.error.msg.contains("periodic CHECK dropped"), "{e:?}");
        assert_eq!(background_of(&s, "c5"), 0);
        // Refused at shutdown.
        let (w, _) = s.enqueue(periodic("c6")).unwrap();
        assert_eq!(s.stop_accepting(), 3, "c1's, c5's runtime DELs and c6's");
        assert!(w.wait().await.is_err());
        assert_eq!(background_of(&s, "c6"), 0);
        assert!(s.state().background.is_empty());
    }

    fn reap(cid: &str) -> NewOp {
        let mut op = del(cid, "n");
        op.work = Work::Reap {
            candidate: Box::new(cni_async::stale::Candidate {
                network: "n".into(),
                container_id: cid.into(),
                ifname: "eth0".into(),
                netns: String::new(),
                written: None,
                identity: None,
                verdict: cni_async::stale::Verdict::Stale(
                    cni_async::stale::StaleReason::NamespaceGone,
                ),
            }),
            rt: RuntimeConf::new(cid, "", "eth0"),
        };
        op
    }

    /// What a runtime request of `cid` supersedes, as the scan of every
    /// operation found it before the per-container list: the background
    /// operations of the table of `cid`, in arrival order.
    fn scanned(s: &Scheduler, cid: &str) -> Vec<u64> {
        s.state()
            .ops
            .values()
            .filter(|o| o.background)
            .filter(|o| o.attachment.as_ref().is_some_and(|(c, _)| c == cid))
            .map(|o| o.id)
            .collect()
    }

    fn listed(s: &Scheduler, cid: &str) -> Vec<u64> {
        s.state()
            .background
            .get(cid)
            .map(|v| v.iter().map(|o| o.id).collect())
            .unwrap_or_default()
    }

    /// Random interleavings of runtime requests, reaps and periodic
    /// CHECKs of three containers: queued, taken by the driver, run,
    /// dropped, cancelled by their waiters, out of time while queued,
    /// held and released, shut down. After every step each container's
    /// background list is what the scan of every operation found, in the
    /// same order; a periodic CHECK a runtime request superseded has left
    /// it, a reap is promoted; at the end nothing is left.
    #[tokio::test]
    async fn the_background_list_is_the_scan_in_every_order() {
        const CIDS: [&str; 3] = ["c1", "c2", "c3"];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            usize::try_from(seed % n as u64).unwrap()
        };
        for round in 0..40 {
            let s = sched(64);
            let mut waiters: Vec<Waiter> = Vec::new();
            let mut taken: Vec<(Arc<Op>, Option<GateTicket>)> = Vec::new();
            let mut running: Vec<(Arc<Op>, Turn)> = Vec::new();
            for step in 0..200 {
                let cid = CIDS[rnd(CIDS.len())];
                match rnd(11) {
                    0 => waiters.push(s.enqueue(periodic(cid)).unwrap().0),
                    1 => waiters.push(s.enqueue(reap(cid)).unwrap().0),
                    2 => {
                        let before = scanned(&s, cid);
                        waiters.push(s.enqueue(del(cid, ["n", "m"][rnd(2)])).unwrap().0);
                        // Every periodic CHECK it found still queued or
                        // taken (not started) is gone from the table.
                        for id in before {
                            let op = s.state().ops.get(&id).cloned();
                            if let Some(op) = op {
                                let phase = lock(&op.state).phase;
                                assert!(
                                    !op.periodic || phase == OpPhase::Running,
                                    "round {round} step {step}: a superseded periodic CHECK stayed"
                                );
                                // One that took its turn is promoted.
                                assert!(
                                    !op.periodic || op.promoted.is_cancelled(),
                                    "round {round} step {step}: a running periodic CHECK not promoted"
                                );
                                // A reap not started takes a runtime slot.
                                assert!(
                                    op.periodic
                                        || phase != OpPhase::Queued
                                        || op.promoted.is_cancelled(),
                                    "round {round} step {step}: a superseded reap not promoted"
                                );
                            }
                        }
                    }
                    3 => {
                        let mut late = match rnd(3) {
                            0 => periodic(cid),
                            1 => reap(cid),
                            _ => del(cid, "n"),
                        };
                        late.deadline = Instant::now();
                        waiters.push(s.enqueue(late).unwrap().0);
                    }
                    4 | 5 => {
                        if let Some(t) = s.next_for(cid) {
                            taken.push(t);
                        }
                    }
                    6 if !taken.is_empty() && running.len() < 12 => {
                        let (op, ticket) = taken.swap_remove(rnd(taken.len()));
                        let turn =
                            tokio::time::timeout(Duration::from_secs(5), s.acquire(&op, ticket))
                                .await
                                .expect("a slot within the limit");
                        if let Some(turn) = turn {
                            running.push((op, turn));
                        }
                    }
                    7 if !running.is_empty() => {
                        let (op, turn) = running.swap_remove(rnd(running.len()));
                        s.complete(&op, turn, Ok(Done::Nothing));
                    }
                    8 if !waiters.is_empty() => drop(waiters.swap_remove(rnd(waiters.len()))),
                    9 => s.hold(cid, "", "eth0"),
                    10 => {
                        let _ = s.release(cid);
                    }
                    _ => {}
                }
                for c in CIDS {
                    assert_eq!(
                        listed(&s, c),
                        scanned(&s, c),
                        "round {round} step {step} {c}"
                    );
                }
            }
            s.stop_accepting();
            for (op, ticket) in taken.drain(..) {
                assert!(s.acquire(&op, ticket).await.is_none(), "round {round}");
            }
            for (op, turn) in running.drain(..) {
                s.complete(&op, turn, Ok(Done::Nothing));
            }
            drop(waiters);
            for c in CIDS {
                assert_eq!(listed(&s, c), scanned(&s, c), "round {round} end {c}");
            }
            assert!(s.state().ops.is_empty(), "round {round}: operations left");
            assert!(s.state().background.is_empty(), "round {round}: list left");
        }
    }

    #[tokio::test]
    async fn a_held_container_waits_and_its_rollback_goes_first() {
        let s = sched(4);
        s.hold("c1", "/run/netns/a", "eth0");
        let (w1, start) = s.enqueue(del("c1", "n")).unwrap();
        assert!(matches!(start, Start::Nothing), "held: no driver");
        // Another container on the orphan's netns and ifname: held with it.
        let mut on_slot = del("c2", "n");
        on_slot.work = Work::Del {
            list: None,
            rt: RuntimeConf::new("c2", "/run/netns/a", "eth0"),
        };
        let (_w2, start) = s.enqueue(on_slot).unwrap();
        assert!(
            matches!(start, Start::Nothing),
            "held with the orphan's slot"
        );
        // Anything else runs.
        let (_w3, start) = s.enqueue(del("c3", "n")).unwrap();
        assert!(matches!(start, Start::Driver(ref c) if c == "c3"));
        // A driver that runs meanwhile finds nothing to do.
        assert!(s.next_for("c1").is_none());
        // The rollback goes ahead of the request that came first.
        let mut rollback = del("c1", "m");
        rollback.request_id = "recovery-1".into();
        let (_wr, start) = s.enqueue_first(rollback).unwrap();
        assert!(matches!(start, Start::Nothing));
        let (start, with) = s.release("c1");
        assert_eq!(
            (start, with),
            (vec!["c1".to_owned()], vec!["c2".to_owned()])
        );
        let (op, _) = s.next_for("c1").unwrap();
        assert_eq!(op.request_id, "recovery-1");
        let (op, _) = s.next_for("c1").unwrap();
        assert_eq!(op.request_id, "r");
        drop(w1);
        assert!(s.next_for("c2").is_none(), "still held until release_with");
        assert_eq!(s.release_with(vec!["c2".into()]), vec!["c2".to_owned()]);
        assert!(s.next_for("c2").is_some());
    }

    fn del_on(cid: &str, netns: &str, ifname: &str) -> NewOp {
        let mut op = del(cid, "n");
        op.work = Work::Del {
            list: None,
            rt: RuntimeConf::new(cid, netns, ifname),
        };
        op
    }

    #[tokio::test]
    async fn a_container_held_by_two_orphans_waits_for_both() {
        // c1's orphan works on /run/netns/a eth0; c2's own orphan (a DEL
        // without a netns) holds c2; a request of c2 on c1's slot is held
        // with c1's orphan too.
        let s = sched(4);
        s.hold("c1", "/run/netns/a", "eth0");
        s.hold("c2", "", "eth0");
        let (_w, start) = s.enqueue(del_on("c2", "/run/netns/a", "eth0")).unwrap();
        assert!(matches!(start, Start::Nothing));
        // c2's own orphan ends first: c1's still works on the slot.
        let (start, with) = s.release("c2");
        assert!(start.is_empty(), "c2 ran beside c1's orphan: {start:?}");
        assert!(with.is_empty());
        assert!(s.next_for("c2").is_none(), "still held with c1's orphan");
        let (start, with) = s.release("c1");
        assert!(start.is_empty());
        assert_eq!(s.release_with(with), vec!["c2".to_owned()]);

        // The other order: c1's orphan ends first; c2's own still runs.
        let s = sched(4);
        s.hold("c1", "/run/netns/a", "eth0");
        s.hold("c2", "", "eth0");
        let (_w, _) = s.enqueue(del_on("c2", "/run/netns/a", "eth0")).unwrap();
        let (_, with) = s.release("c1");
        assert_eq!(with, vec!["c2".to_owned()]);
        let start = s.release_with(with);
        assert!(start.is_empty(), "c2 ran beside its own orphan: {start:?}");
        assert!(s.next_for("c2").is_none(), "still held by its own orphan");
        let (start, _) = s.release("c2");
        assert_eq!(start, vec!["c2".to_owned()]);
    }

    #[tokio::test]
    async fn deadline_while_queued_cancels() {
        let s = sched(1);
        let mut first = del("c1", "n");
        first.work = Work::Check {
            list: list(),
            rt: RuntimeConf::new("c1", "/x", "eth0"),
        };
        let (_w1, _) = s.enqueue(first).unwrap();
        let mut second = del("c1", "n");
        second.deadline = Instant::now() + Duration::from_millis(20);
        let (w2, _) = s.enqueue(second).unwrap();
        let out = w2.wait().await;
        let e = out.as_ref().as_ref().unwrap_err();
        assert_eq!(e.kind, crate::daemon::error::ErrorKind::DeadlineExpired);
        assert_eq!(s.list(None).len(), 1);
    }
}
