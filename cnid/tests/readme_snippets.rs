//! The README's `sh` blocks, run in order as written, in a sandbox: a
//! network namespace and a mount namespace of their own (`unshare`), with
//! fresh tmpfs on `/run` and `/var/lib` (so `/run/netns`, `/run/cnid`,
//! `/var/lib/cni` and `/var/lib/cnid` start empty and nothing reaches the
//! host's), the binaries of this build installed with `make install
//! INSTALL_FROM=...` into a temp prefix put first on `PATH`, `sudo` and
//! `cargo run -p PKG --bin NAME -- ARGS` standing for running the command
//! and the built `NAME`, from the workspace root. After each block (once
//! the background daemon is stopped, for the blocks that use it) the
//! sandbox must be as it was before the first: the same links, no named
//! namespace, no file under those dirs but host-local's `lock` and
//! `last_reserved_ip.*` and cnid's `cnid.lock` in its state dir, nothing
//! new in the working copy.
//!
//! A comment right before a block's fence steers it:
//! - `<!-- snippet: skip (why) -->`: not run (make test itself, systemd, a
//!   synopsis, a node's production layout);
//! - `<!-- snippet: background, ready: CMD -->`: run in the background (the
//!   daemon), the next block waiting until CMD succeeds;
//! - `<!-- snippet: stop background -->` (anywhere): SIGTERM to the
//!   background block's process group, as Ctrl-C would.
//!
//! Shell variables a block assigns on a line of their own (`S="curl ..."`)
//! are set for the blocks after it, as in the reader's terminal. Each block
//! runs with `bash -e`, so a failing command fails the test with the
//! README's line; curl is told `--fail-with-body` in the README itself.
//!
//! Root only (namespaces, real plugins in /usr/lib/cni, the examples'
//! binaries built: `make test` builds the whole workspace first).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One step of the README.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// A block to run; `line` is its fence's line number.
    Run { line: usize, code: String },
    /// A block to start in the background, then wait for `ready`.
    Background {
        line: usize,
        code: String,
        ready: String,
    },
    /// Stop the background block.
    Stop { line: usize },
    /// A block not run.
    Skip { line: usize },
}

/// The steps of a README: every ```sh block, with the marker right before
/// its fence, and the stop markers.
fn steps(readme: &str) -> Result<Vec<Step>, String> {
    let mut out = Vec::new();
    let mut marker: Option<(usize, String)> = None;
    let mut lines = readme.lines().enumerate().map(|(i, l)| (i + 1, l));
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim();
        if let Some(m) = trimmed
            .strip_prefix("<!-- snippet:")
            .and_then(|m| m.strip_suffix("-->"))
        {
            let m = m.trim().to_owned();
            if m == "stop background" {
                out.push(Step::Stop { line: n });
            } else {
                marker = Some((n, m));
            }
            continue;
        }
        if let Some(info) = trimmed.strip_prefix("```") {
            let mut code = String::new();
            for (_, l) in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                code.push_str(l);
                code.push('\n');
            }
            let pending = marker.take();
            if let Some((m, _)) = &pending
                && *m + 1 != n
            {
                return Err(format!(
                    "line {m}: a snippet marker not right before a ```sh fence"
                ));
            }
            if info != "sh" {
                if let Some((m, _)) = pending {
                    return Err(format!(
                        "line {m}: a snippet marker before a ```{info} block"
                    ));
                }
                continue;
            }
            out.push(match pending {
                None => Step::Run { line: n, code },
                Some((_, m)) if m.starts_with("skip") => Step::Skip { line: n },
                Some((m_line, m)) => match m.strip_prefix("background, ready:") {
                    Some(ready) => Step::Background {
                        line: n,
                        code,
                        ready: ready.trim().to_owned(),
                    },
                    None => return Err(format!("line {m_line}: unknown snippet marker {m:?}")),
                },
            });
            continue;
        }
        if let Some((m, _)) = marker.take() {
            return Err(format!(
                "line {m}: a snippet marker not right before a ```sh fence"
            ));
        }
    }
    Ok(out)
}

