//! cnitool with a plugin that exits 0 but prints a CNI error object: the
//! plugin's error (exit status 1, its code and message), nothing cached
//! (`docs/decisions.md` D18; libcni would print and cache an empty result).

use crate::support::fake::{Fake, Response, result_json};
use crate::support::tool::Sandbox;
use serde_json::json;

fn error_object_exit_0(code: u32) -> Response {
    Response {
        stderr: b"diagnostics\n".to_vec(),
        ..Response::ok(
            &json!({"cniVersion": "1.0.0", "code": code, "msg": "no leases", "details": "pool full"})
                .to_string(),
        )
    }
}

#[test]
fn add_error_object_with_exit_0_fails_and_caches_nothing() {
    let sb = Sandbox::new();
    let netns = sb.netns("errobj");
    sb.plugins.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", error_object_exit_0(107)),
    );
    sb.conflist("errobj", "1.0.0", &[json!({"type": "p"})]);
    let err = sb.run(&["add", "errobj", &netns]).fails();
    assert!(
        err.contains("plugin p ADD failed (exit status 0): no leases; pool full (CNI code 107)"),
        "{err}"
    );
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
    let obj = sb
        .run(&["add", "--json-errors", "errobj", &netns])
        .fails_json();
    assert_eq!(
        (
            obj["code"].as_u64(),
            obj["msg"].as_str(),
            obj["details"].as_str()
        ),
        (Some(107), Some("no leases"), Some("pool full")),
        "{obj}"
    );
    assert_eq!(sb.cache_entries(), Vec::<String>::new());
}

#[test]
fn del_and_check_error_object_with_exit_0_fail() {
    let sb = Sandbox::new();
    let netns = sb.netns("errobj");
    sb.plugins.fake(
        "p",
        // The first matching case answers: these before the plugin's own.
        &Fake::new(Response::ok(""))
            .on("CHECK", error_object_exit_0(101))
            .on("DEL", error_object_exit_0(102))
            .on("ADD", Response::ok(&result_json("1.0.0", "10.1.2.3/24"))),
    );
    sb.conflist("errobj", "1.0.0", &[json!({"type": "p"})]);
    sb.run(&["add", "errobj", &netns]).ok();
    let err = sb.run(&["check", "errobj", &netns]).fails();
    assert!(
        err.contains("plugin p CHECK failed (exit status 0): no leases"),
        "{err}"
    );
    let err = sb.run(&["del", "errobj", &netns]).fails();
    assert!(
        err.contains("plugin p DEL failed (exit status 0): no leases"),
        "{err}"
    );
    // The failed DEL keeps the attachment's record.
    assert_eq!(sb.cache_entries().len(), 1, "{:?}", sb.cache_entries());
}
