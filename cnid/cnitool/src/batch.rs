//! `cnitool batch up|down <network>`: many network namespaces on one network
//! at once, for shell-based test harnesses. README.md ("`cnitool batch`")
//! is the user's reference: the summaries `up` and `down` print, the exit
//! statuses, signals, what a failed member leaves, the bridge's fixed MAC.
//!
//! `up` creates the named namespaces `PREFIX0` .. `PREFIX<N-1>` and attaches
//! each as `cnitool add NETWORK /run/netns/NAME` would (the container ID
//! derived from the path, `-i`, `CNI_ARGS`, `CAP_ARGS`, `CNI_TIMEOUT`), a
//! thin layer over the library's batch ([`cni_async::batch`]):
//! [`BatchBuilder`] with the container IDs derived from the paths
//! (`container_ids`), failed members undone at once (`release_failed`; a
//! namespace whose undo failed is kept for `down`), stopped by a signal
//! (`setup_until`, `teardown_until`), the attached members kept (`keep`).
//!
//! `down` DELs every cached attachment of the network in a namespace
//! `PREFIX<number>` whose container ID is the one derived from its path
//! (with the network's configuration, else the one cached at ADD), and a
//! namespace without one as `cnitool del` would; a namespace is deleted
//! once its DELs succeeded, so running `down` again retries with the same
//! inputs. Namespaces of the prefix in which the network has neither a
//! configuration nor cached attachments (a typo?) are refused and left.
//! It is a thin layer over the library's batch too: [`BatchBuilder::adopt`]
//! (a `MultiNetwork` without networks, `allow_empty`, when the network's
//! file is gone) and `teardown_until`.
//!
//! Progress goes to stderr ([`crate::progress`]); failures follow
//! [`crate::report`]'s contract, the summary printed on stdout first
//! whenever the batch ran.
//!
//! # Caveats
//!
//! - **SIGKILL** runs nothing: namespaces and attachments stay until
//!   `batch down` with the same network, prefix and `-i`.
//! - **The prefix owns its names.** `down` deletes every namespace
//!   `PREFIX<number>`, whoever made it; prefixes cannot end with a digit, so
//!   that `t` never claims `t1`'s `t10`.
//! - **Paths are `/run/netns/NAME`.** The container ID is derived from that
//!   exact string; `/var/run/netns/NAME` names another container.
//! - Runs the plugins in this process; there is no daemon variant.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cni_async::batch::{Batch, BatchBuilder, BatchEvent, BatchEventKind, TeardownEnd, name_list};
use cni_async::multi::{MultiNetwork, NetworkRequest, Sandbox};
use cni_async::netns::NETNS_RUN_DIR;
use cni_async::{CallOptions, Cni};
use cni_core::NetworkConfigList;
use cni_core::error::code;
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::backend::Local;
use crate::batch_cli::{BatchArgs, BatchCommand, BatchCommonArgs, BatchDownArgs, BatchUpArgs};
use crate::cli::GlobalArgs;
use crate::progress::Progress;
use crate::report::{self, ToolError};
use crate::setup::{self, Env};

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
    // Once, up front: every member would fail the same way.
    if let Err(e) = cni_async::netns::Netns::prepare_named() {
        let denied = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied);
        if denied {
            return Err(ToolError::new(
                code::IO_FAILURE,
                format!(
                    "cannot create network namespaces in {}: permission denied: `cnitool batch up` needs root (CAP_SYS_ADMIN)",
                    cni_async::netns::NETNS_RUN_DIR
                ),
            )
            .into());
        }
        return Err(e.into());
    }
    let taken = cni_async::batch::existing_namespaces(prefix)?;
    if !taken.is_empty() {
        return Err(ToolError::new(
            code::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "network namespaces with prefix {prefix:?} exist already ({}): run \
                 `cnitool batch down {} --prefix {prefix}` first, or choose another --prefix",
                name_list(&taken),
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
    let (members, failures) = up_members(&batch, &template.ifname, interrupted);
    if let Some(signal) = interrupted {
        // The partial summary: what had attached (and failed) when the
        // signal came; all of it is torn down now.
        let attached = members.iter().filter(|m| m["error"].is_null()).count();
        // The namespaces made so far: the attached ones and those being set
        // up (or failed and not undone). The summary and stderr give the
        // same counts.
        let made = batch.pending_teardown();
        let (error, torn_down) = undo_interrupted(
            batch,
            &network,
            prefix,
            &args.common,
            &progress,
            (signal, attached),
            &mut signals,
        )
        .await;
        let summary = json!({
            "network": network,
            "prefix": prefix,
            "attached": attached,
            "failed": members.len() - attached,
            "interrupted": signal,
            "namespacesMade": made,
            "tornDown": torn_down,
            "namespaces": members,
            "elapsedMs": elapsed_ms(started),
        });
        report::print_stdout(&report::pretty_json(&summary))?;
        return Err(error);
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
                    name_list(&names)
                ),
            )
            .into())
        }
    }
}

