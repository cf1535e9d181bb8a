//! When a client sends a request again because cnid restarted: the one
//! policy of `cnid-client` (async) and cnid-shim's blocking client.
//!
//! A request is sent again, with a short backoff and within its deadline,
//! when cnid cannot have acted on it:
//! - the connection was refused (the socket file of a dead cnid, not yet
//!   replaced), the backlog was full (`EAGAIN`), or it was reset while it
//!   waited in the backlog of a listener that closed (a copy of a killed
//!   cnid's listener held for a moment by a child between fork and exec);
//! - the socket file was missing, for up to [`MISSING_SOCKET_GRACE`] from
//!   the first attempt that found it missing (not from the request's
//!   start: a request cut by a restart meets the next one's moment too):
//!   the moment a restart replaces it. One missing longer is a cnid that
//!   is not running (a clean stop removes it);
//! - the connection was reset, or the pipe broke, before any byte of an
//!   answer: cnid reads a request's whole body before it queues anything,
//!   and the kernel resets a connection closed with bytes unread.
//!
//! A connection that ended before any byte of an answer (cnid may have
//! read the request and been killed while it ran) is sent again at most
//! [`MAX_UNANSWERED`] times: DEL, CHECK, STATUS and GC are idempotent; an
//! ADD cut off is rolled back by the restart from its intent, ahead of any
//! request on its container, so the ADD sent again runs after that
//! rollback; an ADD the killed cnid completed is refused with 409 "already
//! attached" and runs no plugin, and the client then answers with that
//! attachment's result when it was made with the same parameters
//! ([`crate::AttachmentRequest::made`]).

use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// How long a missing socket file is tried again.
pub const MISSING_SOCKET_GRACE: Duration = Duration::from_secs(1);
/// How many times a request whose connection ended before any answer is
/// sent again (a cnid that dies of the request itself is not fed it
/// forever).
pub const MAX_UNANSWERED: u32 = 3;
/// The first pause before a request is sent again; doubled each time up
/// to [`PAUSE_MAX`].
pub const PAUSE: Duration = Duration::from_millis(10);
/// The longest pause.
pub const PAUSE_MAX: Duration = Duration::from_millis(200);

/// What a failed attempt says about sending the request again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// Not a restart's doing (or an answer came): never again.
    Final,
    /// cnid cannot have read the request.
    NotRead,
    /// The socket file is missing.
    Missing,
    /// The connection ended before any answer: maybe read.
    Unanswered,
}

impl Failure {
    /// A failure to connect, by its error's kind.
    pub fn of_connect(kind: ErrorKind) -> Failure {
        match kind {
            ErrorKind::ConnectionRefused
            | ErrorKind::WouldBlock
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => Failure::NotRead,
            ErrorKind::NotFound => Failure::Missing,
            _ => Failure::Final,
        }
    }

    /// A failure to write the request or read its answer, before any byte
    /// of the answer came, by its error's kind.
    pub fn of_exchange(kind: ErrorKind) -> Failure {
        match kind {
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => Failure::NotRead,
            _ => Failure::Final,
        }
    }
}

/// The retries of one request: within its deadline, a missing socket
/// within the grace, an unanswered one [`MAX_UNANSWERED`] times.
#[derive(Debug, Clone)]
pub struct Retries {
    until: Instant,
    /// When the socket was first found missing, in this run of missing
    /// sockets (another failure ends the run).
    missing_since: Option<Instant>,
    unanswered: u32,
    pause: Duration,
}

impl Retries {
    /// Retries for a request with `window` to go (its deadline).
    pub fn new(window: Duration) -> Retries {
        Retries {
            until: Instant::now() + window,
            missing_since: None,
            unanswered: 0,
            pause: PAUSE,
        }
    }

    /// After `failure`: how long to pause before the next attempt, or
    /// `None` when there is none.
    pub fn next(&mut self, failure: Failure) -> Option<Duration> {
        self.next_at(failure, Instant::now())
    }

    fn next_at(&mut self, failure: Failure, now: Instant) -> Option<Duration> {
        if failure != Failure::Missing {
            self.missing_since = None;
        }
        let go = match failure {
            Failure::Final => false,
            Failure::NotRead => true,
            Failure::Missing => {
                let since = *self.missing_since.get_or_insert(now);
                now < since + MISSING_SOCKET_GRACE
            }
            Failure::Unanswered => {
                self.unanswered += 1;
                self.unanswered <= MAX_UNANSWERED
            }
        };
        if !go || now + self.pause >= self.until {
            return None;
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(PAUSE_MAX);
        Some(pause)
    }

    /// Whether a request was sent again after a connection that ended
    /// before any answer (the first one may have run).
    pub fn resent(&self) -> bool {
        self.unanswered > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_gets_its_grace_from_when_it_went_missing() {
        // A request cut by one restart (sent again, refused while the
        // next cnid starts) that meets the socket missing long after it
        // began: the moment a restart replaces it is still waited out.
        let mut r = Retries::new(Duration::from_secs(60));
        let later = Instant::now() + 3 * MISSING_SOCKET_GRACE;
        assert!(r.next_at(Failure::Unanswered, later).is_some());
        assert!(r.next_at(Failure::NotRead, later).is_some());
        assert!(
            r.next_at(Failure::Missing, later).is_some(),
            "the grace starts when the socket is first found missing"
        );
        let end = later + MISSING_SOCKET_GRACE;
        assert!(r.next_at(Failure::Missing, end).is_none(), "then it ends");
        // A socket back in between (refused) starts a new run.
        assert!(r.next_at(Failure::NotRead, end).is_some());
        assert!(r.next_at(Failure::Missing, end).is_some());
    }

    #[test]
    fn what_a_restart_does_is_retried_and_nothing_else() {
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::WouldBlock,
            ErrorKind::ConnectionReset,
            ErrorKind::BrokenPipe,
        ] {
            assert_eq!(Failure::of_connect(kind), Failure::NotRead, "{kind:?}");
        }
        assert_eq!(Failure::of_connect(ErrorKind::NotFound), Failure::Missing);
        assert_eq!(
            Failure::of_connect(ErrorKind::PermissionDenied),
            Failure::Final
        );
        assert_eq!(
            Failure::of_exchange(ErrorKind::ConnectionReset),
            Failure::NotRead
        );
        assert_eq!(Failure::of_exchange(ErrorKind::TimedOut), Failure::Final);
    }

    #[test]
    fn a_missing_socket_for_the_grace_unanswered_three_times_nothing_past_the_deadline() {
        let mut r = Retries::new(Duration::from_secs(60));
        let now = Instant::now();
        assert!(r.next_at(Failure::Missing, now).is_some());
        assert!(
            r.next_at(Failure::Missing, now + MISSING_SOCKET_GRACE)
                .is_none(),
            "past the grace"
        );
        for _ in 0..MAX_UNANSWERED {
            assert!(r.next(Failure::Unanswered).is_some());
        }
        assert!(r.resent());
        assert!(r.next(Failure::Unanswered).is_none());
        assert!(r.next(Failure::NotRead).is_some(), "not read: still");
        r.until = Instant::now();
        assert!(r.next(Failure::NotRead).is_none(), "past the deadline");
        assert!(r.next(Failure::Final).is_none());
        let mut r = Retries::new(Duration::from_secs(60));
        let pauses: Vec<Duration> = (0..6).filter_map(|_| r.next(Failure::NotRead)).collect();
        assert_eq!(pauses.first(), Some(&PAUSE));
        assert_eq!(pauses.last(), Some(&PAUSE_MAX));
    }
}
