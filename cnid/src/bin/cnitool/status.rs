//! `cnitool status <network> <netns>`: STATUS; prints nothing on success.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::setup::{self, Env};

/// Asks each plugin whether it is ready for ADD (1.1.0 networks; older ones
/// succeed without running anything, as libcni). Not ready is a failure with
/// code 50 or 51. The netns argument is parsed but not used, as in the
/// reference.
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let _unused = setup::runtime_conf(env, &args.netns, global.ifname.as_deref())?;
    backend.status(&args.network).await
}