/// The summary entries of `up`'s members, and the failures (name, error,
/// code). After a signal, a member without an outcome was stopped.
#[allow(clippy::type_complexity)]
fn up_members(
    batch: &Batch,
    ifname: &str,
    interrupted: Option<&str>,
) -> (Vec<Value>, Vec<(String, String, u32)>) {
    let mut members = Vec::new();
    let mut failures: Vec<(String, String, u32)> = Vec::new();
    for m in batch.members() {
        let path = member_path(m.name());
        let (ips, error): (Vec<String>, Option<String>) = match (m.result(), m.error()) {
            (Some(result), _) => (
                result
                    .addresses(ifname)
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
                let text = cni_core::error::Chain(e).to_string();
                failures.push((m.name().to_owned(), text.clone(), e.code()));
                (Vec::new(), Some(text))
            }
            // Stopped by the signal before it attached.
            (None, None) if interrupted.is_some() => {
                let text = format!(
                    "stopped by {} before it attached",
                    interrupted.unwrap_or("")
                );
                failures.push((m.name().to_owned(), text.clone(), code::TRY_AGAIN_LATER));
                (Vec::new(), Some(text))
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
            "ifname": ifname,
            "ips": ips,
            "error": error,
        }));
    }
    (members, failures)
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

/// The exit status of a command stopped by `signal`: 128 + its number, as
/// a shell reports it (130 for SIGINT, 143 for SIGTERM).
fn signal_exit_status(signal: &str) -> u8 {
    match signal {
        "SIGTERM" => 128 + 15,
        _ => 128 + 2,
    }
}

