//! What a connection may hold, and for how long: the table behind
//! `--max-connections`, each connection's phase and deadline
//! (`--request-timeout`, `--idle-timeout`), the budget of buffered request
//! bodies, answers written without reading the request (refused peers,
//! connections over the cap), and warnings at most once per interval.
//!
//! A connection is in one of four phases:
//!
//! | phase | from | bound |
//! |---|---|---|
//! | `Head` | accept | the first request, head and body, within `--request-timeout` |
//! | `Body` | the head parsed | (first request: see `Head`) a later request's body within `--request-timeout` |
//! | `Busy` | the body read | none here (the operation's own deadline) |
//! | `Idle` | the answer made | the next head within `--idle-timeout` |
//!
//! A connection past its bound is closed without an answer (a request that
//! was never complete has nothing to answer). When the table is full, a new
//! connection takes the place of the one that has been `Idle` longest, else
//! of the one that has waited longest in `Head` or `Body`: a flood of
//! stalled connections cannot lock out a health probe. When every one is
//! `Busy`, the new one is answered 503 without being read. Shutdown closes
//! `Head` and `Body` connections at once and lets `Busy` ones finish.
//!
//! # Caveats
//! Eviction picks by age, not by peer: an allowed peer that keeps opening
//! connections and stalling them evicts other stalled (or idle keep-alive)
//! connections, never one with an operation in progress.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::daemon::lock;

/// How often each kind of warning is logged at most.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How long a connection answered without being read (403, 503) is kept to
/// let the peer send its request and read the answer, and how much of the
/// request is read and dropped meanwhile.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;
/// Connections lingering at most at once; more are closed right after the
/// answer is written.
const MAX_LINGERING: usize = 64;

/// Where a connection is in its request cycle (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Phase {
    Head = 0,
    Body = 1,
    Busy = 2,
    Idle = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Head,
            1 => Phase::Body,
            2 => Phase::Busy,
            _ => Phase::Idle,
        }
    }
}

/// One admitted connection.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    phase: AtomicU8,
    /// Milliseconds since [`Conns::epoch`] when the phase began.
    since_ms: AtomicU64,
    epoch: Instant,
    changed: Notify,
    evicted: CancellationToken,
    closed: CancellationToken,
}

impl Conn {
    /// Enters `phase` now, and wakes the connection's watchdog. From `Head`
    /// to `Body` the clock keeps running: the first request of a
    /// connection, head and body, must arrive within one request timeout
    /// of the accept (a later one's body within one timeout of its head).
    pub(crate) fn enter(&self, phase: Phase) {
        if !(phase == Phase::Body && self.phase() == Phase::Head) {
            let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.since_ms.store(ms, Ordering::Release);
        }
        self.phase.store(phase as u8, Ordering::Release);
        self.changed.notify_one();
    }

    pub(crate) fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    fn since(&self) -> Instant {
        self.epoch + Duration::from_millis(self.since_ms.load(Ordering::Acquire))
    }

    /// When the current phase runs out (`None`: `Busy`, no bound here).
    pub(crate) fn deadline(&self, limits: &Limits) -> Option<Instant> {
        match self.phase() {
            Phase::Head | Phase::Body => Some(self.since() + limits.request_timeout),
            Phase::Busy => None,
            Phase::Idle => Some(self.since() + limits.idle_timeout),
        }
    }

    /// Resolves when the phase changes.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Resolves when a newer connection took this one's place.
    pub(crate) async fn evicted(&self) {
        self.evicted.cancelled().await;
    }

    /// Resolves when the connection is closed (its socket too).
    pub(crate) async fn closed(&self) {
        self.closed.cancelled().await;
    }
}

/// The time bounds of a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) request_timeout: Duration,
    pub(crate) idle_timeout: Duration,
}

/// The outcome of [`Conns::admit`].
#[derive(Debug)]
pub(crate) enum Admit {
    /// Below the cap.
    Admitted(Arc<Conn>),
    /// At the cap: `slot` took the place of `victim`, which was told to
    /// close (it had been in `phase` for `waited`).
    Replaced {
        slot: Arc<Conn>,
        victim: Arc<Conn>,
        phase: Phase,
        waited: Duration,
    },
    /// At the cap with every connection busy: refuse this one.
    Full,
}

