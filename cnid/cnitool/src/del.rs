//! `cnitool del <network> <netns>`: DEL; prints nothing on success.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::setup::{self, Env};

/// Runs the plugins last to first and removes the cache entry. When the
/// network's configuration is no longer in `NETCONFPATH`, the configuration
/// cached at ADD is used; a DEL of an attachment that was never added runs
/// the plugins all the same and succeeds if they do (as libcni). So does a
/// DEL whose result cache cannot be used (the dir unusable, no lock, the
/// record unreadable): the plugins run without prevResult, with a warning
/// on stderr for each problem. Refused before any plugin runs only without
/// the privilege the plugins need (CAP_NET_ADMIN).
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let rt = setup::runtime_conf(env, &args.netns, global.ifname.as_deref())?;
    if !backend.remote() {
        // Refused up front only where the plugins cannot run anyway. A
        // result cache this process cannot use is no such reason: the DEL
        // runs without prevResult and warns (`docs/decisions.md` D8).
        setup::check_del_privilege()?;
    }
    backend.del(&args.network, &rt).await
}
