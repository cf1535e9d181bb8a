//! Where the operations run: the [`Backend`] seam.
//!
//! [`Local`] loads networks from `NETCONFPATH` and runs the plugins from
//! this process with `cni-async`, as the reference cnitool does with libcni.
//! The daemon backend (`crate::daemon::Daemon`: `cnitool --socket PATH` /
//! `CNID_SOCKET`) sends the same requests to `cnid`. The subcommands only
//! see the trait, so they print the same output and the same errors
//! whichever runs them.
//!
//! The requests carry what cnitool knows from its command line and
//! environment: network names, plugin types and a [`RuntimeConf`]. Loading a
//! network (and the `NETCONFPATH` it comes from) is the backend's business.

use std::cell::Cell;

use cni_async::{CallOptions, Cni, GcSummary};
use cni_core::result::CniResult;
use cni_core::version::PluginInfo;
use cni_core::{NetworkConfigList, RuntimeConf, Version};
use cnid_api::{ConfigError, NetworkInfo, NetworksResponse};

use crate::setup::Settings;

/// The operations cnitool needs.
pub(crate) trait Backend {
    /// ADD: the final result.
    async fn add(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<CniResult>;
    /// CHECK after ADD.
    async fn check(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()>;
    /// DEL, from the cached configuration when the network's is gone.
    async fn del(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()>;
    /// GC with no valid attachment: every cached attachment of the network is stale.
    async fn gc(&self, network: &str) -> anyhow::Result<GcSummary>;
    /// STATUS of the network's plugins.
    async fn status(&self, network: &str) -> anyhow::Result<()>;
    /// A plugin's VERSION reply.
    async fn version(&self, plugin_type: &str) -> anyhow::Result<PluginInfo>;
    /// Validation of a network; the capabilities it enables.
    async fn validate(&self, network: &str) -> anyhow::Result<Vec<String>>;
    /// The usable networks (default first) and the unusable files.
    async fn networks(&self) -> anyhow::Result<NetworksResponse>;
    /// The `cniVersion` of the network the last call worked on, if known:
    /// the version error JSON is written in.
    fn cni_version(&self) -> Option<Version>;
    /// The in-process backend, for what always runs here (`batch`).
    fn local(&self) -> &Local;
    /// Whether operations go to cnid (which uses its own cache).
    fn remote(&self) -> bool {
        false
    }
}

/// Runs everything in this process.
#[derive(Debug)]
pub(crate) struct Local {
    settings: Settings,
    cni: Cni,
    opts: CallOptions,
    version: Cell<Option<Version>>,
}

impl Local {
    /// A local backend with these settings.
    pub(crate) fn new(settings: Settings) -> Self {
        Local {
            cni: settings.build_cni_single(),
            opts: settings.call_options(),
            settings,
            version: Cell::new(None),
        }
    }

    /// The settings from the environment.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The library handle and the per-operation options.
    pub(crate) fn cni(&self) -> (&Cni, &CallOptions) {
        (&self.cni, &self.opts)
    }

    /// Loads a network from the conf dir; its version is the one error JSON
    /// is written in from now on.
    pub(crate) fn load(&self, network: &str) -> Result<NetworkConfigList, cni_core::Error> {
        let list = self.settings.load_network(network)?;
        self.version.set(Some(list.version()));
        Ok(list)
    }
}

impl Backend for Local {
    async fn add(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<CniResult> {
        let list = self.load(network)?;
        // A second ADD of an attachment would fail deep in a plugin (the
        // bridge's "container veth name provided (eth0) already exists");
        // the cache knows: say so, as cnid does. Checked under the
        // attachment's lock (exclusive), so of two cnitools adding it at
        // once one runs the plugins and the other is refused.
        let added = self
            .cni
            .add_network_list(&list, rt)
            .options(&self.opts)
            .exclusive()
            .await;
        match added {
            Err(e) if matches!(e.innermost(), cni_async::Error::AlreadyAttached { .. }) => {
                Err(crate::report::ToolError::new(
                    cnid_api::code::ALREADY_ATTACHED,
                    e.innermost().to_string(),
                )
                .into())
            }
            other => Ok(other?),
        }
    }

    async fn check(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()> {
        let list = self.load(network)?;
        Ok(self
            .cni
            .check_network_list(&list, rt)
            .options(&self.opts)
            .await?)
    }

    async fn del(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()> {
        let not_found = match self.load(network) {
            Ok(list) => {
                return Ok(self
                    .cni
                    .del_network_list(&list, rt)
                    .options(&self.opts)
                    .await?);
            }
            Err(
                e @ (cni_core::Error::NetworkNotFound { .. } | cni_core::Error::NoConfigs { .. }),
            ) => e,
            Err(e) => return Err(e.into()),
        };
        // The configuration is gone: DEL with the one stored at ADD
        // (`docs/decisions.md` D10). Without a cache entry, the original error.
        match self.cni.del_cached(network, rt).options(&self.opts).await {
            Ok(()) => {
                tracing::info!(network, container = %rt.container_id, ifname = %rt.ifname,
                    "network configuration not found; deleted with the cached configuration");
                Ok(())
            }
            Err(e) if e.kind() == cni_async::ErrorKind::NotAttached => Err(not_found.into()),
            Err(e) => Err(e.into()),
        }
    }

    async fn gc(&self, network: &str) -> anyhow::Result<GcSummary> {
        let list = self.load(network)?;
        // Any attachment left fails the command, as the reference's GC.
        let summary = self
            .cni
            .gc_network_list(&list, &[])
            .options(&self.opts)
            .await?;
        Ok(summary.into_result(network)?)
    }

    async fn status(&self, network: &str) -> anyhow::Result<()> {
        let list = self.load(network)?;
        Ok(self
            .cni
            .status_network_list(&list)
            .options(&self.opts)
            .await?)
    }

    async fn version(&self, plugin_type: &str) -> anyhow::Result<PluginInfo> {
        Ok(self.cni.version_info(plugin_type).await?)
    }

    async fn validate(&self, network: &str) -> anyhow::Result<Vec<String>> {
        let list = self.load(network)?;
        Ok(self.cni.validate_network_list(&list).await?)
    }

    /// The conf dir as cnid would load it, each network marked unusable
    /// (and why) when a plugin binary is missing or does not support its
    /// version (the library's readiness, which asks each binary for
    /// VERSION once).
    async fn networks(&self) -> anyhow::Result<NetworksResponse> {
        let dir = &self.settings.net_dir;
        let set = cni_async::confwatch::NetworkSet::new(dir.clone());
        set.reload_blocking();
        let unusable = match set.readiness(&self.cni, 0).await {
            Ok(ready) => ready.unusable,
            Err(not) => not.unusable,
        };
        let snap = set.snapshot();
        if let Some(e) = &snap.dir_error {
            anyhow::bail!("cannot read the conf dir {}: {e}", dir.display());
        }
        Ok(NetworksResponse {
            conf_dir: dir.display().to_string(),
            generation: 0,
            loaded_at_ms: 0,
            networks: snap
                .networks
                .iter()
                .map(|n| {
                    let mut info = NetworkInfo::new(&n.list, &n.path, &n.shadowed, false);
                    info.unusable = unusable
                        .iter()
                        .find(|u| u.network == info.name)
                        .map(|u| u.reason.clone());
                    info
                })
                .collect(),
            errors: snap
                .skipped
                .iter()
                .map(|s| ConfigError {
                    file: s.path.display().to_string(),
                    reason: s.reason.clone(),
                })
                .collect(),
            conf_dir_missing: snap.dir_missing,
        })
    }

    fn cni_version(&self) -> Option<Version> {
        self.version.get()
    }

    fn local(&self) -> &Local {
        self
    }
}