/// Lines that only assign a shell variable (`S="curl ..."`).
fn assignments(code: &str) -> impl Iterator<Item = &str> {
    code.lines().filter(|l| {
        let Some((name, value)) = l.split_once('=') else {
            return false;
        };
        let name_ok = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        let quoted = |q: char| {
            value.len() >= 2
                && value.starts_with(q)
                && value.ends_with(q)
                && value[1..value.len() - 1].find(q).is_none()
        };
        name_ok && (quoted('"') || quoted('\'') || !value.contains(char::is_whitespace))
    })
}

/// Single-quotes a string for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The driver script run inside the sandbox.
fn driver(steps: &[Step], dir: &Path, prefix: &Path, target: &Path, root: &Path) -> String {
    let mut sh = String::new();
    let _ = write!(
        sh,
        r#"set -u
fail() {{ echo "readme: $*" >&2; exit 1; }}
# The sandbox: fresh /run and /var/lib (this mount namespace only).
mount -t tmpfs -o mode=0755 tmpfs /run || fail "cannot mount a tmpfs on /run"
mount -t tmpfs -o mode=0755 tmpfs /var/lib || fail "cannot mount a tmpfs on /var/lib"
ip link set lo up
export PATH={prefix}/bin:$PATH
export TARGET={target}
sudo() {{ while [ "${{1#-}}" != "$1" ]; do shift; done; "$@"; }}
cargo() {{
  local bin=
  while [ $# -gt 0 ]; do
    case $1 in --bin) bin=$2; shift 2;; --) shift; break;; *) shift;; esac
  done
  [ -n "$bin" ] || {{ echo "readme: only 'cargo run ... --bin NAME [-- ARGS]' is stood in for" >&2; return 127; }}
  "$TARGET/$bin" "$@"
}}
export -f sudo cargo
state() {{
  ip -o link show | awk -F': ' '{{print $2}}' | sed 's/@.*//' | sort
  ip netns list
  find /run /var/lib ! -type d 2>/dev/null \
    | grep -Ev '^/var/lib/cni/networks/[^/]+/(lock|last_reserved_ip\..*)$|^/var/lib/cnid/cnid\.lock$' | sort
  git -C {root} status --porcelain --ignored=no
}}
BG=
cleanup() {{ [ -z "$BG" ] || kill -KILL -- -$BG 2>/dev/null; }}
trap cleanup EXIT
cd {root}
state > {dir}/before
check() {{
  state > {dir}/after
  diff -u {dir}/before {dir}/after >&2 || fail "the block at README line $1 left the above behind"
}}
"#,
        prefix = quote(&prefix.display().to_string()),
        target = quote(&target.display().to_string()),
        root = quote(&root.display().to_string()),
        dir = quote(&dir.display().to_string()),
    );
    let mut vars = String::new();
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Skip { line } => {
                let _ = writeln!(sh, "echo 'readme: line {line}: skipped (marked)' >&2");
            }
            Step::Run { line, code } => {
                let file = dir.join(format!("block{i}.sh"));
                std::fs::write(&file, format!("{vars}{code}")).unwrap();
                let _ = writeln!(
                    sh,
                    "echo 'readme: line {line}: running' >&2\n\
                     bash -e {f} || fail \"the block at README line {line} failed (exit $?)\"\n\
                     [ -n \"$BG\" ] || check {line}",
                    f = quote(&file.display().to_string())
                );
                for a in assignments(code) {
                    vars.push_str(a);
                    vars.push('\n');
                }
            }
            Step::Background { line, code, ready } => {
                let file = dir.join(format!("block{i}.sh"));
                let log = dir.join(format!("block{i}.log"));
                std::fs::write(&file, format!("{vars}{code}")).unwrap();
                let _ = writeln!(
                    sh,
                    "echo 'readme: line {line}: started in the background' >&2\n\
                     setsid bash -e {f} > {log} 2>&1 &\n\
                     BG=$!\n\
                     for _ in $(seq 600); do\n\
                       ( {ready} ) >/dev/null 2>&1 && break\n\
                       kill -0 $BG 2>/dev/null || {{ cat {log} >&2; fail \"the block at README line {line} ended\"; }}\n\
                       sleep 0.1\n\
                     done\n\
                     ( {ready} ) >/dev/null 2>&1 || {{ cat {log} >&2; fail \"the block at README line {line} never got ready\"; }}",
                    f = quote(&file.display().to_string()),
                    log = quote(&log.display().to_string()),
                );
            }
            Step::Stop { line } => {
                let _ = writeln!(
                    sh,
                    "echo 'readme: line {line}: stopping the background block' >&2\n\
                     [ -n \"$BG\" ] || fail \"line {line}: nothing runs in the background\"\n\
                     kill -TERM -- -$BG\n\
                     wait $BG\n\
                     for _ in $(seq 600); do pgrep -g $BG >/dev/null || break; sleep 0.1; done\n\
                     pgrep -g $BG >/dev/null && fail \"line {line}: the background block did not stop\"\n\
                     BG=\n\
                     check {line}"
                );
            }
        }
    }
    sh.push_str("[ -z \"$BG\" ] || fail \"the background block was never stopped\"\necho 'readme: done' >&2\n");
    sh
}

