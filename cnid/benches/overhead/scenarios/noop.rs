//! Scenarios 1–3 (`--only noop`): noop chains of 1 and 8 plugins run by the
//! floor, in-process (`cni_async::Cni`), by `cnitool` as a process, through
//! `cnid`, by the floor as a process (the static C driver) and by Go's
//! cnitool, cache on disk and on tmpfs; the same with the static C noop as
//! the plugin (floor, cnitool, Go's cnitool, the C driver); and the tools'
//! start-up, for the table against Go's cnitool.

use std::path::Path;

use cnid::client::Client;

use crate::Cx;
use crate::chains::{self, GO_CNITOOL, NOOP_NETNS, On, VERBS};
use crate::report::{Findings, Table, row, section as md};
use crate::setup::{C_NOOP, Daemon, NOOP1, NOOP8, Storage, Tree};
use crate::spawn::{Prepared, env_with, rotate};
use crate::stats::Summary;

const INTRO: &str = "Each iteration: ADD, CHECK, DEL of one attachment by the floor, by \
`cni_async::Cni` in this process (current-thread runtime; cache I/O on tokio's blocking pool, \
the default, and inline on the calling thread, `ResultCache::with_inline_io`, as cnitool runs \
it; and with the plugins started by `tokio::process` instead of our own spawn, \
`RawExec::with_posix_spawn`), by `cnitool` as a process, and through `cnid` (typed client, one \
kept-alive connection), in shuffled order. `× floor` and `added ms` are per iteration against \
the floor of the same iteration. The floor has no CHECK-specific work; a runtime's CHECK reads \
the cache, its ADD writes it (temp file, fsync, rename, fsync of the dir) and its DEL removes \
it (no fsync: a resurrected record only costs a repeat DEL); cnid instead appends a `begin` \
line to its journal before the plugins and a `commit` line carrying the record after them, \
each fdatasync'd, and writes the cache record without fsync (crash safety and durability with \
two flushes). The tmpfs rows run the same code with the cache (and cnid's state dir) on tmpfs, \
where fsync is free.";

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let go = cx.go.clone();
    if let Some(go) = &go {
        startup(cx, go)?;
    }
    // With the static C noop as the plugin (the cheapest plugin process
    // there is) only the floor, cnitool, Go's cnitool and the C driver run,
    // cache on disk; and only when Go's cnitool built.
    let c_noop = cx.bins.noop_variants.iter().find(|(l, _)| *l == C_NOOP);
    let ctree = go
        .as_ref()
        .and(c_noop)
        .map(|(_, c)| Tree::new(c))
        .transpose()?;
    // (tree, storage, every runtime or the tools only, key prefix, title)
    let mut rows = vec![
        (&cx.tree, Storage::Disk, true, "", "noop"),
        (&cx.tree, Storage::Tmpfs, true, "", "noop"),
    ];
    rows.extend(
        ctree
            .iter()
            .map(|t| (t, Storage::Disk, false, "c", "C noop (static)")),
    );
    let mut tables = Vec::new();
    let title =
        "The plugins' spawn: our own (`clone3`, pidfd) against `tokio::process`, same iterations";
    let header = "chain, cache|ADD+DEL, own ÷ tokio::process, per iteration, median (p10–p90)|own − tokio::process, ms per plugin run, median (p10–p90)";
    let mut spawn = Table::new(title, header);
    let sizes = [
        (NOOP1, "noop1", cx.n(20, 150)),
        (NOOP8, "noop8", cx.n(10, 80)),
    ];
    for (tree, storage, all, prefix, what) in rows {
        let daemon = all
            .then(|| Daemon::start(&cx.bins.cnid, tree, storage, storage.short(), &[]))
            .transpose()?;
        let client = daemon
            .as_ref()
            .map(|d| cx.tokio.block_on(Client::connect(&d.socket)))
            .transpose()?;
        for (network, size, iterations) in sizes {
            let tag = format!("{prefix}{size}");
            let list = tree.load(network)?;
            let on = On(&list, NOOP_NETNS, tree, storage);
            let mut runners = vec![on.floor()?];
            if all {
                runners.extend([
                    on.in_process(false, false),
                    on.in_process(true, false),
                    on.in_process(false, true),
                ]);
            }
            runners.push(on.cnitool("cnitool", &cx.bins.cnitool)?);
            runners.extend(client.clone().map(|c| on.cnid("cnid", "bench-cnid", c)));
            let dir = tree.cache(storage).with_file_name(format!("driver-{tag}"));
            let driver = cx.bins.driver.as_ref().map(|d| on.driver(d, &dir));
            let go = go.as_ref().map(|go| on.cnitool(GO_CNITOOL, go));
            // The tables' order of rows: the C driver last with the C noop.
            let tail = if all { [driver, go] } else { [go, driver] };
            for r in tail.into_iter().flatten() {
                runners.push(r?);
            }
            let label = format!("{tag}, {}", storage.label());
            let s = chains::run_loop(&mut runners, &cx.tokio, cx.n(2, 5), iterations, &label);
            let s = s.map_err(|e| match &daemon {
                Some(d) => d.ctx(e),
                None => e,
            })?;
            let title = format!("{what} ×{}, {}", list.plugins().len(), storage.label());
            if all {
                // Runners 1 and 3: in process on tokio's pool, with our
                // spawn and with `tokio::process`; 2 plugin runs per
                // plugin in an ADD+DEL.
                let (own, tokio) = (s.series(1, "ADD+DEL"), s.series(3, "ADD+DEL"));
                let runs = 2.0 * list.plugins().len() as f64;
                let per_run: Vec<f64> = own
                    .iter()
                    .zip(&tokio)
                    .map(|(a, b)| (a - b) / runs)
                    .collect();
                row!(
                    spawn,
                    &title,
                    Summary::ratios(&own, &tokio).ratio(),
                    Summary::of(&per_run).ms()
                );
            }
            let key = format!("{tag}/{}", storage.short());
            tables.push(chains::tabulate(&s, &title, &key, &mut cx.findings));
        }
    }
    spawn.note(
        "The in-process runner on tokio's blocking pool, once with `RawExec`'s own spawn (the \
         default) and once with `RawExec::with_posix_spawn` (`tokio::process`), in the same \
         shuffled iterations: the ratio and the difference are per iteration.",
    );
    tables.push(spawn);
    let s = md(
        "Scenarios 1–3: noop chains (in-process, cnitool, cnid)",
        INTRO,
        &tables,
    );
    Ok(Some(if go.is_some() {
        format!("{s}\n{}", go_section(&cx.findings))
    } else {
        s
    }))
}

