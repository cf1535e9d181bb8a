//! `cnitool batch up|down <network>`: many network namespaces on one network
//! at once, for shell-based test harnesses.
//!
//! `batch up NETWORK --count N` creates the named namespaces `PREFIX0` ..
//! `PREFIX<N-1>` (`/run/netns/NAME`, so `ip netns` and `ip -n NAME` see
//! them), attaches each to the network, at most `--concurrency` at a time,
//! and prints a JSON summary on stdout:
//!
//! ```json
//! {"network": "net", "prefix": "cnitool-batch-", "attached": 2, "failed": 0,
//!  "namespaces": [{"namespace": "cnitool-batch-0", "path": "/run/netns/cnitool-batch-0",
//!                  "containerId": "cnitool-…", "ifname": "eth0",
//!                  "ips": ["10.22.0.2/24"], "error": null}, …],
//!  "elapsedMs": 412}
//! ```
//!
//! - Each member is an attachment as `cnitool add NETWORK /run/netns/NAME`
//!   would make it: the container ID is derived from the netns path as the
//!   reference cnitool derives it, so `cnitool check|del NETWORK PATH` (ours
//!   or the reference's) work on a member, and `CNI_ARGS`, `CAP_ARGS`,
//!   `-i`/`CNI_IFNAME`, `CNI_CACHE_DIR` and `CNI_TIMEOUT` mean what they mean
//!   for `add`.
//! - The namespaces and attachments outlive the command: `batch down`
//!   removes them.
//! - A member that fails is undone (each ADD runs with rollback: the plugins
//!   that ran get a DEL) and its namespace deleted; it is listed with its
//!   `error` and empty `ips`, and the exit status is 1. The members that
//!   attached stay up. If undoing a failed member fails too, its namespace
//!   is kept so that `batch down` can DEL it again.
//! - `up` refuses to start when a namespace `PREFIX<number>` exists already:
//!   the prefix names the batch, and `down` deletes every such namespace.
//! - SIGINT or SIGTERM during `up` stops it: the plugins in flight are
//!   killed, everything set up so far is torn down, and the exit status is 1
//!   with nothing on stdout. A second signal stops the teardown; `batch
//!   down` finishes it.
//!
//! `up` is a thin layer over the library's batch ([`cni_async::batch`]):
//! [`BatchBuilder`] with the container IDs derived from the paths
//! (`container_ids`), failed members undone at once (`release_failed`),
//! stopped by a signal (`setup_until`, `teardown_until`), the attached
//! members kept (`keep`).
//!
//! `batch down NETWORK` tears a batch down: every cached attachment of the
//! network whose netns is `/run/netns/PREFIX<number>` (and whose container
//! ID is the one derived from that path) gets a DEL with its cached
//! arguments, with the network's configuration or, when that is gone, the
//! configuration cached at ADD. A namespace `PREFIX<number>` without such
//! an entry (an `up` killed mid-ADD, a member whose undo failed) gets a DEL
//! with the current configuration, the interface name of `-i`/`CNI_IFNAME`
//! and `CNI_ARGS`/`CAP_ARGS`, as `cnitool del` would run it. Then each
//! namespace whose DELs succeeded is deleted; one whose DEL failed is kept,
//! so that running `down` again retries with the same inputs. It prints
//! `{"network", "prefix", "detached", "deleted", "errors": [{"namespace",
//! "error"}], "elapsedMs"}`; the exit status is 1 when `errors` is not
//! empty. With nothing left to do it succeeds.
//!
//! Progress goes to stderr (see [`crate::progress`]); `--quiet` turns it
//! off. Failures follow the failure contract of [`crate::report`] (message
//! or error JSON on stderr, status 1); the JSON summary is printed on stdout
//! first whenever the batch ran.
//!
//! # Caveats
//!
//! - **SIGKILL** (a CI job's hard timeout) runs nothing: namespaces and
//!   attachments stay until `batch down` with the same network, prefix and
//!   `-i`.
//! - **The prefix owns its names.** `down` deletes every namespace
//!   `PREFIX<number>`, whoever made it. Prefixes cannot end with a digit, so
//!   two prefixes never claim each other's names (were `t1` allowed, `t`
//!   would claim its `t10`).
//! - **Paths are `/run/netns/NAME`.** The container ID is derived from that
//!   exact string; `cnitool del NETWORK /var/run/netns/NAME` names another
//!   container. Use the `path` of the summary.
//! - Runs the plugins in this process; there is no daemon variant.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cni_async::batch::{Batch, BatchBuilder, BatchEvent, BatchEventKind, TeardownEnd};
use cni_async::multi::{MultiNetwork, Sandbox};
use cni_async::netns::{NETNS_RUN_DIR, Netns};
use cni_async::{CallOptions, Cni};
use cni_core::error::code;
use cni_core::{NetworkConfigList, RuntimeConf};
use futures::stream::{self, StreamExt};
use serde_json::json;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::backend::Local;
use crate::batch_cli::{BatchArgs, BatchCommand, BatchCommonArgs, BatchDownArgs, BatchUpArgs};
use crate::cli::GlobalArgs;
use crate::progress::Progress;
use crate::report::{self, ToolError};
use crate::setup::{self, Env};

