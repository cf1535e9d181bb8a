//! Running operations: what each verb does around `cni-async`, on tasks of
//! their own (never on the request's task, so a client that goes away
//! cannot stop an operation half way).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cni_async::multi::{GateTicket, MultiResult, NetworkGates, SandboxStep, SetupMode, StepHook};
use cni_async::{CallOptions, Cni, GcFailure};
use cni_core::cache::CacheRecord;
use cni_core::error::code as cni_code;
use cni_core::result::CniResult;
use cni_core::stdin::GcAttachment;
use cni_core::{Command, NetworkConfigList, RuntimeConf, Version};
use tokio_util::task::TaskTracker;

use super::drift::DriftView;
use super::error::{ApiError, ErrorKind};
use super::intents::{BeginAnswer, BeginError, Intent, IntentFile, Intents};
use super::metrics::Metrics;
use super::networks::Networks;
use super::operation::{Done, NewOp, Outcome, SandboxNet, Work};
use super::queue::{Op, Scheduler, Start, Waiter};
use super::stale_view::{StaleView, key};
use crate::api::{
    GcFailed, GcResponse, SandboxInterface, SandboxIp, SandboxNetworkResult, SandboxResult,
};
use crate::daemon::lock;

mod admit;
mod reap;

pub(crate) use admit::SandboxOps;

/// Per-verb default deadlines and the cap on what a request may ask for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub(crate) defaults: cni_async::Timeouts,
    pub(crate) max: Duration,
}

impl Deadlines {
    /// The deadline of a request of `verb` asking for `timeout_ms`.
    pub(crate) fn for_request(
        &self,
        verb: Command,
        timeout_ms: Option<u64>,
    ) -> Result<Duration, ApiError> {
        match timeout_ms {
            Some(0) => Err(ApiError::bad_request(
                cni_code::INVALID_ENVIRONMENT_VARIABLES,
                "invalid timeoutMs 0: must be at least 1",
            )),
            Some(ms) => Ok(Duration::from_millis(ms).min(self.max)),
            None => Ok(self.defaults.for_command(verb).min(self.max)),
        }
    }
}

/// The daemon's state shared by the server, the scheduler's tasks and the
/// lifecycle: built from its [`Parts`], reached through its methods.
#[derive(Debug)]
pub(crate) struct Engine {
    p: Parts,
    started: Instant,
    /// Rollbacks of unfinished ADDs queued by this start (their request
    /// ids).
    recoveries: std::sync::atomic::AtomicUsize,
}

/// What an [`Engine`] is made of (the lifecycle builds them).
#[derive(Debug)]
pub(crate) struct Parts {
    pub(crate) cni: Cni,
    pub(crate) networks: Arc<Networks>,
    pub(crate) intents: Intents,
    pub(crate) sched: Arc<Scheduler>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) deadlines: Deadlines,
    pub(crate) tracker: TaskTracker,
    /// Networks needed to be ready (see `Config::min_networks`).
    pub(crate) min_networks: usize,
    /// Which container owns which netns and ifname.
    pub(crate) owners: super::owners::Owners,
    /// Whether the owners' check (`Engine::claim_owners`) refuses anything.
    pub(crate) check_netns_owner: bool,
    /// The records this start kept for the next (could not restore), by
    /// attachment, until an operation on the attachment put them back
    /// ([`Engine::restore_kept`]).
    pub(crate) kept: std::sync::Mutex<Vec<CacheRecord>>,
    /// What the stale-attachment reaper found and did (`reaper`).
    pub(crate) stale: Arc<StaleView>,
    /// Attachments whose periodic CHECK fails (`checker`).
    pub(crate) drift: Arc<DriftView>,
    /// The slots of operations running plugins in a burst (`pace`).
    pub(crate) pace: Arc<super::pace::Pace>,
}

/// What the engine hands its background workers (the reaper, the periodic
/// CHECK): queue their work, run the tasks that wait for it, see whether
/// a container has operations; nothing else of the engine.
#[derive(Debug, Clone)]
pub(crate) struct Submitter {
    engine: Arc<Engine>,
}

impl Submitter {
    /// Queues background work (a reap, a periodic CHECK) with its verb's
    /// default deadline, no claim and no request's trace.
    pub(crate) fn submit(
        &self,
        request_id: String,
        network: String,
        version: Version,
        work: Work,
    ) -> Result<Waiter, ApiError> {
        self.engine.submit(NewOp {
            deadline: Instant::now() + self.engine.p.deadlines.defaults.for_command(work.verb()),
            request_id,
            network,
            version,
            work,
            claim: None,
            trace: Default::default(),
        })
    }

    /// Runs `task` among the daemon's tasks (drained at shutdown).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.engine.p.tracker.spawn(task);
    }

    /// Whether `container_id` has an operation queued or running.
    pub(crate) fn busy(&self, container_id: &str) -> bool {
        !self.engine.p.sched.list(Some(container_id)).is_empty()
    }
}

/// An ADD that never completed, found at start: its intent and its
/// configuration.
#[derive(Debug)]
pub(crate) struct Unfinished {
    intent: Box<Intent>,
    list: Arc<NetworkConfigList>,
}

/// The outcome of a verb that answers nothing; its error in `version`.
fn nothing(res: Result<(), cni_async::Error>, version: Version) -> Outcome {
    res.map(|()| Done::Nothing)
        .map_err(|e| ApiError::from_cni(&e, version))
}

