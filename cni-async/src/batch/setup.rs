//! Setting a batch up: [`BatchBuilder`] and the work of each member.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cni_core::error::Chain;
use cni_core::validate;
use futures::stream::{self, StreamExt};

use super::*;
use crate::Error;
use crate::hidden::Hidden;
use crate::multi::{MultiNetwork, Sandbox};
use crate::netns::{NETNS_NAME_MAX, NETNS_RUN_DIR, Netns, NetnsGuard};

/// Builder of a batch; [`BatchBuilder::setup`] runs it.
#[derive(Debug)]
#[must_use]
pub struct BatchBuilder {
    pub(super) multi: MultiNetwork,
    pub(super) prefix: String,
    pub(super) count: usize,
    pub(super) concurrency: usize,
    pub(super) template: Sandbox,
    pub(super) callback: Hidden<Arc<EventCallback>>,
    pub(super) container_ids: Hidden<Arc<ContainerIdFn>>,
    pub(super) release_failed: bool,
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
            callback: Hidden(None),
            container_ids: Hidden(None),
            release_failed: false,
        }
    }

    setters! {
        /// The namespace name prefix: names are the prefix plus the index. It
        /// must make valid container IDs (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`) unless
        /// [`Self::container_ids`] derives them otherwise.
        pub fn prefix(prefix: impl Into<String>, Into::into);

        /// How many namespaces.
        pub fn count(count: usize);

        /// Labels, capability arguments and `ignore_unknown` for every
        /// namespace; its container ID and netns path are replaced by each
        /// member's.
        pub fn sandbox_template(template: Sandbox);

        /// Whether the namespace of a member whose setup failed is deleted at
        /// once, so that only the attached members remain (default: kept until
        /// teardown). Not when its rollback failed ([`Error::RollbackFailed`]):
        /// teardown DELs it again.
        pub fn release_failed(release_failed: bool);
    }

    /// How many namespaces are set up (or torn down) at once, at least 1.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Derives each member's container ID from its namespace path instead
    /// of using its name (as the reference cnitool derives it, so that
    /// `cnitool check|del NETWORK PATH` work on a member). The IDs must be
    /// valid and distinct.
    pub fn container_ids(
        mut self,
        derive: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Self {
        self.container_ids = Hidden(Some(Arc::new(derive)));
        self
    }

    /// Calls `callback` for every [`BatchEvent`], from the task (or, for a
    /// teardown on drop, the thread) doing the work. Keep it short.
    pub fn on_event(mut self, callback: impl Fn(&BatchEvent<'_>) + Send + Sync + 'static) -> Self {
        self.callback = Hidden(Some(Arc::new(callback)));
        self
    }

    /// Each member's container ID, by its name ([`Self::container_ids`]).
    pub(super) fn id_of(&self) -> impl Fn(&str) -> String + use<> {
        let derive = self.container_ids.0.clone();
        move |name: &str| match &derive {
            Some(f) => f(&member_path(name)),
            None => name.to_owned(),
        }
    }

    /// The work shared by the members of a batch of `total` namespaces.
    pub(super) fn into_job(self, total: usize, release_failed: bool) -> Arc<Job> {
        Arc::new(Job {
            multi: self.multi,
            template: self.template,
            concurrency: self.concurrency,
            progress: Progress::new(total, self.callback.0),
            release_failed,
        })
    }

    /// Creates and attaches the namespaces. Fails only when the settings are
    /// invalid; the failures of single namespaces are in the [`Batch`].
    pub async fn setup(self) -> Result<Batch, Error> {
        self.setup_until(std::future::pending()).await
    }

    /// [`Self::setup`], stopped when `stop` completes first (a signal, the
    /// caller's deadline): the plugins in flight are killed (teardown DELs
    /// their members), and the [`Batch`] holds what was set up so far
    /// ([`Batch::stopped`]).
    pub async fn setup_until(self, stop: impl Future<Output = ()>) -> Result<Batch, Error> {
        let id_of = self.id_of();
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
        let (count, release_failed) = (self.count, self.release_failed);
        let job = self.into_job(count, release_failed);
        let slots = Arc::new(Mutex::new(Members {
            members,
            closed: false,
        }));
        job.progress.restart_clock();
        let started = Instant::now();
        let work = {
            let (c, s) = (job.clone(), slots.clone());
            Box::pin(
                stream::iter(0..count)
                    .map(move |i| setup_one(c.clone(), s.clone(), i))
                    .buffer_unordered(job.concurrency),
            )
        };
        let mut running = Running {
            work,
            stage: Stage {
                job: job.clone(),
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
            job,
            members,
            setup_elapsed: started.elapsed(),
            stopped,
        })
    }
}

async fn setup_one(job: Arc<Job>, slots: Shared, index: usize) {
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
        Ok(Err(e)) => return record_failure(&job, &slots, index, &name, e),
        Err(join) => {
            let e = lost_task(Path::new(NETNS_RUN_DIR).join(&name), "create", join);
            return record_failure(&job, &slots, index, &name, e);
        }
    }
    job.progress
        .emit(BatchEventKind::Created, index, &name, None, false);

    match lock(&slots).members[index].as_mut() {
        Some(m) => m.attempted = true,
        None => return,
    }
    let outcome = job.multi.setup(&job.sandbox(&name, &container_id)).await;
    match outcome {
        Ok(result) => {
            job.progress
                .emit(BatchEventKind::Attached, index, &name, None, false);
            if let Some(m) = lock(&slots).members[index].as_mut() {
                m.setup = Setup::Attached(result);
            }
        }
        Err(e) => {
            let rolled_back = !matches!(e, Error::RollbackFailed { .. });
            record_failure(&job, &slots, index, &name, e);
            if job.release_failed && rolled_back {
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

fn record_failure(job: &Job, slots: &Mutex<Members>, index: usize, name: &str, error: Error) {
    tracing::warn!(netns = name, error = %Chain(&error), "batch: namespace setup failed");
    job.progress
        .emit(BatchEventKind::Failed, index, name, Some(&error), false);
    if let Some(m) = lock(slots).members[index].as_mut() {
        m.setup = Setup::Failed(error);
    }
}
