//! Micro-benchmarks of the pure work cni-core does per plugin call:
//! conflist parsing, stdin building, result parsing and conversion, cache
//! record encoding and decoding.
//!
//! `cargo bench -p cni-core --bench core`

use std::hint::black_box;

use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::result::CniResult;
use cni_core::stdin::{StdinInput, list_plugin_stdin};
use cni_core::{NetworkConfigList, RuntimeConf, Version};
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

const CONFLIST: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "bench",
  "plugins": [
    {"type": "loopback"},
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16", "gateway": "10.88.0.1"}]],
              "routes": [{"dst": "10.89.0.0/16"}]}},
    {"type": "tuning", "capabilities": {"mac": true}, "sysctl": {"net.core.somaxconn": "1024"}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}},
    {"type": "firewall", "backend": "iptables"}
  ]
}"#;

const RESULT_1_0: &str = r#"{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"6a:1e:2b:3c:4d:5e"},{"name":"veth1234","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","mac":"12:34:56:78:9a:bc","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"address":"10.88.0.7/16","gateway":"10.88.0.1","interface":2},{"address":"fd00::7/64","gateway":"fd00::1","interface":2}],"routes":[{"dst":"10.89.0.0/16","gw":"10.88.0.1"}],"dns":{"nameservers":["10.88.0.1"]}}"#;

fn rt() -> RuntimeConf {
    let mut rt = RuntimeConf::new("3f5c1a2b9d", "/var/run/netns/cni-1234", "eth0");
    rt.args = "IgnoreUnknown=1;K8S_POD_NAME=web".parse().unwrap();
    rt.capability_args.insert(
        "portMappings",
        json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]),
    );
    rt.capability_args.insert("mac", json!("12:34:56:78:9a:bc"));
    rt
}

fn benches(c: &mut Criterion) {
    c.bench_function("conflist_parse_6_plugins", |b| {
        b.iter(|| NetworkConfigList::from_bytes(black_box(CONFLIST.as_bytes()), None).unwrap())
    });

    let list = NetworkConfigList::from_bytes(CONFLIST.as_bytes(), None).unwrap();
    let rt = rt();
    let prev = serde_json::from_str::<serde_json::Value>(RESULT_1_0).unwrap();
    c.bench_function("stdin_build_one_plugin_with_prev_result", |b| {
        b.iter(|| {
            list_plugin_stdin(
                black_box(&list),
                3,
                StdinInput::Attachment {
                    rt: &rt,
                    prev_result: Some(&prev),
                },
            )
            .unwrap()
        })
    });

    c.bench_function("result_parse_1_0_0", |b| {
        b.iter(|| CniResult::parse(black_box(RESULT_1_0.as_bytes()), Version::V1_0_0).unwrap())
    });
    let result = CniResult::parse(RESULT_1_0.as_bytes(), Version::V1_0_0).unwrap();
    c.bench_function("result_convert_1_0_0_to_0_4_0", |b| {
        b.iter(|| black_box(&result).convert(Version::V0_4_0).unwrap())
    });
    c.bench_function("result_convert_1_0_0_to_0_2_0", |b| {
        b.iter(|| black_box(&result).convert(Version::V0_2_0).unwrap())
    });
    c.bench_function("result_to_value", |b| {
        b.iter(|| black_box(&result).to_value())
    });

    let rec = CacheRecord::new("bench", &rt, list.cache_bytes(), Some(result.to_value()));
    c.bench_function("cache_record_encode", |b| {
        b.iter(|| black_box(&rec).encode())
    });
    let bytes = rec.encode();
    c.bench_function("cache_record_decode", |b| {
        b.iter(|| CacheEntry::decode(black_box(&bytes), "bench").unwrap())
    });

    // Everything cni-core does for one plugin of an ADD chain: build its
    // stdin, parse its result, convert it (a no-op here), and serialize it
    // for the next plugin.
    c.bench_function("per_plugin_add_work", |b| {
        b.iter(|| {
            let stdin = list_plugin_stdin(
                &list,
                3,
                StdinInput::Attachment {
                    rt: &rt,
                    prev_result: Some(&prev),
                },
            )
            .unwrap();
            let r = CniResult::parse(RESULT_1_0.as_bytes(), list.version()).unwrap();
            let r = r.convert(list.version()).unwrap();
            black_box((stdin, r.to_value()))
        })
    });
}

criterion_group!(core, benches);
criterion_main!(core);
