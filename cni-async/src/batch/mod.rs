//! Many network namespaces at once, each attached to the same networks: for
//! test harnesses, benchmarks and load generators (feature `netns`).
//!
//! [`BatchBuilder::setup`] creates N named namespaces (`PREFIX0`,
//! `PREFIX1`, ...) and attaches each to every network of a
//! [`MultiNetwork`], at most `concurrency` at a time; a namespace that
//! fails is reported ([`BatchMember::error`]) and the others go on.
//! [`Batch::teardown`] DELs and deletes them all, going on past errors;
//! [`Batch::keep`] leaves them for another process, whose
//! [`BatchBuilder::adopt`] takes them over. Progress comes as
//! [`BatchEvent`]s ([`BatchBuilder::on_event`]).
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
//! - **Teardown on drop blocks.** Dropping a [`Batch`] without
//!   [`Batch::teardown`] (a panicking test) tears it down anyway, on a
//!   thread with its own runtime, blocking the dropping thread (a tokio
//!   worker included) for as long as the DELs take; errors are only logged.
//!   Without a thread or runtime, the namespaces are deleted but nothing
//!   is DELeted. [`Batch::keep`] disarms it.
//! - **Cancellation.** Dropping the future of [`BatchBuilder::setup`] or
//!   [`Batch::teardown`] kills the plugins in flight and then tears down,
//!   as on drop, everything the batch created so far.
//! - **Killed processes.** Nothing runs on `SIGKILL`: the namespaces stay in
//!   `/run/netns` ([`Netns::delete_named`]) and the attachments in the
//!   plugins' state. Use a prefix unique to the run to find them.
//! - **Names are not reserved.** A name that already exists in `/run/netns`
//!   makes that member fail (`AlreadyExists`); the others go on.

mod adopt;
mod events;
mod setup;
mod teardown;

pub use adopt::{existing_namespaces, name_list};
pub use events::{BatchCounts, BatchEvent, BatchEventKind, EventCallback};
pub use setup::BatchBuilder;
pub use teardown::{TeardownEnd, current_thread_runtime};

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cni_core::cache::CacheRecord;
use cni_core::{CapabilityArgs, CniArgs};

use crate::Error;
use crate::multi::{MultiNetwork, MultiResult, NetworkRequest, Sandbox};
use crate::netns::{NETNS_RUN_DIR, Netns, NetnsGuard};
use adopt::member_path;
use events::Progress;
use teardown::blocking_teardown;

/// The default namespace name prefix.
pub const DEFAULT_PREFIX: &str = "cni-batch-";

/// Derives a member's container ID from its namespace path
/// ([`BatchBuilder::container_ids`]).
pub type ContainerIdFn = dyn Fn(&str) -> String + Send + Sync;

/// One namespace of a [`Batch`] and its outcome.
#[derive(Debug)]
pub struct BatchMember {
    index: usize,
    name: String,
    container_id: String,
    netns: Option<NetnsGuard>,
    /// An ADD was started for it: teardown owes it a DEL.
    attempted: bool,
    setup: Setup,
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

/// What a member's setup came to.
#[derive(Debug)]
enum Setup {
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
            setup: Setup::Pending,
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
        matches!(self.setup, Setup::Attached(_))
    }

    /// The aggregated result of its networks, when attached.
    pub fn result(&self) -> Option<&MultiResult> {
        match &self.setup {
            Setup::Attached(r) => Some(r),
            _ => None,
        }
    }

    /// Why its setup failed (creating the namespace, or a network: see
    /// [`MultiNetwork::setup`]).
    pub fn error(&self) -> Option<&Error> {
        match &self.setup {
            Setup::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether it was found by [`BatchBuilder::adopt`] rather than set up
    /// by this batch.
    pub fn is_adopted(&self) -> bool {
        self.adopted.is_some()
    }

    /// For an adopted member, its cached attachments on the batch's
    /// networks, which teardown DELs; empty otherwise.
    pub fn cached_attachments(&self) -> &[CacheRecord] {
        self.adopted.as_ref().map_or(&[], |a| &a.cached)
    }

    /// Whether its name is in `/run/netns` (opened, or an adopted name that
    /// teardown deletes by name).
    pub fn has_name(&self) -> bool {
        self.netns.is_some() || self.adopted.as_ref().is_some_and(|a| a.stale_name)
    }

    /// The sandbox its teardown removes.
    fn sandbox(&self, job: &Job) -> Sandbox {
        let mut sandbox = job.sandbox(&self.name, &self.container_id);
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
    job: Arc<Job>,
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
        self.job.progress.counts()
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
        &self.job.multi
    }
}

// ----- the work -----

/// What every task of a batch operation works with: the networks, the
/// sandbox each member's is made from, the concurrency bound, the
/// progress sink.
struct Job {
    multi: MultiNetwork,
    template: Sandbox,
    concurrency: usize,
    progress: Progress,
    release_failed: bool,
}

impl Job {
    fn sandbox(&self, name: &str, container_id: &str) -> Sandbox {
        self.template
            .clone()
            .with_container(member_path(name), container_id.to_owned())
    }
}

/// The members while an operation runs, shared with its tasks.
struct Members {
    /// `None` once a member was taken out (torn down).
    members: Vec<Option<BatchMember>>,
    /// Set when the operation ended or was abandoned: a namespace created
    /// after that is deleted at once instead of being recorded.
    closed: bool,
}

type Shared = Arc<Mutex<Members>>;

/// The error of a blocking namespace task (`op` on `path`) that panicked
/// or was cancelled.
fn lost_task(path: PathBuf, op: &str, join: tokio::task::JoinError) -> Error {
    Error::Netns {
        path,
        op: op.into(),
        source: std::io::Error::other(join.to_string()),
    }
}

fn lock(slots: &Mutex<Members>) -> MutexGuard<'_, Members> {
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Owns the members during an operation: if the operation's future is
/// dropped, tears down what is left (blocking, as on drop of a [`Batch`]).
struct Stage {
    job: Arc<Job>,
    slots: Shared,
}

impl Stage {
    /// The operation finished: takes the members out and disarms.
    fn finish(self) -> Vec<BatchMember> {
        self.take_members()
    }

    /// Closes the slots and takes the members left in them.
    fn take_members(&self) -> Vec<BatchMember> {
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
        let members = self.take_members();
        blocking_teardown(&self.job, members);
    }
}

/// The work of an operation and the stage that owns its members. Fields
/// drop in order: if the operation is abandoned, the work (its in-flight
/// plugins and attachment locks) goes first, then the stage tears down.
struct Running<W> {
    work: W,
    stage: Stage,
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
            job: Arc::new(Job {
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
}
