//! What an operation is: the work a request (or the daemon itself: a
//! recovery, a reap) hands to the scheduler ([`NewOp`], [`Work`]), and what
//! it ends with ([`Outcome`], [`Done`]). The scheduler (`queue`) decides
//! when it runs, the engine runs it, the HTTP layer answers its outcome.

use std::sync::Arc;
use std::time::Instant;

use cni_core::{Command, RuntimeConf, Version};

use super::error::ApiError;
use crate::api::{GcResponse, SandboxResult};

/// What a successful operation produced.
#[derive(Debug, Clone)]
pub(crate) enum Done {
    /// ADD: the chain's result, in the network's version.
    Result(serde_json::Value),
    /// GC: what was deleted, what could not be, which plugins were called.
    Gc(GcResponse),
    /// A sandbox's ADD: the merged result of its networks.
    Sandbox(SandboxResult),
    /// DEL, CHECK, STATUS: nothing to report.
    Nothing,
}

/// What an operation ended with.
pub(crate) type Outcome = Result<Done, ApiError>;

/// The work of an operation (owned by the operation until it runs).
#[derive(Debug)]
pub(crate) enum Work {
    Add {
        list: Arc<cni_core::NetworkConfigList>,
        rt: RuntimeConf,
    },
    Del {
        /// The network's current configuration; `None` when it is not in the
        /// conf dir (then the cached one, or the ADD intent's, is used).
        list: Option<Arc<cni_core::NetworkConfigList>>,
        rt: RuntimeConf,
    },
    Check {
        list: Arc<cni_core::NetworkConfigList>,
        rt: RuntimeConf,
    },
    Status {
        list: Arc<cni_core::NetworkConfigList>,
    },
    Gc {
        list: Arc<cni_core::NetworkConfigList>,
        valid: Vec<cni_core::stdin::GcAttachment>,
    },
    /// The reaper's DEL of a stale cached attachment (`reaper`): a DEL in
    /// its container's queue under the network's shared gate, which
    /// never coalesces with a runtime's DEL (that one must run unless the
    /// reap deleted the attachment).
    Reap {
        candidate: Box<cni_async::stale::Candidate>,
        /// The record's runtime parameters (netns, ifname, args).
        rt: RuntimeConf,
    },
    /// The opt-in periodic CHECK of a cached attachment (`checker`):
    /// background work, like a reap.
    PeriodicCheck {
        list: Arc<cni_core::NetworkConfigList>,
        /// The record's runtime parameters.
        rt: RuntimeConf,
    },
    /// ADD, DEL or CHECK of a sandbox's networks, in one slot of its
    /// container's queue; each network's step takes that network's gate.
    Sandbox {
        verb: Command,
        container_id: String,
        networks: Vec<SandboxNet>,
    },
}

/// One network of a sandbox operation.
#[derive(Debug, Clone)]
pub(crate) struct SandboxNet {
    pub(crate) name: String,
    /// The configuration; `None` when the network is not loaded (DEL then
    /// uses the cached one, or the ADD intent's).
    pub(crate) list: Option<Arc<cni_core::NetworkConfigList>>,
    pub(crate) rt: RuntimeConf,
}

impl Work {
    /// The daemon's own background work (a reap, a periodic CHECK): it
    /// takes a background slot (`slots`).
    pub(crate) fn background(&self) -> bool {
        matches!(self, Work::Reap { .. } | Work::PeriodicCheck { .. })
    }

    pub(crate) fn verb(&self) -> Command {
        match self {
            Work::Add { .. } => Command::Add,
            Work::Del { .. } | Work::Reap { .. } => Command::Del,
            Work::Check { .. } | Work::PeriodicCheck { .. } => Command::Check,
            Work::Status { .. } => Command::Status,
            Work::Gc { .. } => Command::Gc,
            Work::Sandbox { verb, .. } => *verb,
        }
    }

    /// The container's queue and the interface(s) an operation is about.
    pub(crate) fn attachment(&self) -> Option<(String, String)> {
        match self {
            Work::Sandbox {
                container_id,
                networks,
                ..
            } => {
                let ifnames: Vec<&str> = networks.iter().map(|n| n.rt.ifname.as_str()).collect();
                Some((container_id.clone(), ifnames.join(",")))
            }
            other => other
                .runtime_conf()
                .map(|rt| (rt.container_id.clone(), rt.ifname.clone())),
        }
    }

    pub(crate) fn runtime_conf(&self) -> Option<&RuntimeConf> {
        match self {
            Work::Add { rt, .. }
            | Work::Del { rt, .. }
            | Work::Check { rt, .. }
            | Work::PeriodicCheck { rt, .. }
            | Work::Reap { rt, .. } => Some(rt),
            _ => None,
        }
    }
}

/// A new operation's description.
#[derive(Debug)]
pub(crate) struct NewOp {
    pub(crate) request_id: String,
    pub(crate) network: String,
    pub(crate) version: Version,
    pub(crate) work: Work,
    pub(crate) deadline: Instant,
    /// The netns+ifname claims of its admission (see `owners`).
    pub(crate) claim: Option<super::owners::Claim>,
    /// The trace context its plugins get (the request's `traceparent`,
    /// `tracestate`, `baggage`; none for cnid's own work).
    pub(crate) trace: Arc<cni_core::trace::TraceContext>,
}
