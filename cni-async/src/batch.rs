//! Many network namespaces at once, each attached to the same networks: for
//! test harnesses, benchmarks and load generators (feature `netns`).
//!
//! [`BatchBuilder::setup`] creates N named namespaces (`PREFIX0`,
//! `PREFIX1`, ... in `/run/netns`; the container ID of each is its name,
//! or what [`BatchBuilder::container_ids`] derives from its path),
//! attaches each to every network of a [`MultiNetwork`], at most
//! `concurrency` namespaces in flight at a time, and returns a [`Batch`]
//! holding each namespace's outcome. A namespace that cannot be created or
//! attached is reported (its [`BatchMember::error`]) and the others go on;
//! its own networks were rolled back by [`MultiNetwork::setup`]. With
//! [`BatchBuilder::release_failed`], its namespace is deleted at once too.
//! [`BatchBuilder::setup_until`] stops early (a signal, a deadline of the
//! caller's) and returns what was set up so far.
//!
//! [`Batch::teardown`] detaches every namespace from every network (DEL,
//! last network first, also for those whose setup failed: DEL is
//! idempotent) and deletes every namespace, with the same bounded
//! concurrency, going on past errors; [`Batch::teardown_until`] can be
//! stopped, leaving the rest in place. [`Batch::keep`] leaves everything in
//! place, for another process to tear down: [`BatchBuilder::adopt`] makes
//! a [`Batch`] of what a batch with the same prefix left (its namespaces
//! and their cached attachments), to tear it down the same way.
//!
//! Progress comes as [`BatchEvent`]s to the callback given to
//! [`BatchBuilder::on_event`]: a namespace created, attached, failed,
//! deleted, or its teardown failed, with running [`BatchCounts`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), cni_async::Error> {
//! use cni_async::{Cni, MultiNetwork};
//! use cni_async::batch::{BatchBuilder, BatchEventKind};
//! use cni_core::confdir;
//! use std::path::Path;
//!
//! let cni = Cni::builder().plugin_dirs(["/usr/lib/cni"]).build();
//! let list = confdir::load_network(Path::new("/etc/cni/net.d"), "bench")?;
//! let networks = MultiNetwork::builder(cni).network(list).build()?;
//!
//! let batch = BatchBuilder::new(networks)
//!     .prefix("bench-")
//!     .count(100)
//!     .concurrency(16)
//!     .on_event(|e| {
//!         if e.kind == BatchEventKind::Failed {
//!             eprintln!("{}: {}", e.name, e.error.map(|e| e.to_string()).unwrap_or_default());
//!         }
//!     })
//!     .setup()
//!     .await?;
//! println!("{} attached, {} failed in {:?}",
//!     batch.counts().attached, batch.counts().failed, batch.setup_elapsed());
//! for member in batch.attached() {
//!     println!("{} {:?}", member.name(), member.result().map(|r| r.addresses("eth0")));
//! }
//! batch.teardown().await?;
//! # Ok(()) }
//! ```
//!
//! # Caveats
//!
//! - **Teardown on drop blocks.** Dropping a [`Batch`] without calling
//!   [`Batch::teardown`] (a panicking test, an early return) tears it down
//!   anyway: `Drop` cannot await, so it starts a thread with its own
//!   current-thread tokio runtime, runs the same teardown there and waits
//!   for it. The dropping thread is blocked meanwhile (a tokio worker
//!   included), typically for as long as the DELs take. This is a safety
//!   net; call [`Batch::teardown`] to see the errors (on drop they are only
//!   logged as `tracing` warnings). If no thread or runtime can be started,
//!   the namespaces are still deleted but nothing is DELeted (host-local
//!   keeps those addresses until its dataDir is cleaned). [`Batch::keep`]
//!   disarms it.
//! - **Cancellation.** Dropping the future of [`BatchBuilder::setup`] or
//!   [`Batch::teardown`] kills the plugins in flight (see
//!   [`MultiNetwork`]'s caveats) and then tears down, as on drop, everything
//!   the batch created so far.
//! - **Killed processes.** Nothing runs on `SIGKILL`: the namespaces stay in
//!   `/run/netns` (`ip netns del`, [`Netns::delete_named`]) and the
//!   attachments in the plugins' state. Use a prefix unique to the run to
//!   find them.
//! - **Names are not reserved.** A name that already exists in `/run/netns`
//!   makes that member fail (`AlreadyExists`); the others go on.
//! - **The runtime's duties.** Each namespace is its own container: its
//!   operations run one at a time (or as [`MultiNetwork::mode`] says), and
//!   every ADD is followed by a DEL in teardown.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cni_core::cache::CacheRecord;
use cni_core::error::Chain;
use cni_core::{CapabilityArgs, CniArgs, validate};
use futures::stream::{self, StreamExt};

use crate::Error;
use crate::multi::{MultiNetwork, MultiResult, NetworkRequest, Sandbox};
use crate::netns::{NETNS_NAME_MAX, NETNS_RUN_DIR, Netns, NetnsGuard};

/// The default namespace name prefix.
pub const DEFAULT_PREFIX: &str = "cni-batch-";

