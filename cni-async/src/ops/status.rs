//! STATUS: [`Cni::status_network_list`], [`StatusRequest`].

use std::future::IntoFuture;
use std::time::Duration;

use cni_core::error::code;
use cni_core::stdin::{StdinInput, plugin_stdin};
use cni_core::{Command, NetworkConfigList, validate};
use futures::future::BoxFuture;
use tracing::Instrument;

use crate::error::Error;

use super::{CallOptions, Cni};

impl Cni {
    /// STATUS: asks each plugin, first to last, whether it is ready for ADD.
    /// Lists below 1.1.0 have no STATUS: the call succeeds without running
    /// anything (as libcni). Codes 50 and 51 come back as
    /// [`Error::NotReady`] and [`Error::NotReadyLimitedConnectivity`].
    pub fn status_network_list<'a>(&'a self, list: &'a NetworkConfigList) -> StatusRequest<'a> {
        StatusRequest {
            cni: self,
            list,
            opts: CallOptions::default(),
        }
    }

    async fn run_status(&self, list: &NetworkConfigList, opts: &CallOptions) -> Result<(), Error> {
        validate::network_name(list.name())?;
        if !list.version().has_status_and_gc() {
            tracing::debug!(network = list.name(), version = %list.version(), "STATUS not defined before 1.1.0; nothing to do");
            return Ok(());
        }
        let deadline = self.deadline(Command::Status, opts);
        let span = tracing::info_span!("cni.status", network = list.name());
        async {
            for plugin in list.plugins() {
                let stdin = plugin_stdin(list.name(), list.version(), plugin, StdinInput::Status)?;
                let res = self
                    .run_plugin(list.name(), plugin, Command::Status, None, &stdin, deadline)
                    .await;
                if let Err(e) = res {
                    return Err(match e {
                        Error::Plugin {
                            plugin_type,
                            error: Some(obj),
                            stderr,
                            ..
                        } if obj.code == code::PLUGIN_NOT_AVAILABLE => Error::NotReady {
                            network: list.name().to_owned(),
                            plugin_type,
                            error: obj,
                            stderr,
                        },
                        Error::Plugin {
                            plugin_type,
                            error: Some(obj),
                            stderr,
                            ..
                        } if obj.code == code::PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY => {
                            Error::NotReadyLimitedConnectivity {
                                network: list.name().to_owned(),
                                plugin_type,
                                error: obj,
                                stderr,
                            }
                        }
                        other => other,
                    });
                }
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// A STATUS ready to run ([`Cni::status_network_list`]): `.await` it,
/// after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct StatusRequest<'a> {
    cni: &'a Cni,
    list: &'a NetworkConfigList,
    opts: CallOptions,
}

common_request_methods!(StatusRequest);

impl<'a> IntoFuture for StatusRequest<'a> {
    type Output = Result<(), Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.cni.run_status(self.list, &self.opts).await })
    }
}
