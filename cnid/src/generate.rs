//! Man pages and shell completions generated from the binaries' clap
//! definitions, through a hidden first argument (as ripgrep's
//! `--generate`):
//!
//! ```text
//! cnid --generate man|complete-bash|complete-zsh|complete-fish
//! cnitool --generate ...
//! ```
//!
//! `make install` runs these on the binaries it installs and writes what
//! they print under `share/man/man1`, `share/bash-completion/completions`,
//! `share/zsh/site-functions` and `share/fish/vendor_completions.d`. Output
//! generated from the definitions that parse the command line cannot drift
//! from `--help`, and is made by the very binaries that are installed.
//!
//! Why not at build time: a `build.rs` cannot see the definitions, which
//! live in the binaries' own crates. The generators are only touched under
//! `--generate`; `cnitool add`'s peak RSS is measured with them linked in
//! (BENCHMARKS.md). `cnid-shim` has no clap definitions; it prints its page
//! from its usage text (`shim::setup`).
//!
//! The flag is not part of the clap definitions (so `--help` does not
//! list it): each `main` calls [`intercept`] before parsing.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

/// The hidden flag, which must come first.
pub const FLAG: &str = "--generate";

/// What `--generate` can print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The man page (roff, section 1).
    Man,
    /// The bash completion script.
    Bash,
    /// The zsh completion script (`_NAME`).
    Zsh,
    /// The fish completion script.
    Fish,
}

impl Kind {
    /// Every kind, with the argument that asks for it.
    pub const ALL: [(&'static str, Kind); 4] = [
        ("man", Kind::Man),
        ("complete-bash", Kind::Bash),
        ("complete-zsh", Kind::Zsh),
        ("complete-fish", Kind::Fish),
    ];

    /// The kind an argument names.
    pub fn parse(arg: &str) -> Option<Kind> {
        Kind::ALL.iter().find(|(a, _)| *a == arg).map(|(_, k)| *k)
    }
}

/// Writes the man page or completion script of `cmd` to `out`.
pub fn write(cmd: clap::Command, kind: Kind, out: &mut dyn Write) -> std::io::Result<()> {
    use clap_complete::Shell;

    let shell = match kind {
        Kind::Man => return man(cmd, out),
        Kind::Bash => Shell::Bash,
        Kind::Zsh => Shell::Zsh,
        Kind::Fish => Shell::Fish,
    };
    // Completions are for the command's own name: clap_complete cannot
    // take a `bin_name` with a space.
    let bin = cmd.get_name().to_owned();
    let mut cmd = cmd.bin_name(&bin);
    clap_complete::generate(shell, &mut cmd, bin, out);
    Ok(())
}

/// The man page: clap_mangen's title, name, synopsis, description and
/// options, then (in place of its list of `NAME-SUB(1)` pages, which are
/// not installed) a COMMANDS section with each subcommand's usage, about
/// and arguments, then the text after the help (an `Environment:` block
/// becomes the ENVIRONMENT section, kept as laid out), then the version.
fn man(mut cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    use clap_mangen::roff::{Roff, bold, italic, roman};

    cmd.build();
    let page = clap_mangen::Man::new(cmd.clone());
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;
    page.render_options_section(out)?;
    let mut roff = Roff::new();
    let subs: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        roff.control("SH", ["COMMANDS"]);
    }
    for sub in subs {
        let usage = sub.clone().render_usage().to_string();
        roff.control("TP", []);
        roff.text([bold(usage.strip_prefix("Usage: ").unwrap_or(&usage))]);
        if let Some(about) = sub.get_long_about().or_else(|| sub.get_about()) {
            roff.text([roman(about.to_string())]);
        }
        let args = sub
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !a.is_global_set() && a.get_id() != "help");
        for arg in args {
            let values = (arg.get_action().takes_values())
                .then(|| arg.get_value_names())
                .flatten()
                .map(|v| {
                    v.iter()
                        .map(|n| format!("<{n}>"))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            let name = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("-{s}, --{l} {values}"),
                (None, Some(l)) => format!("--{l} {values}"),
                (Some(s), None) => format!("-{s} {values}"),
                (None, None) => values,
            };
            roff.control("RS", []);
            roff.control("TP", []);
            roff.text([italic(name.trim_end())]);
            if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
                roff.text([roman(help.to_string())]);
            }
            roff.control("RE", []);
        }
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        let text = after.to_string();
        let (title, body) = match text.split_once('\n') {
            Some(("Environment:", rest)) => ("ENVIRONMENT", rest),
            _ => ("NOTES", text.as_str()),
        };
        roff.control("SH", [title]);
        roff.control("nf", []);
        for line in body.lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
    }
    roff.to_writer(out)?;
    match cmd.get_version() {
        Some(_) => page.render_version_section(out),
        None => Ok(()),
    }
}

/// When the process was started as `NAME --generate KIND`, prints what
/// `KIND` names for the definitions `cmd` builds and returns the exit
/// status; `None` otherwise (parse the command line as usual).
pub fn intercept(cmd: impl FnOnce() -> clap::Command) -> Option<ExitCode> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first()? != FLAG {
        return None;
    }
    let kinds = Kind::ALL.map(|(a, _)| a).join("|");
    let kind = match args.get(1).and_then(|a| a.to_str()) {
        Some(arg) if args.len() == 2 => Kind::parse(arg),
        _ => None,
    };
    let Some(kind) = kind else {
        eprintln!("{FLAG} takes one argument: {kinds}");
        return Some(ExitCode::from(2));
    };
    let cmd = cmd();
    let name = cmd.get_name().to_owned();
    let mut out = Vec::new();
    let done = write(cmd, kind, &mut out).and_then(|()| {
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&out)?;
        stdout.flush()
    });
    Some(match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: cannot write the {FLAG} output: {e}");
            ExitCode::FAILURE
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> clap::Command {
        clap::Command::new("tool")
            .about("does things")
            .after_help("Environment:\n  X  an env var")
            .arg(clap::Arg::new("verbose").long("verbose").num_args(0))
            .subcommand(clap::Command::new("add").about("adds"))
    }

    fn text(kind: Kind) -> String {
        let mut out = Vec::new();
        write(sample(), kind, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_kind_names_the_command_and_its_parts() {
        let man = text(Kind::Man);
        assert!(man.contains(".TH tool 1"), "{man}");
        assert!(man.contains("verbose") && man.contains("add"), "{man}");
        assert!(
            man.contains(".SH COMMANDS") && man.contains("tool add"),
            "{man}"
        );
        assert!(
            man.contains(".SH ENVIRONMENT\n.nf\n  X  an env var\n.fi"),
            "{man}"
        );
        assert!(!man.contains("tool-add(1)"), "{man}");
        for kind in [Kind::Bash, Kind::Zsh, Kind::Fish] {
            let script = text(kind);
            assert!(script.contains("tool"), "{kind:?}: {script}");
            assert!(script.contains("verbose"), "{kind:?}: {script}");
            assert!(script.contains("add"), "{kind:?}: {script}");
        }
        assert!(text(Kind::Zsh).starts_with("#compdef tool"));
    }

    #[test]
    fn kinds_parse_by_their_argument_only() {
        for (arg, kind) in Kind::ALL {
            assert_eq!(Kind::parse(arg), Some(kind));
        }
        assert_eq!(Kind::parse("bash"), None);
        assert_eq!(Kind::parse(""), None);
    }
}
