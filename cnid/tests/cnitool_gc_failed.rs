//! `cnitool gc` still fails (status 1) when a stale attachment could not be
//! deleted, now that the library and cnid report such attachments in the
//! GC outcome instead of failing the whole GC: the reference cnitool's GC
//! fails then, and a script relying on its status must not see success.
//! Locally and through cnid (`--socket`), on a 1.0.0 network (no plugin GC
//! that could fail instead).

use crate::support::daemon::{Daemon, Dirs};
use crate::support::fake::{Fake, PluginDir, Response};
use crate::support::tool::{Sandbox, expected_container_id};
use serde_json::json;

const NET: &str = "gcfail";

fn plugins(plugins: &PluginDir) {
    plugins.fake("a", &Fake::plugin("1.0.0", "10.1.2.3/24"));
}

fn refuse_del(plugins: &PluginDir) {
    plugins.fake(
        "a",
        &Fake::plugin("1.0.0", "10.1.2.3/24").on(
            "DEL",
            Response::fail(
                1,
                r#"{"cniVersion":"1.0.0","code":4,"msg":"ARGS: unknown args"}"#,
                "",
            ),
        ),
    );
}

fn conf() -> serde_json::Value {
    json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "a"}]})
}

#[test]
fn local_gc_with_a_refused_del_fails_and_names_the_attachment() {
    let sb = Sandbox::new();
    plugins(&sb.plugins);
    sb.conf(&format!("{NET}.conflist"), &conf());
    let netns = &sb.netns("gcfailtest");
    sb.run(&["add", NET, netns]).ok();
    refuse_del(&sb.plugins);
    let err = sb.run(&["--json-errors", "gc", NET, netns]).fails_json();
    assert_eq!(err["code"], 4, "{err}");
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&expected_container_id(netns)), "{msg}");
    assert!(msg.contains("ARGS: unknown args"), "{msg}");
    assert_eq!(
        sb.cache_entries().len(),
        1,
        "the entry stays for a later GC"
    );
}

#[test]
fn gc_through_cnid_with_a_refused_del_fails_and_names_the_attachment() {
    let dirs = Dirs::new();
    let p = PluginDir::in_dir(dirs.root());
    plugins(&p);
    dirs.conf(&format!("{NET}.conflist"), &conf());
    let daemon = Daemon::start(&dirs, &[]);
    let socket = daemon.socket.to_str().unwrap().to_owned();
    // A link to the daemon's own network namespace (the fake plugins never
    // enter it; cnid wants a network namespace).
    let ns = dirs.data.join("ns1");
    std::os::unix::fs::symlink("/proc/self/ns/net", &ns).unwrap();
    let ns = ns.to_str().unwrap().to_owned();
    let sb = Sandbox::new();
    sb.run(&["--socket", &socket, "add", NET, &ns]).ok();
    refuse_del(&p);
    let err = sb
        .run(&["--socket", &socket, "--json-errors", "gc", NET, &ns])
        .fails_json();
    assert_eq!(err["code"], 4, "{err}");
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(msg.contains(&expected_container_id(&ns)), "{msg}");
    assert!(msg.contains("ARGS: unknown args"), "{msg}");
    assert_eq!(dirs.cached().len(), 1);
}
