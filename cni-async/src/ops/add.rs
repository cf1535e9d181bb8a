//! ADD: [`Cni::add_network_list`], [`Cni::add_network`], [`AddRequest`],
//! the rollback of a partial chain and the ADD on a task of its own.

use std::marker::PhantomData;
use std::time::Instant;

use cni_core::cache::CacheRecord;
use cni_core::error::Chain;
use cni_core::result::CniResult;
use cni_core::validate::Escaped;
use cni_core::{Command, NetworkConfigList, PluginConfig, RuntimeConf};
use serde_json::Value;
use tracing::Instrument;

use crate::cache::AttachmentLock;
use crate::error::{ERROR_STDERR_MAX, ERROR_STDOUT_MAX, Error, Errors, lossy_capped};

use super::request::{Operation, Request};
use super::{CallOptions, Cni, Deadline, Net};

/// Counts one detached ADD in [`Cni::detached`] while it lives (also
/// when its task panics).
#[derive(Debug)]
struct DetachedGuard(Cni);

impl DetachedGuard {
    fn new(cni: &Cni) -> Self {
        cni.detached.send_modify(|n| *n += 1);
        DetachedGuard(cni.clone())
    }
}

impl Drop for DetachedGuard {
    fn drop(&mut self) {
        self.0.detached.send_modify(|n| *n -= 1);
    }
}