#[test]
fn readme_markers_are_understood() {
    let readme = "\
<!-- snippet: skip (x) -->
```sh
make test
```
text
```sh
A=\"b c\"
echo $A
```
<!-- snippet: background, ready: true -->
```sh
daemon
```
```rust
fn main() {}
```
<!-- snippet: stop background -->
";
    let got = steps(readme).unwrap();
    assert_eq!(
        got,
        [
            Step::Skip { line: 2 },
            Step::Run {
                line: 6,
                code: "A=\"b c\"\necho $A\n".into()
            },
            Step::Background {
                line: 11,
                code: "daemon\n".into(),
                ready: "true".into()
            },
            Step::Stop { line: 17 },
        ]
    );
    assert_eq!(
        assignments("S=\"curl -sS\"\nA=b c\nX=1\nNETCONFPATH=x cnitool add\n").collect::<Vec<_>>(),
        ["S=\"curl -sS\"", "X=1"]
    );
    assert!(steps("<!-- snippet: skip -->\n\n```sh\nx\n```\n").is_err());
    assert!(steps("<!-- snippet: nonsense -->\n```sh\nx\n```\n").is_err());
    assert!(steps("<!-- snippet: skip -->\n```json\n{}\n```\n").is_err());
}

#[test]
fn readme_snippets_run_in_order_and_leave_nothing_behind() {
    cni_test_support::require_root!(
        "it runs the README's snippets: namespaces, bridges, the real plugins"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let target: PathBuf = Path::new(env!("CARGO_BIN_EXE_cnid"))
        .parent()
        .unwrap()
        .to_path_buf();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let steps = steps(&readme).unwrap_or_else(|e| panic!("README.md: {e}"));
    let runs = steps
        .iter()
        .filter(|s| matches!(s, Step::Run { .. }))
        .count();
    assert!(runs >= 5, "only {runs} runnable blocks found: {steps:?}");

    // The examples the README runs with `cargo run`.
    for step in &steps {
        if let Step::Run { code, .. } | Step::Background { code, .. } = step
            && let Some(bin) = code.split_whitespace().skip_while(|w| *w != "--bin").nth(1)
        {
            assert!(
                target.join(bin).is_file(),
                "{bin} is not built in {}: cargo build -p cni-examples --bins (make test builds it)",
                target.display()
            );
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    let out = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&root)
        .arg("install")
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("INSTALL_FROM={}", target.display()))
        .env_remove("MAKEFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .unwrap();
    assert!(out.status.success(), "make install: {out:?}");

    let script = driver(&steps, dir.path(), &prefix, &target, &root);
    let driver_path = dir.path().join("driver.sh");
    std::fs::write(&driver_path, &script).unwrap();
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "private", "--", "bash"])
        .arg(&driver_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "README snippets: {}\nstdout:\n{}\nstderr:\n{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("readme: done"), "{stderr}");
    assert_eq!(
        stderr.matches(": running").count(),
        runs,
        "every block ran: {stderr}"
    );
}

/// Every fenced block: its info string (`sh`, `toml`, ...), the snippet
/// marker right before it (if any), and its text.
fn fenced(readme: &str) -> Vec<(String, Option<String>, String)> {
    let mut out = Vec::new();
    let mut marker = None;
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(m) = t
            .strip_prefix("<!-- snippet:")
            .and_then(|m| m.strip_suffix("-->"))
        {
            marker = Some(m.trim().to_owned());
            continue;
        }
        if let Some(info) = t.strip_prefix("```") {
            let mut code = String::new();
            for l in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                code.push_str(l);
                code.push('\n');
            }
            out.push((info.to_owned(), marker.take(), code));
            continue;
        }
        marker = None;
    }
    out
}

