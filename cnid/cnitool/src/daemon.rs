//! The daemon backend: with `--socket PATH` (or `CNID_SOCKET`), `add`,
//! `check`, `del`, `gc` and `status` are sent to cnid on that socket with
//! the typed client ([`cnid_client::Client`]) instead of running plugins
//! here; cnid loads the network and runs the plugins with its own conf
//! dir, plugin dirs and cache (`NETCONFPATH`, `CNI_PATH` and
//! `CNI_CACHE_DIR` do not matter then).
//!
//! What cnitool sends is what it would have run: the container ID derived
//! from the netns path, the interface (`-i`, `CNI_IFNAME`), `CNI_ARGS`,
//! `CAP_ARGS`, and `CNI_TIMEOUT` as the request's `timeoutMs`. GC sends an
//! empty list of valid attachments, as the reference cnitool's GC does: every
//! cached attachment of the network is stale.
//!
//! `version` and `validate` ask the plugins of this machine, as without a
//! daemon: the [`Local`] backend answers them.
//!
//! Failures keep cnitool's contract (`report.rs`): status 1, the message on
//! stderr, and with `--json-errors` the daemon's CNI error object as it sent
//! it (its `cniVersion`, `code`, `msg`, `details`). When the daemon cannot be
//! reached, the code is 5 (I/O failure).
//!
//! A connection is opened by the first request, not before, so a command
//! that stays local never touches the socket; a restart of cnid meanwhile
//! is the client's to ride out (`cnid_client`'s crate docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cni_async::GcSummary;
use cni_core::result::CniResult;
use cni_core::version::PluginInfo;
use cni_core::{RuntimeConf, Version};
use cnid_api::{AttachmentRequest, GcRequest, NetworksResponse};
use cnid_client::{Client, ClientError};

use crate::backend::{Backend, Local};
use crate::report::ToolError;

/// Sends the attachment commands to cnid; `version` and `validate` stay local.
#[derive(Debug)]
pub(crate) struct Daemon {
    socket: PathBuf,
    /// `CNI_TIMEOUT`, sent as `timeoutMs`; `None`: the daemon's defaults.
    timeout: Option<Duration>,
    /// `--force`: sent as `force`.
    force: bool,
    local: Local,
    /// Sent as headers with every request.
    trace: cni_core::trace::TraceContext,
}

impl Daemon {
    /// A backend talking to cnid on `socket`.
    pub(crate) fn new(socket: PathBuf, timeout: Option<Duration>, local: Local) -> Self {
        Daemon {
            socket,
            timeout,
            force: false,
            local,
            trace: Default::default(),
        }
    }

    /// Sends `trace` with every request (the plugins cnid runs get it).
    pub(crate) fn with_trace(mut self, trace: &cni_core::trace::TraceContext) -> Self {
        self.trace = trace.clone();
        self
    }

    /// Sends `force` with ADD, CHECK and DEL (`--force`).
    pub(crate) fn force(mut self, force: bool) -> Self {
        self.force = force;
        self
    }

    async fn client(&self) -> anyhow::Result<Client> {
        let client = Client::connect(&self.socket).await.map_err(failed)?;
        Ok(client.with_trace(&self.trace))
    }

    fn timeout_ms(&self) -> Option<u64> {
        // At least 1 ms: the daemon refuses 0.
        self.timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1))
    }

    fn request(&self, rt: &RuntimeConf) -> AttachmentRequest {
        let mut req = AttachmentRequest::from_runtime_conf(rt);
        req.timeout_ms = self.timeout_ms();
        req.force = self.force;
        req
    }
}