/// The progress callback of a batch.
pub type EventCallback = dyn Fn(&BatchEvent<'_>) + Send + Sync;

/// Derives a member's container ID from its namespace path
/// ([`BatchBuilder::container_ids`]).
pub type ContainerIdFn = dyn Fn(&str) -> String + Send + Sync;

/// How [`Batch::teardown_until`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TeardownEnd {
    /// Every namespace was torn down.
    Done,
    /// `stop` came first: the DELs in flight were killed, and these
    /// namespaces (names) were left in place with their attachments, as
    /// [`Batch::keep`] leaves them.
    Stopped {
        /// The namespaces left, by index.
        left: Vec<String>,
    },
}

/// What happened to one namespace of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchEventKind {
    /// The namespace was created.
    Created,
    /// It is attached to every network.
    Attached,
    /// Creating it or attaching it failed (`error` says why); what was set
    /// up for it was rolled back.
    Failed,
    /// Teardown: its networks were removed and the namespace deleted (for
    /// an adopted member, also when its namespace was gone already;
    /// [`BatchCounts::deleted`] counts only deletions).
    Deleted,
    /// Teardown: removing a network or deleting the namespace failed
    /// (`error` says why); the namespace was deleted when possible (an
    /// adopted one is kept when a DEL failed).
    TeardownFailed,
}

/// Running totals of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BatchCounts {
    /// Namespaces in the batch.
    pub total: usize,
    /// Namespaces created so far.
    pub created: usize,
    /// Namespaces attached to every network so far.
    pub attached: usize,
    /// Namespaces whose setup failed so far.
    pub failed: usize,
    /// Namespaces deleted so far (teardown).
    pub deleted: usize,
    /// Namespaces whose teardown failed so far.
    pub teardown_failed: usize,
}

/// A progress report, passed to the [`BatchBuilder::on_event`] callback.
#[derive(Debug, Clone, Copy)]
pub struct BatchEvent<'a> {
    /// What happened.
    pub kind: BatchEventKind,
    /// The namespace's index in the batch.
    pub index: usize,
    /// The namespace's name.
    pub name: &'a str,
    /// The error, for [`BatchEventKind::Failed`] and
    /// [`BatchEventKind::TeardownFailed`].
    pub error: Option<&'a Error>,
    /// The totals, this event included.
    pub counts: BatchCounts,
    /// Time since the setup or teardown started.
    pub elapsed: Duration,
}

/// One namespace of a [`Batch`] and its outcome.
#[derive(Debug)]
pub struct BatchMember {
    index: usize,
    name: String,
    container_id: String,
    netns: Option<NetnsGuard>,
    /// An ADD was started for it: teardown owes it a DEL.
    attempted: bool,
    outcome: Outcome,
    /// Adopted ([`BatchBuilder::adopt`]): its cached attachments, and
    /// whether its name exists without being a namespace one can open.
    adopted: Option<Adopted>,
}

/// What [`BatchBuilder::adopt`] found for a member.
#[derive(Debug)]
struct Adopted {
    /// The attachments found in the cache, DELed with their own arguments.
    cached: Vec<CacheRecord>,
    /// `/run/netns/NAME` exists but cannot be opened as a namespace (an
    /// interrupted create left an empty file): deleted by name.
    stale_name: bool,
}

#[derive(Debug)]
enum Outcome {
    Pending,
    Attached(MultiResult),
    Failed(Error),
}

impl BatchMember {
    fn new(index: usize, name: String, container_id: String) -> Self {
        BatchMember {
            index,
            name,
            container_id,
            netns: None,
            attempted: false,
            outcome: Outcome::Pending,
            adopted: None,
        }
    }

    /// Its index in the batch (`0..count`).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The namespace name (`PREFIX` + index).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The container ID used for its attachments: the namespace name, or
    /// what [`BatchBuilder::container_ids`] derived from [`Self::path`].
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The namespace path, `/run/netns/NAME`.
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_RUN_DIR).join(&self.name)
    }

    /// The namespace, unless creating it failed (or it was released:
    /// [`BatchBuilder::release_failed`]).
    pub fn netns(&self) -> Option<&Netns> {
        self.netns.as_deref()
    }

    /// Whether it is attached to every network.
    pub fn is_attached(&self) -> bool {
        matches!(self.outcome, Outcome::Attached(_))
    }

    /// The aggregated result of its networks, when attached.
    pub fn result(&self) -> Option<&MultiResult> {
        match &self.outcome {
            Outcome::Attached(r) => Some(r),
            _ => None,
        }
    }

    /// Why its setup failed (creating the namespace, or a network: see
    /// [`MultiNetwork::setup`]).
    pub fn error(&self) -> Option<&Error> {
        match &self.outcome {
            Outcome::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether it was found by [`BatchBuilder::adopt`] rather than set up
    /// by this batch.
    pub fn is_adopted(&self) -> bool {
        self.adopted.is_some()
    }

    /// For an adopted member, its cached attachments on the batch's
    /// networks: what teardown DELs, each with the arguments cached at
    /// ADD. Empty otherwise, and for an adopted namespace without any
    /// (teardown then DELs it as the batch's sandbox template says).
    pub fn cached_attachments(&self) -> &[CacheRecord] {
        self.adopted.as_ref().map_or(&[], |a| &a.cached)
    }

    /// Whether its name is in `/run/netns` (opened, or an adopted name that
    /// is not a namespace one can open: teardown deletes it by name).
    pub fn has_name(&self) -> bool {
        self.netns.is_some() || self.adopted.as_ref().is_some_and(|a| a.stale_name)
    }

    /// The sandbox its teardown removes.
    fn sandbox(&self, ctx: &Ctx) -> Sandbox {
        let mut sandbox = ctx.sandbox(&self.name, &self.container_id);
        if let Some(adopted) = &self.adopted
            && !adopted.cached.is_empty()
        {
            // Exactly the cached attachments, with their cached arguments.
            sandbox.labels = CniArgs::new();
            sandbox.capability_args = CapabilityArgs::new();
            sandbox.ignore_unknown = false;
            sandbox.networks = adopted
                .cached
                .iter()
                .map(|rec| NetworkRequest {
                    network: rec.network_name.clone(),
                    ifname: Some(rec.if_name.clone()),
                    args: rec.cni_args.clone(),
                    capability_args: rec.capability_args.clone(),
                })
                .collect();
        }
        if self.netns.is_none() {
            // The namespace is gone: DEL without one, as the spec allows.
            sandbox.netns.clear();
        }
        sandbox
    }
}

/// Builder of a batch; [`BatchBuilder::setup`] runs it.
#[must_use]
pub struct BatchBuilder {
    multi: MultiNetwork,
    prefix: String,
    count: usize,
    concurrency: usize,
    template: Sandbox,
    callback: Option<Arc<EventCallback>>,
    container_ids: Option<Arc<ContainerIdFn>>,
    release_failed: bool,
}

impl fmt::Debug for BatchBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchBuilder")
            .field("multi", &self.multi)
            .field("prefix", &self.prefix)
            .field("count", &self.count)
            .field("concurrency", &self.concurrency)
            .field("template", &self.template)
            .field("callback", &self.callback.is_some())
            .field("container_ids", &self.container_ids.is_some())
            .field("release_failed", &self.release_failed)
            .finish()
    }
}

