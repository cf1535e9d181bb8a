//! Which container owns which interface of which network namespace, so that
//! a request naming another container's netns and ifname is refused (409)
//! before any plugin touches that container's interface.
//!
//! Two sources, asked in one critical section:
//!
//! - **Attachments**: the cache's index of its records by netns and ifname
//!   ([`ResultCache::attachments_on`], feature `daemon` of cni-async), the
//!   same index a rollback of the library asks before it DELs in a netns.
//!   It holds every record in the shared result cache, whoever wrote it
//!   (cnid, cnitool, a libcni runtime). Each admission first brings it up
//!   to date ([`ResultCache::refresh_attachments`]): watched with inotify,
//!   only the record files created, replaced, rewritten or removed since
//!   the last refresh are read, so an attachment another tool made or
//!   deleted while cnid runs counts from the next request on, and an
//!   admission costs the same with 10 or 10,000 attachments cached. Up to
//!   [`INLINE_RESCAN`] changed files (the usual case: the last requests'
//!   own records) are read on the admitting worker, without a hop to the
//!   blocking pool. Where no watch can be set up the refresh lists
//!   `results/` instead (correct, but linear).
//! - **Claims**, `(netns, ifname) → containers`: the operations admitted
//!   and not finished yet (ADD, DEL, CHECK, a sandbox's). A claim is taken
//!   at admission, in the same critical section as the check, and released
//!   when the operation ends (or is cancelled before it starts), after a
//!   successful ADD has put its attachment in the index. So of two racing
//!   requests of different containers on one netns and ifname exactly one
//!   is admitted; the other gets 409. Lock order: the claims, then the
//!   index (never the other way round).
//!
//! The same index keeps the cache's file names in order, so a page of
//! `GET /v1/attachments` ([`Owners::page`]) starts at its cursor without
//! listing and sorting the dir.
//!
//! # Caveats
//! - Namespaces are compared by path: the same namespace under two names
//!   (`/run/netns/x`, `/proc/PID/ns/net`) is not recognised.
//! - Another tool's ADD is seen once its record is written, that is after
//!   its plugins ran; one that runs while cnid admits a request on the same
//!   netns and ifname is not. The library's rollback then keeps off the
//!   interface ([`cni_async::ops`]: a rollback runs without the netns when
//!   the cache holds another container's attachment there, or when the
//!   cache cannot be read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cni_async::cache::{ListPage, ResultCache};
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;

use super::lock;

/// Up to how many changed record files an admission's refresh reads on
/// its own worker ([`Owners::refresh`]); more go to the blocking pool.
const INLINE_RESCAN: usize = 8;

/// (netns, ifname).
type Slot = (String, String);

/// Containers (with the network they asked for) running an operation on
/// a slot; the same container may appear more than once.
type Claims = HashMap<Slot, Vec<(String, String)>>;

/// The owners of the netns interfaces (see the module docs).
#[derive(Debug)]
pub(crate) struct Owners {
    claims: Arc<Mutex<Claims>>,
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
    claims: Arc<Mutex<Claims>>,
    held: Vec<(Slot, String)>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claims = lock(&self.claims);
        for (slot, cid) in self.held.drain(..) {
            if let Some(v) = claims.get_mut(&slot) {
                if let Some(i) = v.iter().position(|(c, _)| *c == cid) {
                    v.swap_remove(i);
                }
                if v.is_empty() {
                    claims.remove(&slot);
                }
            }
        }
    }
}

impl Owners {
    pub(crate) fn new(cache: ResultCache) -> Self {
        Owners {
            claims: Arc::default(),
            cache,
        }
    }

    /// Brings the cache's attachment index up to date (see the module
    /// docs). Why a few changes inline: under load, the hop to the pool
    /// was most of an admission (7 ms mean on a loaded 2-CPU machine,
    /// against a goal of 0.1 ms).
    pub(crate) async fn refresh(&self) -> Result<(), cni_async::Error> {
        self.cache.refresh_attachments(INLINE_RESCAN).await
    }