/// The wire form of a sandbox's merged result.
fn sandbox_result(m: &MultiResult) -> SandboxResult {
    let values: Vec<serde_json::Value> = m.networks.iter().map(|n| n.result.to_value()).collect();
    let ip = |ip: &cni_async::multi::IpInfo| SandboxIp {
        address: ip.address.to_string(),
        gateway: ip.gateway.map(|g| g.to_string()),
    };
    let interface = |i: &cni_async::multi::InterfaceConfig| SandboxInterface {
        ips: i.ip_configs.iter().map(ip).collect(),
        mac: i.mac.clone(),
        sandbox: i.sandbox.clone(),
    };
    SandboxResult {
        interfaces: m
            .interfaces
            .iter()
            .map(|(name, i)| (name.clone(), interface(i)))
            .collect(),
        routes: values
            .iter()
            .filter_map(|v| v.get("routes").and_then(|r| r.as_array()))
            .flatten()
            .cloned()
            .collect(),
        dns: values
            .iter()
            .filter_map(|v| v.get("dns"))
            .filter(|d| d.as_object().is_some_and(|o| !o.is_empty()))
            .cloned()
            .collect(),
        networks: m
            .networks
            .iter()
            .zip(&values)
            .map(|(n, v)| SandboxNetworkResult {
                network: n.network.clone(),
                ifname: n.ifname.clone(),
                result: v.clone(),
            })
            .collect(),
    }
}

impl Engine {
    pub(crate) fn new(p: Parts) -> Arc<Self> {
        let recoveries = Default::default();
        Arc::new(Engine {
            p,
            started: Instant::now(),
            recoveries,
        })
    }

    /// The handle of the background workers.
    pub(crate) fn submitter(self: &Arc<Self>) -> Submitter {
        Submitter {
            engine: self.clone(),
        }
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.p.metrics
    }

