//! Scenario 7 (`--only shim`): what `cnid-shim` costs.
//!
//! - **Added to a request.** The same ADD, CHECK and DEL of the noop ×1
//!   network sent straight to cnid (a fresh connection with the shim's own
//!   blocking client, and the answer parsed: what a runtime that spoke
//!   cnid's API would do) and through `cnid-shim` spawned as a runtime
//!   spawns a plugin (posix_spawn, stdin, stdout to EOF, wait4). Per
//!   iteration and verb the two go in alternating order and the difference
//!   is taken pairwise; p50 and p99 of it are the figures.
//! - **Start-up.** The runtime execs the shim once per pod and call: exec of
//!   `cnid-shim` with `CNI_COMMAND=VERSION` (answered by the shim itself, no
//!   daemon) against exec of an empty static C program (`empty.c`, built as
//!   `cni-empty-c` like the C noop), spawn to reap, in paired rotation.
//! - **Peak RSS** of the shim's ADD (GNU time).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cnid::api::AttachmentRequest;
use cnid::shim::http;
use serde_json::json;

use crate::Cx;
use crate::chains::{NOOP_NETNS, VERBS};
use crate::procs::peak_rss_kib;
use crate::report::{Table, row, section as md};
use crate::setup::{Daemon, NOOP1, Storage};
use crate::spawn::{Env, Exit, Prepared, env_set, rotate};
use crate::stats::{Summary, diffs, p50_and, q, secs};

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let shim = cx.bins.shim.clone();
    // tmpfs: the fsyncs are the same both ways and only add noise.
    let daemon = Daemon::start(&cx.bins.cnid, &cx.tree, Storage::Tmpfs, "shim", &[])?;
    let conf = json!({"cniVersion": "1.0.0", "name": NOOP1, "type": "cnid-shim", "socket": daemon.socket, "timeout": "60s"});
    let input = serde_json::to_vec(&conf)?;
    let (warmup, n) = (cx.n(2, 5) * 4, cx.n(30, 300));
    let [direct, through] =
        measure(&shim, &daemon.socket, &input, warmup, n).map_err(|e| daemon.ctx(e))?;
    let title =
        "cnid-shim against the same request sent straight to cnid (noop ×1, cache on tmpfs)";
    let header = "verb|direct ms, p50 (p99)|through cnid-shim ms, p50 (p99)|added ms, p50 (p99)";
    let mut t = Table::new(title, header);
    for (v, verb) in VERBS.iter().enumerate() {
        let added = diffs(&through[v], &direct[v]);
        cx.findings
            .put(format!("shim/{verb}/added"), Summary::of(&added));
        cx.findings.put(
            format!("shim/{verb}/added-p99"),
            Summary::of(&[q(&added, 0.99)]),
        );
        row!(
            t,
            verb,
            p50_and(&direct[v], 0.99),
            p50_and(&through[v], 0.99),
            p50_and(&added, 0.99)
        );
    }
    // Peak RSS of the shim's ADD (each followed by a DEL).
    let mut rss = Vec::new();
    for i in 0..cx.n(3, 15) {
        let run = |verb| {
            peak_rss_kib(
                &shim,
                &[],
                &env(verb, &format!("shim-rss{i}")),
                Some(&input),
                cx.tree.root(),
            )
        };
        rss.push(run("ADD")?);
        run("DEL")?;
    }
    cx.findings.put("rss/shim/add", Summary::of(&rss));
    let r = Summary::min_max(&rss);
    t.note(format!(
        "{} iterations; per iteration and verb the direct request and the shim run in \
         alternating order, and \"added\" is their difference in that iteration. Direct: a \
         fresh connection with the shim's own blocking client, the answer parsed. Shim: \
         spawned as the floor spawns plugins ({}). Peak RSS of the shim's ADD: {:.0} KiB \
         (min–max of {} runs {:.0}–{:.0}; GNU time).",
        direct[0].len(),
        shim.display(),
        r.median,
        rss.len(),
        r.p10,
        r.p90,
    ));
    let mut tables = vec![t];
    match cx.bins.empty_c.clone() {
        Some(empty) => tables.push(startup(cx, &shim, &empty)?),
        None => drop(cx.skip("cnid-shim's start-up against a static C program (no cni-empty-c)")),
    }
    Ok(Some(md(
        "Scenario 7: cnid-shim",
        "What the CNI plugin that hands a runtime's calls to cnid adds to the same request sent \
         straight to cnid, and what its start-up costs against a static C program's.",
        &tables,
    )))
}

