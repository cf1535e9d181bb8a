//! The targets, judged on the default configuration (cache on disk, fsync
//! on) from the figures the scenarios recorded; the fsync-free figure and
//! other context are in the notes. A target whose scenario did not run
//! reads "not measured".

use crate::chains::VERBS;
use crate::report::{Findings, Table, row};
use crate::scenarios::scale::{ADMISSION_GOAL_MS, LARGEST, READY_GOAL_S, RSS_GOAL_MIB};
use crate::stats::Summary;

/// Notes from the figures present, joined by "; ".
fn notes(parts: impl IntoIterator<Item = Option<String>>) -> String {
    parts.into_iter().flatten().collect::<Vec<_>>().join("; ")
}

/// `+N% over` when the median is above `limit`.
fn over(s: Summary, limit: f64) -> Option<String> {
    let pct = (s.median / limit - 1.0) * 100.0;
    (s.median > limit).then(|| format!("{pct:+.0}% over"))
}

/// A figure as shown, and whether its median is within the limit.
type Judged = (Option<String>, Option<bool>);

fn judge(s: Option<Summary>, show: impl Fn(Summary) -> String, ok: impl Fn(f64) -> bool) -> Judged {
    (s.map(show), s.map(|s| ok(s.median)))
}

/// One target's row: what, the limit, the figure and verdict, notes.
fn put(t: &mut Table, what: &str, limit: &str, (m, met): Judged, notes: String) {
    let met = met.map_or("–", |ok| if ok { "**met**" } else { "**missed**" });
    row!(
        t,
        what,
        limit,
        m.unwrap_or_else(|| "not measured".into()),
        met,
        notes
    );
}

/// A ratio over the floor, disk and tmpfs (`{s}` in `key`), with `more`
/// notes.
fn ratio(t: &mut Table, f: &Findings, what: &str, key: &str, limit: f64, more: Option<String>) {
    let disk = f.get(&key.replace("{s}", "disk"));
    let tmpfs = f.get(&key.replace("{s}", "tmpfs"));
    let tmpfs = tmpfs.map(|s| format!("fsync free (tmpfs): {}", s.ratio()));
    let over = disk
        .and_then(|d| over(d, limit))
        .filter(|_| tmpfs.is_some());
    let (limit_s, notes) = (format!("≤ {limit:.2}x"), notes([over, tmpfs, more]));
    let v = judge(disk, |s| s.ratio(), |m| m <= limit);
    put(t, what, &limit_s, v, notes);
}

