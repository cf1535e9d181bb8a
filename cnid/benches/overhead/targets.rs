//! The targets, judged on the default configuration (cache on disk, fsync
//! on) from the figures the scenarios recorded; the fsync-free figure and
//! other context are in the notes. A target whose scenario did not run
//! reads "not measured".

use crate::report::{Findings, Table, row};
use crate::scenarios::scale::{ADMISSION_GOAL_MS, LARGEST, READY_GOAL_S, RSS_GOAL_MIB};
use crate::stats::Summary;

/// Notes from the figures present, joined by "; ".
fn notes(parts: impl IntoIterator<Item = Option<String>>) -> String {
    parts.into_iter().flatten().collect::<Vec<_>>().join("; ")
}

/// `+N% over` when the median is above `limit`.
fn over(s: Summary, limit: f64) -> Option<String> {
    (s.median > limit).then(|| format!("{:+.0}% over", (s.median / limit - 1.0) * 100.0))
}

/// One target's row: what, the limit, the figure with its spread as
/// shown, whether the median is within the limit, notes.
fn put(
    t: &mut Table,
    what: &str,
    limit: &str,
    m: Option<String>,
    met: Option<bool>,
    comment: String,
) {
    let verdict = met.map_or("–", |m| if m { "**met**" } else { "**missed**" });
    row!(
        t,
        what,
        limit,
        m.unwrap_or_else(|| "not measured".into()),
        verdict,
        comment
    );
}

/// A ratio over the floor, disk and tmpfs (`{s}` in `key`), with `more`
/// notes.
fn ratio(t: &mut Table, f: &Findings, what: &str, key: &str, limit: f64, more: Option<String>) {
    let disk = f.get(&key.replace("{s}", "disk"));
    let tmpfs = f
        .get(&key.replace("{s}", "tmpfs"))
        .map(|s| format!("fsync free (tmpfs): {}", s.ratio()));
    let comment = notes([
        disk.and_then(|d| over(d, limit))
            .filter(|_| tmpfs.is_some()),
        tmpfs,
        more,
    ]);
    let met = disk.map(|s| s.median <= limit);
    put(
        t,
        what,
        &format!("≤ {limit:.2}x"),
        disk.map(|s| s.ratio()),
        met,
        comment,
    );
}