    pub(crate) fn networks(&self) -> &Networks {
        &self.p.networks
    }

    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.p.sched
    }

    /// The networks' readiness judge: the `Cni` that looks up their
    /// plugins and how many networks must be usable.
    pub(crate) fn readiness_of(&self) -> (&Cni, usize) {
        (&self.p.cni, self.p.min_networks)
    }

    /// Whether the stale-attachment reaper sees the host's mounts.
    pub(crate) fn sees_host_mounts(&self) -> bool {
        self.p.stale.sees_host_mounts()
    }

    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Queues an operation and starts what must run it.
    pub(crate) fn submit(self: &Arc<Self>, new: NewOp) -> Result<Waiter, ApiError> {
        self.submit_at(new, false)
    }

    /// [`Engine::submit`]; `first`: ahead of its container's queue.
    fn submit_at(self: &Arc<Self>, new: NewOp, first: bool) -> Result<Waiter, ApiError> {
        let (waiter, start) = self.p.sched.enqueue_at(new, first)?;
        match start {
            Start::Nothing => {}
            Start::Driver(cid) => self.start_drivers(vec![cid]),
            Start::Network(op, ticket) => {
                let this = self.clone();
                let turn = async move { this.run_turn(&op, ticket).await };
                self.p.tracker.spawn(turn);
            }
        }
        Ok(waiter)
    }

    /// Runs `op` once it has its turn (none: it left while it waited).
    async fn run_turn(&self, op: &Arc<Op>, ticket: Option<GateTicket>) {
        if let Some(claim) = self.p.sched.acquire(op, ticket).await {
            let outcome = Box::pin(self.run(op)).await;
            self.p.sched.complete(op, claim, outcome);
        }
    }

    /// A container's driver: runs its queue in order until it is empty.
    ///
    /// The operation's future is boxed: it is large (the whole plugin
    /// chain), and only the few operations that run need one, not every
    /// container waiting for its turn.
    async fn drive(self: Arc<Self>, container_id: String) {
        while let Some((op, ticket)) = self.p.sched.next_for(&container_id) {
            self.run_turn(&op, ticket).await;
        }
    }

    /// Runs an operation in a pacing slot (`pace`): its deadline is read
    /// after the wait for one. A sandbox operation's steps take theirs,
    /// each after its network's gate (`SandboxSteps::paced`), so that a
    /// step waiting for a GC's gate never holds the slot the GC waits for.
    /// One whose requests all left while it waited for its slot does not
    /// run (none of its plugins has): a queued operation's cancellation.
    /// STATUS is not paced: a readiness probe answers during a burst, and
    /// it takes none of the locks a burst's chains fight over.
    async fn run(&self, op: &Arc<Op>) -> Outcome {
        if op.sandbox() || op.verb == Command::Status {
            return self.run_now(op).await;
        }
        let paced = self.p.pace.run(
            op.background(),
            || op.remaining(),
            op.abandoned(),
            || self.run_now(op),
        );
        match paced.await {
            Ok(outcome) => outcome,
            Err(super::pace::Abandoned) => {
                // Its netns+ifname claims go now.
                drop(op.take_claim());
                tracing::debug!(id = op.id, request_id = %op.request_id, verb = %op.verb,
                    "operation cancelled while it waited for a pacing slot: nobody waits for it");
                Err(ApiError::internal(
                    "cancelled before its plugins ran: every request for it left",
                ))
            }
        }
    }

    async fn run_now(&self, op: &Arc<Op>) -> Outcome {
        let Some(work) = op.take_work() else {
            return Err(ApiError::internal("operation ran twice"));
        };
        // The netns+ifname claims of its admission, released when it ends
        // (after a successful ADD put its attachment in the owners table).
        let _claim = op.take_claim();
        let opts = CallOptions {
            timeout: Some(op.remaining().max(Duration::from_millis(1))),
            rollback: true,
        };
        // trace_id: the request's, so that a trace finds its operation.
        let span = tracing::info_span!("op", id = op.id, request_id = %op.request_id, verb = %op.verb, network = %op.network,
            container = op.attachment.as_ref().map(|a| a.0.as_str()).unwrap_or(""),
            ifname = op.attachment.as_ref().map(|a| a.1.as_str()).unwrap_or(""),
            trace_id = op.trace.trace_id().unwrap_or(""));
        let started = Instant::now();
        // Every plugin of the operation gets its trace context (none for
        // cnid's own work: cnid's environment never passes for a request's).
        let traced = cni_async::trace::scope(op.trace.clone(), async {
            if let Some((cid, ifname)) = &op.attachment {
                self.restore_kept(&op.network, cid, ifname).await;
            }
            match work {
                Work::Add { list, rt } => self.add(&list, &rt, opts).await,
                Work::Del { list, rt } => {
                    let deleted = self.del(&op.network, list.as_deref(), &rt, opts);
                    nothing(deleted.await, op.version)
                }
                Work::Check { list, rt } | Work::PeriodicCheck { list, rt } => {
                    let checked = self.p.cni.check_network_list(&list, &rt).options(&opts);
                    nothing(checked.await, list.version())
                }
                Work::Status { list } => {
                    let ready = self.p.cni.status_network_list(&list).options(&opts);
                    nothing(ready.await, list.version())
                }
                Work::Gc { list, valid } => self.gc(&list, &valid, opts).await,
                Work::Reap { candidate, .. } => self.reap(&candidate, opts).await,
                Work::Sandbox {
                    verb,
                    container_id,
                    networks,
                } => {
                    let deadline = Instant::now() + opts.timeout.unwrap_or_default();
                    self.sandbox(verb, &container_id, &networks, deadline, op.version)
                        .await
                }
            }
        });
        let outcome = tracing::Instrument::instrument(traced, span.clone()).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        span.in_scope(|| match &outcome {
            Ok(_) => tracing::info!(elapsed_ms, "operation done"),
            Err(e) => tracing::warn!(kind = ?e.kind, code = e.error.code, plugin = e.plugin_label(), error = %cni_core::validate::Escaped(&e.error.msg), elapsed_ms, "operation failed"),
        });
        outcome
    }

    async fn add(&self, list: &NetworkConfigList, rt: &RuntimeConf, opts: CallOptions) -> Outcome {
        self.add_result(list, rt, opts)
            .await
            .map(|result| Done::Result(result.to_value()))
            .map_err(|e| ApiError::from_cni(&e, list.version()))
    }

    /// ADD with its intent: recorded before the first plugin runs, removed
    /// once the result is cached or the chain rolled back.
    async fn add_result(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
        opts: CallOptions,
    ) -> Result<CniResult, cni_async::Error> {
        let net = list.name();
        let (cid, ifname) = (rt.container_id.as_str(), rt.ifname.as_str());
        let intent = Intent::new(net, rt, list.cache_bytes());
        let pending = match self.p.intents.begin(&intent).await {
            Ok(BeginAnswer::Recorded(p)) => p,
            Ok(other) => {
                let why = match other {
                    BeginAnswer::Cached => "a cached ADD result exists",
                    _ => "an earlier ADD failed and could not be rolled back",
                };
                let refused = ApiError::already_attached(net, cid, ifname, why);
                return Err(cni_async::Error::hook(refused));
            }
            Err(BeginError::Cache(e)) => return Err(e),
            Err(BeginError::Journal(e)) => {
                return Err(cni_async::Error::hook(ApiError::new(
                    ErrorKind::Io,
                    cni_code::IO_FAILURE,
                    format!("cannot record the ADD before running plugins: {e}"),
                )));
            }
        };
        // Exclusive: the check above is cnid's journal and cache; this one
        // is made under the attachment's lock, so an attachment another
        // process recorded meanwhile (cnitool on the same cache) is refused
        // too, never run over, nor deleted by a sandbox's undo.
        let add = self.p.cni.add_network_list(list, rt);
        let add = add.options(&opts).exclusive();
        match add.with_record().await {
            // The cache wrote the record without fsync (see `run`): the
            // commit line carries the record the ADD wrote (the library
            // hands it over), and is what makes it durable.
            Ok(added) => match self.p.intents.commit(pending, &added.record).await {
                Ok(()) => {
                    // Attached again: a reap of it before is forgotten,
                    // so its DEL runs the plugins.
                    let k = key(net, cid, ifname);
                    self.p.stale.forget(&k);
                    self.p.drift.forget(&k, &self.p.metrics);
                    // Before the claim goes: the owners table learns of the
                    // attachment from the cache, as of any other (so it also
                    // sees the record go, whoever deletes it).
                    if self.p.check_netns_owner
                        && let Err(e) = self.p.owners.refresh().await
                    {
                        tracing::warn!(error = %cni_core::error::Chain(&e), "cannot read the cache for netns owners");
                        self.p.owners.insert(net, rt);
                    }
                    Ok(added.result)
                }
                Err(e) => {
                    // Not durable, and a restart would DEL an attachment the
                    // caller believes made: undo it now and say so.
                    tracing::error!(error = %e, "cannot commit the ADD to the journal; deleting the attachment again");
                    let undo = self.p.cni.del_network_list(list, rt).await;
                    if undo.is_err() {
                        let _ = self.p.intents.write(&intent).await;
                    }
                    Err(cni_async::Error::hook(ApiError::new(
                        ErrorKind::Io,
                        cni_code::IO_FAILURE,
                        format!(
                            "ADD succeeded but could not be committed to the journal ({e}); the attachment was deleted again"
                        ),
                    )))
                }
            },
            Err(e) => {
                // Every ADD here runs with rollback, so any error but a failed
                // rollback means nothing is left: a cache error came before
                // any plugin ran (lock, read-only dir) or after the chain, which
                // was then rolled back (full disk). Keeping the intent would
                // refuse the next ADD (409) for nothing.
                let undone = !e.del_owed();
                if undone {
                    if let Err(e) = self.p.intents.finish(pending).await {
                        tracing::warn!(error = %e, "cannot end the intent of a rolled-back ADD");
                    }
                } else {
                    tracing::warn!(error = %cni_core::error::Chain(&e), "ADD failed and was not fully undone; its intent stays until a DEL succeeds");
                    if let Err(e) = self.p.intents.keep(pending, &intent).await {
                        tracing::error!(error = %e, "cannot keep the intent of an ADD not undone; the next start deletes it");
                    }
                }
                Err(e)
            }
        }
    }

    /// A sandbox's ADD, DEL or CHECK: the library's one orchestration
    /// (`cni_async::multi::{setup_steps, remove_steps, check_steps}`) with
    /// cnid's steps ([`SandboxSteps`]): its networks one after the other
    /// (DEL last to first), each step under its network's shared gate, all
    /// within the request's one deadline.
    ///
    /// - ADD: each network's ADD as the per-network endpoint does it
    ///   (intent, rollback of a partial chain); when one fails, the networks
    ///   already set up, and one whose own rollback failed, are deleted
    ///   again, last to first, each with a fresh DEL deadline, and the error
    ///   names the network. Success answers the merged result.
    /// - DEL: goes on past failures; every failure is named in the error.
    /// - CHECK: goes on past failures; every failure is named.
    async fn sandbox(
        &self,
        verb: Command,
        container_id: &str,
        nets: &[SandboxNet],
        deadline: Instant,
        version: Version,
    ) -> Outcome {
        let steps: Vec<SandboxStep<'_>> = nets
            .iter()
            .map(|n| SandboxStep {
                network: &n.name,
                list: n.list.as_deref(),
                rt: &n.rt,
            })
            .collect();
        let hook = SandboxSteps {
            engine: self,
            deadline,
            set_up: std::sync::Mutex::new(Vec::new()),
        };
        let outcome = match verb {
            Command::Add => {
                let setup =
                    cni_async::multi::setup_steps(&hook, container_id, &steps, SetupMode::Serial);
                match setup.await.map(MultiResult::from_results) {
                    Ok(m) => return Ok(Done::Sandbox(sandbox_result(&m))),
                    Err(e) => Err(e),
                }
            }
            Command::Del => cni_async::multi::remove_steps(&hook, container_id, &steps).await,
            Command::Check => cni_async::multi::check_steps(&hook, container_id, &steps).await,
            other => return Err(ApiError::internal(format!("no sandbox operation {other}"))),
        };
        let e = match outcome {
            Ok(()) => return Ok(Done::Nothing),
            Err(e) => e,
        };
        let error = ApiError::from_cni(&e, version);
        let set_up = hook.set_up.into_inner().unwrap_or_else(|p| p.into_inner());
        if verb != Command::Add
            || set_up.is_empty()
            || matches!(e, cni_async::Error::RollbackFailed { .. })
        {
            return Err(error);
        }
        let note = format!(
            "the networks set up before it were deleted again: {}",
            set_up.join(", ")
        );
        let details = if error.error.details.is_empty() {
            note
        } else {
            format!("{}; {note}", error.error.details)
        };
        Err(error.with_details(details))
    }

    async fn del(
        &self,
        network: &str,
        list: Option<&NetworkConfigList>,
        rt: &RuntimeConf,
        opts: CallOptions,
    ) -> Result<(), cni_async::Error> {
        if self.reaped_already(network, rt).await {
            return Ok(());
        }
        let res = match list {
            Some(list) => self.p.cni.del_network_list(list, rt).options(&opts).await,
            // Not in the conf dir: the configuration stored at ADD.
            None => match self.p.cni.del_cached(network, rt).options(&opts).await {
                Err(e) if e.kind() == cni_async::ErrorKind::NotAttached => {
                    let (cid, ifname) = (&rt.container_id, &rt.ifname);
                    match self.p.intents.read(network, cid, ifname).await {
                        Some(intent) => self.del_as_recorded(&intent.config, rt, &opts).await,
                        None => {
                            tracing::info!(
                                "network not loaded and nothing cached: nothing to delete"
                            );
                            Ok(())
                        }
                    }
                }
                other => other,
            },
        };
        res?;
        self.deleted(network, rt).await;
        Ok(())
    }

    /// DEL of `rt` with the configuration an intent recorded (`config`).
    async fn del_as_recorded(
        &self,
        config: &[u8],
        rt: &RuntimeConf,
        opts: &CallOptions,
    ) -> Result<(), cni_async::Error> {
        let list = NetworkConfigList::from_bytes(config, None)?;
        self.p.cni.del_network_list(&list, rt).options(opts).await
    }

    /// After a successful DEL of an attachment (a runtime's or the
    /// reaper's): its ADD intent and commit line are forgotten, its netns
    /// and ifname owned by nobody.
    async fn deleted(&self, network: &str, rt: &RuntimeConf) {
        let (cid, ifname) = (&rt.container_id, &rt.ifname);
        match self.p.intents.remove(network, cid, ifname).await {
            Ok(true) => tracing::info!("DEL resolved an unfinished ADD"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot remove an ADD intent after DEL"),
        }
        self.p.owners.remove(network, cid, ifname);
        let k = key(network, cid, ifname);
        self.p.drift.forget(&k, &self.p.metrics);
    }

    /// GC of one network, under its exclusive gate. The request's deadline
    /// bounds the whole of it: the DELs of the ADDs recorded as unfinished
    /// and the library's GC (stale cached attachments, then the plugins'
    /// GC) share what is left of it. A stale attachment that cannot be
    /// deleted does not stop the others; it is answered in `failed`. Only a
    /// failure of the GC itself (a plugin's GC) is an error answer, whose
    /// message also names every attachment left.
    async fn gc(
        &self,
        list: &NetworkConfigList,
        valid: &[GcAttachment],
        opts: CallOptions,
    ) -> Outcome {
        let version = list.version();
        if list.disable_gc() {
            return Ok(Done::Gc(GcResponse {
                disabled: true,
                ..Default::default()
            }));
        }
        let total = opts
            .timeout
            .unwrap_or_else(|| self.p.deadlines.defaults.for_command(Command::Gc));
        let deadline = Instant::now() + total;
        // What is left (possibly nothing: the library then starts no plugin
        // and answers with a timeout).
        let left = || CallOptions {
            timeout: Some(deadline.saturating_duration_since(Instant::now())),
            rollback: false,
        };
        // Records this start kept for the next are attachments too: put
        // back, so the library's GC sees (and deletes) the stale ones.
        let kept: Vec<(String, String)> = lock(&self.p.kept)
            .iter()
            .filter(|r| r.network_name == list.name())
            .map(|r| (r.container_id.clone(), r.if_name.clone()))
            .collect();
        for (cid, ifname) in kept {
            self.restore_kept(list.name(), &cid, &ifname).await;
        }
        let keep: HashSet<&GcAttachment> = valid.iter().collect();
        let mut deleted = Vec::new();
        let mut failed: Vec<GcFailure> = Vec::new();
        // ADDs that failed and could not be rolled back: stale unless valid.
        // (The network's gate is held exclusively: no ADD of it is running
        // here. One a killed daemon's orphaned plugin still runs holds no
        // gate: its container is held, and its rollback follows the
        // orphan; a DEL now would run beside the plugin.)
        for intent in self.p.intents.of_network(list.name()).await {
            let key = GcAttachment {
                container_id: intent.rt.container_id.clone(),
                ifname: intent.rt.ifname.clone(),
            };
            if keep.contains(&key) {
                continue;
            }
            if self.p.sched.held(&key.container_id) {
                tracing::info!(container = %key.container_id, ifname = %key.ifname,
                    "GC leaves an unfinished ADD an orphaned plugin may still run to its rollback");
                continue;
            }
            let opts = left();
            let del = self.del_as_recorded(&intent.config, &intent.rt, &opts);
            match del.await {
                Ok(()) => {
                    let (cid, ifname) = (&key.container_id, &key.ifname);
                    let _ = self.p.intents.remove(list.name(), cid, ifname).await;
                    deleted.push(key);
                }
                Err(error) => {
                    tracing::warn!(container = %key.container_id, ifname = %key.ifname, %error,
                        "GC could not delete an unfinished ADD; going on with the others");
                    failed.push(GcFailure {
                        attachment: key,
                        error,
                    });
                }
            }
        }
        let gc = self.p.cni.gc_network_list(list, valid);
        let gc = gc.options(&left()).await;
        // What it deleted is forgotten as a DEL's attachment is.
        if let Err(e) = self.p.intents.forget_removed(list.name()).await {
            tracing::warn!(error = %e, "cannot forget the journal's commit lines of the attachments GC deleted");
        }
        match gc {
            Ok(summary) => {
                for d in summary.deleted {
                    if !deleted.contains(&d) {
                        deleted.push(d);
                    }
                }
                // Their netns and ifname are free now, as after a DEL.
                let owners = &self.p.owners;
                for d in &deleted {
                    owners.remove(list.name(), &d.container_id, &d.ifname);
                }
                for f in summary.failed {
                    if !failed.iter().any(|g| g.attachment == f.attachment) {
                        failed.push(f);
                    }
                }
                let failed = failed
                    .into_iter()
                    .map(|f| GcFailed {
                        error: f.error.to_error_object(&version.to_string()),
                        container_id: f.attachment.container_id,
                        ifname: f.attachment.ifname,
                    })
                    .collect();
                Ok(Done::Gc(GcResponse {
                    deleted,
                    failed,
                    plugins_called: summary.plugins_called,
                    disabled: summary.disabled,
                }))
            }
            Err(e) => {
                let mut errors = cni_async::Errors::new(format!("GC of network {}", list.name()));
                for f in failed {
                    errors.push(f.into_error(list.name()));
                }
                errors.push_flat(e);
                let e = errors.into_result().expect_err("a failed GC has an error");
                Err(ApiError::from_cni(&e, version))
            }
        }
    }

    /// At start: holds the containers the dead daemon's orphaned plugins
    /// work on, reads the owners, then DELs every ADD that never
    /// completed, in the queue ahead of any request, except those of the
    /// containers an orphan still works on (its container, or its netns
    /// and ifname): those are returned, by the orphan's container, for
    /// [`Engine::release_orphaned`] once that orphan is gone (all of them,
    /// under `""`, while a GC's orphan holds every queue). Returns how
    /// many were queued, and the deferred ones.
    pub(crate) async fn recover(
        self: &Arc<Self>,
        orphans: &[super::orphans::Orphan],
    ) -> std::io::Result<(usize, HashMap<String, Vec<Unfinished>>)> {
        for o in orphans {
            if let Some(key) = super::orphans::hold_key(o) {
                self.p.sched.hold(key, &o.netns, &o.ifname);
            }
        }
        // Who owns which netns and ifname, before any request: the
        // rollbacks keep off other containers' interfaces (each admission
        // then reads what changed); the records a later start restores
        // own theirs now.
        if self.p.check_netns_owner {
            if let Err(e) = self.p.owners.refresh().await {
                tracing::warn!(error = %cni_core::error::Chain(&e), "cannot list the cached attachments; netns owners unknown until the cache can be read");
            }
            let kept = lock(&self.p.kept).clone();
            for rec in kept {
                let rt = RuntimeConf::new(&rec.container_id, &rec.netns, &rec.if_name);
                self.p.owners.insert(&rec.network_name, &rt);
            }
        }
        // Before any request: no ADD is recording its intent yet.
        match self.p.intents.remove_leftovers() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                count = n,
                "removed temp files of ADD intents never completed"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot remove leftover ADD intent temp files"),
        }
        let found = self.p.intents.scan()?;
        // A GC's orphan holds every queue: a rollback queued now would
        // wait for it, its deadline running (the GC's may be longer), so
        // the others are deferred to its release too.
        let gc_orphan = orphans
            .iter()
            .any(|o| super::orphans::hold_key(o) == Some(""));
        let mut n = 0;
        let mut deferred: HashMap<String, Vec<Unfinished>> = HashMap::new();
        for f in found {
            let (path, intent) = match f {
                IntentFile::Intent(p, i) => (p, i),
                IntentFile::Corrupt(p, reason) => {
                    tracing::error!(file = %p.display(), %reason, "unreadable ADD intent moved aside; its attachment (if any) is not cleaned up");
                    continue;
                }
            };
            let list = match NetworkConfigList::from_bytes(&intent.config, None) {
                Ok(l) => Arc::new(l),
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %cni_core::error::Chain(&e), "ADD intent holds an unusable configuration; left in place");
                    continue;
                }
            };
            let rt = &intent.rt;
            // The orphan working on it: its own container's, or one on its
            // netns and ifname (whose container's queue then holds it too).
            let orphan = orphans
                .iter()
                .find(|o| o.container_id == rt.container_id)
                .or_else(|| {
                    orphans.iter().find(|o| {
                        !o.container_id.is_empty()
                            && !o.netns.is_empty()
                            && o.netns == rt.netns
                            && o.ifname == rt.ifname
                    })
                });
            let unfinished = Unfinished { intent, list };
            match orphan {
                Some(o) => {
                    let cid = &unfinished.intent.rt.container_id;
                    if o.container_id != *cid {
                        self.p.sched.hold_with(&o.container_id, cid);
                    }
                    tracing::warn!(network = %unfinished.intent.network, container = %unfinished.intent.rt.container_id,
                        ifname = %unfinished.intent.rt.ifname, orphan_pgid = o.pid,
                        "found an ADD that never completed (daemon killed?); deleting it once the orphaned plugin is gone");
                    deferred
                        .entry(o.container_id.clone())
                        .or_default()
                        .push(unfinished);
                }
                None if gc_orphan => {
                    deferred.entry(String::new()).or_default().push(unfinished);
                }
                None => {
                    if self.queue_rollback(unfinished, false, false).is_some() {
                        n += 1;
                    }
                }
            }
        }
        Ok((n, deferred))
    }

    /// The orphans of a held container (`""`: the hold of everything) are
    /// gone: the rollbacks of its unfinished ADDs go first in their queues,
    /// then the hold ends and the queues run. `killed`: an orphan of it
    /// was killed at its deadline.
    pub(crate) fn release_orphaned(
        self: &Arc<Self>,
        container_id: &str,
        unfinished: Vec<Unfinished>,
        killed: bool,
    ) {
        // Only the container's own rollbacks are waited for below: one of
        // a container held with it (its unfinished ADD on the orphan's
        // netns and ifname) is first in that container's queue, which
        // runs only once released with it.
        let mut rollbacks = Vec::new();
        for u in unfinished {
            let own = u.intent.rt.container_id == container_id;
            if let Some(r) = self.queue_rollback(u, killed, true)
                && own
            {
                rollbacks.push(r);
            }
        }
        let (start, with) = self.p.sched.release(container_id);
        self.start_drivers(start);
        if with.is_empty() {
            return;
        }
        // Other containers' requests on the orphan's netns and ifname run
        // after its rollbacks, as they would have after a rollback that
        // claimed the slot before they came.
        let this = self.clone();
        self.p.tracker.spawn(async move {
            for r in rollbacks {
                let _ = r.await;
            }
            let start = this.p.sched.release_with(with);
            this.start_drivers(start);
        });
    }

    fn start_drivers(self: &Arc<Self>, containers: Vec<String>) {
        for cid in containers {
            let this = self.clone();
            self.p.tracker.spawn(async move { this.drive(cid).await });
        }
    }

    /// Queues the DEL of an ADD that never completed (`first`: ahead of
    /// what its container's held queue has). Returns whether it was
    /// queued: the task that waits for it, then logs its outcome.
    fn queue_rollback(
        self: &Arc<Self>,
        u: Unfinished,
        killed: bool,
        first: bool,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let Unfinished { intent, list } = u;
        if killed {
            tracing::warn!(network = %intent.network, container = %intent.rt.container_id, ifname = %intent.rt.ifname,
                "found an ADD that never completed, whose plugin was killed at its deadline; deleting it \
                 (what the killed plugin left half made, such as an empty host-local reservation, may stay: docs/reliability.md)");
        } else {
            tracing::warn!(network = %intent.network, container = %intent.rt.container_id, ifname = %intent.rt.ifname,
                "found an ADD that never completed (daemon killed?); deleting it");
        }
        let deadline = Instant::now() + self.p.deadlines.defaults.del;
        // Another container's attachment on the netns and ifname (made
        // by another tool while we were down): the interface is its;
        // the rollback runs without the netns, as the library's own
        // rollback does (`cni_async::ops`), and releases only what the
        // cut ADD held.
        let mut rt = intent.rt.clone();
        let (check, owners) = (self.p.check_netns_owner, &self.p.owners);
        if check && let Some(owner) = owners.others(&rt).into_iter().find(|o| !o.in_progress) {
            tracing::warn!(network = %intent.network, container = %rt.container_id, ifname = %rt.ifname,
                owner = %owner.container_id, owner_network = %owner.network,
                "the netns and interface belong to another container's attachment; rolling back without the netns");
            rt.netns = String::new();
        }
        // Otherwise the rollback is an operation on its netns and
        // ifname like any other: claimed (whatever is there: it must
        // run), so another container's request there gets 409 until it
        // is done, instead of running at once on the interface the
        // rollback tears down.
        let claim = check
            .then(|| owners.admit([(intent.network.as_str(), &rt)], true).ok())
            .flatten();
        let n = self.recoveries.fetch_add(1, Ordering::Relaxed) + 1;
        let waiter = self.submit_at(
            NewOp {
                request_id: format!("recovery-{n}"),
                network: intent.network.clone(),
                version: list.version(),
                work: Work::Del {
                    list: Some(list),
                    rt,
                },
                deadline,
                claim,
                trace: Default::default(),
            },
            first,
        );
        let metrics = self.p.metrics.clone();
        match waiter {
            Ok(w) => {
                Some(self.p.tracker.spawn(async move {
                    let out = w.wait().await;
                    match out.as_ref() {
                        Ok(_) => {
                            metrics.recovered_ok.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(network = %intent.network, container = %intent.rt.container_id, ifname = %intent.rt.ifname,
                                plugin_killed_at_deadline = killed, "unfinished ADD rolled back");
                        }
                        Err(e) => {
                            metrics.recovered_failed.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(network = %intent.network, container = %intent.rt.container_id, ifname = %intent.rt.ifname,
                                error = %e.error.msg, "cannot roll back an unfinished ADD; it stays recorded and is retried at the next start or by a DEL");
                        }
                    }
                }))
            }
            Err(e) => {
                tracing::error!(error = %e.error.msg, "cannot queue the rollback of an unfinished ADD");
                None
            }
        }
    }

    /// Before an operation on an attachment whose record this start kept
    /// for the next (it could not be restored, `intents`' carried lines):
    /// tries again to put it back into the cache, unless a file is there,
    /// so that the operation finds it (a DEL its `prevResult`, a CHECK its
    /// result, an ADD "already attached"). Written like any record: the
    /// kept journal line stays the durable copy until the attachment's DEL
    /// forgets it or a start settles it.
    async fn restore_kept(&self, network: &str, container_id: &str, ifname: &str) {
        let this = |r: &CacheRecord| {
            r.network_name == network && r.container_id == container_id && r.if_name == ifname
        };
        let Some(rec) = lock(&self.p.kept).iter().find(|r| this(r)).cloned() else {
            return;
        };
        let cache = self.p.cni.cache();
        let Ok(path) = cache.path(network, container_id, ifname) else {
            return;
        };
        if std::fs::symlink_metadata(&path).is_err() {
            if let Err(e) = cache.write(&rec).await {
                tracing::warn!(error = %cni_core::error::Chain(&e),
                    "cannot restore the cached result of an ADD answered before the machine went down; the operation runs without it");
                return;
            }
            tracing::warn!(
                "restored the cached result of an ADD answered before the machine went down (kept since the start)"
            );
        }
        lock(&self.p.kept).retain(|r| !this(r));
    }

    /// `GET /v1/attachments`: one page, from the owners' scan of the
    /// cache (its file names kept in order: a page reads its own records,
    /// it does not list and sort the cache).
    pub(crate) async fn attachments(
        &self,
        container_id: Option<&str>,
        page: cni_async::cache::ListPage,
    ) -> Result<crate::api::AttachmentsResponse, ApiError> {
        let paged = self.p.owners.page(container_id, page).await;
        let (recs, next) = paged.map_err(|e| ApiError::from_cni(&e, Version::CURRENT))?;
        Ok(crate::api::AttachmentsResponse {
            next,
            attachments: recs
                .into_iter()
                .map(|r| {
                    let (net, cid, ifname) = (&r.network_name, &r.container_id, &r.if_name);
                    let reap = self.p.stale.state(net, cid, ifname);
                    // The reaper's word first: a CHECK of a namespace
                    // that is gone says nothing more.
                    let drift = reap
                        .is_none()
                        .then(|| self.p.drift.state(net, cid, ifname))
                        .flatten();
                    crate::api::AttachmentInfo {
                        state: reap
                            .as_ref()
                            .map(|s| s.state.to_owned())
                            .or_else(|| drift.as_ref().map(|_| "drifted".to_owned())),
                        check_error: drift.map(|d| d.error),
                        gone_since_ms: reap
                            .as_ref()
                            .and_then(|s| s.gone_since)
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                        reap_error: reap.and_then(|s| s.error),
                        network: r.network_name,
                        container_id: r.container_id,
                        ifname: r.if_name,
                        netns: r.netns,
                        cni_args: r.cni_args.to_string(),
                        capability_args: r.capability_args,
                        result: r.result,
                    }
                })
                .collect(),
        })
    }
}

