//! `cnitool gc <network> <netns>`: GC with no valid attachment.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::setup::{self, Env};

/// As the reference: every cached attachment of the network is stale and
/// gets a DEL (current config, cached args); then, for 1.1.0 networks, each
/// plugin gets GC with empty `cni.dev/valid-attachments`. The netns argument
/// and the environment are parsed (and must be valid) but not used.
/// Prints nothing on success; errors of all steps are reported together.
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let _unused = setup::runtime_conf(env, &args.netns, global.ifname.as_deref())?;
    let summary = backend.gc(&args.network).await?;
    tracing::info!(
        network = %args.network,
        deleted = summary.deleted.len(),
        plugins_called = summary.plugins_called,
        disabled = summary.disabled,
        "GC done"
    );
    Ok(())
}
