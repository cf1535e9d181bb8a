//! Scenario 7: what `cnid-shim` adds to a request. The same ADD, CHECK
//! and DEL of the noop ×1 network sent straight to cnid (a fresh
//! connection with the shim's own blocking client, and the answer parsed:
//! what a runtime that spoke cnid's API would do) and through `cnid-shim`
//! spawned as a runtime spawns a plugin (posix_spawn, stdin, stdout to EOF,
//! wait4). Per iteration the two go in alternating order and the
//! difference is taken pairwise; p50 and p99 of it are the figures. And the
//! shim's peak RSS for one ADD.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cnid::api::AttachmentRequest;
use cnid::shim::http;
use serde_json::json;

use crate::chains::NOOP_NETNS;
use crate::memory::peak_rss_kib;
use crate::spawn::{Prepared, env_with};
use crate::stats::quantile;

pub(crate) const VERBS: [&str; 3] = ["ADD", "CHECK", "DEL"];

/// Per verb: the direct request's times and the shim's, seconds, paired.
pub(crate) struct ShimSamples {
    pub(crate) direct: [Vec<f64>; 3],
    pub(crate) shim: [Vec<f64>; 3],
}

impl ShimSamples {
    /// Shim minus direct, per iteration.
    pub(crate) fn added(&self, v: usize) -> Vec<f64> {
        self.shim[v]
            .iter()
            .zip(&self.direct[v])
            .map(|(s, d)| s - d)
            .collect()
    }
}

/// p50 and p99 of a sample.
pub(crate) fn p50_p99(data: &[f64]) -> (f64, f64) {
    let mut v = data.to_vec();
    v.sort_by(f64::total_cmp);
    (quantile(&v, 0.5), quantile(&v, 0.99))
}

fn stdin(network: &str, socket: &Path) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "cniVersion": "1.0.0", "name": network, "type": "cnid-shim",
        "socket": socket, "timeout": "60s"
    }))
    .expect("JSON")
}

fn shim_call(shim: &Path, verb: &str, container: &str) -> anyhow::Result<Prepared> {
    let env = env_with(&[
        ("CNI_COMMAND", Some(OsStr::new(verb))),
        ("CNI_CONTAINERID", Some(OsStr::new(container))),
        ("CNI_NETNS", Some(OsStr::new(NOOP_NETNS))),
        ("CNI_IFNAME", Some(OsStr::new("eth0"))),
        ("CNI_ARGS", Some(OsStr::new(""))),
        ("CNI_PATH", Some(OsStr::new("/nonexistent"))),
    ]);
    Ok(Prepared::new(shim, &[], &env, format!("cnid-shim {verb}"))?)
}

fn direct(socket: &Path, network: &str, verb: &str, container: &str) -> anyhow::Result<()> {
    // eth1: the direct and the shim attachment of an iteration are made
    // side by side in the one placeholder netns, and cnid refuses a second
    // container's ADD on a (netns, ifname) already owned.
    let mut req = AttachmentRequest::new(container, NOOP_NETNS, "eth1");
    req.timeout_ms = Some(60_000);
    let body = serde_json::to_vec(&req)?;
    let path = format!("/v1/networks/{network}/{}", verb.to_ascii_lowercase());
    let ans = http::request(
        socket,
        "POST",
        &path,
        &[("x-request-id", "bench-direct")],
        Some(&body),
        (Duration::from_secs(90), Duration::from_secs(60)),
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

/// `warmup + iterations` iterations of ADD, CHECK, DEL both ways.
pub(crate) fn measure(
    shim: &Path,
    socket: &Path,
    network: &str,
    warmup: usize,
    iterations: usize,
) -> anyhow::Result<ShimSamples> {
    let input = stdin(network, socket);
    let mut s = ShimSamples {
        direct: Default::default(),
        shim: Default::default(),
    };
    let mut out = Vec::new();
    let started = Instant::now();
    for i in 0..warmup + iterations {
        let (cd, cs) = (format!("shim-d{i}"), format!("shim-s{i}"));
        for (v, verb) in VERBS.iter().enumerate() {
            let call = shim_call(shim, verb, &cs)?;
            let (mut td, mut ts) = (0.0, 0.0);
            for half in 0..2 {
                if (i + v + half) % 2 == 0 {
                    let t = Instant::now();
                    direct(socket, network, verb, &cd).with_context(|| format!("iteration {i}"))?;
                    td = t.elapsed().as_secs_f64();
                } else {
                    out.clear();
                    let t = Instant::now();
                    let exit = call.run(&[&input], &mut out)?;
                    ts = t.elapsed().as_secs_f64();
                    if !exit.success() {
                        bail!(
                            "cnid-shim {verb} failed ({}): {}",
                            exit.describe(),
                            String::from_utf8_lossy(&out)
                        );
                    }
                }
            }
            if i >= warmup {
                s.direct[v].push(td);
                s.shim[v].push(ts);
            }
        }
    }
    eprintln!(
        "overhead: cnid-shim: {iterations} iterations in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(s)
}

/// Peak RSS samples (KiB) of the shim's ADD (each followed by a DEL).
pub(crate) fn rss(
    shim: &Path,
    socket: &Path,
    network: &str,
    scratch: &Path,
    runs: usize,
) -> anyhow::Result<Vec<f64>> {
    let input = stdin(network, socket);
    let mut v = Vec::new();
    for i in 0..runs {
        let c = format!("shim-rss{i}");
        let env = |verb: &str| {
            env_with(&[
                ("CNI_COMMAND", Some(OsStr::new(verb))),
                ("CNI_CONTAINERID", Some(OsStr::new(&c))),
                ("CNI_NETNS", Some(OsStr::new(NOOP_NETNS))),
                ("CNI_IFNAME", Some(OsStr::new("eth0"))),
            ])
        };
        v.push(peak_rss_kib(shim, &[], &env("ADD"), Some(&input), scratch)? as f64);
        peak_rss_kib(shim, &[], &env("DEL"), Some(&input), scratch)?;
    }
    Ok(v)
}
