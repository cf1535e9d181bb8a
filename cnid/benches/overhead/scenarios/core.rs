//! Scenario 6 (`--only core`): the criterion micro-benchmarks of cni-core
//! (`cargo bench -p cni-core --bench core`), read back from criterion's
//! output dir (`target/criterion/<id>/new/sample.json`): per-iteration
//! time of every sample, so the table has the same median and p10–p90 as
//! the others.

use std::path::Path;
use std::time::SystemTime;

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

/// One benchmark: per-iteration time in seconds.
struct CoreBench {
    id: String,
    time: Summary,
    modified: Option<SystemTime>,
}

fn load_one(dir: &Path) -> anyhow::Result<Summary> {
    let path = dir.join("new").join("sample.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let num = |x: &Value| x.as_f64().or_else(|| x.as_str()?.parse().ok());
    let iters: Vec<f64> = v["iters"]
        .as_array()
        .context("iters")?
        .iter()
        .filter_map(num)
        .collect();
    let times: Vec<f64> = v["times"]
        .as_array()
        .context("times")?
        .iter()
        .filter_map(num)
        .collect();
    let per_iter: Vec<f64> = iters
        .iter()
        .zip(&times)
        .filter(|(i, _)| **i > 0.0)
        .map(|(i, t)| t / i * 1e-9)
        .collect();
    Ok(Summary::of(&per_iter))
}

/// Every benchmark found under `criterion_dir`.
fn load(criterion_dir: &Path) -> Vec<CoreBench> {
    let Ok(entries) = std::fs::read_dir(criterion_dir) else {
        return Vec::new();
    };
    let mut out: Vec<CoreBench> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("new").join("sample.json").is_file())
        .filter_map(|e| {
            let id = e.file_name().to_string_lossy().into_owned();
            let time = load_one(&e.path()).ok()?;
            let modified = std::fs::metadata(e.path().join("new").join("sample.json"))
                .and_then(|m| m.modified())
                .ok();
            Some(CoreBench { id, time, modified })
        })
        .collect();
    let rank = |id: &str| ORDER.iter().position(|o| *o == id).unwrap_or(ORDER.len());
    out.sort_by(|a, b| rank(&a.id).cmp(&rank(&b.id)).then(a.id.cmp(&b.id)));
    out
}

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let dir = cx
        .args
        .criterion_dir
        .clone()
        .unwrap_or_else(|| crate::cli::Args::target_dir().join("criterion"));
    let core = load(&dir);
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
        &["benchmark", "µs, median (p10–p90)"],
    );
    for b in &core {
        cx.findings.put(format!("core/{}", b.id), b.time);
        row!(t, format!("`{}`", b.id), b.time.fmt(1e6, 2));
    }
    let newest = core.iter().filter_map(|b| b.modified).max();
    let age = newest
        .and_then(|m| m.elapsed().ok())
        .map_or("?".into(), |d| format!("{:.0} min", d.as_secs_f64() / 60.0));
    t.note(format!(
        "`per_plugin_add_work` is everything cni-core does for one plugin of an ADD chain: \
         build its stdin (6-plugin list, prevResult of 3 interfaces and 2 addresses), parse \
         its result, convert it, serialize it for the next plugin. Results from {}, {age} old.",
        dir.display()
    ));
    Ok(Some(md(TITLE, "", &[t])))
}
