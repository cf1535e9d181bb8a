//! The one orchestration of a sandbox's networks: setup (ADD of each, the
//! networks set up undone when one fails), removal (DEL of each, last to
//! first, going on past failures) and CHECK, each network's step under its
//! shared GC gate ([`NetworkGates`]).
//!
//! [`MultiNetwork`](super::MultiNetwork) runs it with plain steps; a
//! runtime that does more around each step (cnid: its ADD journal)
//! implements [`StepHook`] and calls [`setup_steps`], [`remove_steps`] and
//! [`check_steps`] itself (feature `daemon`), its own refusals carried as
//! [`HookError`]s.

use std::future::Future;

use cni_core::result::CniResult;
use cni_core::{Command, NetworkConfigList, RuntimeConf};
use futures::future::join_all;

use super::{NetworkGates, NetworkResult, SetupMode};
use crate::error::Errors;
use crate::{CallOptions, Cni, Error, ErrorKind};

/// One network of a sandbox's operation.
#[derive(Debug, Clone, Copy)]
pub struct SandboxStep<'a> {
    /// The network name.
    pub network: &'a str,
    /// Its configuration; `None` when the network is not known (any more):
    /// a DEL then uses the configuration cached at ADD, ADD and CHECK are
    /// refused before any step runs.
    pub list: Option<&'a NetworkConfigList>,
    /// The runtime configuration (container ID, netns, ifname, arguments).
    pub rt: &'a RuntimeConf,
}

/// An error a [`StepHook`] answers with itself (a refusal of the
/// runtime's own), returned as [`Error::hook`] and carried untouched
/// ([`Error::hook_error`]).
#[cfg(feature = "daemon")]
pub trait HookError: std::error::Error + Send + Sync + 'static {
    /// Its CNI error object (code, msg, details), written in `cni_version`.
    fn to_error_object(&self, cni_version: &str) -> cni_core::ErrorObject;

    /// The plugin whose failure it reports, with the verb it ran.
    fn failed_plugin(&self) -> Option<(&str, Command)> {
        None
    }
}

/// What each step of [`setup_steps`], [`remove_steps`] and [`check_steps`]
/// runs, and with which options. The provided `add`, `del` and `check` are
/// the plain [`Cni`] calls; a runtime overrides them to do more around
/// each step. Each runs under the network's shared gate, taken by the
/// orchestration.
pub trait StepHook: Sync {
    /// The [`Cni`] the provided steps run on.
    fn cni(&self) -> &Cni;

    /// The gates the steps take (shared).
    fn gates(&self) -> &NetworkGates;

    /// The options of a step of `command`, asked for just before it runs
    /// (after its gate was granted). A setup's ADD gets
    /// [`CallOptions::rollback`] on top.
    fn options(&self, command: Command) -> CallOptions;

    /// The options of a DEL that undoes a network of a failed setup: a
    /// fresh deadline, never the expired one of the ADD.
    fn undo_options(&self) -> CallOptions;

    /// ADD of one network, refused ([`Error::AlreadyAttached`], no plugin
    /// run) when the attachment is recorded already
    /// ([`AddRequest::exclusive`](crate::ops::AddRequest::exclusive)).
    ///
    /// An override must refuse so too: [`setup_steps`] deletes again every
    /// network whose ADD succeeded when another fails, which is right only
    /// for attachments this ADD made.
    fn add(
        &self,
        step: SandboxStep<'_>,
        opts: CallOptions,
    ) -> impl Future<Output = Result<CniResult, Error>> + Send {
        async move {
            let list = known_list(step)?;
            self.cni()
                .add_network_list(list, step.rt)
                .options(&opts)
                .exclusive()
                .await
        }
    }

    /// DEL of one network; one not known is deleted with its cached
    /// configuration, and nothing cached is nothing to delete.
    fn del(
        &self,
        step: SandboxStep<'_>,
        opts: CallOptions,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            let del = match step.list {
                Some(list) => self.cni().del_network_list(list, step.rt),
                None => self.cni().del_cached(step.network, step.rt),
            };
            match del.options(&opts).await {
                // Not known, nothing cached: nothing of ours to delete.
                Err(e) if step.list.is_none() && e.kind() == ErrorKind::NotAttached => Ok(()),
                other => other,
            }
        }
    }

    /// CHECK of one network.
    fn check(
        &self,
        step: SandboxStep<'_>,
        opts: CallOptions,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        async move {
            let list = known_list(step)?;
            self.cni()
                .check_network_list(list, step.rt)
                .options(&opts)
                .await
        }
    }
}

fn known_list(step: SandboxStep<'_>) -> Result<&NetworkConfigList, Error> {
    step.list
        .ok_or_else(|| unknown(vec![step.network.to_owned()]))
}

/// The error for networks not known (to a `MultiNetwork`, to a step).
pub(crate) fn unknown(missing: Vec<String>) -> Error {
    Error::Core(cni_core::Error::InvalidParameter {
        field: "network",
        value: missing.join(", "),
        reason: "not among the known networks".to_owned(),
        code: cni_core::error::code::INVALID_NETWORK_CONFIG,
    })
}

/// Refuses, before any step runs, steps whose network is not known.
fn steps_known(steps: &[SandboxStep<'_>]) -> Result<(), Error> {
    all_known(
        steps
            .iter()
            .filter(|s| s.list.is_none())
            .map(|s| s.network.to_owned()),
    )
}

/// An error naming the `missing` networks, if there are any.
pub(crate) fn all_known(missing: impl Iterator<Item = String>) -> Result<(), Error> {
    let missing: Vec<String> = missing.collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(unknown(missing))
    }
}