impl Cni {
    /// ADD: runs the plugins first to last, chaining each result as the
    /// next `prevResult` (converted to the list's version first), and caches
    /// the final result. Await the request; set options on it first if
    /// needed ([`AddRequest::timeout`], [`AddRequest::rollback`],
    /// [`AddRequest::options`]).
    pub fn add_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> AddRequest<'a> {
        self.add_request(Ok(Net::list(list)), rt)
    }

    /// ADD of a single plugin configuration (its own `name` and
    /// `cniVersion`), libcni's `AddNetwork`. Options as
    /// [`Cni::add_network_list`].
    pub fn add_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> AddRequest<'a> {
        self.add_request(Net::single(plugin), rt)
    }

    fn add_request<'a>(
        &'a self,
        net: Result<Net<'a>, Error>,
        rt: &'a RuntimeConf,
    ) -> AddRequest<'a> {
        Request::new(
            self,
            AddOp {
                net,
                rt,
                detach: false,
                exclusive: false,
                out: PhantomData,
            },
        )
    }

    /// The ADD. `gave_up` is asked before each plugin and before the cache
    /// write: when it says the caller is gone (a detached ADD's), the
    /// plugins that ran are rolled back and the answer is `Ok(None)`.
    async fn add(
        &self,
        net: &Net<'_>,
        rt: &RuntimeConf,
        opts: &CallOptions,
        exclusive: bool,
        gave_up: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<Added>, Error> {
        self.validate_attachment(net, rt, Command::Add)?;
        let deadline = self.deadline(Command::Add, opts);
        let span = tracing::info_span!("cni.add", network = &*net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            let started = Instant::now();
            // `existed`: this attachment's record (or a corrupt file) was
            // there before this ADD, so no rollback may DEL it: a DEL
            // cannot tell what this call made from what was there.
            let (lock, prior) = self
                .cache()
                .lock_for_add(
                    (&*net.name, &rt.container_id, &rt.ifname),
                    deadline.remaining(),
                    exclusive,
                )
                .await?;
            let existed = prior.existed();
            // What a later scan proves the namespace gone by.
            let identity = crate::sys::identity::identity_of(&rt.netns);
            let mut prev: Option<CniResult> = None;
            let mut prev_value: Option<Value> = None;
            for (index, plugin) in net.plugins.iter().enumerate() {
                if gave_up() {
                    self.roll_back_abandoned(net, &net.plugins[..index], rt, prev_value.as_ref(), existed).await;
                    return Ok(None);
                }
                let e = match self.add_one(net, plugin, rt, prev_value.as_ref(), deadline).await {
                    Ok(result) => {
                        prev_value = Some(result.to_value());
                        prev = Some(result);
                        continue;
                    }
                    Err(e) => e,
                };
                // A plugin that could not be found or started never ran:
                // nothing of it to DEL, and its DEL would fail the same way
                // and stop the rollback of the plugins that did.
                let started = !matches!(e, Error::PluginNotFound { .. } | Error::Spawn { .. });
                if opts.rollback && existed {
                    tracing::warn!(plugin = plugin.plugin_type(), error = %Escaped(Chain(&e)),
                        "ADD over an attachment recorded before it failed; not rolled back, which would delete that attachment");
                    // That attachment (and whatever this chain made) is
                    // left to its DEL.
                    return Err(Error::in_operation(&net.name, &rt.ifname, Command::Add, true, e));
                }
                if !opts.rollback {
                    // Not rolled back: owed a DEL once a plugin ran.
                    let owed = index > 0 || started;
                    return Err(Error::in_operation(&net.name, &rt.ifname, Command::Add, owed, e));
                }
                tracing::warn!(plugin = plugin.plugin_type(), error = %Escaped(Chain(&e)), "ADD failed; rolling back the plugins that ran");
                let ran = &net.plugins[..index + usize::from(started)];
                let rb = self.rollback(net, ran, rt, prev_value.as_ref()).await;
                drop(lock);
                return Err(e.after_rollback(rb));
            }
            let Some(result) = prev else {
                return Err(Error::Core(cni_core::Error::InvalidConfig {
                    origin: format!("network {}", &*net.name),
                    reason: "no plugins to run".into(),
                }));
            };
            if gave_up() {
                self.roll_back_abandoned(net, &net.plugins, rt, prev_value.as_ref(), existed).await;
                return Ok(None);
            }
            // A namespace replaced at the path while the plugins ran: the
            // record must not name the one that was there before them.
            let identity = crate::sys::identity::unchanged(identity, &rt.netns);
            let rec = CacheRecord::new(&net.name, rt, net.cache_bytes.to_vec(), prev_value)
                .with_identity(identity);
            let (lock, written) = self.inner.cache.write_holding(&rec, lock, prior).await;
            if let Err(e) = written {
                // Attached but not recorded: with rollback, undo it
                // (unless it existed before); otherwise the caller owes a DEL.
                if opts.rollback && !existed {
                    let value = result.to_value();
                    if let Err(rb) = self.rollback(net, &net.plugins, rt, Some(&value)).await {
                        return Err(Error::RollbackFailed {
                            error: Box::new(e),
                            rollback: Box::new(rb),
                        });
                    }
                }
                let owed = !opts.rollback;
                return Err(Error::in_operation(&net.name, &rt.ifname, Command::Add, owed, e));
            }
            tracing::debug!(elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX), "ADD done");
            Ok(Some(Added {
                result,
                record: rec,
                lock,
                existed,
            }))
        }
        .instrument(span)
        .await
    }

    /// Rolls back the plugins a detached ADD ran before its caller gave up
    /// (nobody is left to hear a failure: it is logged); nothing when the
    /// attachment was recorded before the ADD (`existed`).
    async fn roll_back_abandoned(
        &self,
        net: &Net<'_>,
        ran: &[PluginConfig],
        rt: &RuntimeConf,
        prev: Option<&Value>,
        existed: bool,
    ) {
        if existed {
            tracing::warn!(
                plugins = ran.len(),
                "ADD over an attachment recorded before it given up by its caller; not rolled back, which would delete that attachment"
            );
            return;
        }
        tracing::info!(
            plugins = ran.len(),
            "ADD given up by its caller; rolling back the plugins that ran"
        );
        if !ran.is_empty()
            && let Err(e) = self.rollback(net, ran, rt, prev).await
        {
            tracing::warn!(error = %Escaped(Chain(&e)), "rollback of a given-up ADD failed");
        }
    }

    /// A detached ADD's task ([`AddRequest::rollback_on_cancel`]): runs
    /// the ADD with rollback, hands the outcome to `tx`, and DELs the
    /// attachment when the caller is gone before taking its result (`ack`
    /// dropped unsent).
    async fn add_detached(
        self,
        net: Net<'static>,
        rt: RuntimeConf,
        opts: CallOptions,
        exclusive: bool,
        (tx, ack): (
            tokio::sync::oneshot::Sender<Result<Attached, Error>>,
            tokio::sync::oneshot::Receiver<()>,
        ),
        _counted: DetachedGuard,
    ) {
        let outcome = self
            .add(&net, &rt, &opts, exclusive, &|| tx.is_closed())
            .await;
        // The attachment's lock stays held until the caller took the
        // result, or until the DEL below is done: a caller that gave up and
        // retries the same attachment at once waits for it, and this DEL
        // can never delete what the retry made.
        let Added {
            result,
            record,
            lock,
            existed,
        } = match outcome {
            Ok(None) => return,
            Ok(Some(added)) => added,
            Err(e) => {
                // A failed ADD was rolled back already.
                let _ = tx.send(Err(e));
                return;
            }
        };
        if tx.send(Ok(Attached { result, record })).is_ok() && ack.await.is_ok() {
            return;
        }
        if existed {
            // Attached before this ADD: the caller's attachment is still
            // there (recorded again), and a DEL would take it away.
            tracing::warn!(
                "ADD over an attachment recorded before it given up by its caller after it finished; leaving the attachment"
            );
            return;
        }
        tracing::info!("ADD given up by its caller after it finished; deleting it");
        let deadline = self.deadline(Command::Del, &CallOptions::default());
        if let Err(e) = self.del_expecting(&net, &rt, deadline, lock, None).await {
            tracing::warn!(error = %Escaped(Chain(&e)), "DEL of a given-up ADD failed");
        }
    }

    async fn add_one(
        &self,
        net: &Net<'_>,
        plugin: &PluginConfig,
        rt: &RuntimeConf,
        prev: Option<&Value>,
        deadline: Deadline,
    ) -> Result<CniResult, Error> {
        let out = self
            .run_on_attachment(net, plugin, Command::Add, rt, prev, deadline)
            .await?;
        let bad = |reason: String| Error::PluginOutput {
            plugin_type: plugin.plugin_type().to_owned(),
            command: Command::Add,
            reason,
            stdout: lossy_capped(&out.stdout, ERROR_STDOUT_MAX),
            stderr: lossy_capped(&out.stderr, ERROR_STDERR_MAX),
        };
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Err(bad("plugin succeeded but printed no result".into()));
        }
        let result = CniResult::parse(&out.stdout, net.version).map_err(|e| bad(e.to_string()))?;
        if result.version() == net.version {
            return Ok(result);
        }
        // An older (or newer) result: convert before chaining, printing and
        // caching it (`docs/decisions.md` D6).
        tracing::debug!(plugin = plugin.plugin_type(), from = %result.version(), to = %net.version, "converting plugin result");
        result.convert(net.version).map_err(|e| bad(e.to_string()))
    }

    async fn rollback(
        &self,
        net: &Net<'_>,
        ran: &[PluginConfig],
        rt: &RuntimeConf,
        prev: Option<&Value>,
    ) -> Result<(), Error> {
        // A fresh deadline: never the ADD's, which may have expired.
        let deadline = Deadline::after(self.inner.timeouts.del);
        let rt = &self.rollback_attachment(rt).await;
        let prev = if net.version.has_prev_result_on_del() {
            prev
        } else {
            None
        };
        // Unlike DEL, a rollback goes on past a failing plugin: it is
        // cleanup, and every plugin undone is a leak avoided.
        let mut errors = Errors::new(format!("rollback of network {}", &*net.name));
        for plugin in ran.iter().rev() {
            let undone = self.run_on_attachment(net, plugin, Command::Del, rt, prev, deadline);
            if let Err(e) = undone.await {
                tracing::warn!(plugin = plugin.plugin_type(), error = %Escaped(Chain(&e)), "rollback DEL failed; continuing with the others");
                errors.push(e);
            }
        }
        errors.into_result()
    }

    /// The attachment a rollback DELs: `rt`, or `rt` without its netns when
    /// another container's cached attachment holds that netns and ifname,
    /// or when the cache's attachments cannot be read (no proof that the
    /// interface is this ADD's alone: it is kept). Asks the cache's owner
    /// index, brought up to date first, so a record another tool wrote
    /// before this call counts. Also what a sandbox's undo of a network
    /// set up DELs ([`crate::multi::setup_steps`]).
    pub(crate) async fn rollback_attachment(&self, rt: &RuntimeConf) -> RuntimeConf {
        if rt.netns.is_empty() {
            return rt.clone();
        }
        let others = match self
            .cache()
            .others_on(&rt.netns, &rt.ifname, &rt.container_id)
            .await
        {
            Ok(o) => o,
            Err(e) => {
                // No proof that the interface is this ADD's alone: keep it
                // (the plugins release what they can without the netns).
                tracing::warn!(error = %Escaped(Chain(&e)), "cannot read the cache's attachments before a rollback; rolling back without the netns, keeping the interface");
                return RuntimeConf {
                    netns: String::new(),
                    ..rt.clone()
                };
            }
        };
        match others.first() {
            None => rt.clone(),
            Some(owner) => {
                tracing::warn!(owner = ?owner.container_id, owner_network = ?owner.network,
                    "the netns and interface belong to another container's attachment; rolling back without the netns");
                RuntimeConf {
                    netns: String::new(),
                    ..rt.clone()
                }
            }
        }
    }
}