/// How many failing names an error message lists.
const NAMES_SHOWN: usize = 5;

/// Runs `batch up` or `batch down` here (never in cnid): networks are
/// loaded with `local` (so the error JSON is in their version), the plugins
/// run on a [`Cni`] whose cache I/O uses tokio's blocking pool, so that the
/// fsyncs of different members overlap.
pub(crate) async fn exec(
    local: &Local,
    env: Env<'_>,
    global: &GlobalArgs,
    args: &BatchArgs,
) -> anyhow::Result<()> {
    let runner = Runner {
        local,
        cni: local.settings().build_cni(),
    };
    let ifname = global.ifname.as_deref();
    match &args.command {
        BatchCommand::Up(args) => up(&runner, env, ifname, args).await,
        BatchCommand::Down(args) => down(&runner, env, ifname, args).await,
    }
}

/// What the commands run with.
struct Runner<'a> {
    local: &'a Local,
    cni: Cni,
}

impl Runner<'_> {
    fn load(&self, network: &str) -> Result<NetworkConfigList, cni_core::Error> {
        self.local.load(network)
    }

    fn call_options(&self) -> CallOptions {
        self.local.settings().call_options()
    }
}

// ----- names -----

/// `PREFIX` + `index`.
fn member_name(prefix: &str, index: usize) -> String {
    format!("{prefix}{index}")
}

/// `/run/netns/NAME`.
fn member_path(name: &str) -> String {
    format!("{NETNS_RUN_DIR}/{name}")
}

