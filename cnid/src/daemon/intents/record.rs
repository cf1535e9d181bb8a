//! The journal's record format: one line of compact JSON per record.
//!
//! - `begin` (an [`Intent`]'s fields and `seq`): an ADD about to run its
//!   first plugin; the same fields as an intent file, so one decoder reads
//!   both.
//! - `end` (`{"end":seq}`): that ADD is over (rolled back, or kept in its
//!   intent file).
//! - commit (`end`, `boot`, `record`): the ADD completed; the cache
//!   record's exact bytes (base64) and the boot it was written in.
//! - `gone` (`{"gone":key}`): the attachment was deleted after its commit.
//!
//! Invariants kept here: a record never holds a raw newline (compact JSON),
//! so a line is a record and only a torn last line fails to parse (it is
//! skipped: its append never returned); [`open_records`] counts a `begin`
//! open only while no `end` of its number and no later `begin` of its
//! attachment follows; [`committed_records`] gives the last commit line
//! of each attachment not followed by its `gone` line; [`max_seq`] is the
//! number a new run must number past. `end` 0 ends no `begin` (numbers
//! start at 1).

use super::*;

/// The `kind` of intent records.
pub(crate) const KIND: &str = "cnidAddIntentV1";

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

    pub(super) fn encode(&self) -> Vec<u8> {
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

    pub(super) fn decode(bytes: &[u8]) -> Result<Intent, String> {
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

/// A `begin` line: the intent's fields (as in an intent file) and `seq`.
pub(super) fn begin_line(seq: u64, intent: &Intent) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&intent.encode()).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("seq".into(), json!(seq));
    }
    // Compact JSON has no raw newline: one record per line.
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    line
}

pub(super) fn end_line(seq: u64) -> Vec<u8> {
    format!("{{\"end\":{seq}}}\n").into_bytes()
}

/// A commit line: ends `seq` and carries the attachment's cache record
/// (its exact bytes, base64) and this boot's id.
pub(super) fn commit_line(seq: u64, boot: &str, record: &[u8]) -> Vec<u8> {
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
pub(super) fn gone_line(key: &str) -> Vec<u8> {
    let mut line = serde_json::to_vec(&json!({ "gone": key })).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The fields of a journal line that the start's passes read
/// ([`committed_records`], [`open_records`], [`max_seq`]), parsed without
/// building a JSON tree of the whole line: a start reads 10,000 lines
/// three times, and a commit line is mostly its record's base64, borrowed
/// here (at 10,000 attachments: 13 ms of CPU per pass as `Value`s, 2 ms so).
/// Other fields are skipped. A line whose field has another type (or a
/// field twice) does not parse: cnid writes none, and like a torn line it
/// is skipped.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Fields<'a> {
    seq: Option<u64>,
    end: Option<u64>,
    #[serde(borrow)]
    gone: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    record: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    boot: Option<std::borrow::Cow<'a, str>>,
}

/// The journal's lines, torn and empty ones left out, with their fields.
fn lines(bytes: &[u8]) -> impl Iterator<Item = (&[u8], Fields<'_>)> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice::<Fields<'_>>(l).ok().map(|f| (l, f)))
}

/// The cache records the journal's commit lines carry, the last one per
/// attachment and not followed by a `gone` line of it, with the boot each
/// was committed in. Unreadable ones are skipped with an error logged.
pub(super) fn committed_records(bytes: &[u8]) -> Vec<(String, CacheRecord, Vec<u8>)> {
    committed_records_with_end(bytes)
        .into_iter()
        .map(|(boot, rec, bytes, _)| (boot, rec, bytes))
        .collect()
}

/// A commit line: its boot, its record decoded and as bytes, its `end`.
pub(super) type CommitLine = (String, CacheRecord, Vec<u8>, u64);