impl Backend for Daemon {
    async fn add(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<CniResult> {
        let value = self
            .client()
            .await?
            .add(network, &self.request(rt))
            .await
            .map_err(failed)?;
        // Printed as the local backend prints its result.
        CniResult::from_value(&value, Version::CURRENT).context("the ADD result cnid sent")
    }

    async fn check(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()> {
        self.client()
            .await?
            .check(network, &self.request(rt))
            .await
            .map_err(failed)
    }

    async fn del(&self, network: &str, rt: &RuntimeConf) -> anyhow::Result<()> {
        // The daemon falls back to the configuration cached at ADD when the
        // network's file is gone, as the local backend does.
        self.client()
            .await?
            .del(network, &self.request(rt))
            .await
            .map_err(failed)
    }

    async fn gc(&self, network: &str) -> anyhow::Result<GcSummary> {
        let req = GcRequest {
            valid_attachments: Vec::new(),
            timeout_ms: self.timeout_ms(),
        };
        let r = self
            .client()
            .await?
            .gc(network, &req)
            .await
            .map_err(failed)?;
        // As the local backend: an attachment left is a failure of the
        // command (the reference cnitool's GC fails then too).
        if let Some(first) = r.failed.first() {
            let list: Vec<String> = r
                .failed
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    format!(
                        "[{}] delete stale attachment {} {} of network {network}: {}",
                        i + 1,
                        f.container_id,
                        f.ifname,
                        f.error.msg
                    )
                })
                .collect();
            return Err(ToolError::new(
                first.error.code,
                format!(
                    "GC of network {network} failed with {} error(s): {}",
                    list.len(),
                    list.join("; ")
                ),
            )
            .into());
        }
        Ok(GcSummary {
            deleted: r.deleted,
            plugins_called: r.plugins_called,
            disabled: r.disabled,
            ..Default::default()
        })
    }

    async fn status(&self, network: &str) -> anyhow::Result<()> {
        self.client()
            .await?
            .status(network, self.timeout)
            .await
            .map_err(failed)
    }

    async fn version(&self, plugin_type: &str) -> anyhow::Result<PluginInfo> {
        self.local.version(plugin_type).await
    }

    async fn validate(&self, network: &str) -> anyhow::Result<Vec<String>> {
        self.local.validate(network).await
    }

    async fn networks(&self) -> anyhow::Result<NetworksResponse> {
        self.client().await?.networks().await.map_err(failed)
    }

    fn cni_version(&self) -> Option<Version> {
        // Only the local commands load a network; the daemon's errors carry
        // their own cniVersion.
        self.local.cni_version()
    }

    fn local(&self) -> &Local {
        &self.local
    }

    fn remote(&self) -> bool {
        true
    }
}

/// cnid's error answer becomes its CNI error object, passed on as it is
/// (`report.rs`), under the HTTP status for the message; a failure to talk
/// to cnid at all is code 5 (I/O), an undecodable answer code 6.
fn failed(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Api {
            status,
            error,
            plugin,
        } => {
            // As without a daemon: `plugin bridge CHECK failed (...): msg`.
            let context = match plugin {
                Some(p) => format!("plugin {p} failed (cnid answered HTTP {status})"),
                None => format!("cnid answered HTTP {status}"),
            };
            anyhow::Error::new(error).context(context)
        }
        ClientError::Connect { path, source } => {
            let obj = ClientError::Connect {
                path: path.clone(),
                source: std::io::Error::from(source.kind()),
            }
            .error_object(&Version::CURRENT.to_string());
            let msg = if source.kind() == std::io::ErrorKind::PermissionDenied {
                format!(
                    "cannot connect to cnid at {}: permission denied: the socket admits root and the users and groups cnid allows \
                     (run as root, or have cnid started with `--allow-uid {}` or `--allow-gid GID` and a socket mode or group that lets you in)",
                    path.display(),
                    // /proc/self belongs to the effective uid.
                    std::fs::metadata("/proc/self").map_or_else(
                        |_| "UID".to_owned(),
                        |m| std::os::unix::fs::MetadataExt::uid(&m).to_string()
                    )
                )
            } else {
                format!("{}: {source}", obj.msg)
            };
            ToolError::new(obj.code, msg).into()
        }
        other => {
            let obj = other.error_object(&Version::CURRENT.to_string());
            ToolError::new(obj.code, obj.msg).into()
        }
    }
}
