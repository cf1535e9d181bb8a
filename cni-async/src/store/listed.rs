//! The one reader of a record file found in `results/` by name (a
//! listing, a scan, the owner lookup of a rollback), where no attachment
//! was asked for: which files count as cached attachments.
//!
//! A file counts when it is a `cniCacheV1` record that the format's
//! decoder accepts ([`CacheEntry::decode`]: anything else is corrupt, as
//! spec decisions 8 and 14 have it), whose `networkName` and `ifName` are
//! not empty (libcni's `GetCachedAttachments` skips such records), and
//! whose fields name the file it is in (file names are ambiguous when
//! names contain `-`; the fields are not). A legacy bare result names no
//! attachment. Nothing is moved: reading a listing changes nothing.
//! Unreadable, corrupt and mismatched files are skipped with a warning.
//!
//! The readers that protect an attachment rather than use it (the scan
//! behind the owner index of `owners.rs`, which rollbacks and cnid's
//! admissions ask, and the reaper)
//! ask [`read_named`]: it also takes a corrupt `cniCacheV1` record whose
//! names (`networkName`, `containerId`, `ifName`, `netns`) read and match
//! its file name. Its other fields are unusable, but it still proves an
//! attachment there: taking it for absent would admit another container
//! on its netns and interface, and let that one's rollback DEL it.

use std::path::Path;

use cni_core::cache::{self as record, CacheEntry, CacheRecord};
use cni_core::error::Chain;

use super::durable::read_nofollow;
use crate::error::Error;

/// An attachment's identity in the cache: (network, container ID, ifname).
pub type AttachmentKey = (String, String, String);

/// The identity and netns of a record, kept without its result (a cached
/// result can be megabytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScannedRecord {
    /// `networkName`.
    pub(crate) network_name: String,
    /// `containerId`.
    pub(crate) container_id: String,
    /// `ifName`.
    pub(crate) if_name: String,
    /// `netns` (empty when absent).
    pub(crate) netns: String,
    /// `netnsIdentity` ([`record::NetnsIdentity`]; `None` when absent;
    /// one with an empty boot id when there but unreadable: damaged or
    /// forged, which proves nothing either way).
    pub(crate) identity: Option<record::NetnsIdentity>,
}

impl ScannedRecord {
    pub(crate) fn key(&self) -> AttachmentKey {
        (
            self.network_name.clone(),
            self.container_id.clone(),
            self.if_name.clone(),
        )
    }
}

/// Cheap pre-filter of file names by container, as libcni does; the
/// record's field decides.
pub(crate) fn names_container(name: &str, container_id: &str) -> bool {
    name.contains(&format!("-{container_id}-"))
}

/// A counted record, and whether it carries a `netnsIdentity` that cannot
/// be read (damaged or forged: it proves nothing either way, which is not
/// the same as a record without one).
pub(crate) struct Listed {
    pub(crate) record: CacheRecord,
    pub(crate) identity_unreadable: bool,
}

/// The record in `results/<name>`, when it counts (see the module docs).
pub(crate) fn read_listed(results: &Path, name: &str) -> Option<Listed> {
    let path = results.join(name);
    let bytes = read_entry(&path)?;
    match judge(&path, name, &bytes) {
        Judged::Listed(l) => Some(*l),
        Judged::Corrupt | Judged::Skipped => None,
    }
}

/// The attachment `results/<name>` names, for a reader that protects it:
/// a counted record, or a corrupt `cniCacheV1` one whose names read (see
/// the module docs). Its `identity` is one with an empty boot id when the
/// record's cannot be read (damaged or forged: it proves nothing).
///
/// An error when the file could not be read for a reason that may pass
/// (no descriptor or memory left, an I/O error): no answer about what it
/// holds, unlike a file gone, a symbolic link or not a regular file.
pub(crate) fn read_named(results: &Path, name: &str) -> Result<Option<ScannedRecord>, Error> {
    let path = results.join(name);
    let bytes = match read_nofollow(&path) {
        Ok(b) => b,
        Err(e) if is_not_a_record(&e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %path.display(), error = %e, "skipping unreadable cache entry");
            }
            return Ok(None);
        }
        Err(e) => return Err(super::io_err(&path, "read record", e)),
    };
    Ok(match judge(&path, name, &bytes) {
        Judged::Listed(l) => {
            let rec = l.record;
            Some(ScannedRecord {
                identity: if l.identity_unreadable {
                    Some(record::NetnsIdentity::default())
                } else {
                    rec.identity
                },
                network_name: rec.network_name,
                container_id: rec.container_id,
                if_name: rec.if_name,
                netns: rec.netns,
            })
        }
        Judged::Corrupt => names_of(name, &bytes),
        Judged::Skipped => None,
    })
}

