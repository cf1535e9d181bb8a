//! Scenario 6 (`--only core`): the criterion micro-benchmarks of cni-core
//! (`cargo bench -p cni-core --bench core`), read back from criterion's
//! output dir (`target/criterion/<id>/new/sample.json`): per-iteration
//! time of every sample, so the table has the same median and p10–p90 as
//! the others.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use crate::Cx;
use crate::report::{Table, row, section as md};
use crate::stats::Summary;

/// The order the benchmarks are listed in (others follow, sorted).
const ORDER: [&str; 9] = [
    "conflist_parse_6_plugins",
    "stdin_build_one_plugin_with_prev_result",
    "result_parse_1_0_0",
    "result_convert_1_0_0_to_0_4_0",
    "result_convert_1_0_0_to_0_2_0",
    "result_to_value",
    "cache_record_encode",
    "cache_record_decode",
    "per_plugin_add_work",
];

/// One benchmark's `sample.json`: per-iteration time in seconds.
fn load_one(path: &Path) -> anyhow::Result<Summary> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let nums = |k: &str| -> anyhow::Result<Vec<f64>> {
        let all = v[k].as_array().context(k.to_owned())?.iter();
        Ok(all
            .filter_map(|x| x.as_f64().or_else(|| x.as_str()?.parse().ok()))
            .collect())
    };
    let (iters, times) = (nums("iters")?, nums("times")?);
    let per_iter: Vec<f64> = iters
        .iter()
        .zip(&times)
        .filter(|(i, _)| **i > 0.0)
        .map(|(i, t)| t / i * 1e-9)
        .collect();
    Ok(Summary::of(&per_iter))
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let dir = cx
        .args
        .criterion_dir
        .clone()
        .unwrap_or_else(|| crate::cli::Args::target_dir().join("criterion"));
    // Every benchmark found there: id, time, when written.
    let mut core: Vec<_> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let (e, rank) = (e.ok()?, |id: &str| {
                ORDER.iter().position(|o| *o == id).unwrap_or(ORDER.len())
            });
            let (id, sample) = (
                e.file_name().to_string_lossy().into_owned(),
                e.path().join("new/sample.json"),
            );
            let modified = std::fs::metadata(&sample).and_then(|m| m.modified()).ok();
            Some(((rank(&id), id), load_one(&sample).ok()?, modified))
        })
        .collect();
    core.sort_by(|a, b| a.0.cmp(&b.0));
    const TITLE: &str = "Scenario 6: cni-core micro-benchmarks";
    if core.is_empty() {
        let why = format!(
            "No criterion results in {} (run `cargo bench -p cni-core --bench core` first).",
            dir.display()
        );
        return Ok(Some(md(TITLE, &why, &[])));
    }
    let mut t = Table::new(
        "criterion, per iteration (samples' p10–p90)",
        "benchmark|µs, median (p10–p90)",
    );
    for ((_, id), time, _) in &core {
        cx.findings.put(format!("core/{id}"), *time);
        row!(t, format!("`{id}`"), time.fmt(1e6, 2));
    }
    let age = core
        .iter()
        .filter_map(|b| b.2)
        .max()
        .and_then(|m| m.elapsed().ok());
    let age = age.map_or("?".into(), |d| format!("{:.0} min", d.as_secs_f64() / 60.0));
    t.note(format!(
        "`per_plugin_add_work` is everything cni-core does for one plugin of an ADD chain: \
         build its stdin (6-plugin list, prevResult of 3 interfaces and 2 addresses), parse \
         its result, convert it, serialize it for the next plugin. Results from {}, {age} old.",
        dir.display()
    ));
    Ok(Some(md(TITLE, "", &[t])))
}
