//! STATUS: [`Cni::status_network_list`], [`StatusRequest`].

use cni_core::error::code;
use cni_core::stdin::{StdinInput, plugin_stdin};
use cni_core::{Command, NetworkConfigList, validate};
use tracing::Instrument;

use crate::error::Error;

use super::request::{Operation, Request};
use super::{CallOptions, Cni};

impl Cni {
    /// STATUS: asks each plugin, first to last, whether it is ready for ADD.
    /// Lists below 1.1.0 have no STATUS: the call succeeds without running
    /// anything (as libcni). Codes 50 and 51 come back as
    /// [`Error::NotReady`] and [`Error::NotReadyLimitedConnectivity`].
    pub fn status_network_list<'a>(&'a self, list: &'a NetworkConfigList) -> StatusRequest<'a> {
        Request::new(self, StatusOp { list })
    }
}

/// A STATUS ready to run ([`Cni::status_network_list`]): `.await` it,
/// after setting options if needed.
pub type StatusRequest<'a> = Request<'a, StatusOp<'a>>;

/// What a [`StatusRequest`] runs.
#[derive(Debug)]
pub struct StatusOp<'a> {
    list: &'a NetworkConfigList,
}

impl<'a> Operation<'a> for StatusOp<'a> {
    type Output = ();

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<(), Error> {
        let list = self.list;
        validate::network_name(list.name())?;
        if !list.version().has_status_and_gc() {
            tracing::debug!(network = list.name(), version = %list.version(), "STATUS not defined before 1.1.0; nothing to do");
            return Ok(());
        }
        let deadline = cni.deadline(Command::Status, &opts);
        let span = tracing::info_span!("cni.status", network = list.name());
        async {
            for plugin in list.plugins() {
                let stdin = plugin_stdin(list.name(), list.version(), plugin, StdinInput::Status)?;
                let res = cni
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