/// Whether a [`read_nofollow`] error says the entry is no record file
/// (gone, a symbolic link, not a regular file), not that it could not be
/// read this time.
fn is_not_a_record(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData
    ) || matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO))
}

/// The bytes of `path`; `None` (with a warning unless it is gone) when it
/// cannot be read.
fn read_entry(path: &Path) -> Option<Vec<u8>> {
    match read_nofollow(path) {
        Ok(b) => Some(b),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %path.display(), error = %e, "skipping unreadable cache entry");
            }
            None
        }
    }
}

enum Judged {
    Listed(Box<Listed>),
    /// Refused by the decoder.
    Corrupt,
    /// Names no attachment, or not this file's.
    Skipped,
}

fn judge(path: &Path, name: &str, bytes: &[u8]) -> Judged {
    let rec = match CacheEntry::decode(bytes, &path.display().to_string()) {
        Ok(CacheEntry::Record(rec)) => rec,
        Ok(CacheEntry::LegacyResult(_)) => return Judged::Skipped,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %Chain(&e), "skipping corrupt cache entry");
            return Judged::Corrupt;
        }
    };
    if !names_file(name, &rec.network_name, &rec.container_id, &rec.if_name) {
        tracing::warn!(file = %path.display(), "skipping cache entry whose fields do not match its file name");
        return Judged::Skipped;
    }
    let identity_unreadable = rec.identity.is_none() && has_identity(bytes);
    Judged::Listed(Box::new(Listed {
        record: rec,
        identity_unreadable,
    }))
}

/// Whether the names are an attachment's (libcni's `GetCachedAttachments`
/// skips records without a network or interface name) and name the file.
fn names_file(name: &str, network: &str, container_id: &str, ifname: &str) -> bool {
    !network.is_empty()
        && !ifname.is_empty()
        && record::file_name(network, container_id, ifname)
            .ok()
            .as_deref()
            == Some(name)
}

/// The names of a `cniCacheV1` record the decoder refuses, when they read
/// as strings (`netns` may be absent or `null`) and name the file.
fn names_of(name: &str, bytes: &[u8]) -> Option<ScannedRecord> {
    #[derive(serde::Deserialize)]
    struct Names {
        kind: String,
        #[serde(rename = "networkName")]
        network_name: String,
        #[serde(rename = "containerId")]
        container_id: String,
        #[serde(rename = "ifName")]
        if_name: String,
        #[serde(default)]
        netns: Option<String>,
        #[serde(rename = "netnsIdentity", default)]
        identity: Option<serde_json::Value>,
    }
    let n: Names = serde_json::from_slice(bytes).ok()?;
    if n.kind != record::KIND_V1 || !names_file(name, &n.network_name, &n.container_id, &n.if_name)
    {
        return None;
    }
    Some(ScannedRecord {
        identity: n
            .identity
            .filter(|v| !v.is_null())
            .map(|v| record::NetnsIdentity::from_value(&v).unwrap_or_default()),
        network_name: n.network_name,
        container_id: n.container_id,
        if_name: n.if_name,
        netns: n.netns.unwrap_or_default(),
    })
}

