//! `cnitool version <plugin>`: a plugin's VERSION reply on stdout.

use crate::backend::Backend;
use crate::cli::VersionArgs;
use crate::report;

/// Runs VERSION on the plugin (found in `CNI_PATH`) and prints its reply
/// (`cniVersion`, `supportedVersions`) as JSON indented by four spaces.
pub(crate) async fn exec(backend: &impl Backend, args: &VersionArgs) -> anyhow::Result<()> {
    let info = backend.version(&args.plugin_type).await?;
    report::print_stdout(&report::pretty_json(&info))?;
    Ok(())
}
