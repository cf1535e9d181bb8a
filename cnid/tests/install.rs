//! `make install` and `make uninstall` into a temp DESTDIR, with the
//! binaries this test run built (`INSTALL_FROM`, the target dir; `make
//! install` without it builds the release binaries first): the exact file
//! set (no benchmark plugin, no example, no test binary), systemd units
//! that start the installed cnid, man pages groff reads without a warning,
//! completion scripts each shell would load, a warning for dynamically
//! linked binaries, and an uninstall that removes every file and the dirs
//! install created.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root (the Makefile's dir).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cnid is inside the workspace")
        .to_path_buf()
}

/// The dir with the binaries of this build (target/debug).
fn built() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_cnid"))
        .parent()
        .expect("a binary has a dir")
        .to_path_buf()
}

fn make(args: &[&str]) -> Output {
    let out = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(root())
        .args(args)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .expect("make runs");
    assert!(
        out.status.success(),
        "make {args:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let rel = path.strip_prefix(base).unwrap();
                out.insert(format!("/{}", rel.display()));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The man pages and their sections (cnid is a daemon: 8).
const MAN_PAGES: [(&str, &str); 3] = [("cnid", "8"), ("cnitool", "1"), ("cnid-shim", "1")];

/// What `make install PREFIX=prefix` installs.
fn expected(prefix: &str) -> BTreeSet<String> {
    let mut want = BTreeSet::new();
    for b in ["cnid", "cnitool", "cnid-shim"] {
        want.insert(format!("{prefix}/bin/{b}"));
    }
    for (m, section) in MAN_PAGES {
        want.insert(format!("{prefix}/share/man/man{section}/{m}.{section}"));
    }
    for c in ["cnid", "cnitool"] {
        want.insert(format!("{prefix}/share/bash-completion/completions/{c}"));
        want.insert(format!("{prefix}/share/zsh/site-functions/_{c}"));
        want.insert(format!("{prefix}/share/fish/vendor_completions.d/{c}.fish"));
    }
    for u in ["cnid.service", "cnid.socket"] {
        want.insert(format!("{prefix}/lib/systemd/system/{u}"));
    }
    for d in ["API.md", "LICENSE", "installed-dirs"] {
        want.insert(format!("{prefix}/share/doc/cnid/{d}"));
    }
    want
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every dir under `dir`, relative to it.
fn dirs(dir: &Path) -> BTreeSet<String> {
    walkdir(dir)
        .into_iter()
        .filter(|p| dir.join(p.trim_start_matches('/')).is_dir())
        .collect()
}

/// Every path (file or dir) under `dir`, relative to it.
fn walkdir(dir: &Path) -> BTreeSet<String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            out.insert(format!("/{}", path.strip_prefix(base).unwrap().display()));
            if path.is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

fn install_and_uninstall(prefix: &str) {
    let dest = tempfile::tempdir().unwrap();
    let dest_arg = format!("DESTDIR={}", dest.path().display());
    let prefix_arg = format!("PREFIX={prefix}");
    let from_arg = format!("INSTALL_FROM={}", built().display());
    let out = make(&["install", &dest_arg, &prefix_arg, &from_arg]);
    let at = |p: &str| dest.path().join(p.trim_start_matches('/'));

    // The debug build's cnitool and cnid-shim are dynamically linked,
    // where the README promises static ones: said.
    let stderr = String::from_utf8_lossy(&out.stderr);
    for b in ["cnitool", "cnid-shim"] {
        let said = format!("{}/{b} is dynamically linked", built().display());
        assert!(stderr.contains(&said), "no warning {said:?} in: {stderr}");
    }

    // The file set, exactly: nothing else (cni-noop, the examples' and the
    // tests' binaries are in the same target dir).
    let got = files(dest.path());
    pretty_assertions::assert_eq!(got, expected(prefix));
    assert!(
        built().join("cni-noop").is_file(),
        "the benchmark plugin was there to leave out"
    );

    // The binaries run and are the ones built.
    for b in ["cnid", "cnitool", "cnid-shim"] {
        let path = at(&format!("{prefix}/bin/{b}"));
        let out = Command::new(&path).arg("--version").output().unwrap();
        assert!(out.status.success(), "{b} --version: {out:?}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            std::fs::read(built().join(b)).unwrap(),
            "{b} is not the built binary"
        );
    }

    // The service starts the installed cnid and points at the installed
    // docs; the socket unit is the one the service requires.
    let service = read(&at(&format!("{prefix}/lib/systemd/system/cnid.service")));
    let exec = service
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("cnid.service has ExecStart=");
    let program = exec.split_whitespace().next().unwrap();
    assert_eq!(program, format!("{prefix}/bin/cnid"), "{service}");
    assert!(at(program).is_file());
    assert!(service.contains("Requires=cnid.socket"), "{service}");
    for unit in ["cnid.service", "cnid.socket"] {
        let text = read(&at(&format!("{prefix}/lib/systemd/system/{unit}")));
        for doc in text
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation=file://"))
        {
            assert!(at(doc).is_file(), "{unit}: {doc} is not installed");
        }
    }

    // Man pages: roff with a title in their section, the sections an
    // operator looks for, readable by groff without a warning when groff
    // is there.
    let groff = Command::new("groff").arg("--version").output().is_ok();
    for (m, section) in MAN_PAGES {
        let path = at(&format!("{prefix}/share/man/man{section}/{m}.{section}"));
        let page = read(&path);
        assert!(
            page.lines()
                .any(|l| l.starts_with(&format!(".TH {m} {section}"))),
            "{m}.{section} has no .TH: {page}"
        );
        let mut sections = vec![
            ".SH NAME",
            ".SH \"EXIT STATUS\"",
            ".SH FILES",
            ".SH ENVIRONMENT",
        ];
        if m == "cnid" {
            sections.push(".SH SIGNALS");
        }
        for s in sections {
            assert!(page.contains(s), "{m}.{section} lacks {s}: {page}");
        }
        if groff {
            let out = Command::new("groff")
                .args(["-man", "-Tutf8", "-ww", "-z"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "groff on {m}.{section}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let cnitool_man = read(&at(&format!("{prefix}/share/man/man1/cnitool.1")));
    assert!(
        !cnitool_man.contains("batch \\-\\-help"),
        "batch is not left to --help"
    );
    // batch documented on the page, its commands and their options.
    for part in [
        ".SH COMMANDS",
        "cnitool add",
        ".SH ENVIRONMENT",
        "NETCONFPATH",
        "cnitool batch up",
        "cnitool batch down",
        "\\-\\-count",
        "Namespaces are /run/netns/PREFIX0",
    ] {
        assert!(cnitool_man.contains(part), "cnitool.1 lacks {part:?}");
    }
    assert!(!cnitool_man.contains("generate"), "the flag is hidden");

    // Completions: bash parses the script; zsh and fish scripts are for
    // their command and know its subcommands.
    for c in ["cnid", "cnitool"] {
        let bash = at(&format!("{prefix}/share/bash-completion/completions/{c}"));
        let out = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
        assert!(out.status.success(), "bash -n {c}: {out:?}");
        assert!(read(&bash).contains(&format!("complete -F _{c}")));
        let zsh = read(&at(&format!("{prefix}/share/zsh/site-functions/_{c}")));
        assert!(zsh.starts_with(&format!("#compdef {c}")), "{zsh}");
        let fish = read(&at(&format!(
            "{prefix}/share/fish/vendor_completions.d/{c}.fish"
        )));
        assert!(fish.contains(&format!("complete -c {c}")), "{fish}");
    }
    let fish = read(&at(&format!(
        "{prefix}/share/fish/vendor_completions.d/cnitool.fish"
    )));
    for sub in ["add", "check", "del", "gc", "status", "networks", "batch"] {
        assert!(fish.contains(&format!("-a \"{sub}\"")), "no {sub}: {fish}");
    }

    // Bash completes network names (the installed cnitool's `networks` on
    // NETCONFPATH) where a command takes one, subcommands as before.
    let bash = at(&format!(
        "{prefix}/share/bash-completion/completions/cnitool"
    ));
    let complete = |words: &str| complete_bash(&bash, &at(&format!("{prefix}/bin")), words);
    assert_eq!(complete("cnitool add cnirs-b"), ["cnirs-bridge"]);
    assert_eq!(
        complete("cnitool -i eth1 del ''"),
        ["cnirs-bridge", "cnirs-ptp"]
    );
    assert_eq!(complete("cnitool batch up cnirs-p"), ["cnirs-ptp"]);
    assert_eq!(complete("cnitool ba"), ["batch"]);

    // Uninstall removes every file and every dir install created: nothing
    // is left under DESTDIR.
    make(&["uninstall", &dest_arg, &prefix_arg]);
    let left = walkdir(dest.path());
    assert!(left.is_empty(), "left after uninstall: {left:?}");
}

/// What bash's completion of cnitool offers for the command line `words`
/// (the last word is the one completed), with `bin` first on PATH and the
/// bundled networks as NETCONFPATH.
fn complete_bash(script: &Path, bin: &Path, words: &str) -> Vec<String> {
    let program = format!(
        "source \"$1\"\nCOMP_WORDS=({words})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n\
         _cnitool_networks cnitool \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", &program, "complete", &script.to_string_lossy()])
        .env("PATH", path)
        .env("NETCONFPATH", root().join("examples/net.d"))
        .env_remove("CNID_SOCKET")
        .output()
        .unwrap();
    assert!(out.status.success(), "completing {words:?}: {out:?}");
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    got.sort();
    got
}

/// Dirs that were there before install (the system's, another package's)
/// stay after uninstall, empty or not; the ones install made go, also
/// after a second install over the first.
#[test]
fn uninstall_removes_the_dirs_install_created_and_keeps_the_others() {
    let dest = tempfile::tempdir().unwrap();
    let dest_arg = format!("DESTDIR={}", dest.path().display());
    let from_arg = format!("INSTALL_FROM={}", built().display());
    let at = |p: &str| dest.path().join(p.trim_start_matches('/'));
    std::fs::create_dir_all(at("/usr/bin")).unwrap();
    std::fs::create_dir_all(at("/usr/share/man")).unwrap();
    std::fs::write(at("/usr/share/man/another-page"), "").unwrap();
    let before = walkdir(dest.path());
    make(&["install", &dest_arg, "PREFIX=/usr", &from_arg]);
    make(&["install", &dest_arg, "PREFIX=/usr", &from_arg]);
    assert!(dirs(dest.path()).contains("/usr/share/zsh/site-functions"));
    make(&["uninstall", &dest_arg, "PREFIX=/usr"]);
    pretty_assertions::assert_eq!(walkdir(dest.path()), before);
}

#[test]
fn install_puts_the_shipped_files_under_the_prefix_and_uninstall_removes_them() {
    install_and_uninstall("/usr");
}

#[test]
fn the_service_starts_cnid_where_another_prefix_put_it() {
    install_and_uninstall("/opt/cnirs");
}

#[test]
fn the_hidden_generate_flag_refuses_unknown_kinds_and_is_not_in_help() {
    for b in ["cnid", "cnitool"] {
        let path = built().join(b);
        let out = Command::new(&path)
            .args(["--generate", "pdf"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{b}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("man|complete-bash"),
            "{b}: {out:?}"
        );
        let help = Command::new(&path).arg("--help").output().unwrap();
        assert!(
            !String::from_utf8_lossy(&help.stdout).contains("generate"),
            "{b} --help lists --generate"
        );
    }
    let shim = Command::new(built().join("cnid-shim"))
        .args(["--generate", "complete-bash"])
        .output()
        .unwrap();
    assert_eq!(shim.status.code(), Some(2), "{shim:?}");
}

/// `make install` builds with two cargo runs, not three: cnid (dynamic),
/// then cnitool and cnid-shim statically linked in one build (as separate
/// builds, each package's feature set compiled the shared dependencies
/// again). `make -n` prints the commands without running them.
#[test]
fn install_builds_the_static_binaries_in_one_cargo_build() {
    let out = make(&["-n", "install-build"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let builds: Vec<&str> = text.lines().filter(|l| l.contains(" build ")).collect();
    assert_eq!(builds.len(), 2, "{text}");
    assert!(
        builds[0].contains("--bin cnid") && !builds[0].contains("crt-static"),
        "{text}"
    );
    assert!(
        builds[1].contains("crt-static")
            && builds[1].contains("--bin cnitool")
            && builds[1].contains("--bin cnid-shim"),
        "{text}"
    );
    assert!(!text.contains("make"), "no recursive build: {text}");
    // With INSTALL_FROM nothing is built.
    let out = make(&["-n", "install-build", "INSTALL_FROM=/nonexistent"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
}

/// `make help` lists every target of the Makefile's .PHONY lists, each with
/// what it does.
#[test]
fn make_help_lists_every_target() {
    let makefile = read(&root().join("Makefile"));
    let phony: BTreeSet<&str> = makefile
        .lines()
        .filter_map(|l| l.strip_prefix(".PHONY:"))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        phony.contains("install") && phony.contains("help"),
        "{phony:?}"
    );
    let out = make(&["help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: BTreeSet<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(listed, phony, "{text}");
    for line in text.lines().skip(1) {
        assert!(
            line.split_whitespace().count() > 1,
            "no description: {line:?}"
        );
    }
}
