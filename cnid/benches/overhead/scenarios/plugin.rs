//! The floor's unit (`--only floor`): one plugin process. The noop plugin's
//! ADD against `/bin/true`, and beside them the other noop builds in the
//! bin dir (the static C one, the dynamic one), all spawned as the floor
//! spawns plugins, in one rotating loop.

use std::path::Path;

use crate::Cx;
use crate::report::{Table, row, section as md};
use crate::spawn::{Prepared, env_set, rotate};
use crate::stats::Summary;

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let vars = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/proc/self/ns/net"),
    ];
    let env = env_set(&[vars.as_slice(), &[("CNI_CONTAINERID", "bench")]].concat());
    // (label, findings key, program); the benchmark's plugin first,
    // /bin/true last.
    let noop = cx.tree.bin.join("noop");
    let mut progs = vec![(
        "cni-noop ADD (the plugin of the loops below)",
        "noop".to_owned(),
        noop.as_path(),
    )];
    for (label, path) in &cx.bins.noop_variants {
        progs.push((label, format!("noop-variant/{label}"), path));
    }
    progs.push(("/bin/true", "true".to_owned(), Path::new("/bin/true")));
    let prepared: Vec<Prepared> = progs
        .iter()
        .map(|(l, _, p)| Prepared::new(p, &[], &env, *l))
        .collect::<Result<_, _>>()?;
    let stdin = br#"{"cniVersion":"1.0.0","name":"bench-noop1","type":"noop"}"#;
    // Wall and CPU times per program.
    let t = rotate(&prepared, stdin, cx.n(50, 400), "plugin runs", |_, e, _| {
        e.success()
    })?;
    let truth = &t[progs.len() - 1][0];
    cx.findings
        .put("own/noop-true/wall", Summary::diffs(&t[0][0], truth));
    let title = "the noop plugin ADD against /bin/true, all spawned as the floor spawns plugins";
    let header = "program|spawn to reap, ms median (p10–p90)|child CPU, ms mean|− /bin/true, ms median (p10–p90)";
    let mut table = Table::new(title, header);
    for (r, (label, key, _)) in progs.iter().enumerate() {
        let w = Summary::of(&t[r][0]);
        cx.findings.put(format!("own/{key}/wall"), w);
        let over = if r == progs.len() - 1 {
            "–".into()
        } else {
            Summary::diffs(&t[r][0], truth).ms()
        };
        let cpu = t[r][1].iter().sum::<f64>() / t[r][1].len().max(1) as f64;
        row!(table, label, w.ms(), format!("{:.3}", cpu * 1e3), over);
    }
    table.note(format!(
        "{} rotating runs each. `/bin/true` is the cost of any process start on this machine \
         (posix_spawn, exec, dynamic loading of libc); a plugin's own run is what it adds. \
         `make bench` builds cni-noop statically linked (glibc, crt-static, `no_main`), \
         as the plugin of every noop loop.",
        truth.len()
    ));
    Ok(Some(md(
        "The floor's unit: one plugin process",
        "",
        &[table],
    )))
}