/// An ADD ready to run ([`Cni::add_network_list`], [`Cni::add_network`]):
/// `.await` it, after setting options if needed.
pub type AddRequest<'a> = Request<'a, AddOp<'a>>;

/// What an [`AddRequest`] runs; `Out` is what it answers: the result, or
/// with [`AddRequest::with_record`] the result and the record cached
/// ([`Attached`]).
#[derive(Debug)]
pub struct AddOp<'a, Out = CniResult> {
    net: Result<Net<'a>, Error>,
    rt: &'a RuntimeConf,
    detach: bool,
    exclusive: bool,
    out: PhantomData<fn() -> Out>,
}

/// A successful ADD: its result and the record it wrote into the cache
/// ([`AddRequest::with_record`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Attached {
    /// The final result, in the network's version.
    pub result: CniResult,
    /// The cache record, as written (the result in it is `result`).
    pub record: CacheRecord,
}

impl<'a> AddRequest<'a> {
    /// Answers the record the ADD wrote into the cache with the result
    /// ([`Attached`]), for a caller that keeps its own copy of it (cnid's
    /// journal): the very record, not one rebuilt from the same inputs.
    pub fn with_record(self) -> Request<'a, AddOp<'a, Attached>> {
        let Request { cni, op, opts } = self;
        Request {
            cni,
            op: AddOp {
                net: op.net,
                rt: op.rt,
                detach: op.detach,
                exclusive: op.exclusive,
                out: PhantomData,
            },
            opts,
        }
    }
}

