//! The library's log fields that carry outside text (plugin stderr, plugin
//! error messages, names in spans) are escaped, also under a subscriber
//! that formats fields as they come (tracing-subscriber's default): a
//! plugin cannot put a raw ESC sequence into the embedder's log.

mod support;

use cni_test_support::log::LogBuf;

use serde_json::json;
use support::fake::{Fake, Response, Rig, conflist, runtime};

#[tokio::test]
async fn plugin_output_is_logged_escaped() {
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let rig = Rig::new();
    let noisy = |stdout: &str, exit: i32| Response {
        stderr: "stderr \u{1b}[31mred\u{7} \u{9b}2J\n".as_bytes().to_vec(),
        ..Response::fail(exit, stdout, "")
    };
    rig.fake(
        "first",
        &Fake::new(noisy("", 0)).on(
            "ADD",
            noisy(
                r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}]}"#,
                0,
            ),
        ),
    );
    rig.fake(
        "second",
        &Fake::new(noisy("", 0)).on(
            "ADD",
            noisy(
                &json!({"cniVersion": "1.0.0", "code": 101, "msg": "bad \u{1b}[2J \u{202e}"})
                    .to_string(),
                1,
            ),
        ),
    );
    let list = conflist(json!({
        "cniVersion": "1.0.0", "name": "noisy",
        "plugins": [{"type": "first"}, {"type": "second"}]
    }));
    let opts = cni_async::CallOptions {
        rollback: true,
        ..Default::default()
    };
    let err = rig
        .cni()
        .add_network_list(&list, &runtime("c1", "eth0"))
        .options(&opts)
        .await
        .expect_err("the second plugin fails");
    assert_eq!(err.code(), 101);

    let log = buf.text();
    assert!(
        log.contains("stderr \\u{1b}[31mred"),
        "plugin stderr not logged:\n{log}"
    );
    assert!(log.contains("rolling back"), "{log}");
    let raw: Vec<char> = log
        .chars()
        .filter(|&c| c != '\n' && cni_core::validate::is_unprintable(c))
        .collect();
    assert!(raw.is_empty(), "raw {raw:?} in the log:\n{log}");
}
