//! Which attachments hold which namespace's interface: the records in
//! `results/`, whoever wrote them (this process, cnitool, a libcni
//! runtime), indexed by `(netns, ifname)`. What a rollback asks before it
//! DELs in a namespace (an interface there may be another container's),
//! and what cnid's admissions ask before they let a request near one.
//!
//! One index per cache dir handle: a [`Store`] and its clones (those of a
//! `ResultCache`) share it, and it is made at its first use, so a process
//! that never asks pays nothing. Each query first brings it up to date
//! with a [`RecordScan`] of its own (`scan.rs`): the first one lists
//! `results/`, the next ones read only the record files changed since
//! (watched with inotify under the feature `watch`; a listing of the dir
//! otherwise). Records the decoder refuses whose names read still hold
//! their slot (`listed.rs`: [`super::listed::read_named`]).
//!
//! # Invariants
//! - A refresh drains what changed after it takes the index's lock, so a
//!   record whose write or removal completed before the refresh began is
//!   in the answer (inotify queues an event before the writer's syscall
//!   returns; a listing sees the dir as it is).
//! - A refresh that fails leaves no half-applied index behind: the index
//!   keeps what it knew (never emptied: a query after the failure still
//!   finds the owners read before), its next refresh lists `results/`
//!   again, and the caller gets the error, which is no proof that the
//!   interface is free.
//!
//! # Caveats
//! - Namespaces are compared by path: the same namespace under two names
//!   (`/run/netns/x`, `/proc/PID/ns/net`) is not recognised.
//! - Blocking (the lock and the scan's reads): the async face runs a
//!   refresh on the blocking pool, or a few changed files on the calling
//!   thread ([`Store::refresh_owners_few`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};

use super::Store;
use super::listed::AttachmentKey;
use super::scan::{RecordScan, ScanChanges};
use crate::error::Error;

/// `(netns, ifname)`.
type Slot = (String, String);

/// An attachment holding a namespace's interface.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// Its network's name.
    pub network: String,
    /// Its container's ID.
    pub container_id: String,
}

/// The index (see the module docs).
#[derive(Debug)]
pub(crate) struct OwnerIndex {
    scan: RecordScan,
    /// Every record's netns (those without one left out).
    by_attachment: HashMap<AttachmentKey, String>,
    /// `by_attachment` by netns and ifname.
    by_slot: HashMap<Slot, BTreeSet<Holder>>,
}

/// What a [`Store`] and its clones share: the index, made at first use.
pub(crate) type SharedOwners = std::sync::Arc<OnceLock<Mutex<OwnerIndex>>>;

impl OwnerIndex {
    /// An empty index; its first refresh lists `results/`.
    fn new() -> Self {
        #[cfg(feature = "watch")]
        let scan = RecordScan::watched();
        #[cfg(not(feature = "watch"))]
        let scan = RecordScan::default();
        OwnerIndex {
            scan,
            by_attachment: HashMap::new(),
            by_slot: HashMap::new(),
        }
    }

    fn apply(&mut self, changes: ScanChanges) {
        // A file that reads as no record keeps its slot (no proof that
        // its attachment left).
        let unreadable: std::collections::HashSet<_> = changes.unreadable.into_iter().collect();
        for k in changes.removed {
            if !unreadable.contains(&k) {
                self.remove(&k);
            }
        }
        for r in changes.added.into_iter().filter(|r| !r.netns.is_empty()) {
            self.insert((r.network_name, r.container_id, r.if_name), r.netns);
        }
    }

    /// Notes an attachment (`netns` empty: none).
    pub(crate) fn insert(&mut self, key: AttachmentKey, netns: String) {
        self.remove(&key);
        if netns.is_empty() {
            return;
        }
        let (network, container_id, ifname) = key.clone();
        self.by_slot
            .entry((netns.clone(), ifname))
            .or_default()
            .insert(Holder {
                network,
                container_id,
            });
        self.by_attachment.insert(key, netns);
    }