/// After SIGINT/SIGTERM: tears down what `batch` set up so far; the error
/// to report (exit status 128 + the signal) and whether everything was
/// torn down. A second signal stops the teardown.
async fn undo_interrupted(
    batch: Batch,
    network: &str,
    prefix: &str,
    common: &BatchCommonArgs,
    progress: &Mutex<UpProgress>,
    (signal, attached): (&str, usize),
    signals: &mut Signals,
) -> (anyhow::Error, bool) {
    let total = batch.pending_teardown();
    // As the summary counts them: made, of which attached.
    let made = format!(
        "the {total} namespaces made so far ({attached} attached, {} not attached)",
        total.saturating_sub(attached)
    );
    if !common.quiet {
        report::write_stderr(&format!("batch up: {signal}: tearing down {made}\n"));
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
    let torn_down = matches!(outcome, Ok(TeardownEnd::Done));
    let msg = match outcome {
        Ok(TeardownEnd::Done) => {
            format!("batch up interrupted by {signal}; {made} were torn down")
        }
        Err(e) => format!(
            "batch up interrupted by {signal}; tearing down what it had set up failed \
             (run `cnitool batch down {network} --prefix {prefix}` again): {}",
            cni_core::error::Chain(&e)
        ),
        Ok(_) => format!(
            "batch up interrupted by {signal}, and its teardown by another signal: \
             run `cnitool batch down {network} --prefix {prefix}` to remove what is left"
        ),
    };
    let error = ToolError::new(code::TRY_AGAIN_LATER, msg)
        .with_exit_status(signal_exit_status(signal))
        .into();
    (error, torn_down)
}

// ----- down: the library's batch, adopted -----

/// The progress and outcomes of `down`, fed by the batch's events.
struct DownProgress {
    progress: Progress,
    ok: usize,
    failed: usize,
    /// Per member index: `None` when torn down, else the error and its code.
    outcomes: BTreeMap<usize, Option<(String, u32)>>,
}

impl DownProgress {
    fn on_event(&mut self, e: &BatchEvent<'_>) {
        match e.kind {
            BatchEventKind::Deleted => {
                self.ok += 1;
                self.outcomes.insert(e.index, None);
            }
            BatchEventKind::TeardownFailed => {
                self.failed += 1;
                let error = e.error.map_or_else(
                    || ("teardown failed".to_owned(), code::IO_FAILURE),
                    |e| {
                        // The summary names the namespace: its error without it.
                        let e = match e {
                            cni_async::Error::Context { source, .. } => source,
                            other => other,
                        };
                        (cni_core::error::Chain(e).to_string(), e.code())
                    },
                );
                self.outcomes.insert(e.index, Some(error));
            }
            _ => return,
        }
        self.progress.update(self.ok, self.failed);
    }
}

/// A namespace `down` works on.
struct DownMember {
    name: String,
    /// The DELs it gets: `{"network", "ifname", "cached"}`.
    dels: Vec<Value>,
    has_name: bool,
}

/// `batch down`: adopt the batch, plan each member's DELs, tear it down
/// (until a signal), then summarize.
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
    let progress = Arc::new(Mutex::new(None::<DownProgress>));
    let (batch, known) = adopt(runner, args, &template, progress.clone()).await?;
    if batch.members().is_empty() {
        // A typo in --prefix would otherwise leak the real batch silently.
        report::write_stderr(&format!(
            "batch down: nothing matches the prefix {prefix:?}: no network namespace \
             {NETNS_RUN_DIR}/{prefix}<number> and no cached attachment of network {network:?} \
             in one\n"
        ));
    }
    let members = plan_dels(runner, &batch, network, known.then_some(&template.ifname)).await;
    *lock(&progress) = Some(DownProgress {
        progress: Progress::new(
            "batch down",
            "torn down",
            "errors",
            members.len(),
            args.common.quiet,
        ),
        ok: 0,
        failed: 0,
        outcomes: BTreeMap::new(),
    });
    let mut signals = Signals::new();
    let mut interrupted = None;
    let outcome = batch
        .teardown_until(async { interrupted = Some(signals.recv().await) })
        .await;
    let Some(DownProgress {
        mut progress,
        outcomes,
        ..
    }) = lock(&progress).take()
    else {
        unreachable!("set above")
    };
    progress.end_line();
    if let (Some(signal), Ok(TeardownEnd::Stopped { left })) = (interrupted, &outcome) {
        return Err(ToolError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "batch down interrupted by {signal}; {} namespaces left ({}): run \
                 `cnitool batch down {network} --prefix {prefix}` again",
                left.len(),
                name_list(left)
            ),
        )
        .into());
    }
    report_down(network, prefix, members, &outcomes, outcome, started)
}

/// The library adopts the batch: the namespaces PREFIX<number> and the
/// cached attachments of the network in them (any interface, with their
/// cached arguments; the cached configuration when the network's file is
/// gone). A namespace not in the cache gets a DEL as `cnitool del` would
/// run it: -i/CNI_IFNAME, CNI_ARGS and CAP_ARGS (`template`). Also says
/// whether the network is known (its file loads).
async fn adopt(
    runner: &Runner<'_>,
    args: &BatchDownArgs,
    template: &cni_core::RuntimeConf,
    progress: Arc<Mutex<Option<DownProgress>>>,
) -> anyhow::Result<(Batch, bool)> {
    let network = args.network.as_str();
    let (list, not_found) = match runner.load(network) {
        Ok(list) => (Some(list), None),
        Err(e @ (cni_core::Error::NetworkNotFound { .. } | cni_core::Error::NoConfigs { .. })) => {
            (None, Some(e))
        }
        Err(e) => return Err(e.into()),
    };
    let known = list.is_some();
    let mut multi = MultiNetwork::builder(runner.cni.clone());
    multi = match list {
        Some(list) => multi.network_with_ifname(list, template.ifname.clone()),
        None => multi.allow_empty(),
    };
    if let Some(timeout) = runner.call_options().timeout {
        multi = multi.timeout(timeout);
    }
    let mut sandbox = Sandbox::new("", "")
        .with_ignore_unknown(false)
        .with_network(NetworkRequest::new(network).with_ifname(template.ifname.clone()));
    sandbox.labels = template.args.clone();
    sandbox.capability_args = template.capability_args.clone();
    let adopted = BatchBuilder::new(multi.build()?)
        .prefix(args.common.prefix.as_str())
        .concurrency(
            args.common
                .concurrency
                .map_or_else(default_concurrency, |c| c as usize),
        )
        .sandbox_template(sandbox)
        .container_ids(setup::container_id)
        .on_event(move |e| {
            if let Some(p) = lock(&progress).as_mut() {
                p.on_event(e);
            }
        })
        .adopt()
        .await;
    match (adopted, not_found) {
        (Ok(batch), _) => Ok((batch, known)),
        // Nothing ties these namespaces to this network (a typo?): leave
        // them alone, and say that the network is not found.
        (Err(e), Some(not_found)) => Err(anyhow::Error::new(not_found).context(e.to_string())),
        (Err(e), None) => Err(e.into()),
    }
}

