//! Admission: what a decoded request must pass before anything is queued,
//! and the operation it becomes. The checks, in the order they answer:
//!
//! - the network is loaded (ADD, CHECK, STATUS, GC; a DEL of a network gone
//!   from the conf dir uses the cached config);
//! - the netns exists and is a network namespace (ADD, CHECK; DEL may name
//!   one that is gone) ([`netns_exists`]);
//! - the netns and ifname are not another container's (the owners table,
//!   unless `--no-check-netns-owner`; claimed until the operation ends);
//! - the request's deadline is one it may ask for.
//!
//! The HTTP layer decodes the request (`cnid_api::decode`), calls
//! [`Engine::admit`] or [`Engine::admit_sandbox`], queues what comes back
//! ([`Engine::submit`]) and answers its outcome.

use std::sync::Arc;
use std::time::Instant;

use cni_core::error::code as cni_code;
use cni_core::{Command, RuntimeConf, Version};

use super::Engine;
use crate::api;
use crate::daemon::error::{ApiError, ErrorKind};
use crate::daemon::operation::{Done, NewOp, Outcome, SandboxNet, Work};
use crate::decode::{DecodedRequest, DecodedSandbox};

/// What a sandbox request becomes.
#[derive(Debug)]
pub(crate) enum SandboxOps {
    /// ADD, DEL or CHECK: one operation in the container's queue.
    One(Box<NewOp>),
    /// STATUS: one STATUS per network, each its own network operation
    /// ([`Engine::status_each`]).
    Each(Vec<NewOp>),
}

/// ADD and CHECK need a netns that is a network namespace, checked by the
/// library's rule ([`cni_async::check_netns`]: one answer for a missing
/// path, a file, a dir, no permission), before anything is queued. The
/// engine's `Cni` checks it again when the operation runs.
/// [`crate::decode::decode_request`] checked the rest of the attachment;
/// DEL may name a netns that is gone.
fn netns_exists(rt: &RuntimeConf, verb: Command) -> Result<(), ApiError> {
    cni_async::check_netns(&rt.netns, verb).map_err(|e| ApiError::from_cni(&e, Version::CURRENT))
}

impl Engine {
    /// The version error objects about `network` are written in: its list's,
    /// or the current one when it is not loaded.
    pub(crate) fn version_of(&self, network: &str) -> Version {
        let loaded = self.p.networks.get(network);
        loaded.map_or(Version::CURRENT, |n| n.list.version())
    }

    /// Admits a request on one network (`POST /v1/networks/{network}/{verb}`):
    /// the operation to queue, or why not (in the network's version).
    /// Timed into `cnid_admission_duration_seconds` (wall time, admitted
    /// or refused).
    pub(crate) async fn admit(
        &self,
        request_id: &str,
        verb: Command,
        network: String,
        decoded: DecodedRequest,
    ) -> Result<NewOp, ApiError> {
        let started = Instant::now();
        let admitted = self.admit_untimed(request_id, verb, network, decoded).await;
        self.p.metrics.admitted(verb, started.elapsed());
        admitted
    }

    async fn admit_untimed(
        &self,
        request_id: &str,
        verb: Command,
        network: String,
        decoded: DecodedRequest,
    ) -> Result<NewOp, ApiError> {
        let loaded = self.p.networks.get(&network);
        let version = loaded
            .as_ref()
            .map_or(Version::CURRENT, |n| n.list.version());
        let need = || {
            loaded
                .as_ref()
                .map(|n| n.list.clone())
                .ok_or_else(|| self.p.networks.not_found(&network))
        };
        let mut claim = None;
        let (work, timeout_ms) = match decoded {
            DecodedRequest::Attachment {
                rt,
                timeout_ms,
                force,
            } => {
                netns_exists(&rt, verb).map_err(|e| e.in_version(version))?;
                if verb == Command::Add || verb == Command::Check {
                    need()?;
                }
                let claimed = self.claim_owners(verb, &[(&network, &rt)], force).await;
                claim = claimed.map_err(|e| e.in_version(version))?;
                let work = match verb {
                    Command::Add => Work::Add { list: need()?, rt },
                    Command::Check => Work::Check { list: need()?, rt },
                    _ => Work::Del {
                        list: loaded.as_ref().map(|n| n.list.clone()),
                        rt,
                    },
                };
                (work, timeout_ms)
            }
            DecodedRequest::Status { timeout_ms } => (Work::Status { list: need()? }, timeout_ms),
            DecodedRequest::Gc {
                valid_attachments,
                timeout_ms,
            } => (
                Work::Gc {
                    list: need()?,
                    valid: valid_attachments,
                },
                timeout_ms,
            ),
        };
        let timeout = self.p.deadlines.for_request(verb, timeout_ms);
        let timeout = timeout.map_err(|e| e.in_version(version))?;
        Ok(NewOp {
            request_id: request_id.to_owned(),
            network,
            version,
            work,
            deadline: Instant::now() + timeout,
            claim,
            trace: Default::default(),
        })
    }

