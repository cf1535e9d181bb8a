//! VERSION: [`Cni::version_info`] and the validation built on it.

use cni_core::stdin::version_stdin;
use cni_core::version::PluginInfo;
use cni_core::{Command, NetworkConfigList, PluginConfig, Version, env};

use crate::error::{ERROR_STDERR_MAX, ERROR_STDOUT_MAX, Error, Errors, lossy_capped};
use crate::exec::{ExecRequest, PluginExec};

use super::{Cni, Net};

impl Cni {
    /// Asks each plugin of the list for its supported versions; errors for
    /// every plugin that is missing or does not support the list's version
    /// (all collected). On success, the capabilities the list enables.
    pub async fn validate_network_list(
        &self,
        list: &NetworkConfigList,
    ) -> Result<Vec<String>, Error> {
        let mut errors = Errors::new(format!("validation of network {}", list.name()));
        for plugin in list.plugins() {
            match self.version_info(plugin.plugin_type()).await {
                Ok(info) if info.supports(list.version()) => {}
                Ok(info) => errors.push(unsupported(list.version(), plugin, &info)),
                Err(e) => errors.push(e),
            }
        }
        errors.into_result()?;
        Ok(list.capabilities())
    }

    /// Runs `VERSION` on a plugin.
    pub async fn version_info(&self, plugin_type: &str) -> Result<PluginInfo, Error> {
        let path = self.find_plugin(plugin_type)?;
        let mut env = env::plugin_env(Command::Version, None, &self.inner.cni_path);
        env.extend(crate::trace::env());
        // Plugins built on an old skel insist on these even for VERSION;
        // libcni passes "dummy" for the same reason.
        for (k, v) in env.iter_mut() {
            if k == env::CNI_NETNS || k == env::CNI_IFNAME {
                *v = "dummy".into();
            }
        }
        let stdin = version_stdin(Version::CURRENT);
        let timeout = self.inner.timeouts.version;
        let req = ExecRequest::new(&path, plugin_type, Command::Version, &env, &stdin, timeout);
        let req = req.with_limits(self.inner.limits);
        let out = match self.inner.exec.exec(req).await {
            Ok(out) => out,
            // A plugin from before VERSION existed (spec 0.1.0) rejects it.
            Err(Error::Plugin { error, stderr, .. })
                if error
                    .as_deref()
                    .is_some_and(|o| o.msg == "unknown CNI_COMMAND: VERSION")
                    || stderr.trim() == "unknown CNI_COMMAND: VERSION" =>
            {
                return Ok(PluginInfo {
                    cni_version: "0.1.0".into(),
                    supported_versions: vec!["0.1.0".into()],
                });
            }
            Err(e) => return Err(e),
        };
        crate::exec::check_success(plugin_type, Command::Version, &out)?;
        PluginInfo::decode(&out.stdout).map_err(|e| Error::PluginOutput {
            plugin_type: plugin_type.to_owned(),
            command: Command::Version,
            reason: e.to_string(),
            stdout: lossy_capped(&out.stdout, ERROR_STDOUT_MAX),
            stderr: lossy_capped(&out.stderr, ERROR_STDERR_MAX),
        })
    }

    /// Checks that the plugin exists and supports the config's version;
    /// returns the capabilities it enables.
    pub async fn validate_network(&self, plugin: &PluginConfig) -> Result<Vec<String>, Error> {
        let net = Net::single(plugin)?;
        let info = self.version_info(plugin.plugin_type()).await?;
        if !info.supports(net.version) {
            return Err(unsupported(net.version, plugin, &info));
        }
        Ok(plugin
            .capabilities()
            .iter()
            .filter(|(_, on)| *on)
            .map(|(c, _)| c.clone())
            .collect())
    }
}

/// `plugin` (whose VERSION answered `info`) does not support `version`.
fn unsupported(version: Version, plugin: &PluginConfig, info: &PluginInfo) -> Error {
    Error::Core(cni_core::Error::UnsupportedVersion {
        version: version.to_string(),
        context: format!(
            "plugin {} (supports {})",
            plugin.plugin_type(),
            info.supported_versions.join(", ")
        ),
    })
}
