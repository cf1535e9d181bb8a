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
/// is `<target>/<profile>` or `<target>/<triple>/<profile>`, and the
/// target dir is the one [`is_target_root`] recognises.
fn target_layout(profile_dir: &Path) -> Result<(&Path, Option<&str>), String> {
    let up = profile_dir
        .parent()
        .ok_or_else(|| format!("no target dir above {}", profile_dir.display()))?;
    if is_target_root(up) {
        return Ok((up, None));
    }
    let triple = up.file_name().and_then(|n| n.to_str());
    match (up.parent(), triple) {
        (Some(target), Some(t)) if is_target_root(target) => Ok((target, Some(t))),
        _ => Err(format!(
            "cannot tell the target dir of {} (no CACHEDIR.TAG or .rustc_info.json above it)",
            profile_dir.display()
        )),
    }
}

/// Whether cargo keeps a target dir at `dir`: its `CACHEDIR.TAG`, which
/// cargo writes only when it creates the dir itself (not when something
/// else made it first, as `make deploy-check`'s venv may on a fresh clone),
/// or its `.rustc_info.json`, which it writes at every run.
fn is_target_root(dir: &Path) -> bool {
    dir.join("CACHEDIR.TAG").is_file() || dir.join(".rustc_info.json").is_file()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A target dir is recognised by its CACHEDIR.TAG or by cargo's
    /// `.rustc_info.json` alone (a fresh clone's `target/` made first by
    /// something other than cargo has no tag), with or without a target
    /// triple between it and the profile dir.
    #[test]
    fn the_target_dir_is_found_with_or_without_its_tag() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("target");
        let host = target.join("debug");
        let cross = target.join("x86_64-unknown-linux-gnu").join("release");
        std::fs::create_dir_all(&host).unwrap();
        std::fs::create_dir_all(&cross).unwrap();
        assert!(target_layout(&host).is_err(), "no marker yet");
        std::fs::write(target.join(".rustc_info.json"), "{}").unwrap();
        assert_eq!(target_layout(&host).unwrap(), (target.as_path(), None));
        assert_eq!(
            target_layout(&cross).unwrap(),
            (target.as_path(), Some("x86_64-unknown-linux-gnu"))
        );
        std::fs::remove_file(target.join(".rustc_info.json")).unwrap();
        std::fs::write(
            target.join("CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55\n",
        )
        .unwrap();
        assert_eq!(target_layout(&host).unwrap(), (target.as_path(), None));
    }
}
