//! cnid with a plugin that exits 0 but prints a CNI error object: the ADD
//! fails with the plugin's code and message, nothing is cached, the partial
//! attachment is rolled back and no intent stays behind (`docs/decisions.md` D18).

use crate::support::daemon::{Daemon, Dirs, post};
use serde_json::json;

#[test]
fn add_error_object_with_exit_0_is_the_plugins_error() {
    let dirs = Dirs::new();
    let calls = dirs.data.join("calls");
    dirs.plugin(
        "p",
        &format!(
            r#"cat > /dev/null
echo "$CNI_COMMAND" >> '{calls}'
case "$CNI_COMMAND" in
ADD) echo diagnostics >&2
     printf '{{"cniVersion":"1.0.0","code":107,"msg":"no leases","details":"pool full"}}';;
VERSION) printf '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
            calls = calls.display()
        ),
    );
    dirs.conf(
        "10-errobj.conflist",
        &json!({"cniVersion": "1.0.0", "name": "errobj", "plugins": [{"type": "p"}]}),
    );
    let daemon = Daemon::start(&dirs, &[]);
    let body = json!({"containerId": "c1", "netns": "/proc/self/ns/net"}).to_string();
    let r = post(&daemon.socket, "/v1/networks/errobj/add", &body);
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.cni_error(), 107);
    let obj = r.json();
    assert_eq!(
        (obj["msg"].as_str(), obj["details"].as_str()),
        (Some("no leases"), Some("pool full")),
        "{obj}"
    );
    assert_eq!(dirs.cached(), Vec::<String>::new());
    assert_eq!(dirs.intents(), Vec::<String>::new());
    // The plugin ran and was rolled back.
    let calls = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(calls.lines().collect::<Vec<_>>(), ["ADD", "DEL"]);
}