    /// One page of the cached attachments (`GET /v1/attachments`; see
    /// [`ResultCache::list_page`] for `page`): from the names of the
    /// refreshed index, so a page costs its own records, not a listing and
    /// sort of the whole cache. Every record present throughout a paging
    /// is listed once: pages follow the file names, and each starts from a
    /// refresh as recent as the request.
    pub(crate) async fn page(
        &self,
        container_id: Option<&str>,
        page: ListPage,
    ) -> Result<(Vec<CacheRecord>, Option<String>), cni_async::Error> {
        self.refresh().await?;
        let cache = self.cache.clone();
        let cid = container_id.map(str::to_owned);
        let listed = move || cache.list_page_indexed_blocking(cid.as_deref(), &page);
        match tokio::task::spawn_blocking(listed).await {
            Ok(r) => Ok(r),
            Err(e) => Err(cni_async::Error::Cache {
                path: self.cache.results_dir(),
                op: "page the cache",
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }

    /// After a successful ADD (before its claim is released).
    pub(crate) fn insert(&self, network: &str, rt: &RuntimeConf) {
        self.cache
            .note_attachment(network, &rt.container_id, &rt.ifname, &rt.netns);
    }

    /// After a successful DEL.
    pub(crate) fn remove(&self, network: &str, container_id: &str, ifname: &str) {
        self.cache.forget_attachment(network, container_id, ifname);
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
        let mut claims = lock(&self.claims);
        for (i, (_, rt)) in slots.clone().into_iter().enumerate() {
            if rt.netns.is_empty() || force {
                continue;
            }
            let others = self.others_in(&claims, rt);
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
            claims
                .entry(slot.clone())
                .or_default()
                .push((rt.container_id.clone(), network.to_owned()));
            held.push((slot, rt.container_id.clone()));
        }
        Ok(Claim {
            claims: self.claims.clone(),
            held,
        })
    }

    /// The other containers on `rt`'s netns and ifname (for `force`'s
    /// warning).
    pub(crate) fn others(&self, rt: &RuntimeConf) -> Vec<Owner> {
        if rt.netns.is_empty() {
            return Vec::new();
        }
        self.others_in(&lock(&self.claims), rt)
    }

    /// Other containers' attachments and claims on `rt`'s slot; none when
    /// `rt`'s container has an attachment of its own there.
    fn others_in(&self, claims: &Claims, rt: &RuntimeConf) -> Vec<Owner> {
        let there = self.cache.attachments_on(&rt.netns, &rt.ifname);
        if there.iter().any(|h| h.container_id == rt.container_id) {
            return Vec::new();
        }
        // By (network, container): the index's order.
        let mut found: Vec<Owner> = there
            .into_iter()
            .map(|h| Owner {
                network: h.network,
                container_id: h.container_id,
                ifname: rt.ifname.clone(),
                in_progress: false,
            })
            .collect();
        let slot = (rt.netns.clone(), rt.ifname.clone());
        if let Some(running) = claims.get(&slot) {
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

    /// Writes `network`'s record of `cid` on `netns` as another tool
    /// would (a temp file renamed into place, or straight into place
    /// with `in_place`, as libcni's `O_TRUNC` write).
    fn write_record(
        cache: &std::path::Path,
        network: &str,
        cid: &str,
        netns: &str,
        in_place: bool,
    ) {
        let rec = CacheRecord::new(
            network,
            &rt(cid, netns, "eth0"),
            br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#.to_vec(),
            Some(serde_json::json!({"cniVersion": "1.0.0"})),
        );
        let dir = cache.join("results");
        std::fs::create_dir_all(&dir).unwrap();
        let name = cni_core::cache::file_name(network, cid, "eth0").unwrap();
        if in_place {
            std::fs::write(dir.join(&name), rec.encode()).unwrap();
        } else {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, rec.encode()).unwrap();
            std::fs::rename(&tmp, dir.join(&name)).unwrap();
        }
    }

    fn remove_record(cache: &std::path::Path, network: &str, cid: &str) {
        let name = cni_core::cache::file_name(network, cid, "eth0").unwrap();
        std::fs::remove_file(cache.join("results").join(name)).unwrap();
    }

    fn listings(o: &Owners) -> u64 {
        o.cache.attachment_listings()
    }

    fn owner_of(o: &Owners, netns: &str) -> Vec<String> {
        o.others(&rt("probe", netns, "eth0"))
            .into_iter()
            .map(|o| format!("{}/{}", o.network, o.container_id))
            .collect()
    }

    /// An admission whose refresh fails checks against the index as last
    /// refreshed (what `claim_owners` says it does): another container's
    /// attachment read before is still refused. The failed refresh emptied
    /// the index, so the request was admitted and its plugins ran on the
    /// owner's interface. Once the cache reads again, the index follows it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_admission_after_a_failed_refresh_still_refuses_a_known_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_record(dir, "net", "a", "/run/netns/a", false);
        let o = Owners::new(ResultCache::new(dir));
        o.refresh().await.unwrap();
        let results = dir.join("results");
        std::fs::rename(&results, dir.join("away")).unwrap();
        std::fs::write(&results, b"in the way").unwrap();
        assert!(o.refresh().await.is_err());
        let b = rt("b", "/run/netns/a", "eth0");
        let (_, others) = o
            .admit([("net", &b)], false)
            .expect_err("admitted on another container's interface");
        assert_eq!(others[0].container_id, "a");
        std::fs::remove_file(&results).unwrap();
        std::fs::rename(dir.join("away"), &results).unwrap();
        remove_record(dir, "net", "a");
        o.refresh().await.unwrap();
        let _b = o.admit([("net", &b)], false).expect("free once removed");
    }

    /// Regression test (node scale): every admission listed
    /// all of `results/` (35.8 ms of CPU per ADD+DEL with 10,000 records
    /// cached). Now the dir is listed once, and what other tools write,
    /// replace, rewrite in place or remove afterwards is still seen, at
    /// the next refresh.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refreshes_read_what_other_tools_changed_without_listing_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        for c in 0..50 {
            write_record(
                dir,
                "net",
                &format!("c{c}"),
                &format!("/run/netns/n{c}"),
                false,
            );
        }
        let o = Owners::new(ResultCache::new(dir));
        o.refresh().await.unwrap();
        assert_eq!(listings(&o), 1, "the first refresh lists the cache");
        assert_eq!(owner_of(&o, "/run/netns/n7"), ["net/c7"]);
        for _ in 0..20 {
            o.refresh().await.unwrap();
        }
        // Another tool: a new record (renamed into place), one written in
        // place, one removed, one rewritten in place for another netns.
        write_record(dir, "other", "x1", "/run/netns/x1", false);
        write_record(dir, "other", "x2", "/run/netns/x2", true);
        remove_record(dir, "net", "c3");
        write_record(dir, "net", "c4", "/run/netns/moved", true);
        o.refresh().await.unwrap();
        assert_eq!(owner_of(&o, "/run/netns/x1"), ["other/x1"]);
        assert_eq!(owner_of(&o, "/run/netns/x2"), ["other/x2"]);
        assert!(owner_of(&o, "/run/netns/n3").is_empty(), "removed");
        assert!(owner_of(&o, "/run/netns/n4").is_empty(), "rewritten");
        assert_eq!(owner_of(&o, "/run/netns/moved"), ["net/c4"]);
        assert_eq!(
            listings(&o),
            1,
            "refreshes after the first read what changed, not a listing of the cache"
        );
        // `results/` replaced by another dir: listed again, from a new watch.
        std::fs::rename(dir.join("results"), dir.join("old-results")).unwrap();
        write_record(dir, "net", "fresh", "/run/netns/fresh", false);
        o.refresh().await.unwrap();
        assert_eq!(owner_of(&o, "/run/netns/fresh"), ["net/fresh"]);
        assert!(
            owner_of(&o, "/run/netns/n7").is_empty(),
            "the old dir's records"
        );
        assert_eq!(listings(&o), 2);
        write_record(dir, "net", "later", "/run/netns/later", false);
        o.refresh().await.unwrap();
        assert_eq!(owner_of(&o, "/run/netns/later"), ["net/later"]);
        assert_eq!(listings(&o), 2);
    }

    /// A refresh that finds a few record files changed
    /// (up to [`INLINE_RESCAN`]: the last requests' own ADDs and DELs)
    /// reads them on the calling worker, done at its first poll, without
    /// a hop to the blocking pool (most of an admission on a loaded
    /// machine); more go to the pool. Either way the tables see them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_few_changes_are_read_without_the_blocking_pool() {
        use futures::FutureExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_record(dir, "net", "c0", "/run/netns/n0", false);
        let o = Owners::new(ResultCache::new(dir));
        o.refresh().await.unwrap();
        assert_eq!(
            o.refresh().now_or_never().map(Result::unwrap),
            Some(()),
            "nothing changed"
        );
        // A record added and one removed (two names), then one rewritten in
        // place: each refresh done at once.
        write_record(dir, "net", "c1", "/run/netns/n1", false);
        remove_record(dir, "net", "c0");
        assert!(o.refresh().now_or_never().is_some(), "two names changed");
        assert_eq!(owner_of(&o, "/run/netns/n1"), ["net/c1"]);
        assert!(owner_of(&o, "/run/netns/n0").is_empty());
        write_record(dir, "net", "c1", "/run/netns/moved", true);
        assert!(o.refresh().now_or_never().is_some(), "one name changed");
        assert_eq!(owner_of(&o, "/run/netns/moved"), ["net/c1"]);
        // More than the inline share: the pool's scan (which may be done
        // by the first poll too: not checked).
        for c in 0..=INLINE_RESCAN {
            write_record(
                dir,
                "many",
                &format!("m{c}"),
                &format!("/run/netns/m{c}"),
                false,
            );
        }
        o.refresh().await.unwrap();
        for c in 0..=INLINE_RESCAN {
            assert_eq!(
                owner_of(&o, &format!("/run/netns/m{c}")),
                [format!("many/m{c}")]
            );
        }
        assert_eq!(listings(&o), 1, "never listed again");
    }

