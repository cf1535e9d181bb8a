//! The per-network GC gate: ADD, DEL and CHECK of a network share it, GC
//! takes it alone, as the spec asks of runtimes ("GC ... must not be called
//! concurrently with ADD, DEL or CHECK of the same network").
//!
//! Each network has a fair (FIFO) reader/writer gate. A place in it is
//! taken at once ([`NetworkGates::request`], synchronous: under a lock of
//! the caller's) and granted in order: every operation that asks after a
//! waiting GC waits until the GC is done, even when only readers hold the
//! gate.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// How an operation holds a network's gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateKind {
    /// ADD, DEL, CHECK: alongside each other.
    Shared,
    /// GC: alone.
    Exclusive,
}

#[derive(Debug, Default)]
struct Gate {
    shared: usize,
    exclusive: bool,
    waiting: VecDeque<(GateKind, oneshot::Sender<()>)>,
}

impl Gate {
    fn compatible(&self, kind: GateKind) -> bool {
        match kind {
            GateKind::Shared => !self.exclusive,
            GateKind::Exclusive => !self.exclusive && self.shared == 0,
        }
    }

    fn take(&mut self, kind: GateKind) {
        match kind {
            GateKind::Shared => self.shared += 1,
            GateKind::Exclusive => self.exclusive = true,
        }
    }

    fn give_back(&mut self, kind: GateKind) {
        match kind {
            GateKind::Shared => self.shared = self.shared.saturating_sub(1),
            GateKind::Exclusive => self.exclusive = false,
        }
    }

    /// Grants the waiters at the front that fit, in order.
    fn grant_waiting(&mut self) {
        while let Some((kind, _)) = self.waiting.front() {
            let kind = *kind;
            if !self.compatible(kind) {
                break;
            }
            let Some((_, tx)) = self.waiting.pop_front() else {
                break;
            };
            // A waiter that is gone (its ticket was dropped) is skipped.
            if tx.send(()).is_ok() {
                self.take(kind);
            }
        }
    }

    fn idle(&self) -> bool {
        self.shared == 0 && !self.exclusive && self.waiting.is_empty()
    }
}

/// The GC gates of every network, by name: fair (FIFO) reader/writer
/// gates, shared by ADD, DEL and CHECK, alone for GC. Cheap to clone;
/// clones share the gates.
#[derive(Debug, Clone, Default)]
pub struct NetworkGates {
    gates: Arc<Mutex<HashMap<String, Gate>>>,
}

impl NetworkGates {
    /// No gate held.
    pub fn new() -> Self {
        NetworkGates::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Gate>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a place in `network`'s gate now; [`GateTicket::granted`]
    /// waits for its turn. Dropping the ticket gives the place (or the
    /// gate) back.
    pub fn request(&self, network: &str, kind: GateKind) -> GateTicket {
        let mut gates = self.lock();
        let gate = gates.entry(network.to_owned()).or_default();
        let state = if gate.waiting.is_empty() && gate.compatible(kind) {
            gate.take(kind);
            TicketState::Granted
        } else {
            let (tx, rx) = oneshot::channel();
            gate.waiting.push_back((kind, tx));
            TicketState::Waiting(rx)
        };
        GateTicket {
            gates: self.clone(),
            network: network.to_owned(),
            kind,
            state,
        }
    }

    /// `network`'s gate, shared (an ADD, DEL or CHECK), once granted.
    pub async fn shared(&self, network: &str) -> GateTicket {
        let mut ticket = self.request(network, GateKind::Shared);
        ticket.granted().await;
        ticket
    }

    /// `network`'s gate, alone (a GC), once granted.
    pub async fn exclusive(&self, network: &str) -> GateTicket {
        let mut ticket = self.request(network, GateKind::Exclusive);
        ticket.granted().await;
        ticket
    }

    /// Whether no gate is held or waited for.
    pub fn is_idle(&self) -> bool {
        self.lock().is_empty()
    }
}

#[derive(Debug)]
enum TicketState {
    Granted,
    Waiting(oneshot::Receiver<()>),
}

/// A place in a network's gate ([`NetworkGates::request`]); gives it back
/// when dropped, granted or not.
#[derive(Debug)]
#[must_use = "the gate is given back when the ticket is dropped"]
pub struct GateTicket {
    gates: NetworkGates,
    network: String,
    kind: GateKind,
    state: TicketState,
}

impl GateTicket {
    /// Waits until the gate is granted (at once if it was). Cancel-safe:
    /// the place in the queue stays with the ticket.
    pub async fn granted(&mut self) {
        if let TicketState::Waiting(rx) = &mut self.state {
            // The sender is only dropped unsent when the gate is dropped,
            // which never happens while a ticket waits for it.
            let _ = rx.await;
            self.state = TicketState::Granted;
        }
    }

    /// Whether the gate is granted (as of the last wait).
    pub fn is_granted(&self) -> bool {
        matches!(self.state, TicketState::Granted)
    }
}

impl Drop for GateTicket {
    fn drop(&mut self) {
        // Under the gates' lock the ticket either got the gate (give it
        // back) or never will (leave the queue).
        let mut gates = self.gates.lock();
        let granted = match &mut self.state {
            TicketState::Granted => true,
            TicketState::Waiting(rx) => {
                rx.close();
                rx.try_recv().is_ok()
            }
        };
        if let Some(gate) = gates.get_mut(&self.network) {
            if granted {
                gate.give_back(self.kind);
            }
            gate.waiting.retain(|(_, tx)| !tx.is_closed());
            gate.grant_waiting();
            if gate.idle() {
                gates.remove(&self.network);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn gc_gate_is_exclusive_and_fifo() {
        let g = NetworkGates::new();
        // A shared holder (an ADD running on n).
        let shared = g.request("n", GateKind::Shared);
        assert!(shared.is_granted());
        // GC arrives: waits.
        let mut gc = g.request("n", GateKind::Exclusive);
        // A later shared request waits behind GC even though only readers hold it.
        let mut later = g.request("n", GateKind::Shared);
        assert!(!gc.is_granted());
        assert!(!later.is_granted());
        // Another network is not held back.
        assert!(g.request("m", GateKind::Shared).is_granted());
        drop(shared);
        tokio::time::timeout(Duration::from_secs(5), gc.granted())
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), later.granted())
                .await
                .is_err()
        );
        drop(gc);
        tokio::time::timeout(Duration::from_secs(5), later.granted())
            .await
            .unwrap();
        drop(later);
        assert!(g.is_idle());
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_gives_its_place_back() {
        let g = NetworkGates::new();
        let shared = g.request("n", GateKind::Shared);
        let gc = g.request("n", GateKind::Exclusive);
        let mut later = g.request("n", GateKind::Shared);
        // The GC is abandoned while it waits: the later reader is not held.
        drop(gc);
        tokio::time::timeout(Duration::from_secs(5), later.granted())
            .await
            .unwrap();
        drop((shared, later));
        assert!(g.is_idle());
    }
}