impl<Out> Request<'_, AddOp<'_, Out>> {
    setters! {
        /// When the chain fails part way, DEL the plugins that ran (see
        /// [`CallOptions::rollback`]).
        pub fn rollback(opts.rollback: bool);
    }

    /// Refuses an attachment the cache holds already: fails with
    /// [`Error::AlreadyAttached`], running no plugin (libcni runs them
    /// again, and most fail deep inside: "container veth name provided
    /// (eth0) already exists"). Checked under the attachment's lock, so of
    /// several exclusive ADDs of one attachment exactly one runs its
    /// plugins.
    pub fn exclusive(mut self) -> Self {
        self.op.exclusive = true;
        self
    }

    /// Runs the ADD on a task of its own, with [`CallOptions::rollback`]
    /// on, so that dropping this future leaves nothing behind: a caller
    /// that gives up gets the plugins that ran rolled back, last to first
    /// (the plugin running then finishes first), and an ADD that had
    /// finished DELed; not when the attachment's record was in the cache
    /// before this ADD (see [`CallOptions::rollback`]).
    ///
    /// The work holds the attachment's lock until it is done, so a retry
    /// of the same attachment waits for it. [`Cni::wait_detached`] waits
    /// for all such work (before a shutdown).
    ///
    /// ```no_run
    /// # async fn demo(cni: cni_async::Cni, list: cni_core::NetworkConfigList, rt: cni_core::RuntimeConf) {
    /// use std::time::Duration;
    /// let add = cni.add_network_list(&list, &rt).rollback_on_cancel();
    /// // Gives up after 5 s: whatever the ADD made is undone on its task.
    /// if tokio::time::timeout(Duration::from_secs(5), add).await.is_err() {
    ///     cni.wait_detached().await;
    /// }
    /// # }
    /// ```
    pub fn rollback_on_cancel(mut self) -> Self {
        self.opts.rollback = true;
        self.op.detach = true;
        self
    }
}