/// Whether `name` is `PREFIX` followed by one or more digits.
fn is_member(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Sort key: by length, then by name, so that `P2` comes before `P10`.
fn name_order(name: &str) -> (usize, String) {
    (name.len(), name.to_owned())
}

/// The namespaces `PREFIX<number>` in `/run/netns`, in index order.
fn existing_members(prefix: &str) -> Result<Vec<String>, cni_async::Error> {
    let mut names: Vec<String> = Netns::list_named()?
        .into_iter()
        .filter(|n| is_member(prefix, n))
        .collect();
    names.sort_by_key(|n| name_order(n));
    Ok(names)
}

/// The attachment of the member with netns `path`: `template` with the
/// container ID derived from the path, as `cnitool add` derives it.
fn member_conf(template: &RuntimeConf, path: &str) -> RuntimeConf {
    let mut rt = template.clone();
    rt.container_id = setup::container_id(path);
    rt.netns = path.to_owned();
    rt
}

fn default_concurrency() -> usize {
    std::thread::available_parallelism().map_or(4, usize::from)
}

fn concurrency(common: &BatchCommonArgs, items: usize) -> usize {
    common
        .concurrency
        .map_or_else(default_concurrency, |c| c as usize)
        .clamp(1, items.max(1))
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `a, b, c and 4 more`.
fn list_names(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(NAMES_SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMES_SHOWN {
        text.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
    }
    text
}

// ----- signals -----

/// SIGINT and SIGTERM, while `up` runs. Once registered, tokio keeps
/// handling them for the rest of the process.
struct Signals {
    int: Option<Signal>,
    term: Option<Signal>,
}

impl Signals {
    fn new() -> Self {
        let register = |kind| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot handle {kind:?}; it will not tear the batch down");
                None
            }
        };
        Signals {
            int: register(SignalKind::interrupt()),
            term: register(SignalKind::terminate()),
        }
    }

    /// Waits for one; its name.
    async fn recv(&mut self) -> &'static str {
        async fn one(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    if s.recv().await.is_none() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
        let Signals { int, term } = self;
        tokio::select! {
            () = one(int) => "SIGINT",
            () = one(term) => "SIGTERM",
        }
    }
}

// ----- teardown of `down` -----

/// Where DEL gets the configuration from.
enum Config<'a> {
    /// The network's configuration, loaded from `NETCONFPATH`.
    Current(&'a NetworkConfigList),
    /// The one cached at ADD (the network's file is gone).
    Cached(&'a str),
}

/// One namespace of a batch to tear down.
#[derive(Debug)]
struct Target {
    name: String,
    /// Whether `/run/netns/NAME` exists (and is to be deleted).
    netns: bool,
    /// The attachments to DEL, in order.
    dels: Vec<RuntimeConf>,
}

/// What tearing down one namespace did.
#[derive(Debug, Default)]
struct TornDown {
    detached: usize,
    deleted: bool,
    errors: Vec<cni_async::Error>,
}

struct Teardown<'a> {
    cni: &'a Cni,
    config: Config<'a>,
    opts: CallOptions,
}

impl Teardown<'_> {
    /// DELs the target's attachments, then deletes its namespace if they all
    /// succeeded.
    async fn one(&self, target: &Target) -> TornDown {
        let mut out = TornDown::default();
        for rt in &target.dels {
            let mut rt = rt.clone();
            if !target.netns {
                // The namespace is gone: DEL without one, as the spec allows.
                rt.netns.clear();
            }
            let result = match self.config {
                Config::Current(list) => {
                    self.cni
                        .del_network_list(list, &rt)
                        .options(&self.opts)
                        .await
                }
                Config::Cached(network) => {
                    self.cni.del_cached(network, &rt).options(&self.opts).await
                }
            };
            match result {
                Ok(()) => out.detached += 1,
                Err(e) => out.errors.push(cni_async::Error::Context {
                    context: format!("DEL of {} (container {})", rt.ifname, rt.container_id),
                    source: Box::new(e),
                }),
            }
        }
        if target.netns && out.errors.is_empty() {
            match Netns::delete_named(&target.name) {
                Ok(()) => out.deleted = true,
                Err(e) => out.errors.push(e),
            }
        }
        out
    }
}

// ----- up: the library's batch -----

