//! What a restart after `kill -9` does to an ADD that
//! had finished (its answer may never have reached the runtime): nothing.
//! Only unfinished ADDs are rolled back at the next start
//! (`daemon_crash::kill_9_during_add_then_restart_leaks_nothing`); a
//! finished one stays attached, cached, until the runtime's DEL, as the
//! README says.

use crate::support;
use crate::support::daemon::{Daemon, Dirs};
use cnid::api::AttachmentRequest;
use serde_json::json;

const NET: &str = "danswered";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_add_stays_after_kill_9_until_the_runtimes_del() {
    support::require_root!();
    let dirs = Dirs::new();
    let calls = dirs.data.join("calls");
    dirs.plugin(
        "answer",
        &format!(
            r#"cat >/dev/null
echo "$CNI_COMMAND" >> {calls}
case "$CNI_COMMAND" in
ADD) printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.98.0.9/24"}}]}}';;
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac
exit 0"#,
            calls = calls.display()
        ),
    );
    dirs.conf(
        "10-answered.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "answer"}]}),
    );
    let mut daemon = Daemon::start(&dirs, &[]);
    let req = AttachmentRequest::new("c-ans", dirs.netns("c-ans"), "eth0");
    daemon.client().await.add(NET, &req).await.expect("ADD");
    daemon.kill9();

    let daemon = Daemon::start(&dirs, &[]);
    let client = daemon.client().await;
    // Not rolled back: no DEL ran, the attachment is still cached.
    let ran = || std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(!ran().contains("DEL"), "{}", ran());
    assert_eq!(dirs.cached().len(), 1, "{:?}", dirs.cached());
    // The runtime's DEL removes it.
    client.del(NET, &req).await.expect("DEL");
    assert!(ran().contains("DEL"), "{}", ran());
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
}
