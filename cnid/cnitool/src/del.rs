//! `cnitool del <network> <netns>`: DEL; prints nothing on success.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::setup::{self, Env};

/// Runs the plugins last to first and removes the cache entry. When the
/// network's configuration is no longer in `NETCONFPATH`, the configuration
/// cached at ADD is used; a DEL of an attachment that was never added runs
/// the plugins all the same and succeeds if they do (as libcni).
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let rt = setup::runtime_conf(env, &args.netns, global.ifname.as_deref())?;
    if !backend.remote() {
        // As `add` fails on the cache before any plugin runs: a caller who
        // may not use the cache may not run the plugins either (they would
        // fail on the netns, after a warning per cache file).
        setup::check_cache_access(&backend.local().settings().cache_dir)?;
    }
    backend.del(&args.network, &rt).await
}
