//! `.with_record()`: an ADD answers the record it wrote into the cache
//! with its result, so that a caller keeping its own copy (cnid's journal)
//! keeps that record, not one rebuilt from the same inputs.

use crate::support::fake::{Fake, Response, Rig, conflist};
use cni_async::Attached;
use cni_core::cache::CacheRecord;
use cni_core::{CapabilityArgs, CniArgs, RuntimeConf};
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.0.2/24"}]}"#;

fn rig() -> Rig {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    rig
}

/// An attachment with every field of a record set: CNI_ARGS and
/// capability args too.
fn rt() -> RuntimeConf {
    let mut rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    rt.args = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=p1").unwrap();
    rt.capability_args = CapabilityArgs::from_json(r#"{"mac":"0a:00:00:00:00:02"}"#).unwrap();
    rt
}

/// The record answered is, byte for byte, the cache file.
fn assert_is_the_cached_file(rig: &Rig, attached: &Attached) {
    let file = std::fs::read(rig.cache_file("rec", "c1", "eth0")).expect("cache file");
    assert_eq!(
        String::from_utf8_lossy(&attached.record.encode()),
        String::from_utf8_lossy(&file),
        "the record answered and the cache file differ"
    );
    assert_eq!(attached.record.result, Some(attached.result.to_value()));
    assert_eq!(attached.record.cni_args, rt().args);
    assert_eq!(attached.record.capability_args, rt().capability_args);
}

#[tokio::test]
async fn an_add_with_record_answers_the_record_the_cache_file_holds() {
    let rig = rig();
    let list = conflist(
        json!({"cniVersion":"1.0.0","name":"rec","plugins":[{"type":"first"},{"type":"second"}]}),
    );
    let rt = rt();
    let attached = rig
        .cni()
        .add_network_list(&list, &rt)
        .rollback(true)
        .with_record()
        .await
        .expect("ADD");
    assert_is_the_cached_file(&rig, &attached);
    assert!(attached.record.identity.is_some(), "no netnsIdentity");
    assert_eq!(
        attached.record,
        CacheRecord::new(
            "rec",
            &rt,
            list.cache_bytes(),
            Some(attached.result.to_value())
        )
        .with_identity(attached.record.identity.clone())
    );
}

#[tokio::test]
async fn a_detached_add_with_record_answers_the_record_the_cache_file_holds() {
    let rig = rig();
    let cni = rig.cni();
    let list = conflist(json!({"cniVersion":"1.0.0","name":"rec","plugins":[{"type":"first"}]}));
    let attached = cni
        .add_network_list(&list, &rt())
        .rollback_on_cancel()
        .with_record()
        .await
        .expect("ADD");
    cni.wait_detached().await;
    assert_is_the_cached_file(&rig, &attached);
}
