//! The operations of a [`MultiNetwork`]: setup, remove, check, status, GC.

use std::collections::HashSet;

use cni_core::{CapabilityArgs, CniArgs, Command, RuntimeConf, validate};

use super::builder::invalid_set;
use super::request::set_pair;
use super::steps::{
    SandboxStep, StepHook, all_known, check_steps, context, remove_into, setup_steps,
};
use super::*;
use crate::error::Errors;
use crate::{CallOptions, Cni, Error, GcSummary};
use cni_core::stdin::GcAttachment;

impl MultiNetwork {
    /// A builder (see [`MultiNetworkBuilder`]).
    pub fn builder(cni: Cni) -> MultiNetworkBuilder {
        MultiNetworkBuilder::new(cni)
    }

    /// The networks, in setup order.
    pub fn networks(&self) -> &[NetworkAttachment] {
        &self.inner.networks
    }

    /// The [`Cni`] that runs the operations.
    pub fn cni(&self) -> &Cni {
        &self.inner.cni
    }

    /// The setup mode [`MultiNetwork::setup`] uses.
    pub fn mode(&self) -> SetupMode {
        self.inner.mode
    }

    fn opts(&self) -> CallOptions {
        CallOptions {
            timeout: self.inner.timeout,
            rollback: false,
        }
    }

    /// The network named `name`: from the default set, else from the
    /// further networks of the conf dir.
    pub fn find(&self, name: &str) -> Option<&NetworkAttachment> {
        self.inner
            .networks
            .iter()
            .chain(&self.inner.available)
            .find(|n| n.name() == name)
    }

