//! `cnitool gc <network> [<netns>]`: GC with no valid attachment.

use cnid::api::GcResponse;

use crate::backend::Backend;
use crate::cli::{GlobalArgs, NetworkArgs};
use crate::report;
use crate::setup::{self, Env};

/// As the reference: every cached attachment of the network is stale and
/// gets a DEL (current config, cached args); then, for 1.1.0 networks, each
/// plugin gets GC with empty `cni.dev/valid-attachments`. The netns argument
/// may be left out; when given it is checked but not used, and so is the
/// environment. Prints what was deleted, as cnid answers GC
/// (`{"deleted": [{"containerID", "ifname"}], "pluginsCalled", "disabled"}`);
/// errors of all steps are reported together.
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &NetworkArgs,
) -> anyhow::Result<()> {
    setup::check_unused_netns(env, args.netns.as_deref(), global.ifname.as_deref())?;
    let summary = backend.gc(&args.network).await?;
    // An attachment left over already failed the command (as the
    // reference's GC), so `failed` is empty here.
    let answer = GcResponse {
        deleted: summary.deleted,
        plugins_called: summary.plugins_called,
        disabled: summary.disabled,
        ..GcResponse::default()
    };
    report::print_stdout(&report::pretty_json(&answer))?;
    Ok(())
}
