//! The cache record against libcni's on-disk format.

use crate::support::{assert_json_eq, json};
use cni_core::cache::{self, CacheEntry, CacheRecord};
use cni_core::{NetworkConfigList, RuntimeConf};
use serde_json::json;

/// A record as libcni's `cacheAdd` writes it: Go's `json.Marshal` of
/// `cachedInfo` (struct fields in declaration order, map keys sorted, `[]byte`
/// as standard base64, HTML characters escaped as \u003c etc.). The config is
/// base64 of
/// `{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.88.0.0/16"}},{"type":"portmap","capabilities":{"portMappings":true}}]}`.
const LIBCNI_RECORD: &str = r#"{"kind":"cniCacheV1","containerId":"3f5c1a2b9d","config":"eyJjbmlWZXJzaW9uIjoiMS4wLjAiLCJuYW1lIjoicG9kbmV0IiwicGx1Z2lucyI6W3sidHlwZSI6ImJyaWRnZSIsImJyaWRnZSI6ImNuaTAiLCJpcGFtIjp7InR5cGUiOiJob3N0LWxvY2FsIiwic3VibmV0IjoiMTAuODguMC4wLzE2In19LHsidHlwZSI6InBvcnRtYXAiLCJjYXBhYmlsaXRpZXMiOnsicG9ydE1hcHBpbmdzIjp0cnVlfX1dfQ==","ifName":"eth0","networkName":"podnet","netns":"/var/run/netns/cni-1234","cniArgs":[["IgnoreUnknown","1"],["K8S_POD_NAME","web\u003c1\u003e"]],"capabilityArgs":{"portMappings":[{"containerPort":80,"hostPort":8080,"protocol":"tcp"}]},"result":{"cniVersion":"1.0.0","dns":{},"interfaces":[{"mac":"6a:1e:2b:3c:4d:5e","name":"cni0"},{"mac":"aa:bb:cc:dd:ee:ff","name":"veth1234"},{"mac":"12:34:56:78:9a:bc","name":"eth0","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"address":"10.88.0.7/16","gateway":"10.88.0.1","interface":2}],"routes":[{"dst":"0.0.0.0/0","gw":"10.88.0.1"}]}}"#;

#[test]
fn libcni_record_decodes_field_by_field() {
    let entry = CacheEntry::decode(LIBCNI_RECORD.as_bytes(), "podnet-3f5c1a2b9d-eth0").unwrap();
    let CacheEntry::Record(rec) = entry else {
        panic!("expected a cniCacheV1 record");
    };
    rec.check_matches("podnet", "3f5c1a2b9d", "eth0").unwrap();
    assert_eq!(rec.netns, "/var/run/netns/cni-1234");
    assert_eq!(
        rec.cni_args.to_string(),
        "IgnoreUnknown=1;K8S_POD_NAME=web<1>"
    );
    assert_json_eq(
        &serde_json::Value::Object(rec.capability_args.as_map().clone()),
        &json!({"portMappings": [{"containerPort": 80, "hostPort": 8080, "protocol": "tcp"}]}),
    );
    let list = NetworkConfigList::from_bytes(&rec.config, None).unwrap();
    assert_eq!(list.name(), "podnet");
    assert_eq!(list.plugins().len(), 2);
    let result = rec.result.as_ref().unwrap();
    assert_eq!(result["ips"][0]["address"], "10.88.0.7/16");
    // The result parses as a 1.0.0 result.
    let parsed =
        cni_core::result::CniResult::from_value(result, cni_core::Version::V1_0_0).unwrap();
    assert_eq!(parsed.version(), cni_core::Version::V1_0_0);
}

#[test]
fn our_record_has_libcni_layout_and_round_trips() {
    let entry = CacheEntry::decode(LIBCNI_RECORD.as_bytes(), "x").unwrap();
    let CacheEntry::Record(rec) = entry else {
        unreachable!()
    };
    let ours = rec.encode();
    // Same keys in the same order as libcni's struct.
    let v = json(&ours);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "kind",
            "containerId",
            "config",
            "ifName",
            "networkName",
            "netns",
            "cniArgs",
            "capabilityArgs",
            "result"
        ]
    );
    // Same values: libcni reads what we write.
    assert_json_eq(&v, &json(LIBCNI_RECORD.as_bytes()));
    // And we read back what we wrote.
    assert_eq!(
        CacheEntry::decode(&ours, "x").unwrap(),
        CacheEntry::Record(rec)
    );
}

#[test]
fn empty_optional_fields_are_omitted_like_omitempty() {
    let rt = RuntimeConf::new("c1", "", "eth0");
    let rec = CacheRecord::new("n", &rt, b"{}".to_vec(), None);
    assert_eq!(
        String::from_utf8(rec.encode()).unwrap(),
        r#"{"kind":"cniCacheV1","containerId":"c1","config":"e30=","ifName":"eth0","networkName":"n"}"#
    );
    let back = CacheEntry::decode(&rec.encode(), "x").unwrap();
    assert_eq!(back, CacheEntry::Record(rec));
}

#[test]
fn legacy_bare_result_is_read_as_a_result() {
    let legacy =
        br#"{"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.1.0.5/16"}],"dns":{}}"#;
    let entry = CacheEntry::decode(legacy, "x").unwrap();
    assert!(matches!(entry, CacheEntry::LegacyResult(_)));
    assert_eq!(entry.result().unwrap()["ips"][0]["address"], "10.1.0.5/16");
}

#[test]
fn read_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = cache::file_path(dir.path(), "podnet", "3f5c1a2b9d", "eth0").unwrap();
    assert!(CacheEntry::read(&path).unwrap().is_none());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, LIBCNI_RECORD).unwrap();
    assert!(matches!(
        CacheEntry::read(&path).unwrap(),
        Some(CacheEntry::Record(_))
    ));
    std::fs::write(&path, "{truncated").unwrap();
    let e = CacheEntry::read(&path).unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}
