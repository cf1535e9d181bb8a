//! Durable ADD intents: crash safety for attachments half made, and the
//! durability of the ADD results the daemon caches.
//!
//! Before the first plugin of an ADD runs, the daemon appends a `begin`
//! record to `<state dir>/intents/journal` and `fdatasync`s it: one line of
//! JSON holding everything a DEL needs (the configuration list's bytes,
//! self-contained, plugin files inlined, and the runtime parameters) and a
//! sequence number. When the ADD completed, its result is in the cache,
//! written there *without* `fsync` (the daemon's [`ResultCache`] is
//! [`with_durable(false)`](ResultCache::with_durable)), and before the
//! caller is answered a `commit` line follows and is `fdatasync`ed: it ends
//! the `begin` and carries the cache record's exact bytes and this boot's
//! id ([`Intents::commit`]). One flush where the cache's own write takes
//! two (the temp file, then the dir after the rename). When the ADD failed
//! and its rollback succeeded, a plain `end` line follows, not flushed.
//! When the rollback failed too, the intent goes to its own file,
//! `<state dir>/intents/<network>:<containerID>:<ifname>.json` (temp file,
//! `fsync`, `rename`, `fsync` of the dir: [`durable::write_atomic`]), before
//! the `end`; that file stays until a DEL of the attachment succeeds.
//!
//! At start ([`Intents::prepare`]) every `begin` without its `end` belongs
//! to an ADD whose caller never got a success: it becomes an intent file
//! (durably, before the journal is emptied), and the daemon DELs each
//! intent file with the configuration it recorded (`prevResult` from the
//! cache when the chain had finished). So a `kill -9` at any point of an
//! ADD leaks no IP and no interface. Commit lines written in another boot
//! put their records back into the cache where a power loss lost them
//! (unless a newer record is there, written since the reboot); those of
//! this boot have their records `fsync`ed; then the journal is emptied.
//! While the daemon runs, its flush task ([`Intents::flush_loop`], off the
//! request path) `fsync`s the records of the commit lines and then drops
//! those lines: every 30 s for the lines older than 30 s, and when the
//! journal passed 1 MiB (it is then rewritten with its open records and
//! the newer commit lines). A DEL that succeeded forgets the attachment's
//! commit line (an unflushed `gone` line), and so does a GC's deletion
//! ([`Intents::forget_removed`]). At a graceful exit the records are
//! flushed and the journal removed.
//!
//! A start that cannot restore or flush a record keeps its commit line,
//! and only such lines: the journal is rewritten with them (`end` 0, which
//! ends no `begin`) once the open ADDs are intent files, and until a later
//! start settles them every rewrite copies them and a graceful exit keeps
//! the journal ([`Journal::carried`]). A new run numbers its ADDs past every
//! number the journal held, so no old `end` ends a new `begin`.
//!
//! The daemon writes its cache this way only when the journal outlives it:
//! with the state dir on tmpfs or ramfs and the cache dir not, or without a
//! readable boot id, the cache flushes its own records and an ADD ends with
//! a plain `end` line.
//!
//! What each flush is for: the `begin`'s `fdatasync` makes the record
//! outlive a power loss or kernel crash, after which the plugins' own state
//! (host-local's files in `/var/lib/cni/networks`, written without fsync)
//! may or may not hold the address; a DEL of an attachment that was never
//! made must succeed, so recovery is right either way. The `commit`'s
//! makes the answered ADD's cached result outlive one, as the cache's
//! own flushes do for a library caller. A process crash (`kill -9`, OOM)
//! needs no flush at all: the page cache keeps every write, which is why
//! commit lines of this boot restore nothing (a record missing then was
//! removed by a DEL). The `end`s and the removals are not flushed: a power
//! loss can only bring back a record of an ADD that was answered (a commit
//! line of the last 30 to 60 s whose `gone` line was not written back
//! restores the record of an attachment DELed since), whose containers
//! are gone with the reboot,
//! and the DEL that recovery or the runtime then makes is what the host
//! needs.
//!
//! `:` cannot occur in network names, container IDs or interface names, so
//! unlike the result cache's `<network>-<containerID>-<ifname>`, these names
//! never collide, and `<network>:` picks exactly one network's intents.
//!
//! # Caveats
//! A journal append is one `write` with `O_APPEND`, so concurrent ADDs'
//! records never interleave; only the last line can be torn (by a crash
//! during the append, before any plugin of that ADD ran), and unparsable
//! lines are skipped. A failed append is cut off again at once.
//!
//! A write of an intent file in progress shows as a dot-file (`.<name>.tmp-<pid>-<n>`,
//! [`durable::temp_path`]) in the same dir. Such files are removed as crash leftovers at start only
//! ([`Intents::remove_leftovers`], before any request runs); while the
//! daemon serves, nothing but the writer touches them, and GC of a network
//! reads that network's files only ([`Intents::of_network`]), never
//! removing or moving any.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cni_async::cache::ResultCache;
use cni_async::durable;
use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::{CapabilityArgs, CniArgs, RuntimeConf, validate};
use serde_json::{Map, Value, json};

/// The `kind` of intent records.
pub(crate) const KIND: &str = "cnidAddIntentV1";
/// Subdirectory of the state dir.
pub(crate) const INTENTS_DIR: &str = "intents";
/// Where unreadable intent files are moved.
pub(crate) const CORRUPT_DIR: &str = "corrupt";
const SUFFIX: &str = ".json";
/// The journal of ADDs in progress, in the intents dir.
pub(crate) const JOURNAL: &str = "journal";
/// Past this size the journal is rewritten with only its open records.
const COMPACT_AT: u64 = 1 << 20;
/// Commit lines older than this are dropped after a flush of the cache:
/// about the kernel's own write-back delay (`dirty_expire_centisecs`,
/// 30 s by default).
const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
/// A temp file in the cache's `results/` whose writer's pid is gone is
/// removed once it is this old ([`Intents::remove_abandoned_cache_temps`]):
/// no write of a record takes that long, even by a writer in another pid
/// namespace, whose pid may name no process here.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// One recorded ADD.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Intent {
    pub(crate) network: String,
    pub(crate) rt: RuntimeConf,
    /// The configuration list's bytes (`NetworkConfigList::cache_bytes`).
    pub(crate) config: Vec<u8>,
    pub(crate) created_ms: u64,
}