/// cnid's steps of a sandbox operation: each ADD and DEL as the
/// per-network endpoints do it (the ADD journal's records, the owners
/// table), all within the operation's one deadline; the networks whose ADD
/// succeeded are remembered for the error of a failed setup. Each step
/// takes a permit of the parallelism limit once its gate is granted
/// (`Scheduler::permit`).
struct SandboxSteps<'e> {
    engine: &'e Engine,
    deadline: Instant,
    set_up: std::sync::Mutex<Vec<String>>,
}

impl SandboxSteps<'_> {
    /// Runs a step's plugins (`run`, given the step's options) in a
    /// `--max-parallel` slot and a pacing slot, both taken after the step's
    /// gate, as every other operation takes its slots after its gate; the
    /// wait for the pacing slot comes off the step's deadline.
    async fn paced<T, F>(
        &self,
        opts: CallOptions,
        run: impl FnOnce(CallOptions) -> F,
    ) -> Result<T, cni_async::Error>
    where
        F: Future<Output = Result<T, cni_async::Error>>,
    {
        let _permit = self.engine.p.sched.permit().await;
        let asked = Instant::now();
        let remaining = opts.timeout.unwrap_or(Duration::MAX);
        let work = || {
            let timeout = opts.timeout.map(|t| {
                t.saturating_sub(asked.elapsed())
                    .max(Duration::from_millis(1))
            });
            run(CallOptions { timeout, ..opts })
        };
        // A step goes on while its sandbox operation runs.
        let never = std::future::pending();
        let paced = self.engine.p.pace.run(None, || remaining, never, work);
        match paced.await {
            Ok(out) => out,
            Err(super::pace::Abandoned) => Err(cni_async::Error::hook(ApiError::internal(
                "sandbox step abandoned while it waited for a pacing slot",
            ))),
        }
    }
}