    /// Forgets an attachment.
    pub(crate) fn remove(&mut self, key: &AttachmentKey) {
        let Some(netns) = self.by_attachment.remove(key) else {
            return;
        };
        let slot = (netns, key.2.clone());
        if let Some(there) = self.by_slot.get_mut(&slot) {
            there.retain(|h| h.network != key.0 || h.container_id != key.1);
            if there.is_empty() {
                self.by_slot.remove(&slot);
            }
        }
    }

    /// The attachments on `netns`'s `ifname`, by network and container.
    pub(crate) fn holders(&self, netns: &str, ifname: &str) -> Vec<Holder> {
        self.by_slot
            .get(&(netns.to_owned(), ifname.to_owned()))
            .map_or_else(Vec::new, |s| s.iter().cloned().collect())
    }

    /// The file names of the last refresh (see [`RecordScan::names_after`]).
    pub(crate) fn names_after(
        &self,
        after: Option<&str>,
        container_id: Option<&str>,
        n: usize,
    ) -> Vec<String> {
        self.scan.names_after(after, container_id, n)
    }

    /// How many times a refresh listed `results/` whole.
    pub(crate) fn listings(&self) -> u64 {
        self.scan.listings()
    }
}

fn lock(m: &Mutex<OwnerIndex>) -> MutexGuard<'_, OwnerIndex> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Store {
    fn owner_index(&self) -> &Mutex<OwnerIndex> {
        self.owners.get_or_init(|| Mutex::new(OwnerIndex::new()))
    }

    /// The index as last refreshed (no I/O).
    pub(crate) fn owners(&self) -> MutexGuard<'_, OwnerIndex> {
        lock(self.owner_index())
    }

    /// Brings the index up to date with `results/` and answers it, still
    /// locked. Blocking: the first refresh lists the dir, the next ones
    /// read what changed (see the module docs). On an error the index is
    /// left as it was, and its next refresh lists `results/` again.
    pub(crate) fn refresh_owners(&self) -> Result<MutexGuard<'_, OwnerIndex>, Error> {
        let mut index = self.owners();
        // On an error the scan changed nothing and lists again next time
        // (`scan.rs`): the index keeps what it knew, so a query after the
        // failure (an admission, another thread's rollback) still finds the
        // owners read before; emptied, it would find none.
        let mut changes = self.scan(&mut index.scan)?;
        // A record file that could not be read this time: the rest is
        // applied, but the answer is no proof (read again next time).
        let unread = changes.unread.take();
        index.apply(changes);
        match unread {
            Some(e) => Err(e),
            None => Ok(index),
        }
    }

    /// [`Store::refresh_owners`] when it is a few system calls: the index
    /// not being refreshed by another thread now, its watch live, and at
    /// most `max` record files changed, none bigger than
    /// [`Store::SCAN_FEW_MAX_BYTES`] ([`Store::scan_few`]). Whether it
    /// brought the index up to date; when not, the changes are left for
    /// the next [`Store::refresh_owners`] (a refresh running now may have
    /// started before a change: the caller must wait for one of its own).
    pub(crate) fn refresh_owners_few(&self, max: usize) -> bool {
        let mut index = match self.owner_index().try_lock() {
            Ok(index) => index,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        match self.scan_few(&mut index.scan, max) {
            // Not up to date when a file could not be read: the caller's
            // refresh reads it again, and answers its error.
            Some(changes) => {
                let whole = changes.unread.is_none();
                index.apply(changes);
                whole
            }
            None => false,
        }
    }

    /// The cached attachments of containers other than `container_id` on
    /// `netns` with interface `ifname` (any network), from the refreshed
    /// index: the refresh and the query of the async face in one blocking
    /// call, for tests.
    #[cfg(test)]
    pub(crate) fn others_on(
        &self,
        netns: &str,
        ifname: &str,
        container_id: &str,
    ) -> Result<Vec<Holder>, Error> {
        let index = self.refresh_owners()?;
        Ok(others(&index, netns, ifname, container_id))
    }
}