pub(crate) fn table(f: &Findings) -> Table {
    let header = "target|limit|measured, median (p10–p90)|verdict|notes";
    let mut table = Table::new("Targets", header);
    let t = &mut table;
    let get = |k: &str| f.get(k);
    let note = |label: &str, k: &str| get(k).map(|s| format!("{label}: {}", s.ratio()));
    let kib = |s: Summary| format!("{:.0} KiB ({:.0}–{:.0})", s.median, s.p10, s.p90);
    let mib = |s: Summary| format!("{:.1} MiB", s.median / 1024.0);
    let ms = |s: Summary| format!("{} ms", s.ms());
    let (n, tr) = (get("own/noop/wall"), get("own/true/wall"));
    let sides = n.zip(tr).map(|(n, t)| (n.ms(), t.ms()));
    let sides = sides.map(|(n, t)| format!("cni-noop {n} ms, /bin/true {t} ms spawn to reap"));
    let v = judge(get("own/noop-true/wall"), ms, |m| m < 0.25e-3);
    let what = "cni-noop's own run (spawn to reap, minus /bin/true's)";
    put(t, what, "well under 0.5 ms", v, sides.unwrap_or_default());
    let (what, key) = (
        "in-process noop ×8 ADD+DEL",
        "noop8/{s}/in-process/ADD+DEL/ratio",
    );
    ratio(t, f, what, key, 1.05, None);
    let v = judge(
        get("core/per_plugin_add_work"),
        |s| format!("{} µs", s.fmt(1e6, 2)),
        |m| m < 20e-6,
    );
    let what = "cni-core work per plugin (parse, build, convert)";
    put(
        t,
        what,
        "< 20 µs",
        v,
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
        let notes = notes([
            over(disk, limit),
            note("fsync free (tmpfs)", &k("", "tmpfs", "cnitool-over-driver")),
            note("C noop", &k("c", "disk", "cnitool-over-driver")),
            note("× the in-process floor", &k("", "disk", "cnitool")),
        ]);
        let (what, v) = (
            format!("{what} ÷ C driver"),
            (Some(disk.ratio()), Some(disk.median <= limit)),
        );
        put(t, &what, &format!("≤ {limit:.2}x"), v, notes);
    }
    // Go's cnitool over ours, per iteration of the same loop; the bound is
    // Go's over the floor as a process, which caches nothing.
    for size in [1, 8] {
        let k = |x: &str, s: &str, r: &str| format!("{x}noop{size}/{s}/{r}/ADD/ratio");
        let v = judge(
            get(&k("", "disk", "go-over-cnitool")),
            |s| s.ratio(),
            |m| m >= 2.0,
        );
        let notes = notes([
            note("fsync free (tmpfs)", &k("", "tmpfs", "go-over-cnitool")),
            note("C noop", &k("c", "disk", "go-over-cnitool")),
            note("bound (Go ÷ C driver)", &k("", "disk", "go-over-driver")),
            note("tmpfs bound", &k("", "tmpfs", "go-over-driver")),
        ]);
        put(
            t,
            &format!("Go's cnitool / ours, noop ×{size} ADD"),
            "≥ 2.0x",
            v,
            notes,
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
    let mb = rss.map(|s| (s.median / 1024.0, s.median * 1.024 / 1000.0));
    let mb = mb.map(|(mib, mb)| format!("{mib:.2} MiB = {mb:.2} MB"));
    let (what, limit) = ("cnitool peak RSS, one ADD (noop ×1)", "< 4 MiB (4096 KiB)");
    put(
        t,
        what,
        limit,
        judge(rss, kib, |m| m < 4096.0),
        mb.unwrap_or_default(),
    );
    for (verb, limit) in [("ADD", 0.5e-3), ("CHECK", 0.3e-3), ("DEL", 0.3e-3)] {
        let k = |s: &str| format!("noop1/{s}/cnid-inproc/{verb}/added");
        let v = judge(get(&k("disk")), ms, |m| m <= limit);
        let tmpfs = get(&k("tmpfs")).map(|s| format!("fsync free (tmpfs): {} ms", s.ms()));
        let what = format!("cnid round trip over in-process, noop ×1 {verb}");
        let limit = format!("≤ +{:.2} ms median", limit * 1e3);
        put(t, &what, &limit, v, tmpfs.unwrap_or_default());
    }
    let shim: Option<Vec<(f64, f64)>> = VERBS
        .iter()
        .map(|v| {
            Some((
                get(&format!("shim/{v}/added"))?,
                get(&format!("shim/{v}/added-p99"))?,
            ))
        })
        .map(|s| s.map(|(p50, p99)| (p50.median, p99.median)))
        .collect();
    let list = |pick: fn(&(f64, f64)) -> f64, d: usize| {
        let each = |s: &Vec<(f64, f64)>| {
            let all = VERBS
                .iter()
                .zip(s)
                .map(|(v, x)| format!("{v} {:.d$}", pick(x) * 1e3));
            all.collect::<Vec<_>>().join(", ") + " ms"
        };
        shim.as_ref().map(each)
    };
    let met = shim.as_ref().map(|s| s.iter().all(|x| x.0 <= 1e-3));
    let p99 = list(|x| x.1, 2).map(|p| format!("p99: {p}"));
    let what = "cnid-shim: added to the same request sent straight to cnid (ADD, CHECK, DEL)";
    put(
        t,
        what,
        "≤ 1 ms p50",
        (list(|x| x.0, 3), met),
        p99.unwrap_or_default(),
    );
    let v = judge(get("rss/shim/add"), kib, |m| m < 4096.0);
    put(
        t,
        "cnid-shim peak RSS, one ADD",
        "< 4 MiB (4096 KiB)",
        v,
        "".into(),
    );
    let v = judge(get("rss/cnid/mem64/idle_warm"), mib, |m| m < 10.0 * 1024.0);
    let fresh = get("rss/cnid/mem64/idle_fresh").map(|s| format!("{} right after start", mib(s)));
    let what = "cnid RSS idle (after 100 requests)";
    put(t, what, "< 10 MiB", v, fresh.unwrap_or_default());
    let v = judge(get("rss/cnid/mem64/hwm"), mib, |m| m < 40.0 * 1024.0);
    let all = get("rss/cnid/mem1000/hwm").map(mib);
    let all = all.map(|s| format!("with --max-parallel 1000 (all running at once): {s}"));
    let what = "cnid RSS with 1,000 ADDs in flight (peak)";
    put(t, what, "< 40 MiB", v, all.unwrap_or_default());
    let k = |s: &str, r: &str, x: &str| get(&format!("batch/c4/{s}/{r}/{x}"));
    let per_ns = k("disk", "runtime", "total").zip(k("disk", "floor", "total"));
    let per_ns = per_ns.map(|(r, fl)| (r.median * 1e3, fl.median * 1e3));
    let per_ns = per_ns.map(|(r, fl)| format!("{r:.2} ms vs floor {fl:.2} ms per namespace"));
    let min_max = |s: Summary| format!("{:.2}x (min {:.2}, max {:.2}", s.median, s.p10, s.p90);
    let tmpfs =
        k("tmpfs", "runtime", "ratio").map(|s| format!("fsync free (tmpfs): {})", min_max(s)));
    let show = |s: Summary| format!("{} of {} runs)", min_max(s), s.n);
    let v = judge(k("disk", "runtime", "ratio"), show, |m| m <= 1.10);
    let what = "batch, concurrency 4, time per namespace";
    put(t, what, "≤ 1.10x floor", v, notes([per_ns, tmpfs]));
    let at = |what: &str| get(&format!("scale/{what}/{LARGEST}"));
    let ms0 = |s: Summary| format!("{:.0} ms", s.median * 1e3);
    let cache = at("ready_cache").map(|s| format!("from the cache alone: {}", ms0(s)));
    let what = "cnid with 10,000 attachments (cache and journal): start to ready";
    let v = judge(at("ready"), ms0, |m| m <= READY_GOAL_S);
    put(
        t,
        what,
        &format!("≤ {READY_GOAL_S} s"),
        v,
        cache.unwrap_or_default(),
    );
    let v = judge(
        at("rss"),
        |s| format!("{:.1} MiB", s.median),
        |m| m <= RSS_GOAL_MIB,
    );
    let what = "cnid with 10,000 attachments: RSS idle";
    put(t, what, &format!("≤ {RSS_GOAL_MIB} MiB"), v, "".into());
    // Measured by cnid itself (`cnid_admission_duration_seconds`), at
    // every size: the goal is for any.
    let sizes = [0, 1000, LARGEST].map(|n| (n, get(&format!("scale/admission/{n}"))));
    let worst = sizes
        .iter()
        .filter_map(|(_, s)| s.map(|s| s.median))
        .reduce(f64::max);
    let at_n =
        |(n, s): &(usize, Option<Summary>)| s.map(|s| format!("at {n}: {:.3} ms", s.median * 1e3));
    let mut notes: Vec<_> = sizes.iter().map(at_n).collect();
    let within = at("admission_within").map(|w| w.median * 100.0);
    notes.push(within.map(|w| format!("{w:.0}% within the goal at {LARGEST}")));
    let cpu = at("cpu_over_zero").map(|c| c.median * 1e3);
    notes.push(cpu.map(|c| format!("cnid CPU per ADD+DEL over the empty cache {c:+.3} ms")));
    let adm = at("admission").map(|s| format!("{:.3} ms", s.median * 1e3));
    let v = (adm, worst.map(|w| w <= ADMISSION_GOAL_MS * 1e-3));
    let what = "cnid with 10,000 attachments: admission of an ADD (mean, cnid's own histogram)";
    put(
        t,
        what,
        &format!("≤ {ADMISSION_GOAL_MS} ms at any size"),
        v,
        self::notes(notes),
    );
    table
}
