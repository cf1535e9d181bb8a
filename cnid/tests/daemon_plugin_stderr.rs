//! cnid logs the stderr of a plugin that succeeded with the operation
//! (as libcni passes it on): one line naming the plugin, verb, network, container
//! and ifname, the stderr escaped. The answer does not carry it.

use crate::support::daemon::{Daemon, Dirs};
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "perrlog";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successful_plugins_stderr_is_logged_with_the_operation() {
    let dirs = Dirs::new();
    dirs.plugin(
        "talker",
        r#"cat >/dev/null
case "$CNI_COMMAND" in
ADD) printf 'warning: x \033[31mred\n' >&2; echo '{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}';;
esac"#,
    );
    dirs.conf(
        "10-perrlog.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "talker"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    let req = AttachmentRequest::new("stderr-c1", "/proc/self/ns/net", "eth0");
    client.add(NET, &req).await.expect("ADD");

    // Written before the answer was sent: no waiting needed.
    let log = daemon.log();
    let line = log
        .lines()
        .find(|l| l.contains("plugin succeeded with output on stderr"))
        .unwrap_or_else(|| panic!("no plugin stderr line in the log:\n{log}"));
    for part in [
        "INFO",
        "verb=ADD",
        "network=perrlog",
        // The operation's span (strings quoted), then the event's fields.
        r#"container="stderr-c1""#,
        r#"ifname="eth0""#,
        "container=stderr-c1 ifname=eth0",
        "plugin=talker",
        "command=ADD",
        "warning: x ",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(!log.contains('\u{1b}'), "raw ESC in the log:\n{log}");
    client.del(NET, &req).await.expect("DEL");
}