    /// The networks a sandbox's operations run on, with their runtime
    /// configuration, in setup order (see [`Sandbox::networks`]).
    ///
    /// With [`MultiNetwork::remove`], a requested network that is no longer
    /// known comes back as `None`: its DEL uses the cached configuration.
    fn plan<'a>(&'a self, sandbox: &Sandbox) -> Result<Vec<Planned<'a>>, Error> {
        sandbox.validate()?;
        let as_set = |n: &'a NetworkAttachment| Planned {
            name: n.name().to_owned(),
            net: Some(n),
            rt: sandbox.runtime_conf(n.ifname()),
        };
        let networks = self.inner.networks.iter();
        if sandbox.networks.is_empty() {
            return Ok(networks.map(as_set).collect());
        }
        let mut planned: Vec<Planned<'a>> = networks
            .filter(|n| n.name() == LOOPBACK_NETWORK && n.ifname() == LOOPBACK_IFNAME)
            .map(as_set)
            .collect();
        let explicit: HashSet<String> = sandbox
            .networks
            .iter()
            .filter_map(|r| r.ifname.clone())
            .chain(planned.iter().map(|p| p.rt.ifname.clone()))
            .collect();
        let mut generated = 0usize;
        let mut next_ifname = || loop {
            let name = format!("{}{generated}", self.inner.prefix);
            generated += 1;
            if !explicit.contains(&name) {
                return name;
            }
        };
        for req in &sandbox.networks {
            validate::network_name(&req.network)?;
            let ifname = req.ifname.clone().unwrap_or_else(&mut next_ifname);
            let mut rt = sandbox.runtime_conf(&ifname);
            for (k, v) in &req.args.0 {
                set_pair(&mut rt.args, k.clone(), v.clone());
            }
            if !req.args.is_empty()
                && sandbox.ignore_unknown
                && rt.args.get(IGNORE_UNKNOWN).is_none()
            {
                rt.args
                    .0
                    .insert(0, (IGNORE_UNKNOWN.to_owned(), "1".to_owned()));
            }
            for (k, v) in &req.capability_args.0 {
                rt.capability_args.insert(k.clone(), v.clone());
            }
            rt.validate()?;
            if planned.iter().any(|p| p.rt.ifname == rt.ifname) {
                return Err(invalid_set(
                    &rt.ifname,
                    &format!(
                        "interface name used by more than one network of sandbox {:?} (network {:?} and an earlier one)",
                        sandbox.container_id, req.network
                    ),
                ));
            }
            planned.push(Planned {
                name: req.network.clone(),
                net: self.find(&req.network),
                rt,
            });
        }
        Ok(planned)
    }

    /// The planned networks that are known, or an error naming those that are not.
    fn known<'p, 'a>(
        planned: &'p [Planned<'a>],
    ) -> Result<Vec<(&'a NetworkAttachment, &'p RuntimeConf)>, Error> {
        all_known(
            planned
                .iter()
                .filter(|p| p.net.is_none())
                .map(|p| p.name.clone()),
        )?;
        Ok(planned
            .iter()
            .filter_map(|p| Some((p.net?, &p.rt)))
            .collect())
    }

    /// Attaches the sandbox to its networks (the default set, or those it
    /// names), in the configured [`SetupMode`].
    pub async fn setup(&self, sandbox: &Sandbox) -> Result<MultiResult, Error> {
        self.setup_with(sandbox, self.inner.mode).await
    }

    /// Attaches the sandbox to its networks, in `mode`.
    ///
    /// Each network's ADD runs with [`CallOptions::rollback`], so a chain
    /// that fails part way is undone by itself. When a network fails, the
    /// networks already set up are deleted again, last to first, each DEL
    /// with a fresh deadline; the error names the failing network(s) (in
    /// parallel mode, every network that failed: [`Error::Multiple`]). If
    /// that rollback fails too, the error is [`Error::RollbackFailed`].
    ///
    /// A network attached already is refused ([`Error::AlreadyAttached`])
    /// and never deleted by that rollback (see the module's caveats).
    pub async fn setup_with(
        &self,
        sandbox: &Sandbox,
        mode: SetupMode,
    ) -> Result<MultiResult, Error> {
        let planned = self.plan(sandbox)?;
        Self::known(&planned)?;
        let steps: Vec<SandboxStep<'_>> = planned.iter().map(Planned::step).collect();
        let results = setup_steps(&Plain(self), &sandbox.container_id, &steps, mode).await?;
        Ok(MultiResult::from_results(results))
    }

    /// Detaches the sandbox from its networks: DEL, last to first, going on
    /// past errors. Fails with [`Error::Multiple`] listing every network
    /// whose DEL failed. Repeating it is fine.
    ///
    /// The namespace may be gone ([`Sandbox::netns`] empty or stale). A
    /// network this `MultiNetwork` no longer has, named by the sandbox or
    /// in a cached attachment of this container, is deleted with the
    /// configuration cached at ADD ([`Cni::del_cached`]).
    pub async fn remove(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        let hook = Plain(self);
        let steps: Vec<SandboxStep<'_>> = planned.iter().map(Planned::step).collect();
        let mut errors = Errors::new(format!("remove of container {:?}", sandbox.container_id));
        remove_into(&hook, &steps, &mut errors).await;
        // Cached attachments of this container on networks we do not know.
        match self
            .cni()
            .cached_attachments(Some(&sandbox.container_id))
            .await
        {
            Ok(records) => {
                let mut gone = Vec::new();
                for rec in &records {
                    let planned_here = planned
                        .iter()
                        .any(|p| p.name == rec.network_name && p.rt.ifname == rec.if_name);
                    if planned_here || self.find(&rec.network_name).is_some() {
                        continue;
                    }
                    let rt = RuntimeConf {
                        args: CniArgs::new(),
                        capability_args: CapabilityArgs::new(),
                        ..sandbox.runtime_conf(&rec.if_name)
                    };
                    let (name, net) = (rec.network_name.clone(), None);
                    gone.push(Planned { name, net, rt });
                }
                let steps: Vec<SandboxStep<'_>> = gone.iter().map(Planned::step).collect();
                remove_into(&hook, &steps, &mut errors).await;
            }
            Err(e) => errors.push(e),
        }
        errors.into_result_listed()
    }

    /// CHECK of the sandbox's networks, in order, going on past errors.
    /// Fails with [`Error::Multiple`] listing every network whose CHECK failed.
    pub async fn check(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        Self::known(&planned)?;
        let steps: Vec<SandboxStep<'_>> = planned.iter().map(Planned::step).collect();
        check_steps(&Plain(self), &sandbox.container_id, &steps).await
    }

    /// STATUS of every network of the default set, in order (a no-op for
    /// lists below 1.1.0), going on past errors. Fails with
    /// [`Error::Multiple`] listing every network that is not ready; its
    /// [`Error::code`] is the first one's (50 or 51 when a plugin said so).
    pub async fn status(&self) -> Result<(), Error> {
        self.status_networks(self.inner.networks.iter()).await
    }

    /// STATUS of the networks `sandbox` uses (the default set, or those it
    /// names): ready iff all are. Errors as [`MultiNetwork::status`].
    pub async fn status_of(&self, sandbox: &Sandbox) -> Result<(), Error> {
        let planned = self.plan(sandbox)?;
        let networks = Self::known(&planned)?;
        self.status_networks(networks.into_iter().map(|(n, _)| n))
            .await
    }

    async fn status_networks<'n>(
        &self,
        networks: impl Iterator<Item = &'n NetworkAttachment>,
    ) -> Result<(), Error> {
        let mut errors = Errors::new("status");
        let mut seen = HashSet::new();
        for n in networks {
            if !seen.insert(n.name()) {
                continue;
            }
            if let Err(e) = self
                .cni()
                .status_network_list(n.list())
                .options(&self.opts())
                .await
            {
                errors.push(context(n.name(), n.ifname(), Command::Status, e));
            }
        }
        errors.into_result_listed()
    }

    /// GC for a node: for every network of this `MultiNetwork` (default set
    /// and further conf-dir networks), the cached attachments of containers
    /// not in `live` get a DEL and lose their cache entry, then (1.1.0
    /// lists) the plugins get GC with the live attachments as valid
    /// ([`Cni::gc_network_list`]).
    ///
    /// Each network's GC runs alone (no ADD, DEL or CHECK of this
    /// `MultiNetwork` on it meanwhile), as the spec asks of runtimes. Goes
    /// on past a failing network; every failure comes back in
    /// [`Error::Multiple`]. `live`: `["c1", "c2"]`, `&ids`, a set, or `[]`
    /// ([`LiveContainers`]).
    pub async fn gc(&self, live: impl LiveContainers) -> Result<Vec<NetworkGc>, Error> {
        let live = live.into_container_ids();
        let mut out = Vec::new();
        let mut errors = Errors::new("GC of the node");
        let mut seen = HashSet::new();
        for n in self.inner.networks.iter().chain(&self.inner.available) {
            if !seen.insert(n.name()) {
                continue;
            }
            let _exclusive = self.inner.gates.exclusive(n.name()).await;
            // Read under the gate: no ADD of this network can run meanwhile.
            let records = match self.inner.cni.cached_attachments(None).await {
                Ok(records) => records,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let valid: Vec<GcAttachment> = records
                .into_iter()
                .filter(|r| r.network_name == n.name() && live.contains(&r.container_id))
                .map(|r| GcAttachment {
                    container_id: r.container_id,
                    ifname: r.if_name,
                })
                .collect();
            match self
                .cni()
                .gc_network_list(n.list(), &valid)
                .options(&self.opts())
                .await
            {
                Ok(summary) => out.push(NetworkGc {
                    network: n.name().to_owned(),
                    summary,
                }),
                Err(e) => errors.push(Error::Context {
                    context: format!("network {:?} GC", n.name()),
                    source: Box::new(e),
                }),
            }
        }
        errors.into_result_listed().map(|()| out)
    }
}

