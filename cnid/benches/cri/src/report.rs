//! The figures of the paired rounds as Markdown tables: ratios (each way
//! ÷ direct, and paced ÷ unpaced cnid when both ran) as the median
//! (min–max) of the repetitions, the absolute medians, and the CPU per
//! pod.

use std::fmt::Write;

use crate::round::{Half, Round, Way};

/// The `q` quantile of sorted `v`, linear between neighbours.
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// "median (min–max)", or the one value.
fn spread(v: Vec<f64>, digits: usize) -> String {
    let v = sorted(v);
    let m = quantile(&v, 0.5);
    if v.len() == 1 {
        return format!("{m:.digits$}");
    }
    format!(
        "{m:.digits$} ({:.digits$}–{:.digits$})",
        v[0],
        v[v.len() - 1]
    )
}

/// p50, p95 and total (wall) of a half, seconds.
fn figures(h: &Half) -> [f64; 3] {
    [quantile(&h.calls, 0.5), quantile(&h.calls, 0.95), h.wall]
}

/// The pairs of ways compared: each against direct, and paced against
/// unpaced cnid when both ran (indices into `ways`).
fn comparisons(ways: &[Way]) -> Vec<(usize, usize)> {
    let at = |w| ways.iter().position(|&x| x == w);
    let mut v: Vec<(usize, usize)> = (1..ways.len()).map(|i| (i, 0)).collect();
    if let (Some(p), Some(c)) = (at(Way::Paced), at(Way::Cnid)) {
        v.push((p, c));
    }
    v
}

/// `results`: per concurrency, per repetition, one round per way in
/// `ways`' order (direct first).
pub(crate) fn markdown(
    version: &str,
    n: usize,
    ways: &[Way],
    results: &[(usize, Vec<Vec<Round>>)],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{version}; {n} sandboxes per round.\n\n\
         | ratio, median (min–max) of the repetitions | reps | load | run p50 | run p95 | run total | stop+remove p50 | stop+remove p95 | stop+remove total |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for (c, reps) in results {
        let loads = sorted(
            reps.iter()
                .flatten()
                .flat_map(|r| [r.load.0, r.load.1])
                .collect(),
        );
        for (a, b) in comparisons(ways) {
            let mut cols: Vec<Vec<f64>> = vec![Vec::new(); 6];
            for r in reps {
                let (fa, fb) = (figures(&r[a].run), figures(&r[b].run));
                let (ga, gb) = (figures(&r[a].remove), figures(&r[b].remove));
                for i in 0..3 {
                    cols[i].push(fa[i] / fb[i]);
                    cols[3 + i].push(ga[i] / gb[i]);
                }
            }
            let _ = write!(
                s,
                "| {} ÷ {}, concurrency {c} | {} | {:.0}–{:.0} |",
                ways[a].label(),
                ways[b].label(),
                reps.len(),
                loads.first().unwrap_or(&f64::NAN),
                loads.last().unwrap_or(&f64::NAN)
            );
            for col in cols {
                let _ = write!(s, " {} |", spread(col, 2));
            }
            s.push('\n');
        }
    }
    let _ = writeln!(
        s,
        "\nAbsolute, ms, median of the repetitions (p50 / p95 / total):\n\n\
         | concurrency, way | run | stop+remove |\n\
         |---|---|---|"
    );
    for (c, reps) in results {
        for (w, way) in ways.iter().enumerate() {
            let abs = |pick: &dyn Fn(&Round) -> &Half| {
                let f: Vec<[f64; 3]> = reps.iter().map(|r| figures(pick(&r[w]))).collect();
                (0..3)
                    .map(|i| {
                        format!(
                            "{:.0}",
                            quantile(&sorted(f.iter().map(|x| x[i] * 1e3).collect()), 0.5)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let _ = writeln!(
                s,
                "| {c}, {} | {} | {} |",
                way.label(),
                abs(&|r| &r.run),
                abs(&|r| &r.remove)
            );
        }
    }
    let _ = writeln!(
        s,
        "\nCPU per pod, ms (user + system), median of the repetitions:\n\n\
         | concurrency, way, verb | containerd itself | containerd's children (CNI plugins) | cnid itself | cnid's children (the chain) | all |\n\
         |---|---|---|---|---|---|"
    );
    for (c, reps) in results {
        for verb in ["run", "stop+remove"] {
            for (w, way) in ways.iter().enumerate() {
                let half = |r: &Vec<Round>| -> Half {
                    if verb == "run" {
                        r[w].run.clone()
                    } else {
                        r[w].remove.clone()
                    }
                };
                let med = |f: &dyn Fn(&Half) -> f64| {
                    quantile(
                        &sorted(reps.iter().map(|r| f(&half(r)) * 1e3 / n as f64).collect()),
                        0.5,
                    )
                };
                let a = med(&|h| h.containerd.own);
                let b = med(&|h| h.containerd.children);
                let (cs, cc) = (med(&|h| h.cnid.own), med(&|h| h.cnid.children));
                let all = med(&|h| {
                    h.containerd.own + h.containerd.children + h.cnid.own + h.cnid.children
                });
                let _ = writeln!(
                    s,
                    "| {c}, {}, {verb} | {a:.2} | {b:.2} | {cs:.2} | {cc:.2} | {all:.2} |",
                    way.label()
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_neighbours() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn each_way_is_compared_with_direct_and_paced_with_unpaced() {
        assert_eq!(comparisons(&[Way::Direct, Way::Cnid]), [(1, 0)]);
        assert_eq!(
            comparisons(&[Way::Direct, Way::Cnid, Way::Paced]),
            [(1, 0), (2, 0), (2, 1)]
        );
    }

    #[test]
    fn a_spread_is_median_min_max() {
        assert_eq!(spread(vec![1.2, 0.9, 1.0], 2), "1.00 (0.90–1.20)");
        assert_eq!(spread(vec![1.0], 2), "1.00");
    }
}
