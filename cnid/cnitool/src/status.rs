//! `cnitool status <network> [<netns>]`: STATUS.

use crate::backend::Backend;
use crate::cli::{GlobalArgs, NetworkArgs};
use crate::report;
use crate::setup::{self, Env};

/// Asks each plugin whether it is ready for ADD (1.1.0 networks; older ones
/// succeed without running anything, as libcni). Not ready is a failure with
/// code 50 or 51. Ready prints one line saying so, and, for a network older
/// than 1.1.0, that nothing was asked. The netns argument may be left out;
/// when given it is checked but not used, as in the reference.
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &NetworkArgs,
) -> anyhow::Result<()> {
    setup::check_unused_netns(env, args.netns.as_deref(), global.ifname.as_deref())?;
    backend.status(&args.network).await?;
    let line = match backend.cni_version() {
        Some(v) if !v.has_status_and_gc() => format!(
            "network {}: ready (cniVersion {v} has no STATUS; nothing was asked, as libcni)",
            args.network
        ),
        _ => format!("network {}: ready", args.network),
    };
    report::print_stdout(&line)?;
    Ok(())
}