/// The shim's start-up (VERSION) against the empty static C program's.
fn startup(cx: &mut Cx, shim: &Path, empty: &Path) -> anyhow::Result<Table> {
    let env = env("VERSION", "shim-version");
    let progs = [
        Prepared::new(shim, &[], &env, "cnid-shim VERSION")?,
        Prepared::new(empty, &[], &env, "empty static C program")?,
    ];
    let ok = |r, e: &Exit, out: &[u8]| e.success() && (r > 0 || !out.is_empty());
    let t = rotate(
        &progs,
        br#"{"cniVersion":"1.0.0"}"#,
        cx.n(50, 400),
        "cnid-shim start-up",
        ok,
    )?;
    let diff = diffs(&t[0][0], &t[1][0]);
    let title = "cnid-shim start-up against an empty static C program";
    let mut table = Table::new(
        title,
        "program|spawn to reap ms, p50 (p90)|− empty C program ms, p50 (p90)",
    );
    row!(
        table,
        "cnid-shim, CNI_COMMAND=VERSION",
        p50_and(&t[0][0], 0.9),
        p50_and(&diff, 0.9)
    );
    row!(table, "empty static C program", p50_and(&t[1][0], 0.9), "–");
    table.note(format!(
        "{} rotating pairs after 20 of warm-up, both spawned as the floor spawns plugins \
         (the shim's VERSION is answered without cnid); the difference is per pair. {} ({}).",
        diff.len(),
        shim.display(),
        crate::report::linkage(shim),
    ));
    Ok(table)
}

/// The shim's environment for one call.
fn env(verb: &str, container: &str) -> Env {
    let ids = [
        ("CNI_COMMAND", verb),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", NOOP_NETNS),
    ];
    env_set(
        &[
            &ids[..],
            &[
                ("CNI_IFNAME", "eth0"),
                ("CNI_ARGS", ""),
                ("CNI_PATH", "/nonexistent"),
            ],
        ]
        .concat(),
    )
}

/// The request the shim sends, straight to cnid: a fresh connection with
/// the shim's own client, the answer parsed.
fn direct(socket: &Path, verb: &str, container: &str) -> anyhow::Result<()> {
    // eth1: the direct and the shim attachment of an iteration are made
    // side by side in the one placeholder netns, and cnid refuses a second
    // container's ADD on a (netns, ifname) already owned.
    let mut req = AttachmentRequest::new(container, NOOP_NETNS, "eth1");
    req.timeout_ms = Some(60_000);
    let (body, path) = (
        serde_json::to_vec(&req)?,
        format!("/v1/networks/{NOOP1}/{}", verb.to_ascii_lowercase()),
    );
    let deadlines = (Duration::from_secs(90), Duration::from_secs(60));
    let ans = http::request(
        socket,
        "POST",
        &path,
        &[("x-request-id", "bench-direct")],
        Some(&body),
        deadlines,
    )?;
    if !(200..300).contains(&ans.status) {
        bail!(
            "direct {verb}: HTTP {}: {}",
            ans.status,
            String::from_utf8_lossy(&ans.body)
        );
    }
    if verb == "ADD" {
        let _: serde_json::Value = serde_json::from_slice(&ans.body)?;
    }
    Ok(())
}

/// `warmup + iterations` iterations of ADD, CHECK, DEL both ways: per verb,
/// the direct request's times and the shim's, seconds, paired.
fn measure(
    shim: &Path,
    socket: &Path,
    input: &[u8],
    warmup: usize,
    n: usize,
) -> anyhow::Result<[[Vec<f64>; 3]; 2]> {
    let (mut s, mut out): ([[Vec<f64>; 3]; 2], _) = Default::default();
    let started = Instant::now();
    for i in 0..warmup + n {
        let (cd, cs) = (format!("shim-d{i}"), format!("shim-s{i}"));
        for (v, verb) in VERBS.iter().enumerate() {
            let call = Prepared::new(shim, &[], &env(verb, &cs), format!("cnid-shim {verb}"))?;
            let mut t = [0.0; 2];
            for half in 0..2 {
                let st = Instant::now();
                if (i + v + half) % 2 == 0 {
                    direct(socket, verb, &cd).with_context(|| format!("iteration {i}"))?;
                    t[0] = secs(st);
                } else {
                    t[1] = call.run_ok(&[input], &mut out)?.0;
                }
            }
            if i >= warmup {
                s[0][v].push(t[0]);
                s[1][v].push(t[1]);
            }
        }
    }
    eprintln!(
        "overhead: cnid-shim: {n} iterations in {:.1} s",
        secs(started)
    );
    Ok(s)
}
