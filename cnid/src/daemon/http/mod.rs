//! HTTP/1.1 on the Unix socket, the only part of the daemon that speaks
//! HTTP: `accept` (the accept loop, peer checks, each connection's
//! watchdog), `conns` (the connection table, phases and deadlines),
//! `routes` (reading a request, routing it to the engine) and `responses`
//! (statuses, bodies, headers). What a request asks for is checked and
//! queued by the engine (`Engine::admit`).

use std::sync::Arc;

use tokio::sync::Semaphore;

use conns::{Conns, Limits, Warnings};

use crate::daemon::auth::PeerPolicy;
use crate::daemon::memory::HeapTrim;

mod accept;
pub(crate) mod conns;
mod responses;
mod routes;

pub(crate) use accept::serve;

/// HTTP settings.
#[derive(Debug)]
pub(crate) struct HttpSettings {
    pub(crate) peers: PeerPolicy,
    /// The request body cap (413 beyond).
    pub(crate) body_limit: usize,
    /// Bytes of request bodies buffered at once, over all connections
    /// (beyond `routes::BODY_FREE` each); a body that does not fit waits, within
    /// its request deadline.
    pub(crate) body_budget: Arc<Semaphore>,
    pub(crate) limits: Limits,
    pub(crate) conns: Arc<Conns>,
    pub(crate) warnings: Warnings,
    pub(crate) trim: Arc<HeapTrim>,
}
