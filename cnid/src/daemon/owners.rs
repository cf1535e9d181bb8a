//! Which container owns which interface of which network namespace, so that
//! a request naming another container's netns and ifname is refused (409)
//! before any plugin touches that container's interface.
//!
//! Two tables under one mutex:
//!
//! - **Attachments**, `(network, container, ifname) → netns`: every record
//!   in the shared result cache, whoever wrote it (cnid, cnitool, a libcni
//!   runtime). Each admission first brings it up to date with
//!   [`cni_async::cache::RecordScan`] (a listing of `results/`; only new or
//!   replaced files are read), so an attachment another tool made or
//!   deleted while cnid runs counts from the next request on.
//! - **Claims**, `(netns, ifname) → containers`: the operations admitted
//!   and not finished yet (ADD, DEL, CHECK, a sandbox's). A claim is taken
//!   at admission, in the same critical section as the check, and released
//!   when the operation ends (or is cancelled before it starts), after a
//!   successful ADD has put its attachment in the table. So of two racing
//!   requests of different containers on one netns and ifname exactly one
//!   is admitted; the other gets 409.
//!
//! # Caveats
//! - Namespaces are compared by path: the same namespace under two names
//!   (`/run/netns/x`, `/proc/PID/ns/net`) is not recognised.
//! - Another tool's ADD is seen once its record is written, that is after
//!   its plugins ran; one that runs while cnid admits a request on the same
//!   netns and ifname is not. The library's rollback then keeps off the
//!   interface ([`cni_async::ops`]: a rollback runs without the netns when
//!   the cache holds another container's attachment there).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cni_async::cache::{AttachmentKey, RecordScan, ResultCache, ScannedRecord};
use cni_core::RuntimeConf;

/// (netns, ifname).
type Slot = (String, String);

#[derive(Debug, Default)]
struct Tables {
    by_attachment: HashMap<AttachmentKey, String>,
    /// Containers (with the network they asked for) running an operation on
    /// a slot; the same container may appear more than once.
    claims: HashMap<Slot, Vec<(String, String)>>,
}

impl Tables {
    fn apply(&mut self, added: Vec<ScannedRecord>, removed: Vec<AttachmentKey>) {
        for k in removed {
            self.by_attachment.remove(&k);
        }
        for r in added.into_iter().filter(|r| !r.netns.is_empty()) {
            self.by_attachment
                .insert((r.network_name, r.container_id, r.if_name), r.netns);
        }
    }

    /// Other containers' attachments and claims on `rt`'s slot; none when
    /// `rt`'s container has an attachment of its own there.
    fn others(&self, rt: &RuntimeConf) -> Vec<Owner> {
        let own = self.by_attachment.iter().any(|((_, cid, ifname), netns)| {
            *netns == rt.netns && *ifname == rt.ifname && *cid == rt.container_id
        });
        if own {
            return Vec::new();
        }
        let mut found: Vec<Owner> = self
            .by_attachment
            .iter()
            .filter(|((_, cid, ifname), netns)| {
                **netns == rt.netns && *ifname == rt.ifname && *cid != rt.container_id
            })
            .map(|((network, cid, ifname), _)| Owner {
                network: network.clone(),
                container_id: cid.clone(),
                ifname: ifname.clone(),
                in_progress: false,
            })
            .collect();
        found.sort_by(|a, b| (&a.network, &a.container_id).cmp(&(&b.network, &b.container_id)));
        if let Some(running) = self.claims.get(&(rt.netns.clone(), rt.ifname.clone())) {
            for (cid, network) in running.iter().filter(|(cid, _)| *cid != rt.container_id) {
                if !found.iter().any(|o| o.container_id == *cid) {
                    found.push(Owner {
                        network: network.clone(),
                        container_id: cid.clone(),
                        ifname: rt.ifname.clone(),
                        in_progress: true,
                    });
                }
            }
        }
        found
    }
}

/// The owners tables (see the module docs).
#[derive(Debug)]
pub(crate) struct Owners {
    tables: Arc<Mutex<Tables>>,
    scan: Arc<Mutex<RecordScan>>,
    cache: ResultCache,
}

/// An attachment (or an operation in progress) of another container on
/// the same netns and ifname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub(crate) network: String,
    pub(crate) container_id: String,
    pub(crate) ifname: String,
    /// Not (yet) an attachment: an operation of that container admitted
    /// and not finished.
    pub(crate) in_progress: bool,
}

