//! The figures of the paired rounds as Markdown tables: ratios (via cnid
//! ÷ direct) as the median (min–max) of the repetitions, the absolute
//! medians, and the CPU per pod.

use std::fmt::Write;

use crate::round::{Half, Round};

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

pub(crate) fn markdown(
    version: &str,
    n: usize,
    results: &[(usize, Vec<(Round, Round)>)],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{version}; {n} sandboxes per round.\n\n\
         | via cnid ÷ direct, median (min–max) of the repetitions | reps | load | run p50 | run p95 | run total | stop+remove p50 | stop+remove p95 | stop+remove total |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for (c, pairs) in results {
        let mut cols: Vec<Vec<f64>> = vec![Vec::new(); 6];
        let mut loads = Vec::new();
        for (d, v) in pairs {
            let (fd, fv) = (figures(&d.run), figures(&v.run));
            let (gd, gv) = (figures(&d.remove), figures(&v.remove));
            for i in 0..3 {
                cols[i].push(fv[i] / fd[i]);
                cols[3 + i].push(gv[i] / gd[i]);
            }
            loads.extend([d.load.0, d.load.1, v.load.0, v.load.1]);
        }
        let loads = sorted(loads);
        let _ = write!(
            s,
            "| concurrency {c} | {} | {:.0}–{:.0} |",
            pairs.len(),
            loads.first().unwrap_or(&f64::NAN),
            loads.last().unwrap_or(&f64::NAN)
        );
        for col in cols {
            let _ = write!(s, " {} |", spread(col, 2));
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "\nAbsolute, ms, median of the repetitions (run p50 / p95 / total; stop+remove p50 / p95 / total):\n\n\
         | concurrency | direct run | via cnid run | direct stop+remove | via cnid stop+remove |\n\
         |---|---|---|---|---|"
    );
    for (c, pairs) in results {
        let abs = |pick: &dyn Fn(&(Round, Round)) -> &Half| {
            let f: Vec<[f64; 3]> = pairs.iter().map(|p| figures(pick(p))).collect();
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
            "| {c} | {} | {} | {} | {} |",
            abs(&|p| &p.0.run),
            abs(&|p| &p.1.run),
            abs(&|p| &p.0.remove),
            abs(&|p| &p.1.remove)
        );
    }
    let _ = writeln!(
        s,
        "\nCPU per pod, ms (user + system), median of the repetitions:\n\n\
         | concurrency, way, verb | containerd itself | containerd's children (CNI plugins) | cnid itself | cnid's children (the chain) | all |\n\
         |---|---|---|---|---|---|"
    );
    for (c, pairs) in results {
        for (way, verb) in [
            ("direct", "run"),
            ("via cnid", "run"),
            ("direct", "stop+remove"),
            ("via cnid", "stop+remove"),
        ] {
            let pick = |p: &(Round, Round)| -> Half {
                let r = if way == "direct" { &p.0 } else { &p.1 };
                if verb == "run" {
                    r.run.clone()
                } else {
                    r.remove.clone()
                }
            };
            let med = |f: &dyn Fn(&Half) -> f64| {
                quantile(
                    &sorted(pairs.iter().map(|p| f(&pick(p)) * 1e3 / n as f64).collect()),
                    0.5,
                )
            };
            let a = med(&|h| h.containerd.own);
            let b = med(&|h| h.containerd.children);
            let (cs, cc) = (med(&|h| h.cnid.own), med(&|h| h.cnid.children));
            let all =
                med(&|h| h.containerd.own + h.containerd.children + h.cnid.own + h.cnid.children);
            let _ = writeln!(
                s,
                "| {c}, {way}, {verb} | {a:.2} | {b:.2} | {cs:.2} | {cc:.2} | {all:.2} |"
            );
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
    fn a_spread_is_median_min_max() {
        assert_eq!(spread(vec![1.2, 0.9, 1.0], 2), "1.00 (0.90–1.20)");
        assert_eq!(spread(vec![1.0], 2), "1.00");
    }
}
