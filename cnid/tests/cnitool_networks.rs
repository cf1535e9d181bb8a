//! `cnitool networks`, and `gc`/`status` that say what they did: the
//! networks of the conf dir (default first, as go-cni picks it) or of cnid,
//! with unusable files and why; GC prints what it deleted; STATUS prints a
//! line; neither needs the netns argument.

use crate::support::daemon::{Daemon, Dirs};
use crate::support::fake::{Fake, PluginDir};
use crate::support::tool::Sandbox;
use serde_json::json;

#[test]
fn networks_lists_the_default_first_and_unusable_files() {
    let sb = Sandbox::new();
    sb.conf(
        "00-multus.conf",
        &json!({"cniVersion": "1.0.0", "name": "multus-net", "type": "multus"}),
    );
    sb.conf(
        "10-pods.conflist",
        &json!({"cniVersion": "1.1.0", "name": "pods", "plugins": [
            {"type": "bridge"}, {"type": "portmap", "capabilities": {"portMappings": true}}]}),
    );
    std::fs::write(sb.net_dir().join("20-broken.conflist"), "{").unwrap();
    let run = sb.run(&["networks"]).ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{}", run.stdout);
    assert!(lines[0].starts_with("NAME"), "{}", run.stdout);
    // No plugin of either network is installed: both are listed, and
    // marked unusable with why.
    assert!(
        lines[1].starts_with("multus-net (default) (unusable)")
            && lines[1].contains("00-multus.conf"),
        "{}",
        run.stdout
    );
    assert!(
        lines[2].starts_with("pods (unusable) ")
            && lines[2].contains("1.1.0")
            && lines[2].contains("bridge,portmap")
            && lines[2].contains("portMappings"),
        "{}",
        run.stdout
    );
    assert!(
        lines[3].starts_with("unusable: network \"multus-net\": plugin \"multus\" not found"),
        "{}",
        run.stdout
    );
    assert!(
        lines[4].starts_with("unusable: network \"pods\": plugin \"bridge\" not found"),
        "{}",
        run.stdout
    );
    assert!(
        lines[5].starts_with("unusable: ") && lines[5].contains("20-broken.conflist"),
        "{}",
        run.stdout
    );

    // Installed: usable.
    for t in ["multus", "bridge", "portmap"] {
        sb.plugins.fake(t, &Fake::plugin("1.1.0", "10.1.2.3/24"));
    }
    let run = sb.run(&["networks"]).ok();
    assert!(!run.stdout.contains("(unusable)"), "{}", run.stdout);
}

#[test]
fn gc_and_status_need_no_netns_and_say_what_they_did() {
    let sb = Sandbox::new();
    sb.plugins.fake("p", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    sb.conflist("oldnet", "1.0.0", &[json!({"type": "p"})]);
    let gcs1 = sb.netns("gcs1");
    sb.run(&["add", "oldnet", &gcs1]).ok();
    let run = sb.run(&["status", "oldnet"]).ok();
    assert_eq!(
        run.stdout,
        "network oldnet: ready (cniVersion 1.0.0 has no STATUS; nothing was asked, as libcni)\n"
    );
    let run = sb.run(&["gc", "oldnet"]).ok();
    let printed = run.stdout_json();
    assert_eq!(printed["deleted"].as_array().unwrap().len(), 1, "{printed}");
    assert_eq!(printed["pluginsCalled"], false);
    assert!(sb.cache_entries().is_empty());
    // With a netns, the attachment's environment is still checked (as the
    // reference parses it): a malformed CNI_ARGS fails.
    let err = sb
        .run_env(&["gc", "oldnet", &gcs1], &[("CNI_ARGS", "novalue")])
        .fails();
    assert!(err.contains("novalue"), "{err}");
}

#[test]
fn networks_through_the_daemon_are_the_daemons() {
    let dirs = Dirs::new();
    let plugins = PluginDir::in_dir(dirs.root());
    plugins.fake("a", &Fake::plugin("1.0.0", "10.1.2.3/24"));
    std::fs::write(
        dirs.conf.join("10-daemonnet.conflist"),
        json!({"cniVersion": "1.0.0", "name": "daemonnet", "plugins": [{"type": "a"}]}).to_string(),
    )
    .unwrap();
    let daemon = Daemon::start(&dirs, &[]);
    // The local conf dir has something else: the daemon's view wins.
    let sb = Sandbox::new();
    sb.conflist("localnet", "1.0.0", &[json!({"type": "a"})]);
    let run = sb
        .run(&["--socket", daemon.socket.to_str().unwrap(), "networks"])
        .ok();
    assert!(run.stdout.contains("daemonnet (default)"), "{}", run.stdout);
    assert!(!run.stdout.contains("localnet"), "{}", run.stdout);
}
