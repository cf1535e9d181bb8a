//! `cnitool add <network> <netns>`: ADD, then the result on stdout.

use crate::backend::Backend;
use crate::cli::{AttachmentArgs, GlobalArgs};
use crate::report;
use crate::setup::{self, Env};

/// Runs the plugins of the network first to last and prints the final
/// result (JSON indented by four spaces, as the reference's `result.Print`).
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &AttachmentArgs,
) -> anyhow::Result<()> {
    let rt = setup::runtime_conf_for_add(env, &args.netns, global.ifname.as_deref())?;
    let result = backend
        .add(&args.network, &rt)
        .await
        .map_err(|e| setup::missing_netns(e, &rt))?;
    report::print_stdout(&result.to_json_pretty())?;
    Ok(())
}
