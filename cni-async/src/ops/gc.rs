//! GC: [`Cni::gc_network_list`], [`GcRequest`], [`GcSummary`].

use cni_core::error::Chain;
use cni_core::stdin::{GcAttachment, StdinInput, plugin_stdin};
use cni_core::{Command, NetworkConfigList, validate};
use tracing::Instrument;

use crate::error::{Error, Errors};

use super::request::{Operation, Request};
use super::{CallOptions, Cni, Net, not_started};

/// What GC did. Callers that treat any leftover as a failure (as the
/// reference cnitool does) use [`GcSummary::into_result`].
#[derive(Debug, Default)]
pub struct GcSummary {
    /// Stale cached attachments that were deleted (DEL run, cache entry removed).
    pub deleted: Vec<GcAttachment>,
    /// Stale cached attachments that were not deleted, in the order tried.
    pub failed: Vec<GcFailure>,
    /// Whether GC was sent to the plugins (1.1.0 lists only).
    pub plugins_called: bool,
    /// True when the list has `disableGC` and nothing was done.
    pub disabled: bool,
}

/// A stale attachment GC could not delete, and why.
#[derive(Debug)]
pub struct GcFailure {
    /// The attachment.
    pub attachment: GcAttachment,
    /// Why its DEL failed: the plugin's error, or [`Error::Timeout`] when
    /// the GC's deadline expired during or before it.
    pub error: Error,
}

impl GcFailure {
    /// The error with the attachment and network named in its context.
    pub fn into_error(self, network: &str) -> Error {
        Error::Context {
            context: format!(
                "delete stale attachment {} {} of network {network}",
                self.attachment.container_id, self.attachment.ifname
            ),
            source: Box::new(self.error),
        }
    }
}

impl GcSummary {
    /// `Ok(self)` when no stale attachment was left; otherwise every
    /// failure as one [`Error::Multiple`] naming the attachments.
    pub fn into_result(self, network: &str) -> Result<GcSummary, Error> {
        if self.failed.is_empty() {
            return Ok(self);
        }
        Err(gc_failed(network, self.failed, Vec::new()))
    }
}

impl Cni {
    /// GC: a no-op with `disableGC`. Otherwise every cached attachment of
    /// this network that is not in `valid_attachments` gets a DEL (with this
    /// config and the cached args) and loses its cache entry; then, for 1.1.0
    /// lists, every plugin gets GC with `cni.dev/valid-attachments` (and the
    /// older `cni.dev/attachments`). Errors do not stop the rest: a stale
    /// DEL that fails is in [`GcSummary::failed`]; a plugin's GC that fails
    /// makes the call fail with every error ([`Error::Multiple`]). One
    /// deadline bounds it all.
    pub fn gc_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        valid_attachments: &'a [GcAttachment],
    ) -> GcRequest<'a> {
        Request::new(
            self,
            GcOp {
                list,
                valid_attachments,
            },
        )
    }
}

/// The [`Error::Multiple`] of a GC: the stale DELs' failures first, each
/// naming its attachment, then `more`.
fn gc_failed(network: &str, failed: Vec<GcFailure>, more: Vec<Error>) -> Error {
    let failed = failed.into_iter().map(|f| f.into_error(network));
    Errors::of(
        format!("GC of network {network}"),
        failed.chain(more).collect(),
    )
    .into_multiple()
}

/// A GC ready to run ([`Cni::gc_network_list`]): `.await` it, after
/// setting options if needed.
pub type GcRequest<'a> = Request<'a, GcOp<'a>>;

/// What a [`GcRequest`] runs.
#[derive(Debug)]
pub struct GcOp<'a> {
    list: &'a NetworkConfigList,
    valid_attachments: &'a [GcAttachment],
}

impl<'a> Operation<'a> for GcOp<'a> {
    type Output = GcSummary;

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<GcSummary, Error> {
        let (list, valid_attachments) = (self.list, self.valid_attachments);
        validate::network_name(list.name())?;
        if list.disable_gc() {
            return Ok(GcSummary {
                disabled: true,
                ..Default::default()
            });
        }
        // One deadline for everything below.
        let deadline = cni.deadline(Command::Gc, &opts);
        let span = tracing::info_span!("cni.gc", network = list.name());
        async {
            let net = Net::list(list);
            let mut summary = GcSummary::default();
            let mut plugin_errors = Vec::new();
            let cached = cni.inner.cache.list(None).await?;
            for rec in cached.into_iter().filter(|r| r.network_name == list.name()) {
                let key = GcAttachment {
                    container_id: rec.container_id.clone(),
                    ifname: rec.if_name.clone(),
                };
                if valid_attachments.contains(&key) {
                    continue;
                }
                let rt = rec.runtime_conf();
                let res = match net.plugins.last() {
                    Some(first) if deadline.remaining().is_zero() => {
                        Err(not_started(first, Command::Del, deadline))
                    }
                    _ => cni.del_expecting(&net, &rt, deadline, None, None).await,
                };
                match res {
                    Ok(_) => summary.deleted.push(key),
                    Err(error) => {
                        tracing::warn!(container = %rt.container_id, ifname = %rt.ifname, error = %Chain(&error), "GC could not delete a stale attachment; going on with the others");
                        summary.failed.push(GcFailure {
                            attachment: key,
                            error,
                        });
                    }
                }
            }
            if list.version().has_status_and_gc() {
                summary.plugins_called = true;
                for plugin in list.plugins() {
                    let stdin = plugin_stdin(
                        list.name(),
                        list.version(),
                        plugin,
                        StdinInput::Gc { valid_attachments },
                    )?;
                    if let Err(e) = cni
                        .run_plugin(list.name(), plugin, Command::Gc, None, &stdin, deadline)
                        .await
                    {
                        plugin_errors.push(e);
                    }
                }
            }
            if plugin_errors.is_empty() {
                return Ok(summary);
            }
            Err(gc_failed(list.name(), summary.failed, plugin_errors))
        }
        .instrument(span)
        .await
    }
}