async fn up(
    runner: &Runner<'_>,
    env: Env<'_>,
    ifname: Option<&str>,
    args: &BatchUpArgs,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let prefix = args.common.prefix.as_str();
    let count = args.count as usize;
    // The environment first, then the network, as the other commands.
    let template = setup::runtime_conf(env, &member_path(&member_name(prefix, 0)), ifname)?;
    template.validate()?;
    let list = runner.load(&args.network)?;
    let taken = existing_members(prefix)?;
    if !taken.is_empty() {
        return Err(ToolError::new(
            code::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "network namespaces with prefix {prefix:?} exist already ({}): run \
                 `cnitool batch down {} --prefix {prefix}` first, or choose another --prefix",
                list_names(&taken),
                args.network
            ),
        )
        .into());
    }

    // The library's batch: one network on the interface of -i/CNI_IFNAME,
    // CNI_ARGS and CAP_ARGS as `cnitool add` passes them, container IDs
    // derived from the paths, failed members undone at once.
    let network = list.name().to_owned();
    let mut multi = MultiNetwork::builder(runner.cni.clone())
        .network_with_ifname(list, template.ifname.clone());
    if let Some(timeout) = runner.call_options().timeout {
        multi = multi.timeout(timeout);
    }
    let mut sandbox = Sandbox::new("", "").with_ignore_unknown(false);
    sandbox.labels = template.args.clone();
    sandbox.capability_args = template.capability_args.clone();
    let progress = Arc::new(Mutex::new(UpProgress {
        up: Progress::new("batch up", "attached", "failed", count, args.common.quiet),
        down: None,
    }));
    let events = progress.clone();
    let mut signals = Signals::new();
    let mut interrupted = None;
    let batch = BatchBuilder::new(multi.build()?)
        .prefix(prefix)
        .count(count)
        .concurrency(concurrency(&args.common, count))
        .sandbox_template(sandbox)
        .container_ids(setup::container_id)
        .release_failed(true)
        .on_event(move |e| lock(&events).on_event(e))
        .setup_until(async { interrupted = Some(signals.recv().await) })
        .await?;
    lock(&progress).up.end_line();
    if let Some(signal) = interrupted {
        return Err(undo_interrupted(
            batch,
            &network,
            prefix,
            &args.common,
            &progress,
            signal,
            &mut signals,
        )
        .await);
    }

    let mut members = Vec::with_capacity(count);
    let mut failures: Vec<(String, String, u32)> = Vec::new();
    for m in batch.members() {
        let path = member_path(m.name());
        let (ips, error): (Vec<String>, Option<String>) = match (m.result(), m.error()) {
            (Some(result), _) => (
                result
                    .addresses(&template.ifname)
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                None,
            ),
            (None, Some(e)) => {
                // The summary names the network: the member's error without it.
                let e = match e {
                    cni_async::Error::Context { source, .. } => source,
                    other => other,
                };
                failures.push((m.name().to_owned(), e.to_string(), e.code()));
                (Vec::new(), Some(e.to_string()))
            }
            // Every member ran to the end: unreachable, but a member without
            // an outcome is a failure, not a panic.
            (None, None) => {
                let text = format!("batch up: {path}: no outcome recorded");
                failures.push((m.name().to_owned(), text.clone(), code::IO_FAILURE));
                (Vec::new(), Some(text))
            }
        };
        members.push(json!({
            "namespace": m.name(),
            "path": path,
            "containerId": m.container_id(),
            "ifname": template.ifname,
            "ips": ips,
            "error": error,
        }));
    }
    // The attached members (and those whose undo failed) stay for `down`.
    drop(batch.keep());
    let summary = json!({
        "network": network,
        "prefix": prefix,
        "attached": count - failures.len(),
        "failed": failures.len(),
        "namespaces": members,
        "elapsedMs": elapsed_ms(started),
    });
    report::print_stdout(&report::pretty_json(&summary))?;
    match failures.first() {
        None => Ok(()),
        Some((name, first, code)) => {
            let names: Vec<String> = failures.iter().map(|(n, _, _)| n.clone()).collect();
            Err(ToolError::new(
                *code,
                format!(
                    "{} of {count} namespaces failed to attach ({}; see the summary on stdout); \
                     the first, {name}: {first}",
                    failures.len(),
                    list_names(&names)
                ),
            )
            .into())
        }
    }
}

/// The progress lines of `up`, fed by the batch's events: setup, then the
/// teardown after a signal.
struct UpProgress {
    up: Progress,
    down: Option<(Progress, usize, usize)>,
}