/// Tool start-up without arguments (each prints its usage and exits):
/// `/bin/true`, our cnitool and Go's, spawned as the floor spawns plugins,
/// in rotating order, after 20 of warm-up.
fn startup(cx: &mut Cx, go: &Path) -> anyhow::Result<()> {
    let (env, tools) = (
        env_with(&[]),
        [Path::new("/bin/true"), &cx.bins.cnitool, go],
    );
    let progs = tools
        .iter()
        .zip(["/bin/true", "cnitool", GO_CNITOOL])
        .map(|(p, l)| Prepared::new(p, &[], &env, l));
    // Both tools exit non-zero after printing their usage.
    let t = rotate(
        &progs.collect::<Result<Vec<_>, _>>()?,
        &[],
        cx.n(50, 400),
        "start-up",
        |_, _, _| true,
    )?;
    for (k, key) in ["true", "cnitool", "go"].iter().enumerate() {
        cx.findings
            .put(format!("startup/{key}/wall"), Summary::of(&t[k][0]));
    }
    cx.findings.put(
        "startup/go-over-cnitool/ratio",
        Summary::ratios(&t[2][0], &t[1][0]),
    );
    Ok(())
}

/// The table against Go's cnitool, from what the start-up run and the noop
/// loops recorded.
fn go_section(f: &Findings) -> String {
    let title = "cnitool against Go's cnitool (libcni), same run";
    let header = "step|cnitool ms, median (p10–p90)|Go cnitool ms, median (p10–p90)|Go / ours, per-iteration ratio, median (p10–p90)";
    let mut t = Table::new(title, header);
    let mut add = |what: String, ours: &str, go: &str, ratio: &str| {
        if let (Some(o), Some(g), Some(r)) = (f.get(ours), f.get(go), f.get(ratio)) {
            row!(t, what, o.ms(), g.ms(), r.ratio());
        }
    };
    let what = "tool start-up, no arguments".into();
    add(
        what,
        "startup/cnitool/wall",
        "startup/go/wall",
        "startup/go-over-cnitool/ratio",
    );
    for s in ["disk", "tmpfs"] {
        let sizes = [
            ("noop1", "noop ×1"),
            ("noop8", "noop ×8"),
            ("cnoop1", "C noop ×1"),
            ("cnoop8", "C noop ×8"),
        ];
        for (tag, what) in sizes {
            for verb in VERBS {
                let k = |x: &str, y: &str| format!("{tag}/{s}/{x}/{verb}/{y}");
                let what = format!("{verb}, {what}, cache on {s}");
                add(
                    what,
                    &k("cnitool", "time"),
                    &k(GO_CNITOOL, "time"),
                    &k("go-over-cnitool", "ratio"),
                );
            }
        }
    }
    if let Some(s) = f.get("startup/true/wall") {
        t.note(format!(
            "`/bin/true` in the start-up run: {} ms. Both tools run with the same environment, \
             conf dir and plugin dir (CNI_PATH, NETCONFPATH, CNI_CACHE_DIR; Go's cache in its own \
             dir), the netns path `{NOOP_NETNS}`, in the same shuffled loops as the floor and the \
             other runners (SCHED_FIFO when root).",
            s.ms()
        ));
    }
    md(
        "Against Go's cnitool",
        "Go's side: `cnid/tests/go/cnitool`, a cnitool on Go's libcni with the reference tool's \
         interface (Debian ships libcni's source in golang-github-appc-cni-dev but not the \
         reference `cnitool/` dir), built with `GO111MODULE=off GOPATH=/usr/share/gocode \
         CGO_ENABLED=0 go build`.",
        &[t],
    )
}
