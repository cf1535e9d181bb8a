//! `cnitool check <network> <netns>`: CHECK; prints nothing on success.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::setup::{self, Env};

/// Runs CHECK with the cached ADD result; refused (code 3) without one.
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let rt = setup::runtime_conf_for_add(env, &args.netns, global.ifname.as_deref())?;
    backend
        .check(&args.network, &rt)
        .await
        .map_err(|e| setup::missing_netns(e, &rt))
}