impl BatchBuilder {
    /// A batch of one namespace named `cni-batch-0` on `multi`'s networks,
    /// with as many in flight as the machine has CPUs.
    pub fn new(multi: MultiNetwork) -> Self {
        BatchBuilder {
            multi,
            prefix: DEFAULT_PREFIX.to_owned(),
            count: 1,
            concurrency: std::thread::available_parallelism().map_or(4, usize::from),
            template: Sandbox::new("", ""),
            callback: None,
            container_ids: None,
            release_failed: false,
        }
    }

    /// The namespace name prefix: names are the prefix plus the index. It
    /// must make valid container IDs (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`) unless
    /// [`Self::container_ids`] derives them otherwise.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many namespaces.
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }

    /// How many namespaces are set up (or torn down) at once, at least 1.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Labels, capability arguments and `ignore_unknown` for every
    /// namespace; its container ID and netns path are replaced by each
    /// member's.
    pub fn sandbox_template(mut self, template: Sandbox) -> Self {
        self.template = template;
        self
    }

    /// Derives each member's container ID from its namespace path
    /// (`/run/netns/NAME`) instead of using its name: e.g. as the reference
    /// cnitool derives it, so that `cnitool check|del NETWORK PATH` work on
    /// a member. The IDs must be valid and distinct.
    pub fn container_ids(
        mut self,
        derive: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Self {
        self.container_ids = Some(Arc::new(derive));
        self
    }

    /// Whether a member whose setup failed is undone at once: after the
    /// rollback of its networks ([`MultiNetwork::setup`]), its namespace is
    /// deleted, so that only the attached members remain (default: kept
    /// until teardown). When the rollback failed (the error is
    /// [`Error::RollbackFailed`]; [`MultiNetwork::setup`] has DELed once
    /// more already), the member keeps its namespace and teardown DELs it
    /// again. A namespace that cannot be deleted is logged and left.
    pub fn release_failed(mut self, on: bool) -> Self {
        self.release_failed = on;
        self
    }

    /// Calls `callback` for every [`BatchEvent`], from the task (or, for a
    /// teardown on drop, the thread) doing the work. Keep it short.
    pub fn on_event(mut self, callback: impl Fn(&BatchEvent<'_>) + Send + Sync + 'static) -> Self {
        self.callback = Some(Arc::new(callback));
        self
    }

    /// Creates and attaches the namespaces. Fails only when the settings are
    /// invalid (a prefix that makes bad names, bad labels); the failures of
    /// single namespaces are in the [`Batch`].
    pub async fn setup(self) -> Result<Batch, Error> {
        self.setup_until(std::future::pending()).await
    }

    /// [`Self::setup`], stopped when `stop` completes first (a signal, the
    /// caller's deadline): the plugins in flight are killed (their members'
    /// networks are owed a DEL, which teardown runs), no namespace is
    /// started after that, and the [`Batch`] holds what was set up so far
    /// ([`Batch::stopped`] says so). Tear it down, keep it or drop it as
    /// any other.
    pub async fn setup_until(self, stop: impl Future<Output = ()>) -> Result<Batch, Error> {
        let derive = self.container_ids.clone();
        let id_of = move |name: &str| match &derive {
            Some(f) => f(&member_path(name)),
            None => name.to_owned(),
        };
        if self.count > 0 {
            let first = format!("{}0", self.prefix);
            let last = format!("{}{}", self.prefix, self.count - 1);
            validate::container_id(&id_of(&first))?;
            validate::container_id(&id_of(&last))?;
            if last.len() > NETNS_NAME_MAX {
                return Err(Error::NetnsName {
                    name: last,
                    reason: "longer than 255 bytes",
                });
            }
            self.template
                .clone()
                .with_container(member_path(&first), id_of(&first))
                .validate()?;
        }
        let members = (0..self.count)
            .map(|i| {
                let name = format!("{}{i}", self.prefix);
                let id = id_of(&name);
                Some(BatchMember::new(i, name, id))
            })
            .collect();
        let ctx = Arc::new(Ctx {
            multi: self.multi,
            template: self.template,
            concurrency: self.concurrency,
            progress: Progress::new(self.count, self.callback),
            release_failed: self.release_failed,
        });
        let slots = Arc::new(Mutex::new(Slots {
            members,
            closed: false,
        }));
        ctx.progress.restart_clock();
        let started = Instant::now();
        let work = {
            let (c, s) = (ctx.clone(), slots.clone());
            Box::pin(
                stream::iter(0..self.count)
                    .map(move |i| setup_one(c.clone(), s.clone(), i))
                    .buffer_unordered(ctx.concurrency),
            )
        };
        let mut running = Running {
            work,
            stage: Stage {
                ctx: ctx.clone(),
                slots,
            },
        };
        let stopped = {
            let drive = async { while running.work.next().await.is_some() {} };
            tokio::select! {
                () = drive => false,
                () = stop => true,
            }
        };
        let Running { work, stage } = running;
        // Kills the plugins still running; then the members are taken out.
        drop(work);
        let members = stage.finish();
        Ok(Batch {
            ctx,
            members,
            setup_elapsed: started.elapsed(),
            stopped,
        })
    }
}

impl BatchBuilder {
    /// Adopts the batch with this builder's prefix that another process
    /// (or an earlier run) set up and left ([`Batch::keep`], `cnitool
    /// batch up`, a killed harness), so that [`Batch::teardown`] or
    /// [`Batch::teardown_until`] removes it. The members are:
    ///
    /// - every namespace `PREFIX<number>` in `/run/netns` (a prefix must
    ///   not end with a digit, so that `t` does not claim `t1`'s `t10`);
    /// - every cached attachment ([`Cni::cached_attachments`](crate::Cni::cached_attachments)) on one of
    ///   the batch's networks whose netns is `/run/netns/PREFIX<number>`
    ///   and whose container ID is the member's (its name, or what
    ///   [`Self::container_ids`] derives from the path), also when that
    ///   namespace is gone.
    ///
    /// The batch's networks are those the [sandbox
    /// template](Self::sandbox_template) names, or else the
    /// `MultiNetwork`'s. Members are ordered by number; `count` is ignored.
    ///
    /// Teardown DELs each member's cached attachments (on any interface)
    /// with the arguments cached at ADD and, for a network the
    /// `MultiNetwork` does not have (its file is gone: build it with
    /// [`MultiNetworkBuilder::allow_empty`](crate::multi::MultiNetworkBuilder::allow_empty)),
    /// with the configuration cached at ADD ([`MultiNetwork::remove`]).
    /// A namespace without cached attachments (a setup killed mid-ADD) is
    /// removed as the sandbox template describes it. Then the namespace is
    /// deleted; unlike a batch set up here, an adopted namespace whose DELs
    /// failed is kept, so that adopting it again retries with the same
    /// inputs.
    ///
    /// Fails when namespaces `PREFIX<number>` exist but nothing ties them
    /// to the batch: none of its networks is known to the `MultiNetwork`
    /// and none has a cached attachment in them (a mistyped network name
    /// must not delete another batch). Also when the prefix is invalid, or
    /// `/run/netns` or the cache cannot be read.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), cni_async::Error> {
    /// use cni_async::{Cni, MultiNetwork};
    /// use cni_async::batch::BatchBuilder;
    /// use cni_core::confdir;
    /// use std::path::Path;
    ///
    /// let cni = Cni::builder().plugin_dirs(["/usr/lib/cni"]).build();
    /// let list = confdir::load_network(Path::new("/etc/cni/net.d"), "bench")?;
    /// let networks = MultiNetwork::builder(cni).network(list).build()?;
    ///
    /// // What a killed run of `BatchBuilder::new(..).prefix("bench-")` left.
    /// let batch = BatchBuilder::new(networks).prefix("bench-").adopt().await?;
    /// for m in batch.members() {
    ///     println!("{}: {} cached attachment(s)", m.name(), m.cached_attachments().len());
    /// }
    /// batch.teardown().await?;
    /// # Ok(()) }
    /// ```
    pub async fn adopt(self) -> Result<Batch, Error> {
        if self.prefix.ends_with(|c: char| c.is_ascii_digit()) {
            return Err(Error::NetnsName {
                name: self.prefix,
                reason: "a batch prefix must not end with a digit",
            });
        }
        let derive = self.container_ids.clone();
        let id_of = move |name: &str| match &derive {
            Some(f) => f(&member_path(name)),
            None => name.to_owned(),
        };
        let networks: Vec<String> = if self.template.networks.is_empty() {
            self.multi
                .networks()
                .iter()
                .map(|n| n.name().to_owned())
                .collect()
        } else {
            self.template
                .networks
                .iter()
                .map(|r| r.network.clone())
                .collect()
        };
        let prefix = self.prefix.clone();
        let names = tokio::task::spawn_blocking(move || existing_namespaces(&prefix))
            .await
            .map_err(|join| Error::Netns {
                path: PathBuf::from(NETNS_RUN_DIR),
                op: "list".into(),
                source: io::Error::other(join.to_string()),
            })??;

        // By (length, name): `P2` before `P10`.
        let mut found: BTreeMap<(usize, String), (bool, Vec<CacheRecord>)> = names
            .iter()
            .map(|n| ((n.len(), n.clone()), (true, Vec::new())))
            .collect();
        let mut cached = 0usize;
        for rec in self.multi.cni().cached_attachments(None).await? {
            let Some(name) = rec
                .netns
                .strip_prefix(NETNS_RUN_DIR)
                .and_then(|n| n.strip_prefix('/'))
            else {
                continue;
            };
            if !is_member(&self.prefix, name)
                || !networks.contains(&rec.network_name)
                || rec.container_id != id_of(name)
            {
                continue;
            }
            cached += 1;
            found
                .entry((name.len(), name.to_owned()))
                .or_insert_with(|| (false, Vec::new()))
                .1
                .push(rec);
        }
        if cached == 0 && !names.is_empty() && networks.iter().all(|n| self.multi.find(n).is_none())
        {
            return Err(Error::Core(cni_core::Error::InvalidParameter {
                field: "prefix",
                value: self.prefix,
                reason: format!(
                    "{} network namespaces with this prefix exist ({}), but network(s) {} have                      neither a configuration nor cached attachments in them",
                    names.len(),
                    name_list(&names),
                    networks
                        .iter()
                        .map(|n| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                code: cni_core::error::code::INVALID_NETWORK_CONFIG,
            }));
        }

        let mut members = Vec::with_capacity(found.len());
        for (index, ((_, name), (listed, cached))) in found.into_iter().enumerate() {
            let id = id_of(&name);
            validate::container_id(&id)?;
            let mut member = BatchMember::new(index, name, id);
            member.attempted = true;
            let mut stale_name = false;
            if listed {
                let open = member.name.clone();
                match tokio::task::spawn_blocking(move || Netns::open_named(&open)).await {
                    Ok(Ok(ns)) => member.netns = Some(NetnsGuard::new(ns)),
                    // Gone meanwhile: nothing to delete.
                    Ok(Err(Error::Netns { source, .. }))
                        if source.kind() == io::ErrorKind::NotFound => {}
                    // Not a namespace (an empty file): deleted by name.
                    Ok(Err(_)) => stale_name = true,
                    Err(join) => {
                        return Err(Error::Netns {
                            path: member.path(),
                            op: "open".into(),
                            source: io::Error::other(join.to_string()),
                        });
                    }
                }
            }
            member.adopted = Some(Adopted { cached, stale_name });
            members.push(member);
        }
        let ctx = Arc::new(Ctx {
            multi: self.multi,
            template: self.template,
            concurrency: self.concurrency,
            progress: Progress::new(members.len(), self.callback),
            release_failed: false,
        });
        Ok(Batch {
            ctx,
            members,
            setup_elapsed: Duration::ZERO,
            stopped: false,
        })
    }
}

/// The namespaces `PREFIX<number>` in `/run/netns`, by number (`P2`
/// before `P10`): the names a batch with this prefix owns
/// ([`BatchBuilder::adopt`] adopts them).
pub fn existing_namespaces(prefix: &str) -> Result<Vec<String>, Error> {
    let mut names: Vec<String> = Netns::list_named()?
        .into_iter()
        .filter(|n| is_member(prefix, n))
        .collect();
    names.sort_by_key(|n| (n.len(), n.clone()));
    Ok(names)
}

/// Whether `name` is `prefix` followed by one or more digits.
fn is_member(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Names as batch errors list them: the first five, then how many more
/// (`a, b, c, d, e and 4 more`).
pub fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// `/run/netns/NAME`, as a string (what `CNI_NETNS` gets).
fn member_path(name: &str) -> String {
    Path::new(NETNS_RUN_DIR).join(name).display().to_string()
}

impl Sandbox {
    fn with_container(mut self, netns: String, container_id: String) -> Self {
        self.netns = netns;
        self.container_id = container_id;
        self
    }
}

/// Namespaces created and attached by [`BatchBuilder::setup`]; see the
/// [module docs](self). Dropping it tears it down (blocking).
pub struct Batch {
    ctx: Arc<Ctx>,
    members: Vec<BatchMember>,
    setup_elapsed: Duration,
    stopped: bool,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("members", &self.members)
            .field("counts", &self.counts())
            .field("setup_elapsed", &self.setup_elapsed)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// A builder (see [`BatchBuilder`]).
    pub fn builder(multi: MultiNetwork) -> BatchBuilder {
        BatchBuilder::new(multi)
    }

    /// Every namespace, by index.
    pub fn members(&self) -> &[BatchMember] {
        &self.members
    }

    /// The namespaces attached to every network.
    pub fn attached(&self) -> impl Iterator<Item = &BatchMember> {
        self.members.iter().filter(|m| m.is_attached())
    }

    /// The namespaces whose setup failed.
    pub fn failed(&self) -> impl Iterator<Item = &BatchMember> {
        self.members.iter().filter(|m| m.error().is_some())
    }

    /// The totals so far.
    pub fn counts(&self) -> BatchCounts {
        self.ctx.progress.counts()
    }

    /// How long [`BatchBuilder::setup`] took.
    pub fn setup_elapsed(&self) -> Duration {
        self.setup_elapsed
    }

    /// Whether [`BatchBuilder::setup_until`] was stopped before every
    /// namespace was set up.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// How many namespaces teardown has work for: those that exist, or
    /// whose networks are owed a DEL.
    pub fn pending_teardown(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.netns.is_some() || m.attempted)
            .count()
    }

    /// The networks.
    pub fn networks(&self) -> &MultiNetwork {
        &self.ctx.multi
    }

    /// Detaches every namespace from every network and deletes it, with the
    /// batch's concurrency, going on past errors. Fails with
    /// [`Error::Multiple`] listing, per namespace, what could not be undone
    /// (an [`Error::Context`] naming the namespace).
    pub async fn teardown(self) -> Result<(), Error> {
        self.teardown_until(std::future::pending())
            .await
            .map(|_| ())
    }

    /// [`Self::teardown`], stopped when `stop` completes first (a second
    /// signal): the DELs in flight are killed and what was not torn down
    /// yet is left in place ([`TeardownEnd::Stopped`]), for another
    /// teardown (e.g. by another process) to finish. Otherwise as
    /// [`Self::teardown`]: [`TeardownEnd::Done`], or the errors.
    pub async fn teardown_until(
        mut self,
        stop: impl Future<Output = ()>,
    ) -> Result<TeardownEnd, Error> {
        let members = std::mem::take(&mut self.members);
        let slots = Arc::new(Mutex::new(Slots {
            members: members.into_iter().map(Some).collect(),
            closed: true,
        }));
        self.ctx.progress.restart_clock();
        let mut running = Running {
            work: Box::pin(teardown_all(self.ctx.clone(), slots.clone())),
            stage: Stage {
                ctx: self.ctx.clone(),
                slots: slots.clone(),
            },
        };
        let errors = tokio::select! {
            errors = &mut running.work => Some(errors),
            () = stop => None,
        };
        let Running { work, stage } = running;
        drop(work);
        let Some(errors) = errors else {
            // Stopped: disarm the stage and leave the rest in place.
            let left = keep_members(stage.finish());
            return Ok(TeardownEnd::Stopped { left });
        };
        drop(stage);
        if errors.is_empty() {
            Ok(TeardownEnd::Done)
        } else {
            Err(Error::Multiple {
                operation: "batch teardown".into(),
                errors: errors.into(),
            })
        }
    }

    /// Leaves everything in place (namespaces and attachments) and returns
    /// the names of the namespaces that exist. Nothing is torn down on drop.
    pub fn keep(mut self) -> Vec<String> {
        keep_members(std::mem::take(&mut self.members))
    }
}

/// Disarms the members' guards; the names of the namespaces that exist.
fn keep_members(members: Vec<BatchMember>) -> Vec<String> {
    members
        .into_iter()
        .filter_map(|m| {
            let netns = m.netns?;
            drop(netns.into_inner());
            Some(m.name)
        })
        .collect()
}

impl Drop for Batch {
    fn drop(&mut self) {
        let members = std::mem::take(&mut self.members);
        blocking_teardown(&self.ctx, members);
    }
}

// ----- the work -----

struct Ctx {
    multi: MultiNetwork,
    template: Sandbox,
    concurrency: usize,
    progress: Progress,
    release_failed: bool,
}

impl Ctx {
    fn sandbox(&self, name: &str, container_id: &str) -> Sandbox {
        self.template
            .clone()
            .with_container(member_path(name), container_id.to_owned())
    }
}

struct Progress {
    total: usize,
    created: AtomicUsize,
    attached: AtomicUsize,
    failed: AtomicUsize,
    deleted: AtomicUsize,
    teardown_failed: AtomicUsize,
    clock: Mutex<Instant>,
    callback: Option<Arc<EventCallback>>,
}

impl Progress {
    fn new(total: usize, callback: Option<Arc<EventCallback>>) -> Self {
        Progress {
            total,
            created: AtomicUsize::new(0),
            attached: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            deleted: AtomicUsize::new(0),
            teardown_failed: AtomicUsize::new(0),
            clock: Mutex::new(Instant::now()),
            callback,
        }
    }

    fn restart_clock(&self) {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn counts(&self) -> BatchCounts {
        BatchCounts {
            total: self.total,
            created: self.created.load(Ordering::Relaxed),
            attached: self.attached.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            deleted: self.deleted.load(Ordering::Relaxed),
            teardown_failed: self.teardown_failed.load(Ordering::Relaxed),
        }
    }

    /// Counts the event (and, with `deleted`, the namespace's deletion),
    /// then reports it.
    fn emit(
        &self,
        kind: BatchEventKind,
        index: usize,
        name: &str,
        error: Option<&Error>,
        deleted: bool,
    ) {
        let counter = match kind {
            BatchEventKind::Created => Some(&self.created),
            BatchEventKind::Attached => Some(&self.attached),
            BatchEventKind::Failed => Some(&self.failed),
            BatchEventKind::Deleted => None,
            BatchEventKind::TeardownFailed => Some(&self.teardown_failed),
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if deleted {
            self.deleted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(cb) = &self.callback {
            let elapsed = self
                .clock
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .elapsed();
            cb(&BatchEvent {
                kind,
                index,
                name,
                error,
                counts: self.counts(),
                elapsed,
            });
        }
    }
}

/// The members while an operation runs, shared with its tasks.
struct Slots {
    /// `None` once a member was taken out (torn down).
    members: Vec<Option<BatchMember>>,
    /// Set when the operation ended or was abandoned: a namespace created
    /// after that is deleted at once instead of being recorded.
    closed: bool,
}

type Shared = Arc<Mutex<Slots>>;

fn lock(slots: &Mutex<Slots>) -> MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Owns the members during an operation: if the operation's future is
/// dropped, tears down what is left (blocking, as on drop of a [`Batch`]).
struct Stage {
    ctx: Arc<Ctx>,
    slots: Shared,
}

impl Stage {
    /// The operation finished: takes the members out and disarms.
    fn finish(self) -> Vec<BatchMember> {
        let mut slots = lock(&self.slots);
        slots.closed = true;
        std::mem::take(&mut slots.members)
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let members: Vec<BatchMember> = {
            let mut slots = lock(&self.slots);
            slots.closed = true;
            std::mem::take(&mut slots.members)
                .into_iter()
                .flatten()
                .collect()
        };
        blocking_teardown(&self.ctx, members);
    }
}

/// The work of an operation and the stage that owns its members. Fields
/// drop in order: if the operation is abandoned, the work (its in-flight
/// plugins and attachment locks) goes first, then the stage tears down.
struct Running<W> {
    work: W,
    stage: Stage,
}

async fn setup_one(ctx: Arc<Ctx>, slots: Shared, index: usize) {
    let Some((name, container_id)) = lock(&slots).members[index]
        .as_ref()
        .map(|m| (m.name.clone(), m.container_id.clone()))
    else {
        return;
    };
    let created = {
        let (slots, name) = (slots.clone(), name.clone());
        tokio::task::spawn_blocking(move || -> Result<bool, Error> {
            let ns = Netns::create(&name)?;
            let mut s = lock(&slots);
            if !s.closed
                && let Some(member) = s.members[index].as_mut()
            {
                member.netns = Some(NetnsGuard::new(ns));
                return Ok(true);
            }
            // The batch was abandoned while this ran.
            drop(s);
            ns.delete()?;
            Ok(false)
        })
        .await
    };
    match created {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return,
        Ok(Err(e)) => return record_failure(&ctx, &slots, index, &name, e),
        Err(join) => {
            let e = Error::Netns {
                path: Path::new(NETNS_RUN_DIR).join(&name),
                op: "create".into(),
                source: io::Error::other(join.to_string()),
            };
            return record_failure(&ctx, &slots, index, &name, e);
        }
    }
    ctx.progress
        .emit(BatchEventKind::Created, index, &name, None, false);

    match lock(&slots).members[index].as_mut() {
        Some(m) => m.attempted = true,
        None => return,
    }
    let outcome = ctx.multi.setup(&ctx.sandbox(&name, &container_id)).await;
    match outcome {
        Ok(result) => {
            ctx.progress
                .emit(BatchEventKind::Attached, index, &name, None, false);
            if let Some(m) = lock(&slots).members[index].as_mut() {
                m.outcome = Outcome::Attached(result);
            }
        }
        Err(e) => {
            let rolled_back = !matches!(e, Error::RollbackFailed { .. });
            record_failure(&ctx, &slots, index, &name, e);
            if ctx.release_failed && rolled_back {
                release(&slots, index, &name).await;
            }
        }
    }
}

/// A failed member whose networks were rolled back: deletes its namespace
/// now; nothing is owed to it any more. A namespace that cannot be deleted
/// is logged and stays in `/run/netns` ([`Netns::delete_named`]).
async fn release(slots: &Shared, index: usize, name: &str) {
    let guard = match lock(slots).members[index].as_mut() {
        Some(m) => {
            m.attempted = false;
            m.netns.take()
        }
        None => None,
    };
    let Some(guard) = guard else { return };
    let error = match tokio::task::spawn_blocking(move || guard.delete()).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => Chain(&e).to_string(),
        Err(join) => join.to_string(),
    };
    tracing::warn!(
        netns = name,
        error,
        "batch: cannot delete the namespace of a failed member"
    );
}

fn record_failure(ctx: &Ctx, slots: &Mutex<Slots>, index: usize, name: &str, error: Error) {
    tracing::warn!(netns = name, error = %Chain(&error), "batch: namespace setup failed");
    ctx.progress
        .emit(BatchEventKind::Failed, index, name, Some(&error), false);
    if let Some(m) = lock(slots).members[index].as_mut() {
        m.outcome = Outcome::Failed(error);
    }
}

async fn teardown_all(ctx: Arc<Ctx>, slots: Shared) -> Vec<Error> {
    let indices: Vec<usize> = lock(&slots)
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.as_ref().map(|_| i))
        .collect();
    let per_member: Vec<Vec<Error>> = stream::iter(indices)
        .map(|i| teardown_one(&ctx, &slots, i))
        .buffer_unordered(ctx.concurrency)
        .collect()
        .await;
    per_member.into_iter().flatten().collect()
}

async fn teardown_one(ctx: &Ctx, slots: &Mutex<Slots>, index: usize) -> Vec<Error> {
    let Some((name, attempted, sandbox)) = lock(slots).members[index]
        .as_ref()
        .map(|m| (m.name.clone(), m.attempted, m.sandbox(ctx)))
    else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    if attempted && let Err(e) = ctx.multi.remove(&sandbox).await {
        errors.push(e);
    }
    // Only now is the member taken out: if this future is dropped before,
    // whoever tears down next still sees it.
    let Some(member) = lock(slots).members[index].take() else {
        return errors;
    };
    let adopted = member.adopted.is_some();
    let stale_name = member.adopted.as_ref().is_some_and(|a| a.stale_name);
    let mut deleted = false;
    if adopted && !errors.is_empty() {
        // An adopted namespace stays for the next try, with its inputs.
        drop(keep_members(vec![member]));
    } else if member.netns.is_some() || stale_name {
        let guard = member.netns;
        let by_name = name.clone();
        let outcome = tokio::task::spawn_blocking(move || match guard {
            Some(guard) => guard.delete(),
            None => Netns::delete_named(&by_name),
        })
        .await;
        match outcome {
            Ok(Ok(())) => deleted = true,
            Ok(Err(e)) => errors.push(e),
            Err(join) => errors.push(Error::Netns {
                path: Path::new(NETNS_RUN_DIR).join(&name),
                op: "delete".into(),
                source: io::Error::other(join.to_string()),
            }),
        }
    }
    if errors.is_empty() {
        // Deleted, or (adopted) detached from a namespace already gone.
        if deleted || adopted {
            ctx.progress
                .emit(BatchEventKind::Deleted, index, &name, None, deleted);
        }
        return errors;
    }
    let error = Error::Context {
        context: format!("network namespace {name}"),
        source: Box::new(if errors.len() == 1 {
            errors.remove(0)
        } else {
            Error::Multiple {
                operation: "teardown".into(),
                errors: errors.into(),
            }
        }),
    };
    tracing::warn!(netns = %name, error = %Chain(&error), "batch: teardown failed");
    ctx.progress.emit(
        BatchEventKind::TeardownFailed,
        index,
        &name,
        Some(&error),
        deleted,
    );
    vec![error]
}

/// A current-thread tokio runtime with the IO and time drivers: what a
/// [`Batch`] dropped without [`Batch::teardown`] runs its teardown on.
///
/// A program that builds its own runtime with this function (cnitool does)
/// keeps one call site of tokio's `Builder::build`, which the compiler
/// specializes to the current-thread scheduler, so tokio's multi-thread
/// scheduler stays out of the binary even when a dependency turns on
/// `rt-multi-thread`. A second call site links it in: for a short-lived CLI
/// whose whole executable is mapped, that is about 0.4 MiB more peak RSS.
pub fn current_thread_runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Teardown from a synchronous context (`Drop`): on a new thread with its
/// own runtime, waited for. Whatever that cannot handle is dropped here,
/// which deletes the namespaces ([`NetnsGuard`]).
fn blocking_teardown(ctx: &Arc<Ctx>, members: Vec<BatchMember>) {
    if members.iter().all(|m| m.netns.is_none() && !m.attempted) {
        return;
    }
    let slots: Shared = Arc::new(Mutex::new(Slots {
        members: members.into_iter().map(Some).collect(),
        closed: true,
    }));
    let (ctx2, slots2) = (ctx.clone(), slots.clone());
    let spawned = std::thread::Builder::new()
        .name("cni-batch-teardown".into())
        .spawn(move || {
            match current_thread_runtime() {
                Ok(rt) => {
                    for e in rt.block_on(teardown_all(ctx2, slots2)) {
                        tracing::warn!(error = %Chain(&e), "batch teardown on drop");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "batch teardown on drop: no runtime; deleting the namespaces without DEL");
                }
            }
        });
    match spawned {
        Ok(handle) => {
            if handle.join().is_err() {
                tracing::warn!("batch teardown on drop panicked");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "batch teardown on drop: cannot start a thread; deleting the namespaces without DEL");
        }
    }
    // Left over only when the thread or its runtime could not do the work.
    let left: Vec<BatchMember> = std::mem::take(&mut lock(&slots).members)
        .into_iter()
        .flatten()
        .collect();
    drop(left);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cni;
    use cni_core::NetworkConfigList;

    fn assert_send<T: Send>(_: &T) {}
    fn assert_send_sync<T: Send + Sync>() {}

    /// Callers spawn these on multi-threaded runtimes.
    #[test]
    fn futures_and_handles_are_send() {
        assert_send_sync::<Batch>();
        assert_send_sync::<MultiNetwork>();
        let list = NetworkConfigList::from_bytes(
            br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"}]}"#,
            None,
        )
        .unwrap();
        let multi = MultiNetwork::builder(Cni::default())
            .network(list)
            .build()
            .unwrap();
        let sandbox = Sandbox::new("c1", "");
        assert_send(&multi.setup(&sandbox));
        assert_send(&multi.remove(&sandbox));
        assert_send(&multi.check(&sandbox));
        assert_send(&multi.status());
        assert_send(&BatchBuilder::new(multi.clone()).setup());
        let empty = Batch {
            ctx: Arc::new(Ctx {
                multi,
                template: Sandbox::new("", ""),
                concurrency: 1,
                progress: Progress::new(0, None),
                release_failed: false,
            }),
            members: Vec::new(),
            setup_elapsed: Duration::ZERO,
            stopped: false,
        };
        // Never polled: dropping it drops the (empty) batch.
        assert_send(&empty.teardown());
    }

    #[test]
    fn members_are_prefix_and_digits_and_long_name_lists_are_cut() {
        assert!(is_member("t-", "t-0"));
        assert!(is_member("t-", "t-123"));
        assert!(!is_member("t-", "t-"));
        assert!(!is_member("t-", "t-1a"));
        assert!(!is_member("t-", "tt-1"));
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        assert_eq!(name_list(&names[..2]), "n0, n1");
        assert_eq!(name_list(&names), "n0, n1, n2, n3, n4 and 3 more");
    }
}