impl Intent {
    pub(crate) fn new(network: &str, rt: &RuntimeConf, config: Vec<u8>) -> Self {
        Intent {
            network: network.to_owned(),
            rt: rt.clone(),
            config,
            created_ms: now_ms(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let args: Vec<Value> = self
            .rt
            .args
            .pairs()
            .iter()
            .map(|(k, v)| json!([k, v]))
            .collect();
        let v = json!({
            "kind": KIND,
            "networkName": self.network,
            "containerId": self.rt.container_id,
            "ifName": self.rt.ifname,
            "netns": self.rt.netns,
            "cniArgs": args,
            "capabilityArgs": Value::Object(self.rt.capability_args.as_map().clone()),
            "config": BASE64.encode(&self.config),
            "createdAtMs": self.created_ms,
            "pid": std::process::id(),
        });
        serde_json::to_vec_pretty(&v).unwrap_or_default()
    }

    fn decode(bytes: &[u8]) -> Result<Intent, String> {
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let obj = v.as_object().ok_or("not a JSON object")?;
        let text = |k: &str| -> Result<String, String> {
            obj.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("missing string field {k:?}"))
        };
        if text("kind")? != KIND {
            return Err(format!("kind is not {KIND:?}"));
        }
        let mut args = CniArgs::new();
        if let Some(pairs) = obj.get("cniArgs").and_then(Value::as_array) {
            for p in pairs {
                match p.as_array().map(Vec::as_slice) {
                    Some([Value::String(k), Value::String(v)]) => args.push(k, v),
                    _ => return Err("field \"cniArgs\" is not a list of [key, value]".into()),
                }
            }
        }
        let caps = CapabilityArgs::from_value(
            obj.get("capabilityArgs")
                .cloned()
                .unwrap_or(Value::Object(Map::new())),
        )
        .map_err(|e| e.to_string())?;
        let rt = RuntimeConf {
            container_id: text("containerId")?,
            netns: text("netns").unwrap_or_default(),
            ifname: text("ifName")?,
            args,
            capability_args: caps,
        };
        let network = text("networkName")?;
        validate::network_name(&network).map_err(|e| e.to_string())?;
        rt.validate().map_err(|e| e.to_string())?;
        let config = BASE64
            .decode(text("config")?)
            .map_err(|e| format!("field \"config\" is not base64: {e}"))?;
        Ok(Intent {
            network,
            rt,
            config,
            created_ms: obj.get("createdAtMs").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// An intent file found at start.
#[derive(Debug)]
pub(crate) enum Found {
    /// A usable intent.
    Intent(PathBuf, Box<Intent>),
    /// A file that could not be read (already moved aside).
    Corrupt(PathBuf, String),
}

/// The intents dir.
#[derive(Debug, Clone)]
pub(crate) struct Intents {
    dir: PathBuf,
    journal: Arc<Mutex<Journal>>,
    /// The result cache whose records [`Intents::commit`] makes durable
    /// (the daemon's, written without `fsync`); `None` in tests of the
    /// journal alone.
    cache: Option<ResultCache>,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`), written into
    /// each commit record: a record from another boot means the machine
    /// went down, and the page cache with it.
    boot: Arc<str>,
    /// Whether the cache is written without `fsync` and commit lines carry
    /// its records ([`Intents::with_cache`]); otherwise an ADD ends with a
    /// plain `end` line, the cache flushing its own records.
    deferred: bool,
    /// Wakes [`Intents::flush_loop`] when the journal is due for a
    /// compaction that has commit lines to flush (off the request path).
    wake: Arc<tokio::sync::Notify>,
    /// The attachments whose records compactions flushed, in order, and
    /// how many record files those flushes `fsync`ed.
    #[cfg(test)]
    synced: Arc<Mutex<(Vec<String>, usize)>>,
}

/// What [`Intents::begin`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Recorded: run the plugins, then [`Intents::commit`] or
    /// [`Intents::finish`].
    Recorded(Pending),
    /// The attachment has a cached result: it exists.
    Cached,
    /// The attachment has an intent: an ADD in progress, or one that
    /// failed and was not undone.
    Open,
}

#[cfg(test)]
impl Begun {
    /// The record, when one was made.
    fn pending(self) -> Option<Pending> {
        match self {
            Begun::Recorded(p) => Some(p),
            Begun::Cached | Begun::Open => None,
        }
    }
}

/// Why [`Intents::begin`] could not record.
#[derive(Debug)]
pub(crate) enum BeginError {
    /// Reading the attachment's cached result failed.
    Cache(cni_async::Error),
    /// Appending to or flushing the journal failed.
    Journal(io::Error),
}

/// The journal's file and the ADDs it holds open.
#[derive(Debug)]
struct Journal {
    /// Opened for appending (at the first record after start).
    file: Option<Arc<File>>,
    /// Bytes appended since it was last emptied or rewritten.
    len: u64,
    next_seq: u64,
    /// The ADDs begun and not ended: their attachment key and their
    /// `begin` line, which a compaction copies.
    open: HashMap<u64, (String, Vec<u8>)>,
    /// Rewrite the journal past this many bytes (and past twice what the
    /// last rewrite kept: many long ADDs open do not make every `end` a
    /// rewrite).
    compact_at: u64,
    kept: u64,
    /// The commit records in the journal whose cache records may not be
    /// flushed yet, by commit number (in append order): a compaction keeps
    /// them until an `fsync` of each of those records. Only a journal with
    /// a deferred cache ([`Intents::with_cache`]) has any.
    committed: std::collections::BTreeMap<u64, Committed>,
    next_commit: u64,
    /// A compaction is flushing the cache (outside the lock).
    compacting: bool,
    /// Commit lines a start could not settle (a record that could not be
    /// restored or flushed: [`Intents::prepare`]), rewritten with `end` 0,
    /// which ends no `begin`. Until the next start settles them, every
    /// rewrite of the journal copies them first, [`Intents::close`] keeps
    /// the journal, and only a commit or a removal of their attachment
    /// drops them (a newer line, or a `gone` line, then stands for it).
    carried: Vec<Carried>,
}

/// A commit line carried over from an earlier start ([`Journal::carried`]).
#[derive(Debug)]
struct Carried {
    attachment: [String; 3],
    line: Vec<u8>,
}

impl Carried {
    fn key(&self) -> String {
        let [n, c, i] = &self.attachment;
        key(n, c, i)
    }
}

/// A commit line kept in the journal: its attachment (network, container
/// ID, interface), its bytes, and when it was appended.
#[derive(Debug)]
struct Committed {
    attachment: [String; 3],
    line: Vec<u8>,
    at: tokio::time::Instant,
}

impl Committed {
    fn names(&self) -> (&str, &str, &str) {
        let [n, c, i] = &self.attachment;
        (n, c, i)
    }
}

/// An ADD recorded in the journal ([`Intents::begin`]), to be ended with
/// [`Intents::finish`] or [`Intents::keep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending(u64);

/// A `begin` line: the intent's fields (as in an intent file) and `seq`.
fn begin_line(seq: u64, intent: &Intent) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&intent.encode()).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("seq".into(), json!(seq));
    }
    // Compact JSON has no raw newline: one record per line.
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    line
}

fn end_line(seq: u64) -> Vec<u8> {
    format!("{{\"end\":{seq}}}\n").into_bytes()
}

/// A commit line: ends `seq` and carries the attachment's cache record
/// (its exact bytes, base64) and this boot's id.
fn commit_line(seq: u64, boot: &str, record: &[u8]) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({
        "end": seq,
        "boot": boot,
        "record": BASE64.encode(record),
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// A `gone` line: the attachment was DELed after its commit line (not
/// flushed: see [`Intents::remove`]).
fn gone_line(key: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({ "gone": key })).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The cache records the journal's commit lines carry, the last one per
/// attachment and not followed by a `gone` line of it, with the boot each
/// was committed in. Unreadable ones are skipped with an error logged.
fn committed_records(bytes: &[u8]) -> Vec<(String, CacheRecord, Vec<u8>)> {
    let mut out: Vec<(String, CacheRecord, Vec<u8>)> = Vec::new();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if let Some(gone) = v.get("gone").and_then(Value::as_str) {
            out.retain(|(_, r, _)| key(&r.network_name, &r.container_id, &r.if_name) != gone);
            continue;
        }
        let Some(b64) = v.get("record").and_then(Value::as_str) else {
            continue;
        };
        let boot = v
            .get("boot")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let rec = BASE64.decode(b64).map_err(|e| e.to_string()).and_then(|b| {
            match CacheEntry::decode(&b, "the ADD journal") {
                Ok(CacheEntry::Record(r)) => Ok((r, b)),
                Ok(CacheEntry::LegacyResult(_)) => Err("not a cniCacheV1 record".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        });
        match rec {
            Ok((rec, bytes)) => {
                let same = |(_, r, _): &(String, CacheRecord, Vec<u8>)| {
                    r.network_name == rec.network_name
                        && r.container_id == rec.container_id
                        && r.if_name == rec.if_name
                };
                out.retain(|e| !same(e));
                out.push((boot, rec, bytes));
            }
            Err(reason) => {
                tracing::error!(%reason, "unreadable cache record in the ADD journal; skipped")
            }
        }
    }
    out
}

/// This boot's id; empty when it cannot be read.
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn key(network: &str, container_id: &str, ifname: &str) -> String {
    format!("{network}:{container_id}:{ifname}")
}

/// The journal's records: the intents begun and not ended, oldest first.
/// Lines that do not parse are skipped: only the tail an interrupted
/// append left can be torn, and that append never returned (no plugin ran
/// for it).
///
/// A `begin` is superseded by a later `begin` of the same attachment:
/// [`Intents::begin`] records one only when the attachment has no ADD
/// open and no intent file, so the earlier ADD was over by then, its
/// `end` or commit line lost to a failed append (a full disk) after it
/// was undone. Rolling it back would delete the later ADD's attachment,
/// answered since.
fn open_records(bytes: &[u8]) -> Vec<(u64, Result<Intent, String>)> {
    let mut begun: Vec<(u64, Result<Intent, String>)> = Vec::new();
    let mut ended = std::collections::HashSet::new();
    let of = |i: &Intent| key(&i.network, &i.rt.container_id, &i.rt.ifname);
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            tracing::debug!("skipping a torn ADD journal record");
            continue;
        };
        if let Some(seq) = v.get("end").and_then(Value::as_u64) {
            ended.insert(seq);
        } else if let Some(seq) = v.get("seq").and_then(Value::as_u64) {
            let intent = Intent::decode(line);
            if let Ok(new) = &intent {
                let k = of(new);
                begun.retain(|(_, old)| old.as_ref().map_or(true, |o| of(o) != k));
            }
            begun.push((seq, intent));
        }
    }
    begun.retain(|(seq, _)| !ended.contains(seq));
    begun
}

/// The highest sequence number a `begin` or an `end` in the journal
/// carries (0 for none): a new run numbers past it, so that no `end` left
/// from an earlier run can end one of its `begin`s.
fn max_seq(bytes: &[u8]) -> u64 {
    bytes
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter_map(|v| {
            v.get("seq")
                .and_then(Value::as_u64)
                .or_else(|| v.get("end").and_then(Value::as_u64))
        })
        .max()
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn ctx(path: &Path, op: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(format!("blocking task failed: {e}"))))
}

/// Whether the journal is to be rewritten: past its size limit, and past
/// twice what the last rewrite kept (many long ADDs open do not make every
/// `end` a rewrite).
fn due(j: &Journal) -> bool {
    j.len >= j.compact_at.max(2 * j.kept)
}

impl Intents {
    /// The intents dir under `state_dir`.
    pub(crate) fn new(state_dir: &Path) -> Self {
        Intents {
            dir: state_dir.join(INTENTS_DIR),
            journal: Arc::new(Mutex::new(Journal {
                file: None,
                len: 0,
                next_seq: 1,
                open: HashMap::new(),
                compact_at: COMPACT_AT,
                kept: 0,
                committed: Default::default(),
                next_commit: 0,
                compacting: false,
                carried: Vec::new(),
            })),
            cache: None,
            deferred: false,
            boot: boot_id().into(),
            wake: Arc::new(tokio::sync::Notify::new()),
            #[cfg(test)]
            synced: Arc::default(),
        }
    }

    /// The daemon's result cache: [`Intents::begin`] checks it. With
    /// `deferred`, the cache is written without `fsync`, commit lines
    /// carry its records, [`Intents::prepare`] restores them after a reboot
    /// and compactions flush them.
    pub(crate) fn with_cache(mut self, cache: ResultCache, deferred: bool) -> Self {
        self.cache = Some(cache);
        self.deferred = deferred;
        self
    }

    /// Whether this boot's id could be read: without it, a restart cannot
    /// tell a reboot from a process crash, and the cache must flush its own
    /// records.
    pub(crate) fn knows_boot(&self) -> bool {
        !self.boot.is_empty()
    }

    #[cfg(test)]
    fn with_boot_id(mut self, boot: &str) -> Self {
        self.boot = boot.into();
        self
    }

    #[cfg(test)]
    fn with_compact_at(self, bytes: u64) -> Self {
        self.journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .compact_at = bytes;
        self
    }

    /// At start, before any request: creates the dir, or makes an existing
    /// one private (0700, see `private_state_dir`), then turns the ADDs the
    /// journal holds open (begun before a crash, never ended) into intent
    /// files ([`Intents::scan`] finds them) and empties the journal. The
    /// files are durable before the journal is emptied, so a crash in
    /// between only does it again.
    pub(crate) fn prepare(&self) -> io::Result<()> {
        super::private_state_dir(&self.dir)
            .map_err(|e| io::Error::other(format!("{}: {e}", self.dir.display())))?;
        let path = self.dir.join(JOURNAL);
        let bytes = match durable::read_nofollow(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ctx(&path, "read", e)),
        };
        let mtime = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok();
        let unsettled = self.settle_commits(&bytes, mtime);
        for (seq, intent) in open_records(&bytes) {
            match intent {
                Ok(i) => {
                    let file = self.path(&i.network, &i.rt.container_id, &i.rt.ifname);
                    durable::write_atomic(&file, &i.encode(), 0o600, true)?;
                }
                Err(reason) => tracing::error!(file = %path.display(), seq, %reason,
                    "unreadable ADD journal record; its attachment (if any) is not cleaned up"),
            }
        }
        // The open records are intent files now: the journal keeps only
        // the commit lines not settled, and no `begin` or `end` of an
        // earlier run (a `begin` left there would be rolled back again at
        // every start, and an `end` would end a new `begin` of the same
        // number).
        let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        j.next_seq = max_seq(&bytes) + 1;
        if unsettled.is_empty() {
            if !bytes.is_empty() {
                let f = OpenOptions::new()
                    .write(true)
                    .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
                    .open(&path)
                    .map_err(|e| ctx(&path, "open", e))?;
                f.set_len(0)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| ctx(&path, "empty", e))?;
            }
        } else {
            let kept: Vec<u8> = unsettled.iter().flat_map(|c| c.line.clone()).collect();
            durable::write_atomic(&path, &kept, 0o600, true)?;
            j.kept = kept.len() as u64;
        }
        j.carried = unsettled;
        Ok(())
    }

    /// Records an ADD before its first plugin runs: one line appended to
    /// the journal and `fdatasync`ed (the journal's dir entry was made
    /// durable when it was created). Cheaper than an intent file per ADD
    /// (temp file, fsync, rename, fsync of the dir) by one flush and three
    /// metadata operations. `Ok(None)`, recording nothing, when the
    /// attachment has an intent already (an ADD not undone, in its file,
    /// or one in progress): checked in the same hop to the blocking pool.
    ///
    /// With a cache ([`Intents::with_cache`]), an attachment whose result is
    /// cached is refused first ([`Begun::Cached`]), in the same hop.
    pub(crate) async fn begin(&self, intent: &Intent) -> Result<Begun, BeginError> {
        let k = key(&intent.network, &intent.rt.container_id, &intent.rt.ifname);
        let this = self.clone();
        let intent = intent.clone();
        let task = tokio::task::spawn_blocking(move || {
            let (net, cid, ifname) = (
                intent.network.as_str(),
                intent.rt.container_id.as_str(),
                intent.rt.ifname.as_str(),
            );
            if let Some(cache) = &this.cache {
                match cache.read_blocking(net, cid, ifname) {
                    Ok(Some(_)) => return Ok(Begun::Cached),
                    Ok(None) => {}
                    Err(e) => return Err(BeginError::Cache(e)),
                }
            }
            let path = this.dir.join(JOURNAL);
            if std::fs::symlink_metadata(this.path(net, cid, ifname)).is_ok() {
                return Ok(Begun::Open);
            }
            let (seq, file) = {
                let mut j = this.journal.lock().unwrap_or_else(|e| e.into_inner());
                if j.open.values().any(|(open, _)| *open == k) {
                    return Ok(Begun::Open);
                }
                let file = this.journal_file(&mut j).map_err(BeginError::Journal)?;
                let seq = j.next_seq;
                j.next_seq += 1;
                let line = begin_line(seq, &intent);
                this.append(&mut j, &file, &line)
                    .map_err(BeginError::Journal)?;
                j.open.insert(seq, (k, line));
                (seq, file)
            };
            // Outside the lock: concurrent ADDs flush together. A
            // compaction meanwhile copies this record into its durable
            // rewrite, so the record is durable either way.
            if let Err(e) = file.sync_data() {
                this.journal
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .open
                    .remove(&seq);
                return Err(BeginError::Journal(ctx(&path, "fdatasync", e)));
            }
            Ok(Begun::Recorded(Pending(seq)))
        });
        task.await.unwrap_or_else(|e| {
            Err(BeginError::Journal(io::Error::other(format!(
                "blocking task failed: {e}"
            ))))
        })
    }

    /// Ends a completed ADD whose result the cache holds, written without
    /// `fsync`: a commit line carrying that record (`rec`, the bytes the
    /// cache file holds) is appended and `fdatasync`ed, on the blocking
    /// pool. One flush instead of the cache's two (temp file, dir), and
    /// what makes the record outlive a power loss: after a reboot,
    /// [`Intents::prepare`] puts it back. A compaction forgets commit lines
    /// only after an `fsync` of their records, in [`Intents::flush_loop`],
    /// never on the request path. On an error the ADD is off the open set
    /// (as with [`Intents::finish`]), and the caller must undo it.
    pub(crate) async fn commit(&self, pending: Pending, rec: &CacheRecord) -> io::Result<()> {
        if !self.deferred {
            return self.finish(pending).await;
        }
        let line = commit_line(pending.0, &self.boot, &rec.encode());
        let attachment = [
            rec.network_name.clone(),
            rec.container_id.clone(),
            rec.if_name.clone(),
        ];
        let this = self.clone();
        blocking(move || {
            let path = this.dir.join(JOURNAL);
            let (file, due_now) = {
                let mut j = this.journal.lock().unwrap_or_else(|e| e.into_inner());
                j.open.remove(&pending.0);
                let file = this.journal_file(&mut j)?;
                this.append(&mut j, &file, &line)?;
                // This line stands for the attachment from now on.
                let k = key(&attachment[0], &attachment[1], &attachment[2]);
                j.carried.retain(|c| c.key() != k);
                let n = j.next_commit;
                j.next_commit += 1;
                j.committed.insert(
                    n,
                    Committed {
                        attachment,
                        line,
                        at: tokio::time::Instant::now(),
                    },
                );
                (file, due(&j))
            };
            // Outside the lock, as in `begin`: a rewrite meanwhile copies
            // the line durably.
            file.sync_data().map_err(|e| ctx(&path, "fdatasync", e))?;
            if due_now {
                this.wake.notify_one();
            }
            Ok(())
        })
        .await
    }

    /// Ends a recorded ADD (completed and cached, or rolled back): an `end`
    /// line, not flushed (see the module docs), written on the calling
    /// thread (a short append to the page cache; only a compaction, which
    /// flushes, goes to the blocking pool). The ADD is off the open set even
    /// when the append fails: its `begin` then only costs a repeat DEL at
    /// the next start.
    pub(crate) async fn finish(&self, pending: Pending) -> io::Result<()> {
        {
            let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
            j.open.remove(&pending.0);
            let file = self.journal_file(&mut j)?;
            self.append(&mut j, &file, &end_line(pending.0))?;
            if !due(&j) {
                return Ok(());
            }
            if !j.committed.is_empty() {
                // Commit lines to flush first: the flush loop's work.
                self.wake.notify_one();
                return Ok(());
            }
        }
        let this = self.clone();
        blocking(move || this.compact_if_due()).await
    }

    /// At a graceful exit, once every operation finished: removes the
    /// journal when it holds no open ADD, so that a stopped cnid leaves only
    /// what the next start needs. With open records (not expected after a
    /// drain), or commit lines carried from the start ([`Journal::carried`]:
    /// records still to restore), it stays for the next start.
    pub(crate) fn close(&self) {
        let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        if !j.open.is_empty() {
            return;
        }
        if !j.committed.is_empty()
            && let Some(cache) = &self.cache
        {
            // The records the commit lines stand for must be on disk before
            // the lines go (at most those of the last minute or so).
            let synced = cache.sync_records_blocking(j.committed.values().map(Committed::names));
            if let Err(e) = synced {
                tracing::warn!(error = %cni_core::error::Chain(&e), "cannot flush the cached ADD results at exit; the ADD journal stays for the next start");
                return;
            }
            j.committed.clear();
        }
        if !j.carried.is_empty() {
            tracing::warn!(
                count = j.carried.len(),
                "cached ADD results not restored yet; the ADD journal stays for the next start"
            );
            return;
        }
        j.file = None;
        j.len = 0;
        let path = self.dir.join(JOURNAL);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot remove the ADD journal at exit")
            }
        }
    }

    /// An ADD that failed and could not be rolled back: its intent file is
    /// written (durably) before the journal's record is ended, so the
    /// attachment stays recorded until a DEL succeeds. When the file cannot
    /// be written, the journal record stays open: the next start turns it
    /// into the file.
    pub(crate) async fn keep(&self, pending: Pending, intent: &Intent) -> io::Result<()> {
        self.write(intent).await?;
        self.finish(pending).await
    }

    /// At start, before the journal is emptied: the cache records its
    /// commit lines carry. Committed in another boot (the machine went
    /// down, maybe before writing them back), each attachment's file is
    /// made to hold its last committed record again, unless it already
    /// does or was written after the journal's last change (by another
    /// tool since the reboot: left alone). A DEL answered before the
    /// crash may come back with it if its `gone` line was not written
    /// back: a repeat DEL of a record is harmless, as for any removal a
    /// power loss undoes. Committed in this boot (only the process died),
    /// the page cache still holds what was written, including later
    /// removals: nothing is restored, the records are flushed. Returns
    /// the commit lines whose record could not be restored or flushed,
    /// rewritten with `end` 0 (see [`Journal::carried`]): the journal keeps
    /// them for the next start, which settles them again. Restartable: a
    /// crash anywhere in here leaves the journal as it was, and doing it
    /// again restores the same bytes or finds them there.
    fn settle_commits(&self, bytes: &[u8], journal_mtime: Option<SystemTime>) -> Vec<Carried> {
        let Some(cache) = &self.cache else {
            return Vec::new();
        };
        let records = committed_records(bytes);
        let mut unsettled = Vec::new();
        let carry = |boot: &str, rec: &CacheRecord, bytes: &[u8]| Carried {
            attachment: [
                rec.network_name.clone(),
                rec.container_id.clone(),
                rec.if_name.clone(),
            ],
            line: commit_line(0, boot, bytes),
        };
        let mut flush = Vec::new();
        for (boot, rec, bytes) in &records {
            let (net, cid, ifname) = (&rec.network_name, &rec.container_id, &rec.if_name);
            if self.boot.is_empty() || **boot == *self.boot {
                flush.push((net.as_str(), cid.as_str(), ifname.as_str()));
                continue;
            }
            let path = match cache.path(net, cid, ifname) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(network = %net, container = %cid, ifname = %ifname, error = %cni_core::error::Chain(&e), "ADD journal: unusable committed record; skipped");
                    continue;
                }
            };
            if durable::read_nofollow(&path).is_ok_and(|b| b == *bytes) {
                continue;
            }
            let newer = std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .zip(journal_mtime)
                .is_some_and(|(file, journal)| file > journal);
            if newer {
                tracing::info!(network = %net, container = %cid, ifname = %ifname,
                    "cached result written after the machine went down; the journal's older one is not restored");
                continue;
            }
            match cache.write_durable_blocking(rec) {
                Ok(()) => tracing::warn!(network = %net, container = %cid, ifname = %ifname,
                    "restored the cached result of an ADD answered before the machine went down"),
                Err(e) => {
                    unsettled.push(carry(boot, rec, bytes));
                    tracing::error!(network = %net, container = %cid, ifname = %ifname, error = %cni_core::error::Chain(&e),
                        "cannot restore the cached result of an ADD answered before the machine went down; the ADD journal is kept for the next start");
                }
            }
        }
        if let Err(e) = cache.sync_records_blocking(flush) {
            unsettled.extend(
                records
                    .iter()
                    .filter(|(boot, _, _)| self.boot.is_empty() || **boot == *self.boot)
                    .map(|(boot, rec, bytes)| carry(boot, rec, bytes)),
            );
            tracing::error!(error = %cni_core::error::Chain(&e), "cannot flush the cached ADD results; the ADD journal is kept for the next start");
        }
        unsettled
    }

    /// Appends one record with one `write` (`O_APPEND`: records of
    /// concurrent ADDs never interleave). A failed append is cut off again,
    /// so that no torn line swallows the records after it.
    fn append(&self, j: &mut Journal, file: &File, line: &[u8]) -> io::Result<()> {
        if let Err(e) = (&*file).write_all(line) {
            let _ = file.set_len(j.len);
            return Err(ctx(&self.dir.join(JOURNAL), "append to", e));
        }
        j.len += line.len() as u64;
        Ok(())
    }

    /// The journal, opened (created, and its dir entry made durable) when
    /// it is not yet.
    fn journal_file(&self, j: &mut Journal) -> io::Result<Arc<File>> {
        if let Some(f) = &j.file {
            return Ok(f.clone());
        }
        self.open_journal(j, true)
    }

    /// Opens the journal for appending; `sync`: make its content and dir
    /// entry durable first (not needed right after a durable rewrite).
    fn open_journal(&self, j: &mut Journal, sync: bool) -> io::Result<Arc<File>> {
        let path = self.dir.join(JOURNAL);
        let f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ctx(&path, "open", e))?;
        j.len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if sync {
            f.sync_all().map_err(|e| ctx(&path, "fsync", e))?;
            durable::sync_dir(&self.dir)?;
        }
        let f = Arc::new(f);
        j.file = Some(f.clone());
        Ok(f)
    }

    /// When the journal is due ([`due`]): flushes the records of its commit
    /// lines (an `fsync` each, outside the journal's lock: ADDs go on
    /// meanwhile), then rewrites the journal without the lines that flush
    /// made unnecessary. Blocking. One compaction at a time; an ADD that
    /// finds one running leaves the work to it or to a later one.
    fn compact_if_due(&self) -> io::Result<()> {
        self.compact_when(due)
    }

    /// Every [`FLUSH_EVERY`] while the daemon runs ([`Intents::flush_loop`]):
    /// commit lines older than that are dropped after an `fsync` of their
    /// records, so that a power loss brings back only the records of the
    /// last minute at most (those DELed since included), and not every
    /// attachment committed since the last compaction.
    fn flush_old_commits(&self) -> io::Result<()> {
        // `committed` is in append order: its first line is the oldest.
        self.compact_when(|j| {
            j.committed
                .values()
                .next()
                .is_some_and(|c| c.at.elapsed() >= FLUSH_EVERY)
        })
    }

    /// Until `stop`: every [`FLUSH_EVERY`], flushes the commits older than
    /// that; when an ADD found the journal due, compacts it. On the
    /// blocking pool, off every request's path. Once, [`ABANDONED_AFTER`]
    /// after the start, removes the temp files of killed cache writers.
    pub(crate) async fn flush_loop(self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let sweep = tokio::time::sleep(ABANDONED_AFTER);
        tokio::pin!(sweep);
        let mut swept = false;
        loop {
            let old = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => true,
                _ = self.wake.notified() => false,
                () = &mut sweep, if !swept => {
                    swept = true;
                    let this = self.clone();
                    let _ = blocking(move || {
                        this.remove_abandoned_cache_temps();
                        Ok(())
                    })
                    .await;
                    continue;
                }
            };
            if old
                && self
                    .journal
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .committed
                    .is_empty()
            {
                // An idle daemon wakes no pool thread.
                continue;
            }
            let this = self.clone();
            let res = blocking(move || {
                if old {
                    this.flush_old_commits()
                } else {
                    this.compact_if_due()
                }
            })
            .await;
            if let Err(e) = res {
                tracing::warn!(error = %e, "cannot flush the committed ADD results; retrying later");
            }
        }
    }

    fn compact_when(&self, when: impl Fn(&Journal) -> bool) -> io::Result<()> {
        let (upto, attachments) = {
            let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
            if j.compacting || !when(&j) {
                return Ok(());
            }
            if j.committed.is_empty() {
                return self.compact(&mut j);
            }
            j.compacting = true;
            let attachments: Vec<[String; 3]> =
                j.committed.values().map(|c| c.attachment.clone()).collect();
            (j.next_commit, attachments)
        };
        // Every commit numbered below `upto` was appended after its cache
        // record was written: these fsyncs make those records durable.
        let synced = self.cache.as_ref().map_or(Ok(0), |c| {
            c.sync_records_blocking(
                attachments
                    .iter()
                    .map(|[n, c, i]| (n.as_str(), c.as_str(), i.as_str())),
            )
        });
        let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        j.compacting = false;
        let _files = match synced {
            Ok(n) => n,
            Err(e) => {
                return Err(io::Error::other(format!(
                    "flush the cached ADD results: {}",
                    cni_core::error::Chain(&e)
                )));
            }
        };
        #[cfg(test)]
        {
            let mut t = self.synced.lock().unwrap();
            t.0.extend(attachments.iter().map(|[n, c, i]| key(n, c, i)));
            t.1 += _files;
        }
        j.committed.retain(|n, _| *n >= upto);
        self.compact(&mut j)
    }

    /// Rewrites the journal with only the lines carried from the start, the
    /// open ADDs' `begin` lines and the commit lines still needed (atomically and durably,
    /// [`durable::write_atomic`]), or empties it when there are none. Under
    /// the journal's lock.
    fn compact(&self, j: &mut Journal) -> io::Result<()> {
        let path = self.dir.join(JOURNAL);
        if j.open.is_empty() && j.committed.is_empty() && j.carried.is_empty() {
            if let Some(f) = &j.file {
                // Not flushed: the records it drops are all ended, and a
                // power loss that brings them back brings back their ends.
                f.set_len(0).map_err(|e| ctx(&path, "empty", e))?;
            }
            j.len = 0;
            j.kept = 0;
            return Ok(());
        }
        let mut seqs: Vec<u64> = j.open.keys().copied().collect();
        seqs.sort_unstable();
        // The carried lines are older than any of this run: first, so that
        // a newer line of their attachment still wins at the next start.
        let mut bytes: Vec<u8> = j.carried.iter().flat_map(|c| c.line.clone()).collect();
        for s in seqs {
            bytes.extend_from_slice(&j.open[&s].1);
        }
        for c in j.committed.values() {
            bytes.extend_from_slice(&c.line);
        }
        durable::write_atomic(&path, &bytes, 0o600, true)?;
        j.file = None;
        j.len = bytes.len() as u64;
        j.kept = j.len;
        self.open_journal(j, false)?;
        Ok(())
    }

    fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        // The names were validated: no '/', no ':', never "." or "..".
        self.dir
            .join(format!("{network}:{container_id}:{ifname}{SUFFIX}"))
    }

    /// Writes the intent's file durably (temp file, fsync, rename, fsync of
    /// the dir: [`durable::write_atomic`]).
    pub(crate) async fn write(&self, intent: &Intent) -> io::Result<()> {
        let path = self.path(&intent.network, &intent.rt.container_id, &intent.rt.ifname);
        let bytes = intent.encode();
        blocking(move || Ok(durable::write_atomic(&path, &bytes, 0o600, true)?)).await
    }

    /// Removes an attachment's intent (not `fsync`ed, see the module docs);
    /// `Ok(false)` when there was none.
    ///
    /// Called after every DEL that succeeded (a GC's deletions:
    /// [`Intents::forget_removed`]): the attachment's commit
    /// lines are forgotten too, with a `gone` line (not flushed), so that a
    /// restart after a power loss restores its record only if that line
    /// did not reach the disk (as with the cache's own removal).
    pub(crate) async fn remove(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> io::Result<bool> {
        let path = self.path(network, container_id, ifname);
        let k = key(network, container_id, ifname);
        let this = self.clone();
        blocking(move || {
            {
                let mut j = this.journal.lock().unwrap_or_else(|e| e.into_inner());
                let before = j.committed.len() + j.carried.len();
                j.committed.retain(|_, c| {
                    let (n, c, i) = c.names();
                    key(n, c, i) != k
                });
                j.carried.retain(|c| c.key() != k);
                if j.committed.len() + j.carried.len() != before {
                    let file = this.journal_file(&mut j)?;
                    this.append(&mut j, &file, &gone_line(&k))?;
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(ctx(&path, "remove", e)),
            }
        })
        .await
    }

    /// After a GC of `network`, under its exclusive gate (no ADD or DEL of
    /// it runs): forgets, as [`Intents::remove`] does after a DEL, the
    /// commit lines of its attachments whose cache record is gone (the
    /// GC deleted them, even when it then failed), with a `gone` line
    /// each. Without it a restart after a power loss would bring such a
    /// record back, and the record would refuse the attachment's next ADD.
    /// Returns how many were forgotten.
    pub(crate) async fn forget_removed(&self, network: &str) -> io::Result<usize> {
        let Some(cache) = self.cache.clone() else {
            return Ok(0);
        };
        let this = self.clone();
        let network = network.to_owned();
        blocking(move || {
            let removed = |[n, c, i]: &[String; 3]| {
                *n == network
                    && cache.path(n, c, i).is_ok_and(|p| {
                        std::fs::symlink_metadata(p)
                            .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
                    })
            };
            let mut j = this.journal.lock().unwrap_or_else(|e| e.into_inner());
            let mut gone: Vec<String> = j
                .committed
                .values()
                .map(|c| &c.attachment)
                .chain(j.carried.iter().map(|c| &c.attachment))
                .filter(|a| removed(a))
                .map(|[n, c, i]| key(n, c, i))
                .collect();
            gone.sort();
            gone.dedup();
            if gone.is_empty() {
                return Ok(0);
            }
            j.committed.retain(|_, c| {
                let (n, c, i) = c.names();
                !gone.contains(&key(n, c, i))
            });
            j.carried.retain(|c| !gone.contains(&c.key()));
            let file = this.journal_file(&mut j)?;
            for k in &gone {
                this.append(&mut j, &file, &gone_line(k))?;
            }
            Ok(gone.len())
        })
        .await
    }

    /// An attachment's intent, if there is a readable one.
    pub(crate) async fn read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<Intent> {
        let path = self.path(network, container_id, ifname);
        blocking(move || {
            Ok(durable::read_nofollow(&path)
                .ok()
                .and_then(|b| Intent::decode(&b).ok()))
        })
        .await
        .ok()
        .flatten()
    }

    /// Whether an attachment has an intent.
    #[cfg(test)]
    pub(crate) async fn exists(&self, network: &str, container_id: &str, ifname: &str) -> bool {
        let k = key(network, container_id, ifname);
        if self
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .values()
            .any(|(open, _)| *open == k)
        {
            return true;
        }
        let path = self.path(network, container_id, ifname);
        blocking(move || Ok(std::fs::symlink_metadata(&path).is_ok()))
            .await
            .unwrap_or(false)
    }

    /// The regular files in the dir, sorted by name.
    fn names(&self) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ctx(&self.dir, "read directory", e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The intent in file `name`, checked against its name.
    fn load(&self, name: &str) -> Result<Intent, String> {
        let path = self.dir.join(name);
        let i = durable::read_nofollow(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| Intent::decode(&b))?;
        let want = self.path(&i.network, &i.rt.container_id, &i.rt.ifname);
        if want == path {
            Ok(i)
        } else {
            Err(format!(
                "its fields name another attachment ({})",
                want.display()
            ))
        }
    }

    /// At start only, before any request runs: removes the temp files of
    /// writes that never finished (no plugin ran for them;
    /// [`durable::remove_leftovers`]). At any other time this would remove
    /// the temp file of an ADD being recorded. Returns how many were removed.
    pub(crate) fn remove_leftovers(&self) -> io::Result<usize> {
        Ok(durable::remove_leftovers(&self.dir)?)
    }

    /// Removes the temp files of cache writers killed mid-write (a
    /// `kill -9` between a record's temp file and its rename) from the
    /// shared cache's `results/`: ours only, of dead writers, at least
    /// [`ABANDONED_AFTER`] old ([`ResultCache::remove_abandoned_temps`]).
    /// At start, and once more that long after it ([`Intents::flush_loop`])
    /// for those the killed predecessor left just before. Blocking.
    pub(crate) fn remove_abandoned_cache_temps(&self) {
        let Some(cache) = &self.cache else { return };
        match cache.remove_abandoned_temps(ABANDONED_AFTER) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                count = n,
                "removed temp files of cache writers killed mid-write"
            ),
            Err(e) => {
                tracing::warn!(error = %cni_core::error::Chain(&e), "cannot remove the temp files of killed cache writers")
            }
        }
    }

    /// Every intent file, oldest name first; unreadable ones are moved to
    /// `intents/corrupt/` and reported. At start only (see the module docs).
    pub(crate) fn scan(&self) -> io::Result<Vec<Found>> {
        let mut out = Vec::new();
        for name in self.names()? {
            if name.starts_with('.') || !name.ends_with(SUFFIX) {
                continue;
            }
            let path = self.dir.join(&name);
            match self.load(&name) {
                Ok(i) => out.push(Found::Intent(path, Box::new(i))),
                Err(reason) => {
                    self.move_aside(&path);
                    out.push(Found::Corrupt(path, reason));
                }
            }
        }
        Ok(out)
    }

    /// The intents of one network (for GC, under the network's exclusive
    /// gate): only its own `<network>:*.json` files are read, and nothing
    /// is removed or moved. An unreadable one is skipped with a warning
    /// (the next start moves it aside).
    pub(crate) async fn of_network(&self, network: &str) -> Vec<Intent> {
        let this = self.clone();
        let prefix = format!("{network}:");
        let res = blocking(move || {
            let mut out = Vec::new();
            for name in this.names()? {
                if !name.starts_with(&prefix) || !name.ends_with(SUFFIX) {
                    continue;
                }
                match this.load(&name) {
                    Ok(i) => out.push(i),
                    Err(reason) => {
                        tracing::warn!(file = %this.dir.join(&name).display(), %reason, "unreadable ADD intent skipped by GC");
                    }
                }
            }
            Ok(out)
        })
        .await;
        res.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the ADD intents for GC");
            Vec::new()
        })
    }

    fn move_aside(&self, path: &Path) {
        if let Err(e) = durable::move_aside(path, &self.dir.join(CORRUPT_DIR)) {
            tracing::warn!(file = %path.display(), error = %e, "cannot move unreadable intent aside");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_scan_remove() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let mut rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        rt.args.push("K", "V");
        rt.capability_args
            .insert("n", serde_json::from_str("18446744073709551617").unwrap());
        let i = Intent::new("net-a", &rt, br#"{"name":"net-a"}"#.to_vec());
        intents.write(&i).await.unwrap();
        assert!(intents.exists("net-a", "c-1", "eth0").await);
        let found = intents.scan().unwrap();
        match found.as_slice() {
            [Found::Intent(p, back)] => {
                assert_eq!(**back, i);
                assert!(p.ends_with("net-a:c-1:eth0.json"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(intents.of_network("net-a").await.len(), 1);
        assert!(intents.of_network("net-b").await.is_empty());
        assert!(intents.remove("net-a", "c-1", "eth0").await.unwrap());
        assert!(!intents.remove("net-a", "c-1", "eth0").await.unwrap());
        assert!(intents.scan().unwrap().is_empty());
    }

    /// GC of one network reads its own files only and never removes a temp
    /// file (another ADD may be writing it) or moves another network's
    /// unreadable file; leftovers are removed by the start-only cleanup.
    #[tokio::test]
    async fn of_network_touches_nothing_and_leftovers_go_at_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let d = dir.path().join(INTENTS_DIR);
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        intents
            .write(&Intent::new("a", &rt, b"{}".to_vec()))
            .await
            .unwrap();
        intents
            .write(&Intent::new("ab", &rt, b"{}".to_vec()))
            .await
            .unwrap();
        let tmp = d.join(".b:c-2:eth0.json.tmp-1");
        let other_bad = d.join("b:c-3:eth0.json");
        std::fs::write(&tmp, b"half").unwrap();
        std::fs::write(&other_bad, b"{not json").unwrap();

        let got = intents.of_network("a").await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].network, "a");
        assert!(intents.of_network("b").await.is_empty());
        assert!(
            tmp.exists(),
            "GC removed a temp file of an ADD being recorded"
        );
        assert!(other_bad.exists(), "GC moved another network's file");
        assert!(!d.join(CORRUPT_DIR).exists());

        assert_eq!(intents.remove_leftovers().unwrap(), 1);
        assert!(!tmp.exists());
        assert!(other_bad.exists());
    }

    /// The longest attachment names requests may carry: the intent's file
    /// name is 5 bytes longer than the cache's, and its temp file's name
    /// must still fit in 255 bytes.
    #[tokio::test]
    async fn the_longest_names_get_an_intent() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let net = "n".repeat(100);
        let cid = "c".repeat(crate::decode::MAX_ATTACHMENT_NAME - 100 - 2 - 5);
        let rt = RuntimeConf::new(&cid, "/run/netns/x", "eth01");
        intents
            .write(&Intent::new(&net, &rt, b"{}".to_vec()))
            .await
            .unwrap();
        assert!(intents.exists(&net, &cid, "eth01").await);
    }

    fn open_names(dir: &Path) -> Vec<String> {
        let bytes = std::fs::read(dir.join(INTENTS_DIR).join(JOURNAL)).unwrap_or_default();
        open_records(&bytes)
            .into_iter()
            .map(|(_, i)| {
                let i = i.unwrap();
                key(&i.network, &i.rt.container_id, &i.rt.ifname)
            })
            .collect()
    }

    /// An ADD begun and not finished survives the daemon (a new `Intents`
    /// on the same dir, as after `kill -9`): the start turns it into an
    /// intent file and empties the journal; a finished one leaves nothing.
    #[tokio::test]
    async fn open_journal_records_become_intent_files_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt1 = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let rt2 = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        let i1 = Intent::new("n", &rt1, b"{\"a\":1}".to_vec());
        let p1 = intents.begin(&i1).await.unwrap().pending().unwrap();
        let p2 = open_add(&intents, &rt2, b"{}".to_vec()).await;
        assert!(intents.exists("n", "c-1", "eth0").await);
        assert!(!intents.exists("n", "c-3", "eth0").await);
        intents.finish(p2).await.unwrap();
        assert!(!intents.exists("n", "c-2", "eth0").await);
        assert_eq!(open_names(dir.path()), ["n:c-1:eth0"]);
        assert!(intents.scan().unwrap().is_empty(), "no file while running");
        let _ = p1;

        // The crash: a new daemon on the same state dir.
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        match after.scan().unwrap().as_slice() {
            [Found::Intent(p, i)] => {
                assert!(p.ends_with("n:c-1:eth0.json"));
                assert_eq!(i.rt, rt1);
                assert_eq!(i.config, i1.config);
            }
            other => panic!("{other:?}"),
        }
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        // Once recovered (the DEL removes the file), the next start finds nothing.
        assert!(after.remove("n", "c-1", "eth0").await.unwrap());
        let again = Intents::new(dir.path());
        again.prepare().unwrap();
        assert!(again.scan().unwrap().is_empty());
    }

    /// A graceful exit removes the journal when nothing is open, and keeps
    /// it (for the next start) while an ADD is.
    #[tokio::test]
    async fn close_removes_the_journal_only_when_nothing_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let p = open_add(&intents, &rt, b"{}".to_vec()).await;
        intents.close();
        assert!(journal.exists(), "an open ADD keeps the journal");
        intents.finish(p).await.unwrap();
        intents.close();
        assert!(!journal.exists(), "nothing open: removed");
        // And the daemon may go on: the next ADD opens a new journal.
        let p = open_add(&intents, &rt, b"{}".to_vec()).await;
        assert!(journal.exists());
        assert_eq!(open_names(dir.path()), ["n:c-1:eth0"]);
        intents.finish(p).await.unwrap();
    }

    /// An attachment with an ADD in progress, or one not undone (its
    /// file), gets no second record: the caller answers 409.
    #[tokio::test]
    async fn begin_refuses_an_attachment_with_an_intent() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, b"{}".to_vec());
        let p = intents
            .begin(&i)
            .await
            .unwrap()
            .pending()
            .expect("recorded");
        assert_eq!(
            intents.begin(&i).await.unwrap().pending(),
            None,
            "in progress"
        );
        intents.keep(p, &i).await.unwrap();
        assert_eq!(
            intents.begin(&i).await.unwrap().pending(),
            None,
            "kept in its file"
        );
        assert!(intents.remove("n", "c-1", "eth0").await.unwrap());
        assert!(intents.begin(&i).await.unwrap().pending().is_some());
    }

    /// A crash during an append leaves a torn last line: skipped, and
    /// the records before it still count.
    #[tokio::test]
    async fn a_torn_last_record_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        open_add(&intents, &rt, b"{}".to_vec()).await;
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let mut f = OpenOptions::new().append(true).open(&journal).unwrap();
        f.write_all(br#"{"kind":"cnidAddIntentV1","networ"#)
            .unwrap();
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        assert_eq!(after.scan().unwrap().len(), 1);
    }

    /// Past its size limit the journal is rewritten with the open records
    /// only (or emptied), and what is open still survives a crash.
    #[tokio::test]
    async fn compaction_keeps_the_open_records_only() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path()).with_compact_at(4096);
        intents.prepare().unwrap();
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let rt = RuntimeConf::new("long-running", "/run/netns/x", "eth0");
        let _open = open_add(&intents, &rt, b"{}".to_vec()).await;
        for i in 0..40 {
            let rt = RuntimeConf::new(format!("c-{i}"), "/run/netns/x", "eth0");
            let p = open_add(&intents, &rt, vec![b' '; 100]).await;
            intents.finish(p).await.unwrap();
        }
        assert!(std::fs::metadata(&journal).unwrap().len() < 4096);
        assert_eq!(open_names(dir.path()), ["n:long-running:eth0"]);
        let after = Intents::new(dir.path());
        after.prepare().unwrap();
        assert_eq!(after.scan().unwrap().len(), 1);

        // None open: emptied.
        let d2 = tempfile::tempdir().unwrap();
        let intents = Intents::new(d2.path()).with_compact_at(1024);
        intents.prepare().unwrap();
        for i in 0..20 {
            let rt = RuntimeConf::new(format!("c-{i}"), "/run/netns/x", "eth0");
            let p = open_add(&intents, &rt, vec![b' '; 100]).await;
            intents.finish(p).await.unwrap();
        }
        assert!(
            std::fs::metadata(d2.path().join(INTENTS_DIR).join(JOURNAL))
                .unwrap()
                .len()
                < 1024
        );
    }

    /// A failed rollback keeps the intent in its own file (GC and DEL find
    /// it there), and the journal record is ended.
    #[tokio::test]
    async fn keep_moves_the_intent_to_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, b"{}".to_vec());
        let p = intents.begin(&i).await.unwrap().pending().unwrap();
        intents.keep(p, &i).await.unwrap();
        assert!(open_names(dir.path()).is_empty());
        assert_eq!(intents.of_network("n").await.len(), 1);
        assert!(intents.exists("n", "c-1", "eth0").await);
    }

    /// Begins an ADD of `rt` on network `n`; it must be recorded.
    async fn open_add(intents: &Intents, rt: &RuntimeConf, config: Vec<u8>) -> Pending {
        intents
            .begin(&Intent::new("n", rt, config))
            .await
            .unwrap()
            .pending()
            .expect("recorded")
    }

    /// The daemon's cache: no fsync of its own (the commit lines stand for it).
    fn cache_in(dir: &Path) -> ResultCache {
        ResultCache::new(dir.join("cache")).with_durable(false)
    }

    /// A journal over the daemon's kind of cache in `dir`, in boot `boot`,
    /// prepared (as at a start: a second call on the same dir is a restart).
    fn deferred(dir: &Path, boot: &str) -> (ResultCache, PathBuf, Intents) {
        let cache = cache_in(dir);
        let intents = Intents::new(dir)
            .with_cache(cache.clone(), true)
            .with_boot_id(boot);
        intents.prepare().unwrap();
        (cache, dir.join(INTENTS_DIR).join(JOURNAL), intents)
    }

    /// One ADD through the journal as the engine makes it: begin, the
    /// cache write (not flushed), commit with the same record.
    async fn committed_add(intents: &Intents, cache: &ResultCache, cid: &str) -> CacheRecord {
        let rt = RuntimeConf::new(cid, "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
        let p = intents.begin(&i).await.unwrap().pending().unwrap();
        let rec = CacheRecord::new(
            "n",
            &rt,
            i.config.clone(),
            Some(json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}]})),
        );
        cache.write(&rec).await.unwrap();
        intents.commit(p, &rec).await.unwrap();
        rec
    }

    /// A power loss can take the cache file the daemon wrote without
    /// fsync; the commit line it flushed puts the same bytes back at the
    /// next start, when the boot id changed. In the same boot (only the
    /// process died) a missing file was removed on purpose (a DEL) and
    /// stays missing.
    #[tokio::test]
    async fn commit_lines_restore_cache_records_after_a_reboot_only() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let path = cache.path("n", "c-1", "eth0").unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(written, rec.encode(), "the engine's record is the cache's");
        let bytes = std::fs::read(&journal).unwrap();
        let found = committed_records(&bytes);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "boot-a");
        assert_eq!(found[0].2, written);

        // Same boot, the file gone (a DEL after the ADD): nothing restored.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&journal, &bytes).unwrap();
        deferred(dir.path(), "boot-a");
        assert!(!path.exists(), "a record removed in this boot came back");
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);

        // Another boot, the file lost or torn: restored, byte for byte.
        std::fs::write(&journal, &bytes).unwrap();
        let (_, _, rebooted) = deferred(dir.path(), "boot-b");
        assert_eq!(std::fs::read(&path).unwrap(), written);
        std::fs::write(&path, b"").unwrap();
        std::fs::write(&journal, &bytes).unwrap();
        deferred(dir.path(), "boot-c");
        assert_eq!(std::fs::read(&path).unwrap(), written);
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        assert!(
            rebooted.scan().unwrap().is_empty(),
            "a committed ADD is no intent"
        );
    }

    /// An attachment whose result is cached is refused before anything is
    /// recorded.
    #[tokio::test]
    async fn begin_refuses_a_cached_attachment() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(dir.path());
        let intents = Intents::new(dir.path()).with_cache(cache.clone(), true);
        intents.prepare().unwrap();
        committed_add(&intents, &cache, "c-1").await;
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        assert_eq!(
            intents
                .begin(&Intent::new("n", &rt, b"{}".to_vec()))
                .await
                .unwrap(),
            Begun::Cached
        );
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert!(matches!(
            intents
                .begin(&Intent::new("n", &rt, b"{}".to_vec()))
                .await
                .unwrap(),
            Begun::Recorded(_)
        ));
    }

    /// Past its size limit the journal is due; an ADD does not compact it
    /// (that would put a flush of many records on its path) but wakes the
    /// flush loop, whose compaction drops the commit lines after an fsync
    /// of each of their records and keeps the open ADDs; a graceful exit
    /// with only commit lines flushes and removes it.
    #[tokio::test]
    async fn compaction_and_close_forget_commits_after_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let cache = cache_in(dir.path());
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path())
            .with_cache(cache.clone(), true)
            .with_compact_at(4096);
        intents.prepare().unwrap();
        let rt = RuntimeConf::new("long-running", "/run/netns/x", "eth0");
        let open = open_add(&intents, &rt, b"{}".to_vec()).await;
        for i in 0..40 {
            committed_add(&intents, &cache, &format!("c-{i}")).await;
        }
        let before = std::fs::metadata(&journal).unwrap().len();
        assert!(before > 4096, "{before}");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            40,
            "an ADD compacted on its own path"
        );
        // What the flush loop does when woken.
        let woken =
            tokio::time::timeout(std::time::Duration::from_secs(10), intents.wake.notified());
        woken.await.expect("the ADDs woke the flush loop");
        intents.compact_if_due().unwrap();
        assert!(std::fs::metadata(&journal).unwrap().len() < 4096);
        assert!(committed_records(&std::fs::read(&journal).unwrap()).is_empty());
        let (synced, files) = intents.synced.lock().unwrap().clone();
        let want: Vec<String> = (0..40).map(|i| format!("n:c-{i}:eth0")).collect();
        assert_eq!(
            synced, want,
            "every dropped commit line's record was flushed first"
        );
        assert_eq!(files, 40, "each of the 40 record files was fsynced");
        assert_eq!(open_names(dir.path()), ["n:long-running:eth0"]);
        assert_eq!(cache.list(None).await.unwrap().len(), 40);
        intents.finish(open).await.unwrap();
        intents.close();
        assert!(
            !journal.exists(),
            "only commit lines left: flushed and removed"
        );
    }

    /// Waits (real time, up to 30 s) until `cond` holds, letting the
    /// runtime's other tasks run: the flush loop's work runs on a pool
    /// thread, and the loop itself on this (paused-clock) runtime.
    async fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "{what}"
            );
            tokio::task::yield_now().await;
        }
    }

    /// The daemon's flush loop, on tokio's paused clock: a commit line
    /// younger than the window stays; once it is older, the next tick
    /// flushes its record and drops it; a journal past its size limit is
    /// compacted as soon as an ADD finds it due, without a tick.
    #[tokio::test(start_paused = true)]
    async fn the_flush_loop_drops_old_commit_lines_and_compacts_when_woken() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(intents.clone().flush_loop(stop.clone()));
        committed_add(&intents, &cache, "c-1").await;
        let lines = || committed_records(&std::fs::read(&journal).unwrap_or_default()).len();

        tokio::time::advance(FLUSH_EVERY / 2).await;
        tokio::task::yield_now().await;
        assert_eq!(lines(), 1, "young: kept");
        assert_eq!(intents.synced.lock().unwrap().1, 0);

        tokio::time::advance(FLUSH_EVERY * 2).await;
        wait_for("the old commit line was not dropped", || {
            intents.journal.lock().unwrap().committed.is_empty()
        })
        .await;
        assert_eq!(lines(), 0);
        assert_eq!(
            intents.synced.lock().unwrap().clone(),
            (vec!["n:c-1:eth0".to_owned()], 1)
        );
        assert!(cache.path("n", "c-1", "eth0").unwrap().exists());

        // Due by size: woken, no tick needed.
        intents.journal.lock().unwrap().compact_at = 1;
        committed_add(&intents, &cache, "c-2").await;
        wait_for("the due journal was not compacted", || {
            intents.journal.lock().unwrap().committed.is_empty()
        })
        .await;
        assert_eq!(intents.synced.lock().unwrap().1, 2);
        stop.cancel();
        task.await.unwrap();
    }

    /// A DEL after the ADD forgets its commit line (a `gone` line): a
    /// restart after a reboot does not bring the record back, unless that
    /// line was lost too.
    #[tokio::test]
    async fn a_del_forgets_the_commit_line() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        let with_both = std::fs::read(&journal).unwrap();
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert!(
            !intents.remove("n", "c-1", "eth0").await.unwrap(),
            "no intent file"
        );
        let bytes = std::fs::read(&journal).unwrap();
        let left: Vec<String> = committed_records(&bytes)
            .into_iter()
            .map(|(_, r, _)| r.container_id)
            .collect();
        assert_eq!(left, ["c-2"]);
        assert_eq!(intents.journal.lock().unwrap().committed.len(), 1);

        // After a reboot that kept the gone line: c-1 stays deleted.
        std::fs::remove_file(cache.path("n", "c-2", "eth0").unwrap()).unwrap();
        deferred(dir.path(), "boot-b");
        assert!(!cache.path("n", "c-1", "eth0").unwrap().exists());
        assert!(cache.path("n", "c-2", "eth0").unwrap().exists(), "restored");

        // One that lost it: c-1 comes back (a repeat DEL's worth).
        cache.remove("n", "c-1", "eth0").await.unwrap();
        std::fs::write(&journal, &with_both).unwrap();
        deferred(dir.path(), "boot-c");
        assert!(cache.path("n", "c-1", "eth0").unwrap().exists());
    }

    /// After a reboot, a record written since (by cnitool or another
    /// runtime, before cnid started) is newer than the journal: left alone.
    #[tokio::test]
    async fn a_record_written_after_the_reboot_is_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let path = cache.path("n", "c-1", "eth0").unwrap();
        let mut newer = rec.clone();
        newer.netns = "/run/netns/after-the-reboot".into();
        std::fs::write(&path, newer.encode()).unwrap();
        // Make the journal older than the record, whatever the clock's
        // resolution.
        let f = std::fs::File::options().write(true).open(&journal).unwrap();
        f.set_modified(SystemTime::now() - std::time::Duration::from_secs(60))
            .unwrap();
        drop(f);
        deferred(dir.path(), "boot-b");
        assert_eq!(std::fs::read(&path).unwrap(), newer.encode());
    }

    /// Without `deferred` (the cache flushes its own records), an ADD ends
    /// with a plain `end` line and the journal carries no record.
    #[tokio::test]
    async fn without_deferral_the_journal_carries_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ResultCache::new(dir.path().join("cache"));
        let journal = dir.path().join(INTENTS_DIR).join(JOURNAL);
        let intents = Intents::new(dir.path()).with_cache(cache.clone(), false);
        intents.prepare().unwrap();
        committed_add(&intents, &cache, "c-1").await;
        let bytes = std::fs::read(&journal).unwrap();
        assert!(committed_records(&bytes).is_empty());
        assert!(open_names(dir.path()).is_empty());
        assert!(intents.journal.lock().unwrap().committed.is_empty());
    }

    /// Makes the restore of `n:<cid>:eth0`'s record fail: a non-empty dir
    /// where the file goes (no rename replaces it), as a full cache file
    /// system or a planted file makes it fail; returns a guard that
    /// removes it (the space freed).
    fn block_restore(cache: &ResultCache, cid: &str) -> impl FnOnce() + use<> {
        let path = cache.path("n", cid, "eth0").unwrap();
        let _ = std::fs::remove_file(&path);
        std::fs::create_dir_all(path.join("blocker")).unwrap();
        move || std::fs::remove_dir_all(&path).unwrap()
    }

    /// Marks every commit line of the journal with boot `boot`: the
    /// journal as a restart after a reboot finds it.
    fn as_if_committed_in(journal: &Path, from: &str, boot: &str) {
        let text = std::fs::read_to_string(journal).unwrap();
        std::fs::write(journal, text.replace(from, boot)).unwrap();
    }

    /// Issue 21, defect 1: a start that kept the journal (a record it could
    /// not restore) numbered its ADDs from 1 again after the kept lines,
    /// and the next start took the kept commit line's `end` 1 for the end
    /// of the new `begin` 1: that ADD, half done when the daemon was
    /// killed, was never rolled back.
    #[tokio::test]
    async fn sequence_numbers_are_not_reused_after_a_kept_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        // The machine went down; c-1's record cannot be restored.
        let _unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1
        );
        // An ADD of c-2 whose second plugin hangs, and the daemon is killed.
        let rt = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        open_add(&kept, &rt, b"{}".to_vec()).await;
        drop(kept);

        let (_, _, after) = deferred(dir.path(), "boot-b");
        let found: Vec<String> = after
            .scan()
            .unwrap()
            .into_iter()
            .map(|f| match f {
                Found::Intent(p, _) => p.file_name().unwrap().to_string_lossy().into_owned(),
                Found::Corrupt(p, r) => panic!("{}: {r}", p.display()),
            })
            .collect();
        assert_eq!(found, ["n:c-2:eth0.json"], "c-2's ADD is not rolled back");
    }

    /// Issue 21, defect 2: the journal a start kept (c-1's record not
    /// restored) was removed by the graceful stop that followed, and by any
    /// compaction, which only knew the commit lines of their own run: the
    /// record was never restored. Kept now until a start restores it.
    #[tokio::test]
    async fn a_kept_journal_survives_a_graceful_stop_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        let unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        unblock(); // the space freed

        // A compaction of this run (nothing of its own to keep).
        kept.journal.lock().unwrap().compact_at = 1;
        let rt = RuntimeConf::new("c-3", "/run/netns/z", "eth0");
        let p = open_add(&kept, &rt, b"{}".to_vec()).await;
        kept.finish(p).await.unwrap();
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1,
            "a compaction dropped the kept commit line"
        );
        // The graceful stop.
        kept.close();
        assert!(
            journal.exists(),
            "the graceful stop removed the kept journal"
        );

        // The next start restores the record, and the journal goes.
        let (_, _, next) = deferred(dir.path(), "boot-b");
        let path = cache.path("n", "c-1", "eth0").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), rec.encode());
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        next.close();
        assert!(!journal.exists());
    }

    /// While a kept line waits, the attachment's own DEL (a `gone` line)
    /// or a new ADD's commit line stands for it: the next start neither
    /// brings back the deleted record nor puts the old one over the new.
    #[tokio::test]
    async fn a_del_or_a_new_add_supersedes_a_kept_commit_line() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        drop(intents);
        let unblock1 = block_restore(&cache, "c-1");
        let unblock2 = block_restore(&cache, "c-2");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let (_, _, kept) = deferred(dir.path(), "boot-b");
        unblock1();
        unblock2();
        // c-1 DELed, c-2 ADDed again (with another result).
        assert!(!kept.remove("n", "c-1", "eth0").await.unwrap());
        let rt = RuntimeConf::new("c-2", "/run/netns/x", "eth0");
        let i = Intent::new("n", &rt, br#"{"name":"n"}"#.to_vec());
        let p = kept.begin(&i).await.unwrap().pending().unwrap();
        let newer = CacheRecord::new(
            "n",
            &rt,
            i.config.clone(),
            Some(json!({"cniVersion": "1.1.0"})),
        );
        cache.write(&newer).await.unwrap();
        kept.commit(p, &newer).await.unwrap();
        kept.close();
        assert!(!journal.exists(), "nothing left to restore: removed");
        // Even a crash instead of that stop (the journal as it was).
        let (_, _, _) = deferred(dir.path(), "boot-c");
        assert!(!cache.path("n", "c-1", "eth0").unwrap().exists());
        assert_eq!(
            std::fs::read(cache.path("n", "c-2", "eth0").unwrap()).unwrap(),
            newer.encode()
        );
    }

    /// Recovery is restartable: a start that keeps the journal, repeated
    /// (killed before or after it settled, again and again), turns the
    /// same open ADD into the same one intent file, lets no file grow, and
    /// converges once the record can be restored.
    #[tokio::test]
    async fn a_crash_during_recovery_repeated_converges() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rec = committed_add(&intents, &cache, "c-1").await;
        let rt = RuntimeConf::new("c-2", "/run/netns/y", "eth0");
        open_add(&intents, &rt, b"{}".to_vec()).await;
        drop(intents);
        let unblock = block_restore(&cache, "c-1");
        as_if_committed_in(&journal, "boot-a", "boot-b0");
        let mut sizes = Vec::new();
        for boot in ["boot-b", "boot-b", "boot-c", "boot-c", "boot-d"] {
            let (_, _, again) = deferred(dir.path(), boot);
            assert_eq!(
                again.scan().unwrap().len(),
                1,
                "the open ADD's one intent file"
            );
            sizes.push(std::fs::metadata(&journal).unwrap().len());
        }
        assert!(sizes.windows(2).all(|w| w[0] == w[1]), "{sizes:?}");
        assert_eq!(
            committed_records(&std::fs::read(&journal).unwrap()).len(),
            1
        );
        unblock();
        deferred(dir.path(), "boot-d");
        assert_eq!(
            std::fs::read(cache.path("n", "c-1", "eth0").unwrap()).unwrap(),
            rec.encode()
        );
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), 0);
        // The recovery DEL done: nothing left for another start.
        assert!(intents_after_del(dir.path()).await);
    }

    async fn intents_after_del(dir: &Path) -> bool {
        let (_, _, i) = deferred(dir, "boot-d");
        i.remove("n", "c-2", "eth0").await.unwrap();
        let (_, _, again) = deferred(dir, "boot-e");
        again.scan().unwrap().is_empty()
    }

    /// A GC's deletions are forgotten as a DEL's are (issue 21, defect
    /// 3, at the journal's level; `daemon_commit.rs` pins it through GC):
    /// only the network's attachments whose record is gone.
    #[tokio::test]
    async fn forget_removed_writes_gone_lines_for_deleted_records_only() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        committed_add(&intents, &cache, "c-1").await;
        committed_add(&intents, &cache, "c-2").await;
        cache.remove("n", "c-1", "eth0").await.unwrap();
        assert_eq!(intents.forget_removed("other").await.unwrap(), 0);
        assert_eq!(intents.forget_removed("n").await.unwrap(), 1);
        assert_eq!(intents.forget_removed("n").await.unwrap(), 0);
        let left: Vec<String> = committed_records(&std::fs::read(&journal).unwrap())
            .into_iter()
            .map(|(_, r, _)| r.container_id)
            .collect();
        assert_eq!(left, ["c-2"]);
    }

    /// Found by the attack on issue 21 (a full state file system): an
    /// ADD whose commit line could not be appended was undone and answered
    /// with an error, but its `begin` stayed open in the journal; the same
    /// attachment ADDed again and answered, the next start rolled that
    /// `begin` back and deleted the answered attachment.
    #[tokio::test]
    async fn a_begin_left_open_by_a_failed_append_does_not_undo_a_later_add() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, journal, intents) = deferred(dir.path(), "boot-a");
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let p = open_add(&intents, &rt, br#"{"name":"n"}"#.to_vec()).await;
        // The end cannot be appended (as with ENOSPC): a descriptor that
        // refuses writes.
        intents.journal.lock().unwrap().file = Some(Arc::new(File::open(&journal).unwrap()));
        assert!(intents.finish(p).await.is_err());
        intents.journal.lock().unwrap().file = None;
        assert_eq!(
            open_names(dir.path()),
            ["n:c-1:eth0"],
            "the begin stays open"
        );
        // The same attachment ADDed again, and answered; then a crash.
        committed_add(&intents, &cache, "c-1").await;
        drop(intents);
        let (_, _, after) = deferred(dir.path(), "boot-a");
        assert!(
            after.scan().unwrap().is_empty(),
            "the answered ADD is rolled back at start"
        );
    }

    #[test]
    fn corrupt_files_are_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let bad = dir.path().join(INTENTS_DIR).join("n:c:eth0.json");
        std::fs::write(&bad, b"{not json").unwrap();
        match intents.scan().unwrap().as_slice() {
            [Found::Corrupt(p, _)] => assert_eq!(p, &bad),
            other => panic!("{other:?}"),
        }
        assert!(!bad.exists());
        assert_eq!(
            std::fs::read_dir(dir.path().join(INTENTS_DIR).join(CORRUPT_DIR))
                .unwrap()
                .count(),
            1
        );
    }
}