/// A step's configuration; an ADD or CHECK of a network not loaded is
/// refused.
fn loaded<'a>(step: &SandboxStep<'a>) -> Result<&'a NetworkConfigList, cni_async::Error> {
    step.list
        .ok_or_else(|| cni_async::Error::hook(ApiError::unknown_network(step.network)))
}

impl StepHook for SandboxSteps<'_> {
    fn cni(&self) -> &Cni {
        &self.engine.p.cni
    }

    fn gates(&self) -> &NetworkGates {
        self.engine.p.sched.gates()
    }

    fn options(&self, _: Command) -> CallOptions {
        CallOptions {
            timeout: Some(
                self.deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ),
            rollback: false,
        }
    }

    fn undo_options(&self) -> CallOptions {
        CallOptions {
            timeout: Some(self.engine.p.deadlines.defaults.for_command(Command::Del)),
            rollback: false,
        }
    }

    async fn add(
        &self,
        step: SandboxStep<'_>,
        opts: CallOptions,
    ) -> Result<CniResult, cni_async::Error> {
        let list = loaded(&step)?;
        let result = self
            .paced(opts, |opts| self.engine.add_result(list, step.rt, opts))
            .await?;
        lock(&self.set_up).push(step.network.to_owned());
        Ok(result)
    }

    async fn del(&self, step: SandboxStep<'_>, opts: CallOptions) -> Result<(), cni_async::Error> {
        self.paced(opts, |opts| {
            self.engine.del(step.network, step.list, step.rt, opts)
        })
        .await
    }

    async fn check(
        &self,
        step: SandboxStep<'_>,
        opts: CallOptions,
    ) -> Result<(), cni_async::Error> {
        let list = loaded(&step)?;
        self.paced(opts, |opts| async move {
            let check = self.engine.p.cni.check_network_list(list, step.rt);
            check.options(&opts).await
        })
        .await
    }
}