/// Per member: its name, the DELs it gets, whether its name exists. A
/// member's teardown DELs NETWORK (from the cache, or as `cnitool del` runs
/// it, on `ifname`, when the cache has none and the network is known) and
/// every other cached attachment of its container (`MultiNetwork::remove`):
/// the summary names each with its network (`batch down cnirs-ptp` on a
/// `cnirs-bridge` batch detaches it from cnirs-bridge).
async fn plan_dels(
    runner: &Runner<'_>,
    batch: &Batch,
    network: &str,
    ifname: Option<&String>,
) -> Vec<DownMember> {
    let mut members: Vec<DownMember> = Vec::new();
    for m in batch.members() {
        let mut records = runner
            .cni
            .cached_attachments(Some(m.container_id()))
            .await
            .unwrap_or_default();
        records.extend(m.cached_attachments().iter().cloned());
        let mut seen = BTreeSet::new();
        records.retain(|r| seen.insert((r.network_name.clone(), r.if_name.clone())));
        let mut dels: Vec<Value> = Vec::new();
        if let Some(ifname) = ifname
            && !records.iter().any(|r| r.network_name == network)
        {
            dels.push(json!({"network": network, "ifname": ifname, "cached": false}));
        }
        // This network's first, then the others by name.
        records.sort_by_key(|r| (r.network_name != network, r.network_name.clone()));
        dels.extend(
            records
                .iter()
                .map(|r| json!({"network": r.network_name, "ifname": r.if_name, "cached": true})),
        );
        members.push(DownMember {
            name: m.name().to_owned(),
            dels,
            has_name: m.has_name(),
        });
    }
    members
}

/// Prints the summary of a teardown that ran to its end; the error names
/// the first failure.
fn report_down(
    network: &str,
    prefix: &str,
    members: Vec<DownMember>,
    outcomes: &BTreeMap<usize, Option<(String, u32)>>,
    outcome: Result<TeardownEnd, cni_async::Error>,
    started: Instant,
) -> anyhow::Result<()> {
    let (mut detached, mut deleted) = (0, 0);
    let mut errors = Vec::new();
    let mut namespaces = Vec::new();
    let mut first: Option<(String, String, u32)> = None;
    for (index, m) in members.into_iter().enumerate() {
        let DownMember {
            name,
            dels,
            has_name,
        } = m;
        match outcomes.get(&index) {
            Some(None) => {
                detached += dels.len();
                deleted += usize::from(has_name);
                namespaces.push(json!({
                    "namespace": name,
                    "detached": dels,
                    "deleted": has_name,
                }));
            }
            Some(Some((error, code))) => {
                errors.push(json!({"namespace": name, "error": error}));
                if first.is_none() {
                    first = Some((name, error.clone(), *code));
                }
            }
            None => {}
        }
    }
    if first.is_none()
        && let Err(e) = outcome
    {
        // Not reported by an event: a failure of the batch as a whole.
        errors.push(
            json!({"namespace": Value::Null, "error": cni_core::error::Chain(&e).to_string()}),
        );
        first = Some((
            prefix.to_owned(),
            cni_core::error::Chain(&e).to_string(),
            e.code(),
        ));
    }
    let summary = json!({
        "network": network,
        "prefix": prefix,
        "detached": detached,
        "deleted": deleted,
        "namespaces": namespaces,
        "errors": errors,
        "elapsedMs": elapsed_ms(started),
    });
    report::print_stdout(&report::pretty_json(&summary))?;
    match first {
        None => Ok(()),
        Some((name, e, code)) => Err(ToolError::new(
            code,
            format!(
                "{} error(s) tearing down the batch (see the summary on stdout; run it again \
                 to retry); the first, {name}: {e}",
                errors.len()
            ),
        )
        .into()),
    }
}
