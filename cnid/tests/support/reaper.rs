//! What the reaper's tests share: a real bridge + host-local network of
//! the test's own, host-local's leftovers, a simulated reboot, waiting for
//! reaps in the log, reading a metric.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::daemon::{
    Daemon, Dirs, date_records_before_boot, eventually_async, journal_of_an_earlier_boot,
};
use super::netns::{LinkGuard, SubnetLease, ip_ok};

/// What a loaded machine keeps for the reaper to act.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A bridge of the test's own, a subnet and a `dataDir` in its temp dir.
pub struct Chain {
    pub bridge: LinkGuard,
    _subnet: SubnetLease,
    pub data_dir: PathBuf,
}

/// Network `net` in conf file `10-<net>.conflist`: `extra` plugins first
/// (their DEL runs last), then bridge with host-local.
pub fn chain(dirs: &Dirs, net: &str, extra: &[Value]) -> Chain {
    super::require_plugins(&["bridge", "host-local"]);
    let bridge = LinkGuard::new();
    let subnet = SubnetLease::new();
    let br = bridge.name();
    ip_ok(&["link", "add", "name", br, "type", "bridge"]);
    ip_ok(&["link", "set", br, "up"]);
    let data_dir = dirs.data.join(format!("host-local-{net}"));
    let mut plugins = extra.to_vec();
    plugins.push(
        json!({"type": "bridge", "bridge": br, "isGateway": false, "ipMasq": false,
        "ipam": {"type": "host-local", "dataDir": data_dir,
                 "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1).to_string()}]]}}),
    );
    dirs.conf(
        &format!("10-{net}.conflist"),
        &json!({"cniVersion": "1.0.0", "name": net, "plugins": plugins}),
    );
    Chain {
        bridge,
        _subnet: subnet,
        data_dir,
    }
}

/// What host-local holds for `net` besides reservations: only `lock` and
/// `last_reserved_ip.*` once every address is released.
pub fn data_dir_leftovers(data_dir: &Path, net: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(data_dir.join(net))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n != "lock" && !n.starts_with("last_reserved_ip."))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// After `kill -9`: the machine "rebooted". Every cache record is dated
/// before this boot and the journal's commit lines are another boot's.
pub fn simulate_reboot(dirs: &Dirs) {
    let before = date_records_before_boot(dirs);
    let journal = dirs.state.join("intents/journal");
    if journal.exists() {
        journal_of_an_earlier_boot(dirs);
        let f = std::fs::File::options().write(true).open(&journal).unwrap();
        f.set_modified(before).unwrap();
    }
}

/// Waits until cnid logged `n` reaps: the log line is the reap's last
/// step (after the record, the metrics and the listing changed).
pub async fn reaps_logged(daemon: &Daemon, n: usize) {
    eventually_async(LIMIT, &format!("{n} reap(s) logged"), || async {
        daemon.log().matches("stale attachment deleted").count() >= n
    })
    .await;
}

/// The value of the metric line starting with `line_start` (0 when none).
pub fn metric(text: &str, line_start: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
