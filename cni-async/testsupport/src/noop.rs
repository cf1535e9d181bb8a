//! Where the benchmark plugin `cni-noop` is, for cnid's tests and its
//! overhead benchmark.
//!
//! `cni-noop` is a package of its own (`cnid/benches/noop`), so that
//! `cargo install --path cnid` does not install it; cargo therefore gives
//! cnid's tests no `CARGO_BIN_EXE_cni-noop`. It is built here on demand,
//! once per process, with the cargo that runs the test (`$CARGO`), into the
//! same target dir and profile as the running test or benchmark binary
//! (`<target>[/<triple>]/<profile>/deps/<name>-<hash>`). When it is up to
//! date that is cargo's fingerprint check, a fraction of a second.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The path of `cni-noop` as a string (for scripts and `format!`); panics,
/// with cargo's output, when it cannot be built.
pub fn noop_path() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| match build_noop() {
        Ok(p) => p.to_str().expect("target dir path is UTF-8").to_owned(),
        Err(e) => panic!("{e}"),
    })
}

/// Builds `cni-noop` (when out of date) next to the running executable's
/// profile dir and returns its path.
pub fn build_noop() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // <profile dir>/deps/<exe>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("no profile dir above {}", exe.display()))?;
    let (target_dir, triple) = target_layout(profile_dir)?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(p) => p,
        None => return Err(format!("bad profile dir {}", profile_dir.display())),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // This package is `cni-async/testsupport`; the plugin is cnid's.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cnid/benches/noop/Cargo.toml");
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--quiet",
        "--bin",
        "cni-noop",
        "--profile",
        profile,
    ])
    .arg("--manifest-path")
    .arg(&manifest)
    .arg("--target-dir")
    .arg(target_dir);
    if let Some(t) = triple {
        cmd.arg("--target").arg(t);
    }
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        format!(
            "run {} build for cni-noop: {e}",
            Path::new(&cargo).display()
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "cargo build of cni-noop ({}) failed ({}): {}",
            manifest.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = profile_dir.join("cni-noop");
    if !path.is_file() {
        return Err(format!(
            "cargo built cni-noop but {} is missing",
            path.display()
        ));
    }
    Ok(path)
}

/// The target dir and, for `--target` builds, the triple: the profile dir
/// is `<target>/<profile>` or `<target>/<triple>/<profile>`; cargo marks
/// the target dir itself with `CACHEDIR.TAG`.
fn target_layout(profile_dir: &Path) -> Result<(&Path, Option<&str>), String> {
    let up = profile_dir
        .parent()
        .ok_or_else(|| format!("no target dir above {}", profile_dir.display()))?;
    if up.join("CACHEDIR.TAG").is_file() {
        return Ok((up, None));
    }
    let triple = up.file_name().and_then(|n| n.to_str());
    match (up.parent(), triple) {
        (Some(target), Some(t)) if target.join("CACHEDIR.TAG").is_file() => Ok((target, Some(t))),
        _ => Err(format!(
            "cannot tell the target dir of {} (no CACHEDIR.TAG above it)",
            profile_dir.display()
        )),
    }
}

/// `cni-noop`'s path where a `&str` constant stood: usable as a path
/// (`AsRef<Path>`, `AsRef<OsStr>`) and in `format!` (`Display`); built on
/// first use.
#[derive(Debug, Clone, Copy)]
pub struct NoopPlugin;

/// See [`NoopPlugin`].
pub const NOOP: NoopPlugin = NoopPlugin;

impl AsRef<Path> for NoopPlugin {
    fn as_ref(&self) -> &Path {
        Path::new(noop_path())
    }
}

impl AsRef<std::ffi::OsStr> for NoopPlugin {
    fn as_ref(&self) -> &std::ffi::OsStr {
        std::ffi::OsStr::new(noop_path())
    }
}

impl std::fmt::Display for NoopPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(noop_path())
    }
}
