//! The targets, judged on the default configuration (cache on disk, fsync
//! on) from the figures the scenarios recorded; the fsync-free figure and
//! other context are in the notes. A target whose scenario did not run
//! reads "not measured".

use crate::report::{Findings, Target};
use crate::scenarios::scale::{ADMISSION_GOAL_MS, LARGEST, READY_GOAL_S, RSS_GOAL_MIB};
use crate::stats::Summary;

fn target(
    what: impl Into<String>,
    limit: impl Into<String>,
    m: Option<String>,
    met: Option<bool>,
    c: String,
) -> Target {
    Target {
        what: what.into(),
        limit: limit.into(),
        measured: m,
        met,
        comment: c,
    }
}

/// Notes from the figures present: `label: figure`, joined by "; ".
fn notes(parts: impl IntoIterator<Item = Option<String>>) -> String {
    parts.into_iter().flatten().collect::<Vec<_>>().join("; ")
}

pub(crate) fn targets(f: &Findings) -> Vec<Target> {
    let get = |k: &str| f.get(k);
    let note = |label: &str, k: &str| get(k).map(|s| format!("{label}: {}", s.ratio()));
    let kib = |s: Summary| format!("{:.0} KiB ({:.0}–{:.0})", s.median, s.p10, s.p90);
    let mib = |s: Summary| format!("{:.1} MiB", s.median / 1024.0);
    // A ratio over the floor, disk and tmpfs (`{s}` in `key`).
    let ratio_target = |what: String, key: &str, limit: f64| {
        let (disk, tmpfs) = (
            get(&key.replace("{s}", "disk")),
            get(&key.replace("{s}", "tmpfs")),
        );
        let over = disk
            .filter(|d| d.median > limit)
            .map(|d| format!("{:+.0}% over", (d.median / limit - 1.0) * 100.0));
        let tmpfs = tmpfs.map(|t| format!("fsync free (tmpfs): {}", t.ratio()));
        let comment = notes([over.filter(|_| tmpfs.is_some()), tmpfs]);
        target(
            what,
            format!("≤ {limit:.2}x"),
            disk.map(|s| s.ratio()),
            disk.map(|s| s.median <= limit),
            comment,
        )
    };
    let mut v = Vec::new();
    let own = get("own/noop-true/wall");
    let sides = get("own/noop/wall").zip(get("own/true/wall"));
    v.push(target(
        "cni-noop's own run (spawn to reap, minus /bin/true's)",
        "well under 0.5 ms",
        own.map(|s| format!("{} ms", s.ms())),
        own.map(|s| s.median < 0.25e-3),
        sides
            .map(|(n, t)| {
                format!(
                    "cni-noop {} ms, /bin/true {} ms spawn to reap",
                    n.ms(),
                    t.ms()
                )
            })
            .unwrap_or_default(),
    ));
    v.push(ratio_target(
        "in-process noop ×8 ADD+DEL".into(),
        "noop8/{s}/in-process/ADD+DEL/ratio",
        1.05,
    ));
    let core = get("core/per_plugin_add_work");
    v.push(target(
        "cni-core work per plugin (parse, build, convert)",
        "< 20 µs",
        core.map(|s| format!("{} µs", s.fmt(1e6, 2))),
        core.map(|s| s.median < 20e-6),
        "criterion `per_plugin_add_work`".into(),
    ));
    // cnitool over the floor as a process (the static C driver, a process
    // as cnitool is); without it (no C compiler), over the in-process
    // floor, which has no process to start.
    for (size, limit) in [(1, 2.5), (8, 1.8)] {
        let (tag, in_process) = (format!("noop{size}"), format!("cnitool noop ×{size} ADD"));
        let k = |s: &str, x: &str| format!("{s}/{x}/ADD/ratio");
        let c_noop = note("C noop", &k(&format!("c{tag}/disk"), "cnitool"));
        let Some(disk) = get(&k(&format!("{tag}/disk"), "cnitool-over-driver")) else {
            let mut t = ratio_target(in_process, &k(&format!("{tag}/{{s}}"), "cnitool"), limit);
            t.comment = notes([Some(t.comment).filter(|c| !c.is_empty()), c_noop]);
            v.push(t);
            continue;
        };
        let comment = notes([
            (disk.median > limit)
                .then(|| format!("{:+.0}% over", (disk.median / limit - 1.0) * 100.0)),
            note(
                "fsync free (tmpfs)",
                &k(&format!("{tag}/tmpfs"), "cnitool-over-driver"),
            ),
            note("C noop", &k(&format!("c{tag}/disk"), "cnitool-over-driver")),
            note(
                "× the in-process floor",
                &k(&format!("{tag}/disk"), "cnitool"),
            ),
        ]);
        v.push(target(
            format!("{in_process} ÷ C driver"),
            format!("≤ {limit:.2}x"),
            Some(disk.ratio()),
            Some(disk.median <= limit),
            comment,
        ));
    }
    // Go's cnitool over ours, per iteration of the same loop; the bound is
    // Go's over the floor as a process, which caches nothing.
    for size in [1, 8] {
        let tag = format!("noop{size}");
        let disk = get(&format!("{tag}/disk/go-over-cnitool/ADD/ratio"));
        let comment = notes([
            note(
                "fsync free (tmpfs)",
                &format!("{tag}/tmpfs/go-over-cnitool/ADD/ratio"),
            ),
            note("C noop", &format!("c{tag}/disk/go-over-cnitool/ADD/ratio")),
            note(
                "bound (Go ÷ C driver)",
                &format!("{tag}/disk/go-over-driver/ADD/ratio"),
            ),
            note(
                "tmpfs bound",
                &format!("{tag}/tmpfs/go-over-driver/ADD/ratio"),
            ),
        ]);
        v.push(target(
            format!("Go's cnitool / ours, noop ×{size} ADD"),
            "≥ 2.0x",
            disk.map(|s| s.ratio()),
            disk.map(|s| s.median >= 2.0),
            comment,
        ));
    }
    v.push(ratio_target(
        "cnitool real chain ADD".into(),
        "real/{s}/cnitool/ADD/ratio",
        1.1,
    ));
    let rss = get("rss/cnitool/add1");
    v.push(target(
        "cnitool peak RSS, one ADD (noop ×1)",
        "< 4 MiB (4096 KiB)",
        rss.map(kib),
        rss.map(|s| s.median < 4096.0),
        rss.map(|s| {
            format!(
                "{:.2} MiB = {:.2} MB",
                s.median / 1024.0,
                s.median * 1.024 / 1000.0
            )
        })
        .unwrap_or_default(),
    ));
    for (verb, limit) in [("ADD", 0.5e-3), ("CHECK", 0.3e-3), ("DEL", 0.3e-3)] {
        let d = get(&format!("noop1/disk/cnid-inproc/{verb}/added"));
        let t = get(&format!("noop1/tmpfs/cnid-inproc/{verb}/added"));
        v.push(target(
            format!("cnid round trip over in-process, noop ×1 {verb}"),
            format!("≤ +{:.2} ms median", limit * 1e3),
            d.map(|s| format!("{} ms", s.ms())),
            d.map(|s| s.median <= limit),
            t.map(|s| format!("fsync free (tmpfs): {} ms", s.ms()))
                .unwrap_or_default(),
        ));
    }
    let shim: Option<Vec<(&str, Summary, Summary)>> = ["ADD", "CHECK", "DEL"]
        .into_iter()
        .map(|v| {
            Some((
                v,
                get(&format!("shim/{v}/added"))?,
                get(&format!("shim/{v}/added-p99"))?,
            ))
        })
        .collect();
    let list = |pick: fn(&(&str, Summary, Summary)) -> f64, d: usize| {
        shim.as_ref().map(|s| {
            let each: Vec<String> = s
                .iter()
                .map(|x| format!("{} {:.d$}", x.0, pick(x) * 1e3))
                .collect();
            each.join(", ") + " ms"
        })
    };
    v.push(target(
        "cnid-shim: added to the same request sent straight to cnid (ADD, CHECK, DEL)",
        "≤ 1 ms p50",
        list(|x| x.1.median, 3),
        shim.as_ref().map(|s| s.iter().all(|x| x.1.median <= 1e-3)),
        list(|x| x.2.median, 2)
            .map(|p| format!("p99: {p}"))
            .unwrap_or_default(),
    ));
    let srss = get("rss/shim/add");
    v.push(target(
        "cnid-shim peak RSS, one ADD",
        "< 4 MiB (4096 KiB)",
        srss.map(kib),
        srss.map(|s| s.median < 4096.0),
        String::new(),
    ));
    let idle = get("rss/cnid/mem64/idle_warm");
    v.push(target(
        "cnid RSS idle (after 100 requests)",
        "< 10 MiB",
        idle.map(mib),
        idle.map(|s| s.median < 10.0 * 1024.0),
        get("rss/cnid/mem64/idle_fresh")
            .map(|s| format!("{} right after start", mib(s)))
            .unwrap_or_default(),
    ));
    let hwm = get("rss/cnid/mem64/hwm");
    v.push(target(
        "cnid RSS with 1,000 ADDs in flight (peak)",
        "< 40 MiB",
        hwm.map(mib),
        hwm.map(|s| s.median < 40.0 * 1024.0),
        get("rss/cnid/mem1000/hwm")
            .map(|s| format!("with --max-parallel 1000 (all running at once): {}", mib(s)))
            .unwrap_or_default(),
    ));
    let b = get("batch/c4/disk/runtime/ratio");
    let per_ns = get("batch/c4/disk/runtime/total").zip(get("batch/c4/disk/floor/total"));
    let comment = notes([
        per_ns.map(|(r, fl)| {
            format!(
                "{:.2} ms vs floor {:.2} ms per namespace",
                r.median * 1e3,
                fl.median * 1e3
            )
        }),
        get("batch/c4/tmpfs/runtime/ratio").map(|t| {
            format!(
                "fsync free (tmpfs): {:.2}x (min {:.2}, max {:.2})",
                t.median, t.p10, t.p90
            )
        }),
    ]);
    v.push(target(
        "batch, concurrency 4, time per namespace",
        "≤ 1.10x floor",
        b.map(|s| {
            format!(
                "{:.2}x (min {:.2}, max {:.2} of {} runs)",
                s.median, s.p10, s.p90, s.n
            )
        }),
        b.map(|s| s.median <= 1.10),
        comment,
    ));
    let at = |what: &str| get(&format!("scale/{what}/{LARGEST}"));
    let ready = at("ready");
    v.push(target(
        "cnid with 10,000 attachments (cache and journal): start to ready",
        format!("≤ {READY_GOAL_S} s"),
        ready.map(|s| format!("{:.0} ms", s.median * 1e3)),
        ready.map(|s| s.median <= READY_GOAL_S),
        at("ready_cache")
            .map(|s| format!("from the cache alone: {:.0} ms", s.median * 1e3))
            .unwrap_or_default(),
    ));
    let rss = at("rss");
    v.push(target(
        "cnid with 10,000 attachments: RSS idle",
        format!("≤ {RSS_GOAL_MIB} MiB"),
        rss.map(|s| format!("{:.1} MiB", s.median)),
        rss.map(|s| s.median <= RSS_GOAL_MIB),
        String::new(),
    ));
    // Measured by cnid itself (`cnid_admission_duration_seconds`), at
    // every size: the goal is for any.
    let sizes = [0, 1000, LARGEST].map(|n| (n, get(&format!("scale/admission/{n}"))));
    let worst = sizes
        .iter()
        .filter_map(|(_, s)| s.map(|s| s.median))
        .reduce(f64::max);
    let mut comment: Vec<Option<String>> = sizes
        .iter()
        .map(|(n, s)| s.map(|s| format!("at {n}: {:.3} ms", s.median * 1e3)))
        .collect();
    comment.push(
        at("admission_within")
            .map(|w| format!("{:.0}% within the goal at {LARGEST}", w.median * 100.0)),
    );
    comment.push(at("cpu_over_zero").map(|c| {
        format!(
            "cnid CPU per ADD+DEL over the empty cache {:+.3} ms",
            c.median * 1e3
        )
    }));
    let adm = at("admission");
    v.push(target(
        "cnid with 10,000 attachments: admission of an ADD (mean, cnid's own histogram)",
        format!("≤ {ADMISSION_GOAL_MS} ms at any size"),
        adm.map(|s| format!("{:.3} ms", s.median * 1e3)),
        worst.map(|w| w <= ADMISSION_GOAL_MS * 1e-3),
        notes(comment),
    ));
    v
}