/// [`committed_records`] with each line's `end`: 0 for a line a start
/// carried because it could not settle it (see `Intents::settle_commits`).
pub(super) fn committed_records_with_end(bytes: &[u8]) -> Vec<CommitLine> {
    // In the order of each attachment's last commit line. A line replaces
    // or drops its attachment's earlier entry through `latest` (its slot),
    // not a pass over every entry: a start reads journals of 10,000 lines.
    let mut slots: Vec<Option<CommitLine>> = Vec::new();
    let mut latest: HashMap<String, usize> = HashMap::new();
    for (_, f) in lines(bytes) {
        if let Some(gone) = f.gone {
            if let Some(i) = latest.remove(gone.as_ref()) {
                slots[i] = None;
            }
            continue;
        }
        let Some(b64) = f.record else {
            continue;
        };
        let boot = f.boot.unwrap_or_default().into_owned();
        let rec = BASE64
            .decode(b64.as_bytes())
            .map_err(|e| e.to_string())
            .and_then(|b| match CacheEntry::decode(&b, "the ADD journal") {
                Ok(CacheEntry::Record(r)) => Ok((r, b)),
                Ok(CacheEntry::LegacyResult(_)) => Err("not a cniCacheV1 record".to_owned()),
                Err(e) => Err(e.to_string()),
            });
        match rec {
            Ok((rec, bytes)) => {
                let k = key(&rec.network_name, &rec.container_id, &rec.if_name);
                if let Some(i) = latest.insert(k, slots.len()) {
                    slots[i] = None;
                }
                let end = f.end.unwrap_or(0);
                slots.push(Some((boot, rec, bytes, end)));
            }
            Err(reason) => {
                tracing::error!(%reason, "unreadable cache record in the ADD journal; skipped")
            }
        }
    }
    slots.into_iter().flatten().collect()
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
pub(super) fn open_records(bytes: &[u8]) -> Vec<(u64, Result<Intent, String>)> {
    let mut begun: Vec<(u64, Result<Intent, String>)> = Vec::new();
    let mut ended = std::collections::HashSet::new();
    let of = |i: &Intent| key(&i.network, &i.rt.container_id, &i.rt.ifname);
    for (line, f) in lines(bytes) {
        if let Some(seq) = f.end {
            ended.insert(seq);
        } else if let Some(seq) = f.seq {
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
pub(super) fn max_seq(bytes: &[u8]) -> u64 {
    lines(bytes)
        .filter_map(|(_, f)| f.seq.or(f.end))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::intents::testing::*;
    use std::fs::OpenOptions;
    use std::io::Write;

    /// The parsers on a literal journal: an `end` closes its own `begin`
    /// only, `end` 0 (a carried commit line) closes none, a later `begin`
    /// of the same attachment supersedes an earlier one, a torn tail is
    /// skipped, and a new run numbers past every `begin` and `end`.
    #[test]
    fn open_records_and_numbers_on_a_literal_journal() {
        let begin = |seq, cid: &str| {
            let rt = RuntimeConf::new(cid, "/run/netns/x", "eth0");
            begin_line(seq, &Intent::new("n", &rt, b"{}".to_vec()))
        };
        let mut j = Vec::new();
        j.extend(begin(1, "c-1"));
        j.extend(begin(2, "c-2"));
        j.extend(end_line(2));
        j.extend(begin(3, "c-1"));
        j.extend(commit_line(0, "boot-a", b"{}"));
        j.extend(begin(4, "c-3"));
        j.extend(end_line(7));
        j.extend(br#"{"kind":"cnidAddIntentV1","netw"#);
        let open: Vec<(u64, String)> = open_records(&j)
            .into_iter()
            .map(|(seq, i)| (seq, i.unwrap().rt.container_id))
            .collect();
        assert_eq!(open, [(3, "c-1".to_owned()), (4, "c-3".to_owned())]);
        assert_eq!(max_seq(&j), 7);
        assert_eq!(max_seq(b""), 0);
    }

    /// The start's passes read a line's fields without a JSON tree
    /// (borrowing its strings): an escaped string is read too (copied), a
    /// line whose field has another type is skipped as a torn one is, and
    /// `null` is a missing field.
    #[test]
    fn line_fields_escaped_mistyped_and_null() {
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
        let line = String::from_utf8(commit_line(5, "boot-a", &rec.encode())).unwrap();
        // `/` and `+` written escaped, as another JSON writer may.
        let escaped = line
            .replace('/', "\\/")
            .replace('+', "\\u002b")
            .replace("boot-a", "boot\\u002da");
        assert_ne!(escaped, line);
        let got = committed_records(escaped.as_bytes());
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0.as_str(), &got[0].1), ("boot-a", &rec));
        assert_eq!(max_seq(escaped.as_bytes()), 5);
        let null_boot = line.replace("\"boot-a\"", "null");
        assert_eq!(committed_records(null_boot.as_bytes())[0].0, "");
        let mistyped = line.replace("\"end\":5", "\"end\":\"5\"");
        assert_ne!(mistyped, line);
        assert!(committed_records(mistyped.as_bytes()).is_empty());
        assert_eq!(max_seq(mistyped.as_bytes()), 0);
    }

    /// The commit lines that count: the last per attachment, in the order
    /// of those last lines, minus the attachments a later `gone` line
    /// names (and a `gone` of an attachment never committed changes
    /// nothing).
    #[test]
    fn committed_records_keep_each_attachments_last_commit_in_order() {
        let commit = |boot: &str, cid: &str, ip: &str| {
            let rt = RuntimeConf::new(cid, "/run/netns/x", "eth0");
            let rec = CacheRecord::new(
                "n",
                &rt,
                b"{}".to_vec(),
                Some(serde_json::json!({"cniVersion": "1.1.0", "ips": [{"address": ip}]})),
            );
            commit_line(0, boot, &rec.encode())
        };
        let mut j = Vec::new();
        j.extend(commit("boot-a", "c-1", "10.0.0.1/24"));
        j.extend(commit("boot-a", "c-2", "10.0.0.2/24"));
        j.extend(commit("boot-b", "c-1", "10.0.0.11/24"));
        j.extend(gone_line(&key("n", "c-2", "eth0")));
        j.extend(gone_line(&key("n", "c-9", "eth0")));
        j.extend(commit("boot-b", "c-3", "10.0.0.3/24"));
        j.extend(commit("boot-b", "c-2", "10.0.0.12/24"));
        let got: Vec<(String, String, String)> = committed_records(&j)
            .into_iter()
            .map(|(boot, r, _)| {
                let ip = r.result.unwrap()["ips"][0]["address"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                (boot, r.container_id, ip)
            })
            .collect();
        let want = [
            ("boot-b", "c-1", "10.0.0.11/24"),
            ("boot-b", "c-3", "10.0.0.3/24"),
            ("boot-b", "c-2", "10.0.0.12/24"),
        ]
        .map(|(b, c, i)| (b.to_owned(), c.to_owned(), i.to_owned()));
        assert_eq!(got, want);
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
}