impl<'a> Operation<'a> for AddOp<'a> {
    type Output = CniResult;

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<CniResult, Error> {
        self.attach_in_operation(cni, opts).await.map(|a| a.result)
    }
}

impl<'a> Operation<'a> for AddOp<'a, Attached> {
    type Output = Attached;

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<Attached, Error> {
        self.attach_in_operation(cni, opts).await
    }
}

impl<'a, Out> AddOp<'a, Out> {
    /// [`Self::attach`], its error naming the network, interface and verb.
    async fn attach_in_operation(self, cni: &'a Cni, opts: CallOptions) -> Result<Attached, Error> {
        let (network, rt) = (self.net.as_ref().ok().map(|n| n.name.clone()), self.rt);
        self.attach(cni, opts).await.map_err(|e| match network {
            Some(network) => Error::in_operation(&network, &rt.ifname, Command::Add, false, e),
            None => e,
        })
    }

    /// The ADD, in place or on a task of its own.
    async fn attach(self, cni: &'a Cni, opts: CallOptions) -> Result<Attached, Error> {
        let net = self.net?;
        if !self.detach {
            let added = cni
                .add(&net, self.rt, &opts, self.exclusive, &|| false)
                .await?;
            let added = added.expect("only a detached ADD is given up");
            return Ok(Attached {
                result: added.result,
                record: added.record,
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (ack, ack_rx) = tokio::sync::oneshot::channel();
        // Counted before the spawn, so that a `wait_detached` right
        // after this future is dropped sees the task.
        let counted = DetachedGuard::new(cni);
        let task = cni.clone().add_detached(
            net.clone().into_owned(),
            self.rt.clone(),
            opts,
            self.exclusive,
            (tx, ack_rx),
            counted,
        );
        // The task runs the plugins: it keeps this one's trace context.
        let handle = tokio::spawn(crate::trace::carry(crate::trace::current(), task));
        let outcome = rx.await;
        // Taken: the task leaves the attachment to the caller.
        let _ = ack.send(());
        match outcome {
            Ok(outcome) => outcome,
            // The task ended without an answer: it panicked (the
            // caller's panic, as in an ADD run in place), or the
            // runtime is shutting down.
            Err(_) => match handle.await {
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // Its plugins may have run, and no rollback: owed a DEL.
                _ => Err(Error::in_operation(
                    &net.name,
                    &self.rt.ifname,
                    Command::Add,
                    true,
                    Error::Core(cni_core::Error::InvalidConfig {
                        origin: format!("network {}", &*net.name),
                        reason: "the ADD's task was cancelled (runtime shutting down)".into(),
                    }),
                )),
            },
        }
    }
}

/// A finished ADD: its result, the record cached, and the attachment's
/// lock still held (none when the cache task holding it was lost), for a
/// detached ADD to keep until its caller took the result.
struct Added {
    result: CniResult,
    record: CacheRecord,
    lock: Option<AttachmentLock>,
    /// The attachment was recorded before this ADD.
    existed: bool,
}
