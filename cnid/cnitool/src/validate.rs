//! `cnitool validate <network>`: are the network's plugins installed and
//! do they support its version?

use crate::backend::Backend;
use crate::cli::ValidateArgs;
use crate::report;

/// Asks every plugin of the network for its VERSION. On success prints the
/// capabilities the network enables, one per line (nothing when none); on
/// failure the error names every plugin that is missing or does not support
/// the network's version.
pub(crate) async fn exec(backend: &impl Backend, args: &ValidateArgs) -> anyhow::Result<()> {
    let caps = backend.validate(&args.network).await?;
    if !caps.is_empty() {
        report::print_stdout(&caps.join("\n"))?;
    }
    Ok(())
}
