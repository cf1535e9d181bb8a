//! What a plugin receives: its exact stdin, and our environment overridden
//! by the request's variables.
//!
//! One test in this binary: it sets a variable in our own environment before
//! any thread exists, which is only sound while nothing else runs.

mod support;

use std::time::Duration;

use cni_async::exec::{ExecRequest, PluginExec, RawExec};
use cni_core::Command;
use pretty_assertions::assert_eq;
use support::fake::{Fake, PluginDir, Response, env};

#[test]
fn plugin_gets_exact_stdin_and_env_with_request_vars_overriding_ours() {
    // SAFETY: no other thread exists yet in this test binary (single test,
    // runtime built below), so nothing reads the environment concurrently.
    unsafe {
        std::env::set_var("EXEC_ENV_TEST_INHERITED", "from parent");
        std::env::set_var("CNI_IFNAME", "parent-value");
        std::env::set_var("CNI_ARGS", "parent=1");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = PluginDir::new();
        let path = dir.fake("rec", &Fake::new(Response::ok("{}")));
        // No trailing newline, unicode, a number above 2^64, odd spacing:
        // the plugin must see exactly these bytes.
        let stdin = "{\"cniVersion\":\"1.1.0\", \"name\":\"n\u{e9}t\",\"big\":123456789012345678901234567890}".as_bytes();
        let vars = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", ""),
            ("CNI_PATH", "/a:/b"),
        ]);
        let req = ExecRequest::new(&path, "rec", Command::Add, &vars, stdin, Duration::from_secs(5));
        let out = RawExec::new().exec(req).await.expect("plugin succeeds");
        assert_eq!(out.stdout, b"{}");

        let calls = dir.invocations();
        assert_eq!(calls.len(), 1);
        let call = &calls[0];
        assert_eq!(call.plugin, "rec");
        assert_eq!(call.stdin, stdin);
        for (k, v) in &vars {
            assert_eq!(call.var(k), Some(v.as_str()), "{k}");
        }
        // Overridden, not duplicated.
        assert_eq!(call.env.iter().filter(|(k, _)| k == "CNI_IFNAME").count(), 1);
        // An empty value overrides too.
        assert_eq!(call.var("CNI_ARGS"), Some(""));
        // Inherited from us.
        assert_eq!(call.var("EXEC_ENV_TEST_INHERITED"), Some("from parent"));
        assert_eq!(
            call.var("PATH").map(str::to_owned),
            std::env::var("PATH").ok()
        );
    });
}
