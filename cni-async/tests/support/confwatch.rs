//! What the conf-dir watcher's tests share (feature `watch`): conflist
//! text, a plugin that answers VERSION, the names a snapshot holds, and
//! waiting for a snapshot.

use std::time::{Duration, Instant};

use cni_async::confwatch::{ConfSnapshot, NetworkSet};

use super::fake::{Fake, PluginDir, Response};

/// The text of a 1.0.0 conflist `name` of one plugin `plugin`.
pub fn conflist_text(name: &str, plugin: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"{plugin}"}}]}}"#)
}

/// A fake plugin `name` that answers VERSION (0.4.0 and 1.0.0) and
/// succeeds otherwise.
pub fn version_fake(dir: &PluginDir, name: &str) {
    dir.fake(
        name,
        &Fake::new(Response::ok("")).on(
            "VERSION",
            Response::ok(r#"{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}"#),
        ),
    );
}

/// The networks' names, in conf-dir order.
pub fn names(snap: &ConfSnapshot) -> Vec<String> {
    snap.networks
        .iter()
        .map(|n| n.list.name().to_owned())
        .collect()
}

/// Waits until the set's snapshot satisfies `cond`; fails after `limit`
/// naming `what` and showing the snapshot.
pub async fn wait_for(
    set: &NetworkSet,
    limit: Duration,
    what: &str,
    cond: impl Fn(&ConfSnapshot) -> bool,
) {
    let start = Instant::now();
    while !cond(&set.snapshot()) {
        assert!(
            start.elapsed() < limit,
            "not seen within {limit:?}: {what}; snapshot: {:#?}",
            set.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
