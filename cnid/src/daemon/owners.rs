//! Which container owns which interface of which network namespace, so that
//! a request naming another container's netns and ifname is refused (409)
//! before any plugin touches that container's interface.
//!
//! An index of cnid's own attachments, `(network, container, ifname) →
//! netns`: loaded from the result cache at start, updated after each ADD
//! and DEL that succeeded. A conflict found in the index is confirmed
//! against the cache record before it refuses anything, so an entry made
//! stale by GC or by cnitool's DEL never blocks a request (it is dropped).
//!
//! # Caveats
//! Namespaces are compared by path: the same namespace under two names
//! (`/run/netns/x`, `/proc/PID/ns/net`) is not recognised. Attachments
//! made by cnitool on the shared cache are not in the index.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use cni_async::Cni;
use cni_async::cache::ListPage;
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;

type Key = (String, String, String);

/// Records per page when the index is loaded.
const LOAD_PAGE_RECORDS: usize = 256;
/// Bytes of record files per page when the index is loaded (one record
/// comes whatever its size).
const LOAD_PAGE_BYTES: u64 = 1024 * 1024;

fn insert_records(m: &mut HashMap<Key, String>, records: &[CacheRecord]) {
    for r in records.iter().filter(|r| !r.netns.is_empty()) {
        m.insert(
            (
                r.network_name.clone(),
                r.container_id.clone(),
                r.if_name.clone(),
            ),
            r.netns.clone(),
        );
    }
}

/// The owners index (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Owners {
    by_attachment: Mutex<HashMap<Key, String>>,
}

/// An attachment of another container on the same netns and ifname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) network: String,
    pub(crate) container_id: String,
    pub(crate) ifname: String,
}

impl Owners {
    fn map(&self) -> MutexGuard<'_, HashMap<Key, String>> {
        self.by_attachment
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the index with the cache's records, read a page at a time:
    /// a cached result can be megabytes, and all of them at once would set
    /// the daemon's peak memory at start.
    pub(crate) async fn load_from(&self, cni: &Cni) -> Result<(), cni_async::Error> {
        let mut fresh = HashMap::new();
        let mut after = None;
        loop {
            let page = ListPage {
                after,
                limit: LOAD_PAGE_RECORDS,
                max_bytes: LOAD_PAGE_BYTES,
            };
            let (records, next) = cni.cached_attachments_page(None, page).await?;
            insert_records(&mut fresh, &records);
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        *self.map() = fresh;
        Ok(())
    }

    /// After a successful ADD.
    pub(crate) fn insert(&self, network: &str, rt: &RuntimeConf) {
        if rt.netns.is_empty() {
            return;
        }
        self.map().insert(
            (
                network.to_owned(),
                rt.container_id.clone(),
                rt.ifname.clone(),
            ),
            rt.netns.clone(),
        );
    }

    /// After a successful DEL (or when the cache says it is gone).
    pub(crate) fn remove(&self, network: &str, container_id: &str, ifname: &str) {
        self.map().remove(&(
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        ));
    }

    /// The attachments of containers other than `rt`'s on `rt`'s netns and
    /// ifname; none when `rt` has no netns, or when `rt`'s container has an
    /// attachment of its own there (the request is then about that one).
    pub(crate) fn others(&self, rt: &RuntimeConf) -> Vec<Owner> {
        if rt.netns.is_empty() {
            return Vec::new();
        }
        let map = self.map();
        let own = map.iter().any(|((_, cid, ifname), netns)| {
            *netns == rt.netns && *ifname == rt.ifname && *cid == rt.container_id
        });
        if own {
            return Vec::new();
        }
        let mut found: Vec<Owner> = map
            .iter()
            .filter(|((_, cid, ifname), netns)| {
                **netns == rt.netns && *ifname == rt.ifname && *cid != rt.container_id
            })
            .map(|((network, cid, ifname), _)| Owner {
                network: network.clone(),
                container_id: cid.clone(),
                ifname: ifname.clone(),
            })
            .collect();
        found.sort_by(|a, b| (&a.network, &a.container_id).cmp(&(&b.network, &b.container_id)));
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(cid: &str, netns: &str, ifname: &str) -> RuntimeConf {
        RuntimeConf {
            container_id: cid.into(),
            netns: netns.into(),
            ifname: ifname.into(),
            ..Default::default()
        }
    }

    #[test]
    fn finds_other_containers_on_the_same_netns_and_ifname() {
        let o = Owners::default();
        o.insert("net", &rt("a", "/run/netns/a", "eth0"));
        o.insert("other", &rt("a", "/run/netns/a", "eth1"));
        assert!(o.others(&rt("a", "/run/netns/a", "eth0")).is_empty());
        assert!(o.others(&rt("b", "/run/netns/a", "eth2")).is_empty());
        assert!(o.others(&rt("b", "/run/netns/b", "eth0")).is_empty());
        assert!(o.others(&rt("b", "", "eth0")).is_empty());
        let found = o.others(&rt("b", "/run/netns/a", "eth0"));
        assert_eq!(
            found,
            vec![Owner {
                network: "net".into(),
                container_id: "a".into(),
                ifname: "eth0".into()
            }]
        );
        // b's own attachment there: its requests are about that one.
        o.insert("other", &rt("b", "/run/netns/a", "eth0"));
        assert!(o.others(&rt("b", "/run/netns/a", "eth0")).is_empty());
        o.remove("other", "b", "eth0");
        o.remove("net", "a", "eth0");
        assert!(o.others(&rt("b", "/run/netns/a", "eth0")).is_empty());
    }
}
