//! Go's cnitool on libcni, beside ours, measured in the same loops
//! (issue 15's comparison).
//!
//! Debian (bookworm) has no `golang-github-containernetworking-cni-dev`:
//! `golang-github-appc-cni-dev` ships the containernetworking/cni source
//! (libcni, pkg/) under `/usr/share/gocode` but not the reference tool's
//! `cnitool/` dir. So the Go side is `cnid/tests/go/cnitool`, the small
//! libcni-based cnitool that cnid's tests already build (same interface,
//! same container ID, libcni doing the work), built the same way: GOPATH
//! mode on Debian's sources (`GO111MODULE=off GOPATH=/usr/share/gocode`), no
//! module downloads, `CGO_ENABLED=0` (a static binary, as Go builds it by
//! default without cgo). `make setup` installs golang-go and the sources.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, bail};

use crate::chains::GO_CNITOOL;
use crate::report::{Findings, Table};
use crate::spawn::{self, Prepared};
use crate::stats::Summary;

/// Debian's Go sources.
const GOPATH: &str = "/usr/share/gocode";
/// What the Go cnitool imports.
pub(crate) const LIBCNI: &str = "src/github.com/containernetworking/cni/libcni";
/// What the go-cni client (`cnid/tests/go/gocni`) imports besides libcni.
pub(crate) const GO_CNI: &str = "src/github.com/containerd/go-cni";

/// Builds the Go cnitool into `dir` (`go-cnitool`). `Ok(Err(why))` when
/// Go or libcni's source is missing (the comparison is then
/// skipped and the report says why).
pub(crate) fn build(dir: &Path) -> anyhow::Result<Result<PathBuf, String>> {
    build_program(dir, "cnitool", "go-cnitool", &[LIBCNI])
}

/// Builds `cnid/tests/go/<program>` into `dir/<out>` (GOPATH mode on
/// Debian's sources, static). `Ok(Err(why))` when Go or one of `sources`
/// (dirs under the GOPATH) is missing.
pub(crate) fn build_program(
    dir: &Path,
    program: &str,
    out: &str,
    sources: &[&str],
) -> anyhow::Result<Result<PathBuf, String>> {
    let go = Command::new("go")
        .arg("version")
        .stdin(Stdio::null())
        .output();
    if !go.is_ok_and(|o| o.status.success()) {
        return Ok(Err(
            "`go` is not installed (Debian: golang-go; `make setup`)".into(),
        ));
    }
    if let Some(missing) = sources.iter().find(|s| !Path::new(GOPATH).join(s).is_dir()) {
        return Ok(Err(format!(
            "{GOPATH}/{missing} is missing (Debian: golang-github-appc-cni-dev, \
             golang-github-containerd-go-cni-dev; `make setup`)"
        )));
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/go")
        .join(program);
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let out = dir.join(out);
    let o = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", dir.join("go-cache"))
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .stdin(Stdio::null())
        .output()
        .context("run go build")?;
    if !o.status.success() {
        bail!(
            "go build of {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(Ok(out))
}

/// Tool start-up without arguments (each prints its usage and exits):
/// `/bin/true`, our cnitool and Go's, spawned as the floor spawns plugins,
/// in rotating order, `n` runs each after 20 of warm-up. Records
/// `startup/{true,cnitool,go}/wall` and `startup/go-over-cnitool/ratio`.
pub(crate) fn startup(
    cnitool: &Path,
    go: &Path,
    n: usize,
    findings: &mut Findings,
) -> anyhow::Result<()> {
    let env = spawn::env_with(&[]);
    let progs = [
        Prepared::new(Path::new("/bin/true"), &[], &env, "/bin/true")?,
        Prepared::new(cnitool, &[], &env, "cnitool")?,
        Prepared::new(go, &[], &env, GO_CNITOOL)?,
    ];
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut out = Vec::new();
    for i in 0..n + 20 {
        for j in 0..3 {
            let k = (i + j) % 3;
            out.clear();
            let s = Instant::now();
            // Both tools exit non-zero after printing their usage.
            progs[k].run(&[], &mut out)?;
            if i >= 20 {
                times[k].push(s.elapsed().as_secs_f64());
            }
        }
    }
    for (k, key) in ["true", "cnitool", "go"].iter().enumerate() {
        findings.put(format!("startup/{key}/wall"), Summary::of(&times[k]));
    }
    findings.put(
        "startup/go-over-cnitool/ratio".into(),
        Summary::ratios(&times[2], &times[1]),
    );
    Ok(())
}

/// The comparison table, from what the start-up run and the noop loops
/// recorded.
pub(crate) fn section(f: &Findings) -> String {
    let mut t = Table::new(
        "cnitool against Go's cnitool (libcni), same run",
        &[
            "step",
            "cnitool ms, median (p10–p90)",
            "Go cnitool ms, median (p10–p90)",
            "Go / ours, per-iteration ratio, median (p10–p90)",
        ],
    );
    let mut row = |what: String, ours: &str, go: &str, ratio: &str| {
        if let (Some(o), Some(g), Some(r)) = (f.get(ours), f.get(go), f.get(ratio)) {
            t.row(vec![what, o.ms(), g.ms(), r.ratio()]);
        }
    };
    row(
        "tool start-up, no arguments".into(),
        "startup/cnitool/wall",
        "startup/go/wall",
        "startup/go-over-cnitool/ratio",
    );
    for s in ["disk", "tmpfs"] {
        for (tag, what) in [
            ("noop1", "noop ×1"),
            ("noop8", "noop ×8"),
            ("cnoop1", "C noop ×1"),
            ("cnoop8", "C noop ×8"),
        ] {
            for verb in ["ADD", "CHECK", "DEL"] {
                row(
                    format!("{verb}, {what}, cache on {s}"),
                    &format!("{tag}/{s}/cnitool/{verb}/time"),
                    &format!("{tag}/{s}/{GO_CNITOOL}/{verb}/time"),
                    &format!("{tag}/{s}/go-over-cnitool/{verb}/ratio"),
                );
            }
        }
    }
    if let Some(s) = f.get("startup/true/wall") {
        t.note(format!(
            "`/bin/true` in the start-up run: {} ms. Both tools run with the same environment, \
             conf dir and plugin dir (CNI_PATH, NETCONFPATH, CNI_CACHE_DIR; Go's cache in its own \
             dir), the netns path `{}`, in the same shuffled loops as the floor and the other \
             runners (SCHED_FIFO when root).",
            s.ms(),
            crate::chains::NOOP_NETNS
        ));
    }
    format!(
        "### Against Go's cnitool\n\n\
         Go's side: `cnid/tests/go/cnitool`, a cnitool on Go's libcni with the reference \
         tool's interface (Debian ships libcni's source in golang-github-appc-cni-dev but not \
         the reference `cnitool/` dir), built with `GO111MODULE=off \
         GOPATH=/usr/share/gocode CGO_ENABLED=0 go build`.\n\n{}",
        t.markdown()
    )
}