/// The container IDs that live, for [`MultiNetwork::gc`]: arrays of
/// `&str` (also the empty `[]`, whose element type an `IntoIterator` bound
/// could not infer), vectors, slices and sets of strings, owned or
/// borrowed. Collect an iterator into a `Vec` first.
pub trait LiveContainers {
    /// The IDs, as a set.
    fn into_container_ids(self) -> HashSet<String>;
}

fn id_set<S: AsRef<str>>(ids: impl IntoIterator<Item = S>) -> HashSet<String> {
    ids.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

/// `LiveContainers` through [`id_set`], for each `[generics] type`.
macro_rules! live_by_id_set {
    ($([$($g:tt)*] $t:ty),* $(,)?) => {$(
        impl<$($g)*> LiveContainers for $t {
            fn into_container_ids(self) -> HashSet<String> {
                id_set(self)
            }
        }
    )*};
}

live_by_id_set!(
    [const N: usize] [&str; N],
    [const N: usize] &[&str; N],
    [T: AsRef<str>] &[T],
    [T: AsRef<str>] Vec<T>,
    [T: AsRef<str>] &Vec<T>,
    [T: AsRef<str>, S: std::hash::BuildHasher] &HashSet<T, S>,
    [T: AsRef<str>] &std::collections::BTreeSet<T>,
);

impl<S: std::hash::BuildHasher> LiveContainers for HashSet<String, S> {
    fn into_container_ids(self) -> HashSet<String> {
        self.into_iter().collect()
    }
}

/// One network's part of [`MultiNetwork::gc`].
#[derive(Debug)]
pub struct NetworkGc {
    /// The network name.
    pub network: String,
    /// What its GC did.
    pub summary: GcSummary,
}

/// One network of a sandbox's operation, with its runtime configuration.
#[derive(Debug)]
struct Planned<'a> {
    name: String,
    /// `None`: a requested network this `MultiNetwork` does not have.
    net: Option<&'a NetworkAttachment>,
    rt: RuntimeConf,
}

impl Planned<'_> {
    fn step(&self) -> SandboxStep<'_> {
        SandboxStep {
            network: &self.name,
            list: self.net.map(NetworkAttachment::list),
            rt: &self.rt,
        }
    }
}

/// The plain steps of a [`MultiNetwork`]: its `Cni`, its gates, its
/// timeout for every step and every undo.
struct Plain<'m>(&'m MultiNetwork);

impl StepHook for Plain<'_> {
    fn cni(&self) -> &Cni {
        &self.0.inner.cni
    }

    fn gates(&self) -> &NetworkGates {
        &self.0.inner.gates
    }

    fn options(&self, _: Command) -> CallOptions {
        self.0.opts()
    }

    fn undo_options(&self) -> CallOptions {
        self.0.opts()
    }
}