    /// Admits a sandbox request (`POST /v1/sandboxes/{verb}`): its networks
    /// (loopback first if asked, the default network when none is named),
    /// as one operation in the container's queue (ADD, DEL, CHECK, see
    /// `Engine::sandbox`) or one STATUS per network. Timed as
    /// [`Engine::admit`] is.
    pub(crate) async fn admit_sandbox(
        &self,
        request_id: &str,
        verb: Command,
        decoded: DecodedSandbox,
    ) -> Result<SandboxOps, ApiError> {
        let started = Instant::now();
        let admitted = self.admit_sandbox_untimed(request_id, verb, decoded).await;
        self.p.metrics.admitted(verb, started.elapsed());
        admitted
    }

    async fn admit_sandbox_untimed(
        &self,
        request_id: &str,
        verb: Command,
        decoded: DecodedSandbox,
    ) -> Result<SandboxOps, ApiError> {
        if verb != Command::Del && verb != Command::Status {
            let rt = decoded.default_rt("eth0");
            netns_exists(&rt, verb)?;
        }
        let snap = self.p.networks.snapshot();
        let mut nets: Vec<SandboxNet> = Vec::new();
        if decoded.loopback {
            nets.push(SandboxNet {
                name: cni_async::multi::LOOPBACK_NETWORK.to_owned(),
                list: Some(Arc::new(cni_async::multi::loopback_network())),
                rt: decoded.default_rt(cni_async::multi::LOOPBACK_IFNAME),
            });
        }
        if decoded.networks.is_empty() {
            let Some(default) = snap.default_network() else {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    cni_code::INVALID_NETWORK_CONFIG,
                    format!(
                        "no default network: no usable network configuration in {}",
                        self.p.networks.dir().display()
                    ),
                ));
            };
            nets.push(SandboxNet {
                name: default.list.name().to_owned(),
                list: Some(default.list.clone()),
                rt: decoded.default_rt(api::DEFAULT_IFNAME),
            });
        }
        for (name, rt) in &decoded.networks {
            let list = snap.get(name).map(|n| n.list.clone());
            // DEL of a network gone from the conf dir uses the cached config.
            if list.is_none() && verb != Command::Del {
                return Err(self.p.networks.not_found(name));
            }
            nets.push(SandboxNet {
                name: name.clone(),
                list,
                rt: rt.clone(),
            });
        }
        drop(snap);
        let timeout = self.p.deadlines.for_request(verb, decoded.timeout_ms)?;
        let deadline = Instant::now() + timeout;
        if verb == Command::Status {
            let ops = nets
                .into_iter()
                .filter_map(|n| {
                    let list = n.list?;
                    Some(NewOp {
                        request_id: request_id.to_owned(),
                        network: n.name,
                        version: list.version(),
                        work: Work::Status { list },
                        deadline,
                        claim: None,
                        trace: Default::default(),
                    })
                })
                .collect();
            return Ok(SandboxOps::Each(ops));
        }
        let version = nets
            .iter()
            .find_map(|n| n.list.as_ref().map(|l| l.version()))
            .unwrap_or(Version::CURRENT);
        let slots: Vec<(&str, &RuntimeConf)> =
            nets.iter().map(|n| (n.name.as_str(), &n.rt)).collect();
        let claim = self.claim_owners(verb, &slots, decoded.force).await;
        let claim = claim.map_err(|e| e.in_version(version))?;
        drop(slots);
        Ok(SandboxOps::One(Box::new(NewOp {
            request_id: request_id.to_owned(),
            network: nets
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
            version,
            work: Work::Sandbox {
                verb,
                container_id: decoded.container_id,
                networks: nets,
            },
            deadline,
            claim,
            trace: Default::default(),
        })))
    }

    /// STATUS of a sandbox's networks: each as its own network operation,
    /// one after the other; ready (`Done::Nothing`) iff all are, else the
    /// first failure's kind and code, naming every network that is not
    /// ready.
    pub(crate) async fn status_each(self: &Arc<Self>, ops: Vec<NewOp>) -> Outcome {
        let mut errors = cni_async::Errors::new("status of the sandbox's networks");
        // The error object is written in the version of the first network
        // that failed, whose code it has.
        let mut failed_version = None;
        for op in ops {
            let (network, version) = (op.network.clone(), op.version);
            let waiter = self.submit(op)?;
            if let Err(e) = waiter.wait().await.as_ref() {
                failed_version.get_or_insert(version);
                errors.push(cni_async::Error::Context {
                    context: format!("network {network:?}"),
                    source: Box::new(cni_async::Error::hook(e.clone())),
                });
            }
        }
        match errors.into_result() {
            Ok(()) => Ok(Done::Nothing),
            Err(e) => Err(ApiError::from_cni(
                &e,
                failed_version.unwrap_or(Version::CURRENT),
            )),
        }
    }

    /// The owners' part of the admission of an ADD, CHECK or DEL on `slots` (network,
    /// attachment; several for a sandbox). Unless cnid runs with
    /// `--no-check-netns-owner`: brings the owners up to date with the
    /// cache (records any tool wrote), refuses (409) when a netns and
    /// ifname is another container's attachment or in use by another
    /// container's operation in progress (unless `force`), and claims the
    /// slots until the operation ends (see `owners`).
    async fn claim_owners(
        &self,
        verb: Command,
        slots: &[(&str, &RuntimeConf)],
        force: bool,
    ) -> Result<Option<crate::daemon::owners::Claim>, ApiError> {
        if !self.p.check_netns_owner {
            return Ok(None);
        }
        if let Err(e) = self.p.owners.refresh().await {
            tracing::warn!(error = %cni_core::error::Chain(&e), "cannot read the cache for netns owners; checking against what was read before");
        }
        match self.p.owners.admit(slots.iter().copied(), force) {
            Ok(claim) => {
                if force {
                    for (network, rt) in slots {
                        for owner in self.p.owners.others(rt) {
                            tracing::warn!(network, container = %rt.container_id, ifname = %rt.ifname,
                                owner = %owner.container_id, owner_network = %owner.network,
                                "{verb} forced on the netns and interface of another container");
                        }
                    }
                }
                Ok(Some(claim))
            }
            Err((i, others)) => {
                let (network, rt) = slots[i];
                Err(ApiError::owned_by_other(verb, network, rt, &others[0]))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_must_exist_for_add_and_check() {
        let rt = |netns: &str| RuntimeConf::new("c1", netns, "eth0");
        assert!(netns_exists(&rt("/proc/self/ns/net"), Command::Add).is_ok());
        for verb in [Command::Add, Command::Check] {
            let e = netns_exists(&rt("/nonexistent/netns"), verb).unwrap_err();
            assert_eq!((e.kind, e.error.code), (ErrorKind::InvalidRequest, 4));
            assert!(
                e.error.msg.contains("not a network namespace"),
                "{}",
                e.error.msg
            );
        }
        assert!(netns_exists(&rt("/nonexistent/netns"), Command::Del).is_ok());
        assert!(netns_exists(&rt(""), Command::Del).is_ok());
    }
}
