//! `cnitool gc <network> [<netns>]`: GC with no valid attachment;
//! `cnitool gc --stale [--dry-run] [<network>]`: the cached attachments
//! whose network namespace is gone ([`cni_async::stale`], as cnid's reaper).

use cni_async::stale::{Reaped, StaleScanner};
use cnid_api::GcResponse;
use serde::Serialize;

use crate::backend::Backend;
use crate::cli::{GcArgs, GlobalArgs};
use crate::report;
use crate::setup::{self, Env};

/// As the reference: every cached attachment of the network is stale and
/// gets a DEL (current config, cached args); then, for 1.1.0 networks, each
/// plugin gets GC with empty `cni.dev/valid-attachments`. The netns argument
/// may be left out; when given it is checked but not used, and so is the
/// environment. Prints what was deleted, as cnid answers GC
/// (`{"deleted": [{"containerID", "ifname"}], "pluginsCalled", "disabled"}`);
/// errors of all steps are reported together. With `--stale`, see [`stale`].
pub(crate) async fn exec(
    backend: &impl Backend,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &GcArgs,
) -> anyhow::Result<()> {
    setup::check_unused_netns(env, args.netns.as_deref(), global.ifname.as_deref())?;
    if args.stale {
        return stale(backend, args).await;
    }
    let Some(network) = args.network.as_deref() else {
        anyhow::bail!("gc needs a network name (or --stale)");
    };
    let summary = backend.gc(network).await?;
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

/// One stale attachment in `gc --stale`'s answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StaleOut {
    network: String,
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
    netns: String,
    /// `rebooted` or `namespace gone`.
    reason: &'static str,
    /// Whether it was deleted (false with --dry-run, or when its DEL failed
    /// or it changed meanwhile).
    deleted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct StaleAnswer {
    dry_run: bool,
    stale: Vec<StaleOut>,
}

/// `gc --stale`: every cached attachment (of `args.network`, or all) whose
/// namespace is proven gone gets a DEL with its cached config, result and
/// args (no netns), and loses its record; in one pass (no `--stale-after`: a
/// namespace gone now is stale). Nothing is touched when the conf dir or
/// the cache cannot be read. Prints each with its reason and outcome;
/// fails when a DEL failed (the others are still done).
async fn stale(backend: &impl Backend, args: &GcArgs) -> anyhow::Result<()> {
    if backend.remote() {
        anyhow::bail!(
            "gc --stale runs on this host's cache: cnid deletes stale attachments itself (see its --stale-after)"
        );
    }
    let local = backend.local();
    let net_dir = &local.settings().net_dir;
    if let Err(e) = std::fs::read_dir(net_dir) {
        anyhow::bail!(
            "conf dir {} unreadable ({e}): nothing is deleted while it cannot be read",
            net_dir.display()
        );
    }
    let (cni, opts) = local.cni();
    let mut scanner = StaleScanner::new(Some(std::time::Duration::ZERO));
    if !scanner.sees_host_mounts() {
        tracing::warn!(
            "cnitool does not see the host's mounts and processes (not in pid 1's mount namespace or not in the initial pid namespace): only attachments of an earlier boot are stale"
        );
    }
    let found = scanner.scan(cni.cache()).await?;
    let mut answer = StaleAnswer {
        dry_run: args.dry_run,
        stale: Vec::new(),
    };
    let mut failed = 0;
    for c in found {
        let Some(reason) = c.verdict.stale() else {
            continue;
        };
        if args.network.as_deref().is_some_and(|n| n != c.network) {
            continue;
        }
        let mut out = StaleOut {
            network: c.network.clone(),
            container_id: c.container_id.clone(),
            ifname: c.ifname.clone(),
            netns: c.netns.clone(),
            reason: reason.as_str(),
            deleted: false,
            error: None,
        };
        if !args.dry_run {
            match cni.reap_stale(&c, opts).await {
                Ok(Reaped::Deleted) => out.deleted = true,
                Ok(Reaped::Changed | Reaped::Alive) => {}
                Err(e) => {
                    failed += 1;
                    out.error = Some(cni_async::Chain(&e).to_string());
                }
            }
            tracing::info!(network = %out.network, container = %out.container_id, ifname = %out.ifname,
                netns = %out.netns, why = reason.as_str(), deleted = out.deleted, error = out.error.as_deref().unwrap_or(""),
                "stale attachment");
        }
        answer.stale.push(out);
    }
    report::print_stdout(&report::pretty_json(&answer))?;
    if failed > 0 {
        anyhow::bail!("{failed} stale attachment(s) could not be deleted (see \"error\" above)");
    }
    Ok(())
}
