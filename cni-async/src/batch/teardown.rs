//! Tearing a batch down: at once, until a stop, on drop, or left for later.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use cni_core::error::Chain;
use futures::stream::{self, StreamExt};

use super::*;
use crate::netns::{NETNS_RUN_DIR, Netns};
use crate::{Error, Errors};

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

impl Batch {
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
        let slots = Arc::new(Mutex::new(Members {
            members: members.into_iter().map(Some).collect(),
            closed: true,
        }));
        self.job.progress.restart_clock();
        let mut running = Running {
            work: Box::pin(teardown_all(self.job.clone(), slots.clone())),
            stage: Stage {
                job: self.job.clone(),
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
        let listed = Errors::of("batch teardown", errors).into_result_listed();
        listed.map(|()| TeardownEnd::Done)
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
        blocking_teardown(&self.job, members);
    }
}

async fn teardown_all(job: Arc<Job>, slots: Shared) -> Vec<Error> {
    let indices: Vec<usize> = lock(&slots)
        .members
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.as_ref().map(|_| i))
        .collect();
    let per_member: Vec<Vec<Error>> = stream::iter(indices)
        .map(|i| teardown_one(&job, &slots, i))
        .buffer_unordered(job.concurrency)
        .collect()
        .await;
    per_member.into_iter().flatten().collect()
}

async fn teardown_one(job: &Job, slots: &Mutex<Members>, index: usize) -> Vec<Error> {
    let Some((name, attempted, sandbox)) = lock(slots).members[index]
        .as_ref()
        .map(|m| (m.name.clone(), m.attempted, m.sandbox(job)))
    else {
        return Vec::new();
    };
    let mut errors = Vec::new();
    if attempted && let Err(e) = job.multi.remove(&sandbox).await {
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
            Err(join) => errors.push(lost_task(
                Path::new(NETNS_RUN_DIR).join(&name),
                "delete",
                join,
            )),
        }
    }
    if errors.is_empty() {
        // Deleted, or (adopted) detached from a namespace already gone.
        if deleted || adopted {
            job.progress
                .emit(BatchEventKind::Deleted, index, &name, None, deleted);
        }
        return errors;
    }
    let error = Error::Context {
        context: format!("network namespace {name}"),
        // One error as it is, more as one `Error::Multiple`.
        source: Box::new(Errors::of("teardown", errors).into_result().unwrap_err()),
    };
    tracing::warn!(netns = %name, error = %Chain(&error), "batch: teardown failed");
    job.progress.emit(
        BatchEventKind::TeardownFailed,
        index,
        &name,
        Some(&error),
        deleted,
    );
    vec![error]
}

/// A current-thread tokio runtime with the IO and time drivers: what a
/// [`Batch`] dropped without [`Batch::teardown`] runs its teardown on. A
/// program that builds its own runtime with it (cnitool) keeps tokio's
/// multi-thread scheduler out of its binary (one call site of `build`):
/// about 0.4 MiB less peak RSS for a short-lived CLI.
pub fn current_thread_runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Teardown from a synchronous context (`Drop`): on a new thread with its
/// own runtime, waited for. Whatever that cannot handle is dropped here,
/// which deletes the namespaces ([`NetnsGuard`]).
pub(super) fn blocking_teardown(job: &Arc<Job>, members: Vec<BatchMember>) {
    if members.iter().all(|m| m.netns.is_none() && !m.attempted) {
        return;
    }
    let slots: Shared = Arc::new(Mutex::new(Members {
        members: members.into_iter().map(Some).collect(),
        closed: true,
    }));
    let (ctx2, slots2) = (job.clone(), slots.clone());
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