/// The open connections of allowed peers.
#[derive(Debug)]
pub(crate) struct Conns {
    cap: usize,
    epoch: Instant,
    next_id: AtomicU64,
    table: Mutex<HashMap<u64, Arc<Conn>>>,
    lingering: AtomicUsize,
}

impl Conns {
    pub(crate) fn new(cap: usize) -> Conns {
        Conns {
            cap: cap.max(1),
            epoch: Instant::now(),
            next_id: AtomicU64::new(1),
            table: Mutex::new(HashMap::new()),
            lingering: AtomicUsize::new(0),
        }
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// How many connections are open.
    pub(crate) fn open(&self) -> usize {
        lock(&self.table).len()
    }

    /// Admits a new connection, in `Head` phase: below the cap as is; at
    /// the cap in place of the connection that has been idle longest (a
    /// keep-alive connection between requests, which HTTP lets a server
    /// close at any time), else of the one that has waited longest for its
    /// request to arrive; that one is told to close. Ties go to the older
    /// connection.
    pub(crate) fn admit(&self) -> Admit {
        let slot = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            phase: AtomicU8::new(Phase::Head as u8),
            since_ms: AtomicU64::new(0),
            epoch: self.epoch,
            changed: Notify::new(),
            evicted: CancellationToken::new(),
            closed: CancellationToken::new(),
        });
        slot.enter(Phase::Head);
        let mut table = lock(&self.table);
        if table.len() < self.cap {
            table.insert(slot.id, slot.clone());
            return Admit::Admitted(slot);
        }
        let victim = table
            .values()
            .filter_map(|s| {
                let rank = match s.phase() {
                    Phase::Idle => 0,
                    Phase::Head | Phase::Body => 1,
                    Phase::Busy => return None,
                };
                Some((rank, s.since_ms.load(Ordering::Acquire), s.id))
            })
            .min()
            .map(|(_, _, id)| id);
        match victim.and_then(|id| table.remove(&id)) {
            Some(v) => {
                v.evicted.cancel();
                table.insert(slot.id, slot.clone());
                Admit::Replaced {
                    slot,
                    phase: v.phase(),
                    waited: v.since().elapsed(),
                    victim: v,
                }
            }
            None => Admit::Full,
        }
    }

    /// Forgets a connection whose socket is closed (the table no longer
    /// has it when it was replaced).
    pub(crate) fn remove(&self, slot: &Conn) {
        lock(&self.table).remove(&slot.id);
        slot.closed.cancel();
    }

    /// Writes `answer` to a connection that is not served (a refused peer,
    /// one over the cap) without reading its request, then closes it. It
    /// lingers up to a second (fewer than [`MAX_LINGERING`] at once),
    /// reading and dropping what the peer sends, so that a client that
    /// writes its request before reading gets the answer and not a broken
    /// pipe.
    pub(crate) async fn answer_and_close(
        self: Arc<Self>,
        mut stream: UnixStream,
        answer: Vec<u8>,
        stop: CancellationToken,
    ) {
        // A fresh socket's buffer takes a short answer whole; if not, the
        // peer gets what fitted.
        let _ = stream.try_write(&answer);
        if self.lingering.fetch_add(1, Ordering::AcqRel) >= MAX_LINGERING {
            self.lingering.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let _ = stream.shutdown().await;
        let drain = async {
            let mut buf = [0u8; 1024];
            let mut read = 0;
            while read < LINGER_BYTES {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
            }
        };
        tokio::select! {
            () = drain => {}
            () = tokio::time::sleep(LINGER) => {}
            () = stop.cancelled() => {}
        }
        self.lingering.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A warning logged at most once per [`LOG_INTERVAL`], with the number of
/// occurrences it stood for.
#[derive(Debug)]
pub(crate) struct Throttle {
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub(crate) const fn new() -> Throttle {
        Throttle {
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(n)` when this occurrence is to be logged: `n` occurrences
    /// since the last one logged were not.
    pub(crate) fn pass(&self) -> Option<u64> {
        let mut st = lock(&self.state);
        let now = Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < LOG_INTERVAL => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

/// The warnings of the HTTP layer, each rate limited on its own.
#[derive(Debug)]
pub(crate) struct Warnings {
    pub(crate) refused: Throttle,
    pub(crate) accept: Throttle,
    pub(crate) replaced: Throttle,
    pub(crate) full: Throttle,
    pub(crate) timed_out: Throttle,
}

impl Warnings {
    pub(crate) const fn new() -> Warnings {
        Warnings {
            refused: Throttle::new(),
            accept: Throttle::new(),
            replaced: Throttle::new(),
            full: Throttle::new(),
            timed_out: Throttle::new(),
        }
    }
}

/// The connection cap actually used: the configured one, but at most half
/// the open-file limit, so that accepting never runs out of descriptors
/// (plugins' pipes, cache and state files need the rest).
pub(crate) fn effective_cap(configured: usize, nofile: Option<u64>) -> usize {
    match nofile {
        Some(n) => configured
            .min(usize::try_from(n / 2).unwrap_or(usize::MAX))
            .max(1),
        None => configured.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_table_replaces_the_longest_idle_then_stalled_never_busy() {
        let conns = Conns::new(3);
        let a = match conns.admit() {
            Admit::Admitted(s) => s,
            other => panic!("{other:?}"),
        };
        let b = match conns.admit() {
            Admit::Admitted(s) => s,
            other => panic!("{other:?}"),
        };
        let c = match conns.admit() {
            Admit::Admitted(s) => s,
            other => panic!("{other:?}"),
        };
        a.enter(Phase::Busy);
        c.enter(Phase::Idle);
        // c is idle: it goes first although b, stalled in Head, is older.
        let d = match conns.admit() {
            Admit::Replaced { slot, .. } => slot,
            other => panic!("{other:?}"),
        };
        assert!(c.evicted.is_cancelled() && !b.evicted.is_cancelled());
        // d (Head, younger) and b (Head, older): b goes.
        let e = match conns.admit() {
            Admit::Replaced { slot, .. } => slot,
            other => panic!("{other:?}"),
        };
        assert!(b.evicted.is_cancelled() && !d.evicted.is_cancelled());
        assert!(!a.evicted.is_cancelled());
        d.enter(Phase::Busy);
        e.enter(Phase::Busy);
        assert!(matches!(conns.admit(), Admit::Full));
        conns.remove(&a);
        assert!(matches!(conns.admit(), Admit::Admitted(_)));
    }

    #[test]
    fn deadlines_follow_the_phase() {
        let limits = Limits {
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        };
        let conns = Conns::new(1);
        let Admit::Admitted(s) = conns.admit() else {
            panic!()
        };
        let now = Instant::now();
        let d = s.deadline(&limits).unwrap();
        assert!(d > now + Duration::from_secs(9) && d <= now + Duration::from_secs(10));
        s.enter(Phase::Busy);
        assert_eq!(s.deadline(&limits), None);
        s.enter(Phase::Idle);
        assert!(s.deadline(&limits).unwrap() > now + Duration::from_secs(59));
    }

    #[test]
    fn throttle_passes_once_per_interval_and_counts() {
        let g = Throttle::new();
        assert_eq!(g.pass(), Some(0));
        assert_eq!(g.pass(), None);
        assert_eq!(g.pass(), None);
        g.state.lock().unwrap().0 = Some(Instant::now() - LOG_INTERVAL);
        assert_eq!(g.pass(), Some(2));
    }

    #[test]
    fn cap_stays_below_half_the_fd_limit() {
        assert_eq!(effective_cap(512, Some(256)), 128);
        assert_eq!(effective_cap(512, Some(1 << 20)), 512);
        assert_eq!(effective_cap(512, None), 512);
        assert_eq!(effective_cap(512, Some(1)), 1);
    }
}
