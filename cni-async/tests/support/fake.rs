//! Fake plugins and the rest of the shared helpers
//! ([`cni_test_support::fake`], [`cni_test_support::process`],
//! [`cni_test_support::json`]), plus what needs this crate's types: a
//! [`Rig`] (a `Cni` over fake plugins and a cache dir) and conflist and
//! runtime builders.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

pub use cni_test_support::fake::*;
pub use cni_test_support::json::{assert_json_eq, sorted_json};
pub use cni_test_support::process::*;

/// A [`PluginDir`] plus a cache dir inside it (`<root>/cache`, not created),
/// and [`cni_async::Cni`]s over both. Dropping it removes everything.
#[derive(Debug)]
pub struct Rig {
    /// The fake plugins.
    pub dir: PluginDir,
    /// The cache dir (`<root>/cache`).
    pub cache_dir: PathBuf,
}

impl Default for Rig {
    fn default() -> Self {
        Self::new()
    }
}

/// Kill grace used by the rigs' executors: short, so timeouts stay fast.
pub const RIG_KILL_GRACE: Duration = Duration::from_millis(300);

impl Rig {
    /// A fresh plugin dir with its cache dir path.
    pub fn new() -> Self {
        let dir = PluginDir::new();
        let cache_dir = dir.scratch("cache");
        Rig { dir, cache_dir }
    }

    /// A `Cni` over the plugin dir and cache dir: 10 s deadlines for every
    /// verb, a [`RIG_KILL_GRACE`] kill grace.
    pub fn cni(&self) -> cni_async::Cni {
        self.cni_with(cni_async::Timeouts::uniform(Duration::from_secs(10)))
    }

    /// Like [`Rig::cni`] with other default deadlines.
    pub fn cni_with(&self, timeouts: cni_async::Timeouts) -> cni_async::Cni {
        self.builder(timeouts).build()
    }

    /// Like [`Rig::cni`], the cache's I/O on the calling thread when
    /// `inline` ([`cni_async::cache::ResultCache::with_inline_io`]).
    pub fn cni_inline_io(&self, inline: bool) -> cni_async::Cni {
        let cache = cni_async::cache::ResultCache::new(&self.cache_dir).with_inline_io(inline);
        self.builder(cni_async::Timeouts::uniform(Duration::from_secs(10)))
            .cache(cache)
            .build()
    }

    fn builder(&self, timeouts: cni_async::Timeouts) -> cni_async::CniBuilder {
        cni_async::Cni::builder()
            .plugin_dirs(self.dir.dirs())
            // Fake plugins, stand-in netns paths: no namespace check.
            .check_netns(false)
            .cache_dir(&self.cache_dir)
            .exec(std::sync::Arc::new(
                cni_async::RawExec::new().with_kill_grace(RIG_KILL_GRACE),
            ))
            .timeouts(timeouts)
    }

    /// Writes a fake plugin (see [`PluginDir::fake`]).
    pub fn fake(&self, name: &str, fake: &Fake) -> PathBuf {
        self.dir.fake(name, fake)
    }

    /// `<cache>/results/<network>-<cid>-<ifname>`.
    pub fn cache_file(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.cache_dir
            .join("results")
            .join(format!("{network}-{container_id}-{ifname}"))
    }

    /// `<cache>/locks/<network>-<cid>-<ifname>.lock`.
    pub fn lock_file(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.cache_dir
            .join("locks")
            .join(format!("{network}-{container_id}-{ifname}.lock"))
    }

    /// The cache file of an attachment parsed as JSON (`None` if absent).
    pub fn cache_json(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<serde_json::Value> {
        let bytes = fs::read(self.cache_file(network, container_id, ifname)).ok()?;
        Some(serde_json::from_slice(&bytes).expect("cache file is JSON"))
    }

    /// Rewrites an attachment's record with `edit` applied to its JSON
    /// (another writer's, another boot's), in place: same inode.
    pub fn edit_record(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        edit: impl FnOnce(&mut serde_json::Value),
    ) {
        let mut v = self
            .cache_json(network, container_id, ifname)
            .expect("a record");
        edit(&mut v);
        fs::write(
            self.cache_file(network, container_id, ifname),
            serde_json::to_vec(&v).unwrap(),
        )
        .unwrap();
    }

    /// The names in `<cache>/corrupt/` (empty if it does not exist).
    pub fn corrupt_files(&self) -> Vec<String> {
        dir_names(&self.cache_dir.join("corrupt"))
    }

    /// The names in `<cache>/results/` (empty if it does not exist).
    pub fn result_files(&self) -> Vec<String> {
        dir_names(&self.cache_dir.join("results"))
    }
}

/// A network configuration list from a JSON value.
pub fn conflist(value: serde_json::Value) -> cni_core::NetworkConfigList {
    cni_core::NetworkConfigList::from_value(&value).expect("test conflist parses")
}

/// Runtime parameters: netns `/run/netns/<cid>`, no args.
pub fn runtime(container_id: &str, ifname: &str) -> cni_core::RuntimeConf {
    cni_core::RuntimeConf::new(container_id, format!("/run/netns/{container_id}"), ifname)
}