pub(crate) fn table(f: &Findings) -> Table {
    let mut table = Table::new(
        "Targets",
        "target|limit|measured, median (p10–p90)|verdict|notes",
    );
    let t = &mut table;
    let get = |k: &str| f.get(k);
    let note = |label: &str, k: &str| get(k).map(|s| format!("{label}: {}", s.ratio()));
    let kib = |s: Summary| format!("{:.0} KiB ({:.0}–{:.0})", s.median, s.p10, s.p90);
    let mib = |s: Summary| format!("{:.1} MiB", s.median / 1024.0);
    let ms = |s: Summary| format!("{} ms", s.ms());
    let (own, sides) = (
        get("own/noop-true/wall"),
        get("own/noop/wall").zip(get("own/true/wall")),
    );
    let sides = sides.map(|(n, t)| {
        format!(
            "cni-noop {} ms, /bin/true {} ms spawn to reap",
            n.ms(),
            t.ms()
        )
    });
    let what = "cni-noop's own run (spawn to reap, minus /bin/true's)";
    put(
        t,
        what,
        "well under 0.5 ms",
        own.map(ms),
        own.map(|s| s.median < 0.25e-3),
        sides.unwrap_or_default(),
    );
    ratio(
        t,
        f,
        "in-process noop ×8 ADD+DEL",
        "noop8/{s}/in-process/ADD+DEL/ratio",
        1.05,
        None,
    );
    let core = get("core/per_plugin_add_work");
    let what = "cni-core work per plugin (parse, build, convert)";
    let core_us = core.map(|s| format!("{} µs", s.fmt(1e6, 2)));
    put(
        t,
        what,
        "< 20 µs",
        core_us,
        core.map(|s| s.median < 20e-6),
        "criterion `per_plugin_add_work`".into(),
    );
    // cnitool over the floor as a process (the static C driver, a process
    // as cnitool is); without it (no C compiler), over the in-process
    // floor, which has no process to start.
    for (size, limit) in [(1, 2.5), (8, 1.8)] {
        let k = |x: &str, s: &str, r: &str| format!("{x}noop{size}/{s}/{r}/ADD/ratio");
        let what = format!("cnitool noop ×{size} ADD");
        let c_noop = note("C noop", &k("c", "disk", "cnitool"));
        let Some(disk) = get(&k("", "disk", "cnitool-over-driver")) else {
            ratio(t, f, &what, &k("", "{s}", "cnitool"), limit, c_noop);
            continue;
        };
        let comment = notes([
            over(disk, limit),
            note("fsync free (tmpfs)", &k("", "tmpfs", "cnitool-over-driver")),
            note("C noop", &k("c", "disk", "cnitool-over-driver")),
            note("× the in-process floor", &k("", "disk", "cnitool")),
        ]);
        let (what, met) = (format!("{what} ÷ C driver"), Some(disk.median <= limit));
        put(
            t,
            &what,
            &format!("≤ {limit:.2}x"),
            Some(disk.ratio()),
            met,
            comment,
        );
    }
    // Go's cnitool over ours, per iteration of the same loop; the bound is
    // Go's over the floor as a process, which caches nothing.
    for size in [1, 8] {
        let k = |x: &str, s: &str, r: &str| format!("{x}noop{size}/{s}/{r}/ADD/ratio");
        let disk = get(&k("", "disk", "go-over-cnitool"));
        let comment = notes([
            note("fsync free (tmpfs)", &k("", "tmpfs", "go-over-cnitool")),
            note("C noop", &k("c", "disk", "go-over-cnitool")),
            note("bound (Go ÷ C driver)", &k("", "disk", "go-over-driver")),
            note("tmpfs bound", &k("", "tmpfs", "go-over-driver")),
        ]);
        let what = format!("Go's cnitool / ours, noop ×{size} ADD");
        put(
            t,
            &what,
            "≥ 2.0x",
            disk.map(|s| s.ratio()),
            disk.map(|s| s.median >= 2.0),
            comment,
        );
    }
    ratio(
        t,
        f,
        "cnitool real chain ADD",
        "real/{s}/cnitool/ADD/ratio",
        1.1,
        None,
    );
    let rss = get("rss/cnitool/add1");
    let mb = rss.map(|s| {
        format!(
            "{:.2} MiB = {:.2} MB",
            s.median / 1024.0,
            s.median * 1.024 / 1000.0
        )
    });
    let what = "cnitool peak RSS, one ADD (noop ×1)";
    put(
        t,
        what,
        "< 4 MiB (4096 KiB)",
        rss.map(kib),
        rss.map(|s| s.median < 4096.0),
        mb.unwrap_or_default(),
    );
    for (verb, limit) in [("ADD", 0.5e-3), ("CHECK", 0.3e-3), ("DEL", 0.3e-3)] {
        let d = get(&format!("noop1/disk/cnid-inproc/{verb}/added"));
        let tm = get(&format!("noop1/tmpfs/cnid-inproc/{verb}/added"));
        let what = format!("cnid round trip over in-process, noop ×1 {verb}");
        let tmpfs = tm.map(|s| format!("fsync free (tmpfs): {} ms", s.ms()));
        let limit_ms = format!("≤ +{:.2} ms median", limit * 1e3);
        put(
            t,
            &what,
            &limit_ms,
            d.map(ms),
            d.map(|s| s.median <= limit),
            tmpfs.unwrap_or_default(),
        );
    }
    let verbs = crate::chains::VERBS;
    let shim: Option<Vec<(f64, f64)>> = verbs
        .iter()
        .map(|v| {
            Some((
                get(&format!("shim/{v}/added"))?.median,
                get(&format!("shim/{v}/added-p99"))?.median,
            ))
        })
        .collect();
    let list = |pick: fn(&(f64, f64)) -> f64, d: usize| {
        let each = |s: &Vec<(f64, f64)>| {
            let all = verbs
                .iter()
                .zip(s)
                .map(|(v, x)| format!("{v} {:.d$}", pick(x) * 1e3));
            all.collect::<Vec<_>>().join(", ") + " ms"
        };
        shim.as_ref().map(each)
    };
    let what = "cnid-shim: added to the same request sent straight to cnid (ADD, CHECK, DEL)";
    let met = shim.as_ref().map(|s| s.iter().all(|x| x.0 <= 1e-3));
    let p99 = list(|x| x.1, 2).map(|p| format!("p99: {p}"));
    put(
        t,
        what,
        "≤ 1 ms p50",
        list(|x| x.0, 3),
        met,
        p99.unwrap_or_default(),
    );
    let srss = get("rss/shim/add");
    put(
        t,
        "cnid-shim peak RSS, one ADD",
        "< 4 MiB (4096 KiB)",
        srss.map(kib),
        srss.map(|s| s.median < 4096.0),
        "".into(),
    );
    let idle = get("rss/cnid/mem64/idle_warm");
    let fresh = get("rss/cnid/mem64/idle_fresh").map(|s| format!("{} right after start", mib(s)));
    let what = "cnid RSS idle (after 100 requests)";
    put(
        t,
        what,
        "< 10 MiB",
        idle.map(mib),
        idle.map(|s| s.median < 10.0 * 1024.0),
        fresh.unwrap_or_default(),
    );
    let hwm = get("rss/cnid/mem64/hwm");
    let all = get("rss/cnid/mem1000/hwm")
        .map(|s| format!("with --max-parallel 1000 (all running at once): {}", mib(s)));
    let what = "cnid RSS with 1,000 ADDs in flight (peak)";
    put(
        t,
        what,
        "< 40 MiB",
        hwm.map(mib),
        hwm.map(|s| s.median < 40.0 * 1024.0),
        all.unwrap_or_default(),
    );
    let b = get("batch/c4/disk/runtime/ratio");
    let per_ns = get("batch/c4/disk/runtime/total").zip(get("batch/c4/disk/floor/total"));
    let per_ns = per_ns.map(|(r, fl)| {
        format!(
            "{:.2} ms vs floor {:.2} ms per namespace",
            r.median * 1e3,
            fl.median * 1e3
        )
    });
    let tmpfs = get("batch/c4/tmpfs/runtime/ratio");
    let tmpfs = tmpfs.map(|t| {
        format!(
            "fsync free (tmpfs): {:.2}x (min {:.2}, max {:.2})",
            t.median, t.p10, t.p90
        )
    });
    let measured = b.map(|s| {
        format!(
            "{:.2}x (min {:.2}, max {:.2} of {} runs)",
            s.median, s.p10, s.p90, s.n
        )
    });
    let what = "batch, concurrency 4, time per namespace";
    put(
        t,
        what,
        "≤ 1.10x floor",
        measured,
        b.map(|s| s.median <= 1.10),
        notes([per_ns, tmpfs]),
    );
    let at = |what: &str| get(&format!("scale/{what}/{LARGEST}"));
    let ms0 = |s: Summary| format!("{:.0} ms", s.median * 1e3);
    let (ready, cache) = (
        at("ready"),
        at("ready_cache").map(|s| format!("from the cache alone: {}", ms0(s))),
    );
    let what = "cnid with 10,000 attachments (cache and journal): start to ready";
    let limit = format!("≤ {READY_GOAL_S} s");
    put(
        t,
        what,
        &limit,
        ready.map(ms0),
        ready.map(|s| s.median <= READY_GOAL_S),
        cache.unwrap_or_default(),
    );
    let rss = at("rss");
    let what = "cnid with 10,000 attachments: RSS idle";
    let limit = format!("≤ {RSS_GOAL_MIB} MiB");
    let mib1 = rss.map(|s| format!("{:.1} MiB", s.median));
    put(
        t,
        what,
        &limit,
        mib1,
        rss.map(|s| s.median <= RSS_GOAL_MIB),
        "".into(),
    );
    // Measured by cnid itself (`cnid_admission_duration_seconds`), at
    // every size: the goal is for any.
    let sizes = [0, 1000, LARGEST].map(|n| (n, get(&format!("scale/admission/{n}"))));
    let worst = sizes
        .iter()
        .filter_map(|(_, s)| s.map(|s| s.median))
        .reduce(f64::max);
    let mut comment: Vec<_> = sizes
        .iter()
        .map(|(n, s)| s.map(|s| format!("at {n}: {:.3} ms", s.median * 1e3)))
        .collect();
    let within = at("admission_within")
        .map(|w| format!("{:.0}% within the goal at {LARGEST}", w.median * 100.0));
    let cpu = at("cpu_over_zero");
    let cpu = cpu.map(|c| {
        format!(
            "cnid CPU per ADD+DEL over the empty cache {:+.3} ms",
            c.median * 1e3
        )
    });
    comment.extend([within, cpu]);
    let adm = at("admission").map(|s| format!("{:.3} ms", s.median * 1e3));
    let what = "cnid with 10,000 attachments: admission of an ADD (mean, cnid's own histogram)";
    let limit = format!("≤ {ADMISSION_GOAL_MS} ms at any size");
    put(
        t,
        what,
        &limit,
        adm,
        worst.map(|w| w <= ADMISSION_GOAL_MS * 1e-3),
        notes(comment),
    );
    table
}
