//! Medians and spreads, and the paired loop every latency scenario runs:
//! each round runs every program once, in a rotating or shuffled order, so
//! each follows every other equally often (what one leaves behind, such as
//! the kernel's deferred veth teardown, falls on whoever comes next), and
//! figures are taken per round (ratios and differences of the same round).

use std::time::Instant;

use anyhow::Context;

/// The `q` quantile of sorted data, linearly interpolated.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, hi) = (sorted[pos.floor() as usize], sorted[pos.ceil() as usize]);
            lo + (hi - lo) * pos.fract()
        }
    }
}

/// Median, 10th and 90th percentile of a sample.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Summary {
    pub(crate) median: f64,
    pub(crate) p10: f64,
    pub(crate) p90: f64,
    pub(crate) n: usize,
}

impl Summary {
    pub(crate) fn of(data: &[f64]) -> Summary {
        let mut v: Vec<f64> = data.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let q = |p| quantile(&v, p);
        Summary {
            median: q(0.5),
            p10: q(0.1),
            p90: q(0.9),
            n: v.len(),
        }
    }

    /// Median, and the smallest and largest value in place of p10 and p90
    /// (for a handful of runs).
    pub(crate) fn min_max(data: &[f64]) -> Summary {
        let s = Summary::of(data);
        let v = data.iter().filter(|x| x.is_finite());
        let (p10, p90) = v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(*x), b.max(*x))
        });
        Summary { p10, p90, ..s }
    }

    /// Per-pair ratios `a[i] / b[i]`.
    pub(crate) fn ratios(a: &[f64], b: &[f64]) -> Summary {
        Summary::of(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
    }

    /// Per-pair differences `a[i] - b[i]`.
    pub(crate) fn diffs(a: &[f64], b: &[f64]) -> Summary {
        Summary::of(&diffs(a, b))
    }

    /// `median (p10–p90)` with values multiplied by `scale`.
    pub(crate) fn fmt(&self, scale: f64, d: usize) -> String {
        let (m, lo, hi) = (self.median * scale, self.p10 * scale, self.p90 * scale);
        format!("{m:.d$} ({lo:.d$}–{hi:.d$})")
    }

    /// Milliseconds, from seconds.
    pub(crate) fn ms(&self) -> String {
        self.fmt(1e3, if self.median.abs() >= 0.1 { 2 } else { 3 })
    }

    /// A ratio: `1.23x (1.10–1.40)`.
    pub(crate) fn ratio(&self) -> String {
        format!("{:.2}x ({:.2}–{:.2})", self.median, self.p10, self.p90)
    }
}

/// Per-pair differences `a[i] - b[i]`.
pub(crate) fn diffs(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}

/// The `p`-quantile of a sample.
pub(crate) fn q(data: &[f64], p: f64) -> f64 {
    let mut v = data.to_vec();
    v.sort_by(f64::total_cmp);
    quantile(&v, p)
}

/// `p50 (pQ)` of a sample in seconds, as milliseconds.
pub(crate) fn p50_and(data: &[f64], p: f64) -> String {
    format!("{:.3} ({:.3})", q(data, 0.5) * 1e3, q(data, p) * 1e3)
}

/// How a round orders the programs: round `i` starts at program `i % k`
/// (`Rotate`), or a Fisher–Yates shuffle per round (fixed seed).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Order {
    Rotate,
    Shuffle,
}

/// Runs `warmup + n` rounds of programs `0..k`; `run(r, i)` runs program
/// `r` in round `i`. Returns what each program's runs after the warm-up
/// returned, `[program][round]`.
pub(crate) fn rounds<T>(
    (k, warmup, n): (usize, usize, usize),
    order: Order,
    label: &str,
    mut run: impl FnMut(usize, usize) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = (0..k).map(|_| Vec::with_capacity(n)).collect();
    let (mut seq, mut rng): (Vec<usize>, u64) = ((0..k).collect(), 0x9e37_79b9_7f4a_7c15);
    let started = Instant::now();
    for i in 0..warmup + n {
        match order {
            Order::Rotate => seq = (0..k).map(|j| (i + j) % k).collect(),
            Order::Shuffle => {
                for j in (1..k).rev() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    seq.swap(j, (rng % (j as u64 + 1)) as usize);
                }
            }
        }
        for &r in &seq {
            let t = run(r, i).with_context(|| format!("{label} (iteration {i})"))?;
            if i >= warmup {
                out[r].push(t);
            }
        }
    }
    eprintln!(
        "overhead: {label}: {n} iterations in {:.1} s",
        secs(started)
    );
    Ok(out)
}

/// Seconds since `t`.
pub(crate) fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// A check of the arithmetic above, run by `cargo test` (which runs this
/// benchmark binary without `--bench`).
pub(crate) fn self_check() -> Result<(), String> {
    let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]);
    let ok = s.median == 3.0
        && s.n == 5
        && (s.p10 - 1.4).abs() < 1e-9
        && (s.p90 - 4.6).abs() < 1e-9
        && Summary::ratios(&[2.0, 3.0], &[1.0, 1.0]).median == 2.5
        && Summary::diffs(&[2.0, 3.0], &[1.0, 1.0]).median == 1.5
        && Summary::of(&[]).median.is_nan();
    ok.then_some(())
        .ok_or(format!("stats self-check failed: {s:?}"))
}