impl UpProgress {
    fn on_event(&mut self, e: &BatchEvent<'_>) {
        match e.kind {
            BatchEventKind::Attached | BatchEventKind::Failed => {
                self.up.update(e.counts.attached, e.counts.failed);
            }
            BatchEventKind::Deleted | BatchEventKind::TeardownFailed => {
                if let Some((down, ok, failed)) = &mut self.down {
                    if e.kind == BatchEventKind::Deleted {
                        *ok += 1;
                    } else {
                        *failed += 1;
                    }
                    down.update(*ok, *failed);
                }
            }
            _ => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// After SIGINT/SIGTERM: tears down what `batch` set up so far; the error
/// to report. A second signal stops the teardown.
async fn undo_interrupted(
    batch: Batch,
    network: &str,
    prefix: &str,
    common: &BatchCommonArgs,
    progress: &Mutex<UpProgress>,
    signal: &str,
    signals: &mut Signals,
) -> anyhow::Error {
    let total = batch.pending_teardown();
    if !common.quiet {
        report::write_stderr(&format!(
            "batch up: {signal}: tearing down the {total} namespaces set up so far\n"
        ));
    }
    lock(progress).down = Some((
        Progress::new("batch down", "torn down", "errors", total, common.quiet),
        0,
        0,
    ));
    let outcome = batch
        .teardown_until(async {
            signals.recv().await;
        })
        .await;
    if let Some((down, _, _)) = &mut lock(progress).down {
        down.end_line();
    }
    let msg = match outcome {
        Ok(TeardownEnd::Done) => format!(
            "batch up interrupted by {signal}; the {total} namespaces it had set up were torn down"
        ),
        Err(e) => format!(
            "batch up interrupted by {signal}; tearing down what it had set up failed \
             (run `cnitool batch down {network} --prefix {prefix}` again): {e}"
        ),
        Ok(_) => format!(
            "batch up interrupted by {signal}, and its teardown by another signal: \
             run `cnitool batch down {network} --prefix {prefix}` to remove what is left"
        ),
    };
    ToolError::new(code::TRY_AGAIN_LATER, msg).into()
}

/// Tears down `targets`, `concurrency` at a time, with progress; the outcome
/// of each, in the order of `targets`.
async fn run_teardown(
    teardown: &Teardown<'_>,
    targets: &[Target],
    concurrency: usize,
    quiet: bool,
) -> Vec<(String, TornDown)> {
    let mut progress = Progress::new("batch down", "torn down", "errors", targets.len(), quiet);
    let mut results: Vec<Option<TornDown>> = (0..targets.len()).map(|_| None).collect();
    let (mut ok, mut failed) = (0, 0);
    let mut work = stream::iter(targets.iter().enumerate())
        .map(|(i, t)| async move { (i, teardown.one(t).await) })
        .buffer_unordered(concurrency);
    while let Some((i, outcome)) = work.next().await {
        if outcome.errors.is_empty() {
            ok += 1;
        } else {
            failed += 1;
        }
        progress.update(ok, failed);
        results[i] = Some(outcome);
    }
    progress.end_line();
    targets
        .iter()
        .zip(results)
        .map(|(t, r)| (t.name.clone(), r.unwrap_or_default()))
        .collect()
}

// ----- down -----

async fn down(
    runner: &Runner<'_>,
    env: Env<'_>,
    ifname: Option<&str>,
    args: &BatchDownArgs,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let prefix = args.common.prefix.as_str();
    let network = args.network.as_str();
    let template = setup::runtime_conf(env, &member_path(&member_name(prefix, 0)), ifname)?;
    template.validate()?;
    let (list, not_found) = match runner.load(network) {
        Ok(list) => (Some(list), None),
        Err(e @ (cni_core::Error::NetworkNotFound { .. } | cni_core::Error::NoConfigs { .. })) => {
            (None, Some(e))
        }
        Err(e) => return Err(e.into()),
    };

    // The batch's cached attachments of this network, by namespace.
    let mut targets: BTreeMap<(usize, String), Target> = BTreeMap::new();
    let records = &runner.cni.cached_attachments(None).await?;
    let mut cached = 0;
    for rec in records {
        let Some(name) = rec
            .netns
            .strip_prefix(NETNS_RUN_DIR)
            .and_then(|n| n.strip_prefix('/'))
        else {
            continue;
        };
        if rec.network_name != network
            || !is_member(prefix, name)
            || rec.container_id != setup::container_id(&rec.netns)
        {
            continue;
        }
        cached += 1;
        targets
            .entry(name_order(name))
            .or_insert_with(|| Target {
                name: name.to_owned(),
                netns: false,
                dels: Vec::new(),
            })
            .dels
            .push(rec.runtime_conf());
    }
    let names = existing_members(prefix)?;
    if let Some(e) = not_found
        && cached == 0
        && !names.is_empty()
    {
        // Nothing says these namespaces were attached to this network (a
        // typo?): leave them alone.
        return Err(anyhow::Error::new(e).context(format!(
            "{} network namespaces with prefix {prefix:?} exist ({}), but network {network:?} \
             has neither a configuration nor cached attachments in them",
            names.len(),
            list_names(&names)
        )));
    }
    for name in names {
        let target = targets.entry(name_order(&name)).or_insert_with(|| Target {
            name: name.clone(),
            netns: false,
            dels: Vec::new(),
        });
        target.netns = true;
        if target.dels.is_empty() && list.is_some() {
            // Not in the cache: DEL anyway (idempotent), as `cnitool del` would.
            target
                .dels
                .push(member_conf(&template, &member_path(&name)));
        }
    }
    let targets: Vec<Target> = targets.into_values().collect();

    let teardown = Teardown {
        cni: &runner.cni,
        config: match &list {
            Some(list) => Config::Current(list),
            None => Config::Cached(network),
        },
        opts: runner.call_options(),
    };
    let results = run_teardown(
        &teardown,
        &targets,
        concurrency(&args.common, targets.len()),
        args.common.quiet,
    )
    .await;

    let (mut detached, mut deleted) = (0, 0);
    let mut errors = Vec::new();
    let mut first: Option<(String, cni_async::Error)> = None;
    for (name, outcome) in results {
        detached += outcome.detached;
        deleted += usize::from(outcome.deleted);
        for e in outcome.errors {
            errors.push(json!({"namespace": name, "error": e.to_string()}));
            if first.is_none() {
                first = Some((name.clone(), e));
            }
        }
    }
    let summary = json!({
        "network": network,
        "prefix": prefix,
        "detached": detached,
        "deleted": deleted,
        "errors": errors,
        "elapsedMs": elapsed_ms(started),
    });
    report::print_stdout(&report::pretty_json(&summary))?;
    match first {
        None => Ok(()),
        Some((name, e)) => Err(ToolError::new(
            e.code(),
            format!(
                "{} error(s) tearing down the batch (see the summary on stdout; run it again \
                 to retry); the first, {name}: {e}",
                errors.len()
            ),
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_prefix_and_digits() {
        assert!(is_member("t-", "t-0"));
        assert!(is_member("t-", "t-123"));
        assert!(!is_member("t-", "t-"));
        assert!(!is_member("t-", "t-1a"));
        assert!(!is_member("t-", "tt-1"));
        assert!(!is_member("t-", "t-x-1"));
        let mut names = vec!["p10".to_owned(), "p2".into(), "p1".into()];
        names.sort_by_key(|n| name_order(n));
        assert_eq!(names, ["p1", "p2", "p10"]);
    }

    #[test]
    fn member_conf_derives_the_container_id_from_the_path() {
        let template = RuntimeConf::new("x", "/run/netns/p0", "eth1");
        let rt = member_conf(&template, "/run/netns/p7");
        assert_eq!(rt.container_id, setup::container_id("/run/netns/p7"));
        assert_eq!(rt.netns, "/run/netns/p7");
        assert_eq!(rt.ifname, "eth1");
    }

    #[test]
    fn long_name_lists_are_cut() {
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        assert_eq!(list_names(&names[..2]), "n0, n1");
        assert_eq!(list_names(&names), "n0, n1, n2, n3, n4 and 3 more");
    }
}