/// Whether a record's JSON has a `netnsIdentity` that is not `null`.
fn has_identity(bytes: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "netnsIdentity", default)]
        identity: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Probe>(bytes).is_ok_and(|p| p.identity.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RecordScan, Store};
    use serde_json::json;

    /// The listing and the scan count the same files: the ones this
    /// reader counts. Before, the scan took a record whose `config` or
    /// `cniArgs` the decoder refuses (corrupt for every other reader) and
    /// skipped one with `"netns": null` (libcni's absent netns), which the
    /// listing took.
    #[test]
    fn the_listing_and_the_scan_count_the_same_records() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let results = store.results_dir();
        std::fs::create_dir_all(&results).unwrap();
        let rec = |cid: &str, ifname: &str| {
            json!({
                "kind": record::KIND_V1, "networkName": "n", "containerId": cid,
                "ifName": ifname, "netns": "/run/netns/x", "config": "",
            })
        };
        let put = |name: &str, v: serde_json::Value| {
            std::fs::write(results.join(name), serde_json::to_vec(&v).unwrap()).unwrap();
        };
        put("n-good-eth0", rec("good", "eth0"));
        let mut null_netns = rec("nullnetns", "eth0");
        null_netns["netns"] = serde_json::Value::Null;
        put("n-nullnetns-eth0", null_netns);
        let mut bad_config = rec("badconfig", "eth0");
        bad_config["config"] = json!("not base64!");
        put("n-badconfig-eth0", bad_config);
        let mut bad_args = rec("badargs", "eth0");
        bad_args["cniArgs"] = json!("K=V");
        put("n-badargs-eth0", bad_args);
        // libcni's rule: an empty ifName (or networkName) is no attachment.
        put("n-noif-", rec("noif", ""));
        put("n-other-eth0", rec("elsewhere", "eth0"));
        let mut unknown = rec("unknown", "eth0");
        unknown["kind"] = json!("cniCacheV2");
        put("n-unknown-eth0", unknown);
        put("n-legacy-eth0", json!({"cniVersion": "1.0.0"}));
        let mut damaged = rec("damaged", "eth0");
        damaged["netnsIdentity"] = json!("garbage");
        put("n-damaged-eth0", damaged);

        let (listed, _) = store.list_page(None, &crate::store::ListPage::ALL).unwrap();
        let mut got: Vec<_> = listed.iter().map(|r| r.container_id.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, ["damaged", "good", "nullnetns"], "the listing");
        // The scan also takes the records whose names are readable but
        // whose other fields the decoder refuses: they name an attachment.
        let changes = store.scan(&mut RecordScan::default()).unwrap();
        let mut got: Vec<_> = changes
            .added
            .iter()
            .map(|r| r.container_id.as_str())
            .collect();
        got.sort_unstable();
        assert_eq!(
            got,
            ["badargs", "badconfig", "damaged", "good", "nullnetns"],
            "the scan"
        );
        let damaged = changes
            .added
            .iter()
            .find(|r| r.container_id == "damaged")
            .unwrap();
        assert_eq!(
            damaged.identity.as_ref().map(|i| i.boot_id.as_str()),
            Some(""),
            "a damaged identity proves nothing, and is not taken for none"
        );
        let null = changes
            .added
            .iter()
            .find(|r| r.container_id == "nullnetns")
            .unwrap();
        assert_eq!(null.netns, "");
    }

    /// A record whose `config`, `cniArgs`, `capabilityArgs` or `result`
    /// the decoder refuses is corrupt for the operations, but its names
    /// still prove an attachment there. Taken for absent, it let cnid
    /// admit another container's ADD on its netns and interface (the
    /// owner table is fed by the scan), and that ADD's rollback DEL the
    /// interface in the netns (the owner lookup did not see it either).
    #[test]
    fn a_record_the_decoder_refuses_still_owns_its_netns_and_interface() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().to_owned());
        let results = store.results_dir();
        std::fs::create_dir_all(&results).unwrap();
        let bad = [
            ("config", json!("not base64!")),
            ("cniArgs", json!("K=V")),
            ("capabilityArgs", json!([1])),
            ("result", json!("text")),
        ];
        for (i, (field, value)) in bad.into_iter().enumerate() {
            let cid = format!("owner{i}");
            let mut rec = json!({
                "kind": record::KIND_V1, "networkName": "n", "containerId": cid,
                "ifName": "eth0", "netns": format!("/run/netns/ns{i}"), "config": "",
            });
            rec[field] = value;
            std::fs::write(
                results.join(format!("n-{cid}-eth0")),
                serde_json::to_vec(&rec).unwrap(),
            )
            .unwrap();
            let others = store
                .others_on(&format!("/run/netns/ns{i}"), "eth0", "intruder")
                .unwrap();
            let got: Vec<_> = others.iter().map(|o| o.container_id.as_str()).collect();
            assert_eq!(got, [cid.as_str()], "the owner lookup, with a bad {field}");
        }
        let changes = store.scan(&mut RecordScan::default()).unwrap();
        let mut got: Vec<_> = changes
            .added
            .iter()
            .map(|r| (r.container_id.as_str(), r.netns.as_str()))
            .collect();
        got.sort_unstable();
        assert_eq!(
            got,
            [
                ("owner0", "/run/netns/ns0"),
                ("owner1", "/run/netns/ns1"),
                ("owner2", "/run/netns/ns2"),
                ("owner3", "/run/netns/ns3"),
            ],
            "the scan"
        );
    }
}