/// `index`'s holders of `netns`'s `ifname` but `container_id`'s.
pub(crate) fn others(
    index: &OwnerIndex,
    netns: &str,
    ifname: &str,
    container_id: &str,
) -> Vec<Holder> {
    let mut found = index.holders(netns, ifname);
    found.retain(|h| h.container_id != container_id);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::ResultCache;
    use cni_core::RuntimeConf;
    use cni_core::cache::CacheRecord;

    fn record(network: &str, cid: &str, netns: &str) -> CacheRecord {
        CacheRecord::new(
            network,
            &RuntimeConf::new(cid, netns, "eth0"),
            br#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#.to_vec(),
            Some(serde_json::json!({"cniVersion": "1.0.0"})),
        )
    }

    /// Through the async face: the refresh on the pool, or (an inline
    /// cache's, few changes) on this thread.
    async fn holders(cache: &ResultCache, netns: &str) -> Vec<String> {
        cache
            .others_on(netns, "eth0", "probe")
            .await
            .unwrap()
            .into_iter()
            .map(|h| format!("{}/{}", h.network, h.container_id))
            .collect()
    }

    /// The index of one cache handle (and its clones) sees what another
    /// handle on the same dir (another process, as far as the index can
    /// tell) wrote and removed after the index was warmed, and only what
    /// is there: a new record, one rewritten for another netns, a removed
    /// one; the clones share the index (one first listing between them).
    #[tokio::test]
    async fn the_index_follows_another_writer_after_it_is_warm() {
        let tmp = tempfile::tempdir().unwrap();
        let ours = ResultCache::new(tmp.path());
        let clone = ours.clone().with_inline_io(true);
        let other = ResultCache::new(tmp.path());
        other
            .write(&record("net", "a", "/run/netns/a"))
            .await
            .unwrap();
        assert_eq!(holders(&ours, "/run/netns/a").await, ["net/a"]);
        assert!(holders(&ours, "/run/netns/b").await.is_empty());
        // Warm: now another writer's record, a moved one and a removal.
        other
            .write(&record("net", "b", "/run/netns/b"))
            .await
            .unwrap();
        assert_eq!(
            holders(&clone, "/run/netns/b").await,
            ["net/b"],
            "a new record"
        );
        other
            .write(&record("net", "a", "/run/netns/moved"))
            .await
            .unwrap();
        assert!(
            holders(&ours, "/run/netns/a").await.is_empty(),
            "moved away"
        );
        assert_eq!(holders(&ours, "/run/netns/moved").await, ["net/a"]);
        other.remove("net", "b", "eth0").await.unwrap();
        assert!(holders(&clone, "/run/netns/b").await.is_empty(), "removed");
        other
            .write(&record("other", "c", "/run/netns/moved"))
            .await
            .unwrap();
        assert_eq!(
            holders(&ours, "/run/netns/moved").await,
            ["net/a", "other/c"]
        );
        assert_eq!(
            ours.store
                .others_on("/run/netns/moved", "eth0", "a")
                .unwrap(),
            [Holder {
                network: "other".into(),
                container_id: "c".into()
            }],
            "the asking container's own attachment is not another's"
        );
        #[cfg(feature = "watch")]
        assert_eq!(
            ours.store.owners().listings(),
            1,
            "listed once, then watched"
        );
    }

    /// A record file that turns unreadable in place (libcni rewrites with
    /// `O_TRUNC`: a writer killed between the truncation and the write
    /// leaves it empty; or damaged past its names) is no proof that its
    /// attachment left: the index keeps the slot it read before, until the
    /// file reads again (then as it says) or goes. Forgotten, a rollback
    /// DELed in the netns of a live attachment.
    #[tokio::test]
    async fn a_record_turned_unreadable_in_place_keeps_its_slot() {
        for inline in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let ours = ResultCache::new(tmp.path()).with_inline_io(inline);
            let other = ResultCache::new(tmp.path());
            other
                .write(&record("net", "a", "/run/netns/a"))
                .await
                .unwrap();
            assert_eq!(holders(&ours, "/run/netns/a").await, ["net/a"]);
            let file = ours
                .results_dir()
                .join(cni_core::cache::file_name("net", "a", "eth0").unwrap());
            for junk in [&b""[..], b"{\"kind\":\"cniCacheV1\",\"networkNa"] {
                std::fs::write(&file, junk).unwrap();
                assert_eq!(
                    holders(&ours, "/run/netns/a").await,
                    ["net/a"],
                    "forgotten when its file read as {junk:?} (inline {inline})"
                );
            }
            other
                .write(&record("net", "a", "/run/netns/moved"))
                .await
                .unwrap();
            assert!(holders(&ours, "/run/netns/a").await.is_empty());
            assert_eq!(holders(&ours, "/run/netns/moved").await, ["net/a"]);
            std::fs::write(&file, b"").unwrap();
            std::fs::remove_file(&file).unwrap();
            assert!(holders(&ours, "/run/netns/moved").await.is_empty(), "gone");
        }
    }

    /// A record file that cannot be read for a while (here: no file
    /// descriptor left, EMFILE) is no proof that no one holds its slot:
    /// the refresh is an error, and a later one reads the file again. The
    /// failed read was taken for a file that names no attachment and
    /// remembered as such, so the owner was missed for good (until its
    /// file changed). Runs in a child process of its own: it lowers the
    /// descriptor limit.
    #[test]
    fn a_record_that_could_not_be_read_is_no_proof_and_is_read_again() {
        const TEST: &str =
            "store::owners::tests::a_record_that_could_not_be_read_is_no_proof_and_is_read_again";
        const CHILD: &str = "CNI_ASYNC_OWNERS_NO_FD_CHILD";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", TEST, "--test-threads=1"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "child failed: {text}");
            assert!(text.contains("1 passed"), "child ran no test: {text}");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        std::fs::create_dir_all(store.results_dir()).unwrap();
        store
            .write_record(&record("net", "b", "/run/netns/b"), false)
            .unwrap();
        assert!(
            store
                .refresh_owners()
                .unwrap()
                .holders("/run/netns/a", "eth0")
                .is_empty()
        );
        // Another writer's record, then no descriptor left for its read (a
        // listing keeps one for the dir).
        store
            .write_record(&record("net", "a", "/run/netns/a"), false)
            .unwrap();
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain getrlimit/setrlimit on valid structs, in a process of
        // this test's own.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: old.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        let free = if cfg!(feature = "watch") { 0 } else { 1 };
        held.truncate(held.len() - free);
        let during = store
            .refresh_owners()
            .map(|index| index.holders("/run/netns/a", "eth0"));
        drop(held);
        // SAFETY: as above.
        unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &old), 0) };
        match during {
            Err(_) => {}
            Ok(found) => assert!(!found.is_empty(), "no owner, on a read that failed"),
        }
        assert_eq!(
            store
                .refresh_owners()
                .unwrap()
                .holders("/run/netns/a", "eth0"),
            [Holder {
                network: "net".into(),
                container_id: "a".into()
            }],
            "the record is not read again once descriptors are back"
        );
    }

    /// What crashes and other writers leave in `results/`, read by a warm
    /// index (pool and inline): a record of another boot (a reboot: the
    /// stale rules, not the index, decide about it) and one bigger than
    /// the inline limit own their slots; a corrupt record whose names read
    /// owns its slot; a writer's leftover temp file (killed before its
    /// rename), an empty file named as a record (its netns unknown) and a
    /// file whose name does not parse own nothing, and none of them fails
    /// or holds up the refresh.
    #[tokio::test]
    async fn leftovers_of_crashes_and_other_writers_own_what_they_prove() {
        for inline in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let ours = ResultCache::new(tmp.path()).with_inline_io(inline);
            let other = ResultCache::new(tmp.path());
            other
                .write(&record("net", "w", "/run/netns/w"))
                .await
                .unwrap();
            assert_eq!(holders(&ours, "/run/netns/w").await, ["net/w"]);
            let results = ours.results_dir();
            let named =
                |cid: &str| results.join(cni_core::cache::file_name("net", cid, "eth0").unwrap());
            let old_boot = record("net", "boot", "/run/netns/boot").with_identity(Some(
                cni_core::cache::NetnsIdentity {
                    boot_id: "another-boot".into(),
                    ..Default::default()
                },
            ));
            other.write(&old_boot).await.unwrap();
            let mut big = record("net", "big", "/run/netns/big");
            big.result = Some(serde_json::json!({
                "cniVersion": "1.0.0",
                "pad": "x".repeat(Store::SCAN_FEW_MAX_BYTES as usize + 1),
            }));
            other.write(&big).await.unwrap();
            std::fs::write(
                named("bad"),
                br#"{"kind":"cniCacheV1","networkName":"net","containerId":"bad","ifName":"eth0","netns":"/run/netns/bad","config":7}"#,
            )
            .unwrap();
            let bad = cni_core::cache::file_name("net", "bad", "eth0").unwrap();
            assert!(
                super::super::listed::read_listed(&results, &bad).is_none(),
                "the decoder refuses it"
            );
            let tmp_name = results.join(format!(
                ".{}.tmp-killed",
                cni_core::cache::file_name("net", "tmp", "eth0").unwrap()
            ));
            std::fs::write(&tmp_name, record("net", "tmp", "/run/netns/tmp").encode()).unwrap();
            std::fs::write(named("empty"), b"").unwrap();
            std::fs::write(
                results.join("no-such-name"),
                record("net", "odd", "/run/netns/odd").encode(),
            )
            .unwrap();
            for (netns, want) in [
                ("/run/netns/boot", &["net/boot"][..]),
                ("/run/netns/big", &["net/big"]),
                ("/run/netns/bad", &["net/bad"]),
                ("/run/netns/tmp", &[]),
                ("/run/netns/odd", &[]),
                ("/run/netns/w", &["net/w"]),
            ] {
                assert_eq!(
                    holders(&ours, netns).await,
                    want,
                    "{netns} (inline {inline})"
                );
            }
        }
    }

    /// An index warmed before `results/` existed sees the records of the
    /// dir another writer made afterwards (no watch could be set up on a
    /// missing dir: the next refresh lists, and watches from then on).
    #[tokio::test]
    async fn the_index_sees_a_results_dir_made_after_it_was_warmed() {
        let tmp = tempfile::tempdir().unwrap();
        let ours = ResultCache::new(tmp.path());
        assert!(holders(&ours, "/run/netns/a").await.is_empty());
        let other = ResultCache::new(tmp.path());
        other
            .write(&record("net", "a", "/run/netns/a"))
            .await
            .unwrap();
        assert_eq!(holders(&ours, "/run/netns/a").await, ["net/a"]);
        other
            .write(&record("net", "b", "/run/netns/a"))
            .await
            .unwrap();
        assert_eq!(holders(&ours, "/run/netns/a").await, ["net/a", "net/b"]);
    }

    /// A refresh that cannot read `results/` (here a file in its place) is
    /// an error, not an empty cache, and keeps what the index knew: a query made after
    /// it (cnid's admission checks against the index as last refreshed; a
    /// rollback's query may follow another thread's failed refresh) still
    /// finds the owner. An index emptied by the failure let cnid admit a
    /// request on another container's netns and interface.
    #[test]
    fn a_failed_refresh_keeps_the_owners_it_knew() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let results = store.results_dir();
        std::fs::create_dir_all(&results).unwrap();
        store
            .write_record(&record("net", "a", "/run/netns/a"), false)
            .unwrap();
        assert_eq!(
            store
                .refresh_owners()
                .unwrap()
                .holders("/run/netns/a", "eth0")
                .len(),
            1
        );
        std::fs::rename(&results, tmp.path().join("away")).unwrap();
        std::fs::write(&results, b"in the way").unwrap();
        assert!(store.refresh_owners().is_err());
        assert_eq!(
            store.owners().holders("/run/netns/a", "eth0"),
            [Holder {
                network: "net".into(),
                container_id: "a".into()
            }],
            "the owner forgotten after a failed refresh"
        );
        assert_eq!(
            store.owners().names_after(None, None, 10).len(),
            1,
            "paging names lost"
        );
        // Recovered: the dir back, its records are there; one removed
        // meanwhile is forgotten.
        std::fs::remove_file(&results).unwrap();
        std::fs::rename(tmp.path().join("away"), &results).unwrap();
        assert_eq!(
            store.others_on("/run/netns/a", "eth0", "x").unwrap().len(),
            1
        );
        std::fs::remove_file(results.join(cni_core::cache::file_name("net", "a", "eth0").unwrap()))
            .unwrap();
        assert!(
            store
                .refresh_owners()
                .unwrap()
                .holders("/run/netns/a", "eth0")
                .is_empty()
        );
    }
}
