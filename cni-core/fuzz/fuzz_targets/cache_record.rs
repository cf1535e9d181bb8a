//! Result cache files (libcni's `cniCacheV1` records and bare legacy
//! results), which anything with write access to the cache dir can alter.
//!
//! Properties, for any input:
//! - decoding never panics, and errors name the file;
//! - a record encodes to bytes that decode to an equal record, and is
//!   rebuilt equal from its own runtime parameters;
//! - a record matches its own attachment; its cache file name, when the
//!   names are valid, never contains `/` and is not `.` or `..`;
//! - a legacy result is an object without `kind`, and round-trips;
//! - what a record holds (the stored config list, the result) goes through
//!   the parsers the runtime uses on DEL without panicking.
#![no_main]

use cni_core::Version;
use cni_core::cache::{CacheEntry, CacheRecord, file_name};
use cni_core::config::NetworkConfigList;
use cni_core::result::CniResult;
use cni_core_fuzz::assert_safe_component;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

const ORIGIN: &str = "/var/lib/cni/results/fuzz-origin";

fuzz_target!(|data: &[u8]| {
    let entry = match CacheEntry::decode(data, ORIGIN) {
        Ok(entry) => entry,
        Err(e) => {
            assert!(e.to_string().contains(ORIGIN), "{e}");
            return;
        }
    };
    match &entry {
        CacheEntry::Record(rec) => check_record(rec),
        CacheEntry::LegacyResult(v) => {
            let obj = v.as_object().expect("a legacy result is an object");
            assert!(!obj.contains_key("kind"));
            let bytes = serde_json::to_vec(v).expect("a value serializes");
            assert_eq!(
                CacheEntry::decode(&bytes, ORIGIN).ok().as_ref(),
                Some(&entry)
            );
            assert_eq!(entry.result(), Some(v));
            let _ = CniResult::from_value(v, Version::V0_2_0);
        }
    }
});

fn check_record(rec: &CacheRecord) {
    let bytes = rec.encode();
    let value: Value = serde_json::from_slice(&bytes).expect("encode() writes JSON");
    assert_eq!(value["kind"], "cniCacheV1");
    match CacheEntry::decode(&bytes, ORIGIN) {
        Ok(CacheEntry::Record(back)) => assert_eq!(&back, rec, "encode/decode round trip"),
        other => panic!("encoded record decodes as {other:?}"),
    }

    let rebuilt = CacheRecord::new(
        &rec.network_name,
        &rec.runtime_conf(),
        rec.config.clone(),
        rec.result.clone(),
    );
    assert_eq!(&rebuilt, rec);
    rec.check_matches(&rec.network_name, &rec.container_id, &rec.if_name)
        .expect("a record matches its own attachment");

    if let Ok(name) = file_name(&rec.network_name, &rec.container_id, &rec.if_name) {
        assert_safe_component("cache::file_name", &name);
    }
    // What DEL does with a record: validate its attachment, parse its list
    // and its result at the list's version.
    let _ = rec.runtime_conf().validate();
    let version =
        NetworkConfigList::from_bytes(&rec.config, None).map_or(Version::V1_0_0, |l| l.version());
    if let Some(result) = &rec.result {
        let _ = CniResult::from_value(result, version);
    }
}