    /// Concurrent admissions while the changes alternate
    /// between the inline share (up to [`INLINE_RESCAN`]) and more, some
    /// written in place, some renamed over a record of another netns,
    /// then all removed: one refresh reads inline while the others wait
    /// for the scan lock, and none of them decides on a stale table (a
    /// slot whose owner's record was complete before the refresh began
    /// is refused; a removed one is free).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_admissions_never_decide_on_a_stale_table() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        write_record(&dir, "net", "c0", "/run/netns/old", false);
        let o = std::sync::Arc::new(Owners::new(ResultCache::new(&dir)));
        o.refresh().await.unwrap();
        for round in 0..24usize {
            let n = 1 + round % (INLINE_RESCAN + 3);
            // The first record of each round replaces one of another netns
            // (the same attachment, moved): renamed over, or in place.
            write_record(&dir, "net", "c0", "/run/netns/old", false);
            o.refresh().await.unwrap();
            for c in 0..n {
                let netns = format!("/run/netns/r{round}-{c}");
                write_record(&dir, "net", &format!("c{c}"), &netns, round % 2 == 0);
            }
            let tasks: Vec<_> = (0..8)
                .map(|t| {
                    let o = o.clone();
                    tokio::spawn(async move {
                        o.refresh().await.unwrap();
                        for c in 0..n {
                            let netns = format!("/run/netns/r{round}-{c}");
                            let rt = rt(&format!("intruder{t}"), &netns, "eth0");
                            assert!(
                                o.admit([("net", &rt)], false).is_err(),
                                "round {round}: {netns} admitted a second container over net/c{c}"
                            );
                        }
                        let old = rt(&format!("intruder{t}"), "/run/netns/old", "eth0");
                        assert!(
                            o.others(&old).is_empty(),
                            "round {round}: net/c0 still seen on its old netns"
                        );
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            for c in 0..n {
                remove_record(&dir, "net", &format!("c{c}"));
            }
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let o = o.clone();
                    tokio::spawn(async move {
                        o.refresh().await.unwrap();
                        for c in 0..n {
                            let netns = format!("/run/netns/r{round}-{c}");
                            assert!(
                                owner_of(&o, &netns).is_empty(),
                                "round {round}: a stale owner of {netns} after its removal"
                            );
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        }
        assert_eq!(listings(&o), 1, "never listed again");
    }

    /// Another tool (libcni writes records in place, `O_TRUNC`) has
    /// created `network`'s record of `cid` but not written it yet: the
    /// file is there, empty, and stays open for the rest of the write.
    fn start_in_place(cache: &std::path::Path, network: &str, cid: &str) -> std::fs::File {
        let name = cni_core::cache::file_name(network, cid, "eth0").unwrap();
        std::fs::File::create(cache.join("results").join(name)).unwrap()
    }

    /// The rest of [`start_in_place`]'s write: the record, then the close.
    fn finish_in_place(mut f: std::fs::File, network: &str, cid: &str, netns: &str) {
        use std::io::Write;
        let rec = CacheRecord::new(
            network,
            &rt(cid, netns, "eth0"),
            br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#.to_vec(),
            Some(serde_json::json!({"cniVersion": "1.0.0"})),
        );
        f.write_all(&rec.encode()).unwrap();
    }

    /// Regression test (node scale): a record a scan read
    /// half written (created, still empty) was never read again once the
    /// watch was lost before the next scan (here `results/` moved away and
    /// back; a queue overflow alike): the loss dropped the names already
    /// reported, and the listing after it kept every entry whose inode was
    /// unchanged, as read before, so the finished record, of another
    /// container on that netns, was never in the owner table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_read_half_written_is_read_again_after_the_watch_is_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_record(dir, "net", "c0", "/run/netns/c0", false);
        let o = Owners::new(ResultCache::new(dir));
        o.refresh().await.unwrap();
        let f = start_in_place(dir, "net", "late");
        o.refresh().await.unwrap();
        assert!(
            owner_of(&o, "/run/netns/late").is_empty(),
            "not written yet"
        );
        finish_in_place(f, "net", "late", "/run/netns/late");
        let (results, away) = (dir.join("results"), dir.join("results.away"));
        std::fs::rename(&results, &away).unwrap();
        std::fs::rename(&away, &results).unwrap();
        o.refresh().await.unwrap();
        assert_eq!(listings(&o), 2, "the lost watch made a listing");
        assert_eq!(owner_of(&o, "/run/netns/late"), ["net/late"]);
        assert_eq!(owner_of(&o, "/run/netns/c0"), ["net/c0"]);
    }

    /// The same through the inotify queue's overflow: more changes between
    /// two scans than the queue holds (`fs.inotify.max_queued_events`, read
    /// at the start: two events per rename, so about that many / 2
    /// renames, ~8,200 at the default).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inotify_overflow_loses_no_record() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_record(dir, "net", "c0", "/run/netns/c0", false);
        let o = Owners::new(ResultCache::new(dir));
        o.refresh().await.unwrap();
        let f = start_in_place(dir, "net", "late");
        o.refresh().await.unwrap();
        finish_in_place(f, "net", "late", "/run/netns/late");
        let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Another tool's file (a dot name: never a record) renamed back
        // and forth, an IN_MOVED_FROM and an IN_MOVED_TO each (their
        // cookies differ: no two merge); then one record removed.
        let (a, b) = (dir.join("results/.flood-a"), dir.join("results/.flood-b"));
        std::fs::write(&a, b"").unwrap();
        for _ in 0..max / 4 + 8 {
            std::fs::rename(&a, &b).unwrap();
            std::fs::rename(&b, &a).unwrap();
        }
        remove_record(dir, "net", "c0");
        o.refresh().await.unwrap();
        assert_eq!(listings(&o), 2, "the overflow made a listing");
        assert_eq!(owner_of(&o, "/run/netns/late"), ["net/late"]);
        assert!(owner_of(&o, "/run/netns/c0").is_empty(), "removed");
        // And the new watch follows what comes next.
        write_record(dir, "net", "next", "/run/netns/next", false);
        o.refresh().await.unwrap();
        assert_eq!(owner_of(&o, "/run/netns/next"), ["net/next"]);
        assert_eq!(listings(&o), 2);
    }

    /// An attempt that found no defect: `results/` replaced by
    /// a symbolic link to another dir, the link pointed elsewhere,
    /// `results/` deleted, then made again: each refresh has the records
    /// of the dir the path leads to now, and no other.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn results_swapped_for_a_link_deleted_and_remade_are_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("c"),
        );
        for (dir, cid) in [(&a, "in-a"), (&b, "in-b"), (&c, "in-c")] {
            write_record(dir, "net", cid, &format!("/run/netns/{cid}"), false);
        }
        let o = Owners::new(ResultCache::new(&a));
        o.refresh().await.unwrap();
        let owners = |o: &Owners| {
            ["in-a", "in-b", "in-c"]
                .into_iter()
                .filter(|cid| !owner_of(o, &format!("/run/netns/{cid}")).is_empty())
                .collect::<Vec<_>>()
        };
        assert_eq!(owners(&o), ["in-a"]);
        let results = a.join("results");
        std::fs::rename(&results, a.join("old")).unwrap();
        std::os::unix::fs::symlink(b.join("results"), &results).unwrap();
        o.refresh().await.unwrap();
        assert_eq!(owners(&o), ["in-b"], "a link to b's");
        let next = a.join("next");
        std::os::unix::fs::symlink(c.join("results"), &next).unwrap();
        std::fs::rename(&next, &results).unwrap();
        o.refresh().await.unwrap();
        assert_eq!(owners(&o), ["in-c"], "the link pointed at c's");
        std::fs::remove_file(&results).unwrap();
        o.refresh().await.unwrap();
        assert!(owners(&o).is_empty(), "no results/");
        write_record(&a, "net", "in-a", "/run/netns/in-a", false);
        o.refresh().await.unwrap();
        assert_eq!(owners(&o), ["in-a"], "made again");
        let listed = listings(&o);
        write_record(&a, "net", "in-b", "/run/netns/in-b", true);
        o.refresh().await.unwrap();
        assert_eq!(owners(&o), ["in-a", "in-b"], "and watched");
        assert_eq!(listings(&o), listed, "from a new watch, not a listing");
    }

    fn page_names(page: &[CacheRecord]) -> Vec<String> {
        page.iter()
            .map(|r| {
                cni_core::cache::file_name(&r.network_name, &r.container_id, &r.if_name).unwrap()
            })
            .collect()
    }

    /// Regression test (node scale): each page of
    /// `GET /v1/attachments` listed and sorted all of `results/` (350 ms a
    /// page with 10,000 records). Now a full paging lists nothing, and
    /// stays right while other tools add and remove records: every record
    /// present throughout comes exactly once, in file name order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_paging_lists_nothing_and_stays_right_while_records_come_and_go() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let mut want = Vec::new();
        for c in 0..200 {
            let cid = format!("keep{c:03}");
            write_record(&dir, "net", &cid, &format!("/run/netns/{cid}"), false);
            want.push(cni_core::cache::file_name("net", &cid, "eth0").unwrap());
        }
        want.sort();
        let o = Owners::new(ResultCache::new(&dir));
        o.refresh().await.unwrap();
        let before = listings(&o);
        // Another tool adds and removes records all along the names
        // (before, among and after the kept ones) while the pages are read.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rounds = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || rounds < 3 {
                    for cid in ["a", "keep050x", "keep150x", "zz"] {
                        write_record(&dir, "net", cid, "/run/netns/churn", false);
                    }
                    for cid in ["a", "keep050x", "keep150x", "zz"] {
                        remove_record(&dir, "net", cid);
                    }
                    rounds += 1;
                }
            })
        };
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = ListPage {
                after: after.clone(),
                limit: 7,
                max_bytes: u64::MAX,
            };
            let (recs, next) = o.page(None, page).await.unwrap();
            pages += 1;
            seen.extend(page_names(&recs));
            match next {
                Some(n) => {
                    assert!(after.as_ref().is_none_or(|a| n > *a), "next went back");
                    after = Some(n);
                }
                None => break,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
        assert!(pages >= 200 / 7, "{pages} pages");
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "pages in file name order, nothing twice: {seen:?}"
        );
        let kept: Vec<&String> = seen
            .iter()
            .filter(|n| !n.contains("x-") && !n.contains("-a-") && !n.contains("-zz-"))
            .collect();
        assert_eq!(
            kept,
            want.iter().collect::<Vec<_>>(),
            "each kept record once"
        );
        assert_eq!(
            listings(&o),
            before,
            "a full paging lists the cache no more (it reads what changed)"
        );
        // One container's records: its only one, and no page after it.
        let page = ListPage {
            after: None,
            limit: 1,
            max_bytes: u64::MAX,
        };
        let (recs, next) = o.page(Some("keep042"), page).await.unwrap();
        assert_eq!(page_names(&recs), ["net-keep042-eth0"]);
        assert_eq!(next, None);
    }
}