/// The value of `key = "..."` in an inline table.
fn inline_str<'a>(table: &'a str, key: &str) -> Option<&'a str> {
    let rest = &table[table.find(&format!("{key} = \""))? + key.len() + 4..];
    Some(&rest[..rest.find('"')?])
}

/// The strings of `key = [...]` in an inline table.
fn inline_list(table: &str, key: &str) -> Vec<String> {
    let Some(start) = table.find(&format!("{key} = [")) else {
        return Vec::new();
    };
    let rest = &table[start + key.len() + 4..];
    rest[..rest.find(']').unwrap_or(rest.len())]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The README's Cargo.toml snippet names this workspace's crates by a path
/// ending in their directory, and only features they have (the git form in
/// its comment too).
#[test]
fn readme_cargo_snippet_names_real_crates_and_features() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let tomls: Vec<String> = fenced(&readme)
        .into_iter()
        .filter(|(info, _, _)| info == "toml")
        .map(|(_, _, code)| code)
        .collect();
    assert!(!tomls.is_empty(), "no ```toml block in README.md");
    let mut checked = 0;
    for line in tomls.iter().flat_map(|c| c.lines()) {
        let line = line.trim().trim_start_matches("# or:").trim();
        let Some((name, table)) = line.split_once(" = {") else {
            continue;
        };
        // A path is the checkout's (`../cni-rs/...`): the rest is the
        // crate's directory in this workspace (`cni-async`, `cnid/client`).
        let dir: PathBuf = match (inline_str(table, "path"), inline_str(table, "git")) {
            (Some(path), _) => Path::new(path)
                .strip_prefix("../cni-rs")
                .unwrap_or_else(|_| panic!("{line}: the path is not under ../cni-rs"))
                .to_owned(),
            (None, Some(_)) => name.into(),
            (None, None) => continue,
        };
        let manifest = std::fs::read_to_string(root.join(&dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{line}: no crate in {dir:?}: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{line}: {dir:?} is not {name}"
        );
        let features = manifest
            .split("[features]")
            .nth(1)
            .map(|f| f.split("\n[").next().unwrap_or(""))
            .unwrap_or("");
        for f in inline_list(table, "features") {
            assert!(
                features.lines().any(|l| l.starts_with(&format!("{f} ="))),
                "{line}: {name} has no feature {f:?}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 2, "the snippet names the crates: {tomls:?}");
}

/// The README's systemd drop-in: every flag of its `ExecStart=` is one of
/// `cnid --help`, and cnid's `--socket` is the socket unit's `ListenStream=`.
#[test]
fn readme_systemd_drop_in_uses_cnids_flags_and_one_socket() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (_, _, code) = fenced(&readme)
        .into_iter()
        .find(|(_, m, _)| m.as_deref().is_some_and(|m| m.contains("drop-in")))
        .expect("the README's drop-in block");
    let help = Command::new(env!("CARGO_BIN_EXE_cnid"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let exec = code
        .lines()
        .filter_map(|l| l.strip_prefix("ExecStart="))
        .find(|l| !l.is_empty())
        .expect("an ExecStart= with a command");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert!(words[0].ends_with("/cnid"), "{exec}");
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        assert!(
            help.contains(&format!("{flag} ")),
            "cnid has no {flag}: {exec}"
        );
    }
    let socket = words
        .windows(2)
        .find(|w| w[0] == "--socket")
        .map(|w| w[1])
        .expect("--socket");
    let listen = code
        .lines()
        .filter_map(|l| l.strip_prefix("ListenStream="))
        .find(|l| !l.is_empty())
        .expect("a ListenStream= with a path");
    assert_eq!(listen, socket, "{code}");
}