/// Slots claimed by one admitted operation; released when dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    tables: Arc<Mutex<Tables>>,
    held: Vec<(Slot, String)>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut t = lock(&self.tables);
        for (slot, cid) in self.held.drain(..) {
            if let Some(v) = t.claims.get_mut(&slot) {
                if let Some(i) = v.iter().position(|(c, _)| *c == cid) {
                    v.swap_remove(i);
                }
                if v.is_empty() {
                    t.claims.remove(&slot);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Owners {
    pub(crate) fn new(cache: ResultCache) -> Self {
        Owners {
            tables: Arc::default(),
            scan: Arc::default(),
            cache,
        }
    }

    /// Brings the attachments table up to date with the cache (see the
    /// module docs). One scan at a time; each reads only what changed.
    pub(crate) async fn refresh(&self) -> Result<(), cni_async::Error> {
        let (cache, scan, tables) = (self.cache.clone(), self.scan.clone(), self.tables.clone());
        let run = move || {
            let mut scan = lock(&scan);
            let changes = cache.scan_blocking(&mut scan)?;
            lock(&tables).apply(changes.added, changes.removed);
            Ok(())
        };
        match tokio::task::spawn_blocking(run).await {
            Ok(r) => r,
            Err(e) => Err(cni_async::Error::Cache {
                path: self.cache.results_dir(),
                op: "scan the cache",
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }

    /// After a successful ADD (before its claim is released).
    pub(crate) fn insert(&self, network: &str, rt: &RuntimeConf) {
        if rt.netns.is_empty() {
            return;
        }
        lock(&self.tables).by_attachment.insert(
            (
                network.to_owned(),
                rt.container_id.clone(),
                rt.ifname.clone(),
            ),
            rt.netns.clone(),
        );
    }

    /// After a successful DEL.
    pub(crate) fn remove(&self, network: &str, container_id: &str, ifname: &str) {
        lock(&self.tables).by_attachment.remove(&(
            network.to_owned(),
            container_id.to_owned(),
            ifname.to_owned(),
        ));
    }

    /// Admission of an operation on `slots` (network, attachment): refused
    /// with the other containers found on any of them, unless `force`;
    /// otherwise the slots with a netns are claimed, all in one critical
    /// section with the check.
    pub(crate) fn admit<'a>(
        &self,
        slots: impl IntoIterator<Item = (&'a str, &'a RuntimeConf)> + Clone,
        force: bool,
    ) -> Result<Claim, (usize, Vec<Owner>)> {
        let mut t = lock(&self.tables);
        for (i, (_, rt)) in slots.clone().into_iter().enumerate() {
            if rt.netns.is_empty() || force {
                continue;
            }
            let others = t.others(rt);
            if !others.is_empty() {
                return Err((i, others));
            }
        }
        let mut held = Vec::new();
        for (network, rt) in slots {
            if rt.netns.is_empty() {
                continue;
            }
            let slot = (rt.netns.clone(), rt.ifname.clone());
            t.claims
                .entry(slot.clone())
                .or_default()
                .push((rt.container_id.clone(), network.to_owned()));
            held.push((slot, rt.container_id.clone()));
        }
        Ok(Claim {
            tables: self.tables.clone(),
            held,
        })
    }

    /// The other containers on `rt`'s netns and ifname (for `force`'s
    /// warning).
    pub(crate) fn others(&self, rt: &RuntimeConf) -> Vec<Owner> {
        if rt.netns.is_empty() {
            return Vec::new();
        }
        lock(&self.tables).others(rt)
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

    fn owners() -> Owners {
        Owners::new(ResultCache::new("/nonexistent-cnid-owners-test"))
    }

    #[test]
    fn finds_other_containers_on_the_same_netns_and_ifname() {
        let o = owners();
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
                ifname: "eth0".into(),
                in_progress: false,
            }]
        );
        // b's own attachment there: its requests are about that one.
        o.insert("other", &rt("b", "/run/netns/a", "eth0"));
        assert!(o.others(&rt("b", "/run/netns/a", "eth0")).is_empty());
        o.remove("other", "b", "eth0");
        o.remove("net", "a", "eth0");
        assert!(o.others(&rt("b", "/run/netns/a", "eth0")).is_empty());
    }

    #[test]
    fn a_claim_admits_one_container_per_slot_until_dropped() {
        let o = owners();
        let a = rt("a", "/run/netns/x", "eth0");
        let b = rt("b", "/run/netns/x", "eth0");
        let claim = o.admit([("net", &a)], false).expect("first is admitted");
        // The same container again (a DEL queued behind its ADD): admitted.
        let again = o.admit([("net", &a)], false).expect("same container");
        let (_, others) = o.admit([("net", &b)], false).expect_err("b is refused");
        assert_eq!(others[0].container_id, "a");
        assert!(others[0].in_progress);
        drop(claim);
        assert!(o.admit([("net", &b)], false).is_err(), "a still has one");
        drop(again);
        let _b = o.admit([("net", &b)], false).expect("free again");
        // A forced request is admitted and claims too.
        let _forced = o.admit([("net", &a)], true).expect("forced");
    }
}
