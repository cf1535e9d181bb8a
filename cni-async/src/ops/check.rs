//! CHECK: [`Cni::check_network_list`], [`Cni::check_network`], [`CheckRequest`].

use cni_core::{Command, NetworkConfigList, PluginConfig, RuntimeConf};
use tracing::Instrument;

use crate::error::Error;

use super::cached::result_of_entry;
use super::request::{Operation, Request};
use super::{CallOptions, Cni, Net};

impl Cni {
    /// CHECK: refused below 0.4.0; a no-op with `disableCheck`; refused with
    /// code 3 when no ADD result is cached (spec: never CHECK before ADD,
    /// `docs/decisions.md` D12); otherwise runs the plugins first to last
    /// with the cached result as `prevResult`.
    pub fn check_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> CheckRequest<'a> {
        self.check_request(Ok(Net::list(list)), rt)
    }

    /// CHECK of a single plugin configuration, libcni's `CheckNetwork`.
    pub fn check_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> CheckRequest<'a> {
        self.check_request(Net::single(plugin), rt)
    }

    fn check_request<'a>(
        &'a self,
        net: Result<Net<'a>, Error>,
        rt: &'a RuntimeConf,
    ) -> CheckRequest<'a> {
        Request::new(self, CheckOp { net, rt })
    }

    async fn check(&self, net: Net<'_>, rt: &RuntimeConf, opts: &CallOptions) -> Result<(), Error> {
        self.validate_attachment(&net, rt, Command::Check)?;
        if !net.version.has_check() {
            return Err(Error::Unsupported {
                network: net.name.to_string(),
                command: Command::Check,
                version: net.version,
            });
        }
        if net.disable_check {
            tracing::debug!(
                network = &*net.name,
                "disableCheck is set; CHECK is a no-op"
            );
            return Ok(());
        }
        let deadline = self.deadline(Command::Check, opts);
        let span = tracing::info_span!("cni.check", network = &*net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            // The lock and the read take one trip to the blocking pool. A
            // corrupt record stays where it is: a CHECK changes nothing.
            let (_lock, read) = self
                .cache()
                .lock_and_read_with(
                    (&*net.name, &rt.container_id, &rt.ifname),
                    deadline.remaining(),
                    false,
                )
                .await?;
            let Some(cached) = result_of_entry(read?, net.version)? else {
                return Err(Error::not_attached(&net.name, rt));
            };
            let prev = cached.to_value();
            for plugin in net.plugins.iter() {
                self.run_on_attachment(&net, plugin, Command::Check, rt, Some(&prev), deadline)
                    .await?;
            }
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// A CHECK ready to run ([`Cni::check_network_list`],
/// [`Cni::check_network`]): `.await` it, after setting options if needed.
pub type CheckRequest<'a> = Request<'a, CheckOp<'a>>;

/// What a [`CheckRequest`] runs.
#[derive(Debug)]
pub struct CheckOp<'a> {
    net: Result<Net<'a>, Error>,
    rt: &'a RuntimeConf,
}

impl<'a> Operation<'a> for CheckOp<'a> {
    type Output = ();

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<(), Error> {
        let net = self.net?;
        let network = net.name.clone();
        cni.check(net, self.rt, &opts)
            .await
            .map_err(|e| Error::in_operation(&network, &self.rt.ifname, Command::Check, false, e))
    }
}
