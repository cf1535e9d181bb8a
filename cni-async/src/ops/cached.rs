//! What the cache holds for an attachment, through [`Cni`].

use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::result::CniResult;
use cni_core::{NetworkConfigList, PluginConfig, RuntimeConf, Version, validate};

use crate::error::Error;

use super::{Cni, Net};

impl Cni {
    /// The cached final ADD result of an attachment, converted to the list's version.
    pub async fn cached_result(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        self.cached_result_of(list.name(), list.version(), rt).await
    }

    /// The configuration bytes and runtime parameters stored for an
    /// attachment (libcni's `GetNetworkListCachedConfig`).
    pub async fn cached_config(
        &self,
        network: &str,
        rt: &RuntimeConf,
    ) -> Result<Option<(Vec<u8>, RuntimeConf)>, Error> {
        match self.read_cached(network, rt, false).await? {
            Some(CacheEntry::Record(rec)) => {
                let mut out = rt.clone();
                if !rec.cni_args.is_empty() {
                    out.args = rec.cni_args.clone();
                }
                out.capability_args = rec.capability_args.clone();
                Ok(Some((rec.config, out)))
            }
            _ => Ok(None),
        }
    }

    /// The cached attachments, all or those of one container.
    pub async fn cached_attachments(
        &self,
        container_id: Option<&str>,
    ) -> Result<Vec<CacheRecord>, Error> {
        if let Some(c) = container_id {
            validate::container_id(c)?;
        }
        self.inner.cache.list(container_id).await
    }

    /// The cached result of a single plugin configuration's attachment.
    pub async fn cached_network_result(
        &self,
        plugin: &PluginConfig,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        let net = Net::single(plugin)?;
        self.cached_result_of(&net.name, net.version, rt).await
    }

    async fn cached_result_of(
        &self,
        network: &str,
        version: Version,
        rt: &RuntimeConf,
    ) -> Result<Option<CniResult>, Error> {
        result_of_entry(self.read_cached(network, rt, false).await?, version)
    }

    /// The cache entry of `rt`'s attachment to `network`, names validated
    /// first; a corrupt file is moved aside only with `move_corrupt`.
    pub(super) async fn read_cached(
        &self,
        network: &str,
        rt: &RuntimeConf,
        move_corrupt: bool,
    ) -> Result<Option<CacheEntry>, Error> {
        validate::network_name(network)?;
        rt.validate()?;
        let names = (network, rt.container_id.as_str(), rt.ifname.as_str());
        self.inner.cache.read_with(names, move_corrupt).await
    }
}

/// The result in a cache entry, in `version`: `None` without an entry or
/// without a result in it. The cached result should be in the config's
/// version unless the config changed while the container ran; it is
/// converted either way.
pub(super) fn result_of_entry(
    entry: Option<CacheEntry>,
    version: Version,
) -> Result<Option<CniResult>, Error> {
    let Some(value) = entry.as_ref().and_then(CacheEntry::result) else {
        return Ok(None);
    };
    let result = CniResult::from_value(value, version)?;
    Ok(Some(result.convert(version)?))
}