/// Names the network of a step in its error (`network "NAME" (ifname
/// IFNAME) VERB`), in place of the operation's own [`Error::Operation`]:
/// named once.
pub(crate) fn context(network: &str, ifname: &str, command: Command, e: Error) -> Error {
    let e = match e {
        Error::Operation { source, .. } => *source,
        e => e,
    };
    Error::Context {
        context: format!("network {network:?} (ifname {ifname}) {command}"),
        source: Box::new(e),
    }
}

/// A step of `command` under its network's shared gate.
async fn gated<T, F>(
    hook: &impl StepHook,
    step: SandboxStep<'_>,
    command: Command,
    run: impl FnOnce(CallOptions) -> F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let _shared = hook.gates().shared(step.network).await;
    let mut opts = hook.options(command);
    if command == Command::Add {
        opts.rollback = true;
    }
    run(opts).await
}

/// Attaches a sandbox to `steps`, in `mode`, each network's ADD under its
/// gate, as [`MultiNetwork::setup_with`](super::MultiNetwork::setup_with) says; the
/// undo's DELs run with [`StepHook::undo_options`].
pub async fn setup_steps<'s>(
    hook: &impl StepHook,
    container_id: &str,
    steps: &[SandboxStep<'s>],
    mode: SetupMode,
) -> Result<Vec<NetworkResult>, Error> {
    steps_known(steps)?;
    let add = |step: SandboxStep<'s>| async move {
        gated(hook, step, Command::Add, |opts| hook.add(step, opts)).await
    };
    let outcomes: Vec<Result<CniResult, Error>> = match mode {
        SetupMode::Serial => {
            let mut outcomes = Vec::with_capacity(steps.len());
            for &step in steps {
                let outcome = add(step).await;
                let failed = outcome.is_err();
                outcomes.push(outcome);
                if failed {
                    break;
                }
            }
            outcomes
        }
        SetupMode::Parallel => join_all(steps.iter().copied().map(add)).await,
    };

    if outcomes.len() == steps.len() && outcomes.iter().all(Result::is_ok) {
        return Ok(steps
            .iter()
            .zip(outcomes)
            .filter_map(|(step, r)| {
                r.ok().map(|result| NetworkResult {
                    network: step.network.to_owned(),
                    ifname: step.rt.ifname.clone(),
                    result,
                })
            })
            .collect());
    }

    // Something failed: undo the networks that were set up, and those
    // whose own rollback failed, last to first.
    let mut errors = Errors::new(format!("setup of container {container_id:?}"));
    let mut undo = Vec::new();
    for (&step, outcome) in steps.iter().zip(outcomes) {
        match outcome {
            Ok(_) => undo.push(step),
            Err(e) => {
                if e.del_owed() {
                    undo.push(step);
                }
                tracing::warn!(network = step.network, ifname = ?step.rt.ifname, container = ?container_id, error = %cni_core::validate::Escaped(cni_core::error::Chain(&e)), "network setup failed");
                errors.push(context(step.network, &step.rt.ifname, Command::Add, e));
            }
        }
    }
    let error = match errors.into_result() {
        Err(e) => e,
        Ok(()) => unreachable!("a failed setup has an error"),
    };
    let mut rollback_errors = Errors::new(format!("rollback of container {container_id:?}"));
    for step in undo.into_iter().rev() {
        let _shared = hook.gates().shared(step.network).await;
        // As a chain's own rollback: when another container's attachment
        // holds this netns and ifname (an ADD forced onto it, or a plugin
        // that succeeds there, as loopback does), or the cache cannot say,
        // the DEL runs without the netns and leaves the interface alone.
        let rt = hook.cni().rollback_attachment(step.rt).await;
        let step = SandboxStep { rt: &rt, ..step };
        if let Err(e) = hook.del(step, hook.undo_options()).await {
            rollback_errors.push(context(step.network, &step.rt.ifname, Command::Del, e));
        }
    }
    Err(error.after_rollback(rollback_errors.into_result_listed()))
}

/// DEL of each of `steps`, last to first, each under its gate, going on
/// past failures; each failure is pushed to `errors`, naming its network.
pub(crate) async fn remove_into(
    hook: &impl StepHook,
    steps: &[SandboxStep<'_>],
    errors: &mut Errors,
) {
    for &step in steps.iter().rev() {
        if let Err(e) = gated(hook, step, Command::Del, |opts| hook.del(step, opts)).await {
            errors.push(context(step.network, &step.rt.ifname, Command::Del, e));
        }
    }
}

/// Detaches a sandbox from `steps`: DEL, last to first, each under its
/// gate, going on past failures. Fails with [`Error::Multiple`] listing
/// every network whose DEL failed.
pub async fn remove_steps(
    hook: &impl StepHook,
    container_id: &str,
    steps: &[SandboxStep<'_>],
) -> Result<(), Error> {
    let mut errors = Errors::new(format!("remove of container {container_id:?}"));
    remove_into(hook, steps, &mut errors).await;
    errors.into_result_listed()
}

/// CHECK of each of `steps`, in order, each under its gate, going on past
/// failures. Fails with [`Error::Multiple`] listing every network whose
/// CHECK failed.
pub async fn check_steps(
    hook: &impl StepHook,
    container_id: &str,
    steps: &[SandboxStep<'_>],
) -> Result<(), Error> {
    steps_known(steps)?;
    let mut errors = Errors::new(format!("check of container {container_id:?}"));
    for &step in steps {
        if let Err(e) = gated(hook, step, Command::Check, |opts| hook.check(step, opts)).await {
            errors.push(context(step.network, &step.rt.ifname, Command::Check, e));
        }
    }
    errors.into_result_listed()
}
