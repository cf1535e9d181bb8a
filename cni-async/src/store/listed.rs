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

use std::path::Path;

use cni_core::cache::{self as record, CacheEntry, CacheRecord};
use cni_core::error::Chain;

use super::durable::read_nofollow;

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
    let bytes = match read_nofollow(&path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %path.display(), error = %e, "skipping unreadable cache entry");
            }
            return None;
        }
    };
    let rec = match CacheEntry::decode(&bytes, &path.display().to_string()) {
        Ok(CacheEntry::Record(rec)) => rec,
        Ok(CacheEntry::LegacyResult(_)) => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %Chain(&e), "skipping corrupt cache entry");
            return None;
        }
    };
    if rec.if_name.is_empty() || rec.network_name.is_empty() {
        return None;
    }
    if record::file_name(&rec.network_name, &rec.container_id, &rec.if_name)
        .ok()
        .as_deref()
        != Some(name)
    {
        tracing::warn!(file = %path.display(), "skipping cache entry whose fields do not match its file name");
        return None;
    }
    let identity_unreadable = rec.identity.is_none() && has_identity(&bytes);
    Some(Listed {
        record: rec,
        identity_unreadable,
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

        let want = ["damaged", "good", "nullnetns"];
        let (listed, _) = store.list_page(None, &crate::store::ListPage::ALL).unwrap();
        let mut got: Vec<_> = listed.iter().map(|r| r.container_id.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, want, "the listing");
        let changes = store.scan(&mut RecordScan::default()).unwrap();
        let mut got: Vec<_> = changes
            .added
            .iter()
            .map(|r| r.container_id.as_str())
            .collect();
        got.sort_unstable();
        assert_eq!(got, want, "the scan");
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
}
