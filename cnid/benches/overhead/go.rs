//! The Go programs the benchmark runs beside ours: Go's cnitool on libcni
//! (`cnid/tests/go/cnitool`) and containerd's go-cni client
//! (`cnid/tests/go/gocni`).
//!
//! Debian (bookworm) has no `golang-github-containernetworking-cni-dev`:
//! `golang-github-appc-cni-dev` ships the containernetworking/cni source
//! (libcni, pkg/) under `/usr/share/gocode` but not the reference tool's
//! `cnitool/` dir. So the Go cnitool is the small libcni-based one that
//! cnid's tests already build (same interface, same container ID, libcni
//! doing the work), built the same way: GOPATH mode on Debian's sources
//! (`GO111MODULE=off GOPATH=/usr/share/gocode`), no module downloads,
//! `CGO_ENABLED=0` (a static binary, as Go builds it by default without
//! cgo). `make setup` installs golang-go and the sources.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// Debian's Go sources.
const GOPATH: &str = "/usr/share/gocode";

/// Builds `cnid/tests/go/<program>` into `dir` (as `go-cnitool` or
/// `gocni`). `Ok(Err(why))` when Go or a source it imports is missing (the
/// report then says why).
pub(crate) fn build(dir: &Path, program: &str) -> anyhow::Result<Result<PathBuf, String>> {
    let libcni = "src/github.com/containernetworking/cni/libcni";
    let sources = if program == "gocni" {
        vec![libcni, "src/github.com/containerd/go-cni"]
    } else {
        vec![libcni]
    };
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
    let out = dir.join(if program == "cnitool" {
        "go-cnitool"
    } else {
        program
    });
    let mut cmd = Command::new("go");
    cmd.args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src);
    cmd.env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", dir.join("go-cache"));
    let o = cmd
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
