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
//! they print under `share/man/man1` (cnid: `man8`), `share/bash-completion/completions`,
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

/// What a binary's man page and completions say beyond its clap
/// definitions.
#[derive(Debug, Clone, Copy)]
pub struct Extras {
    /// The manual section: `"1"` (user commands) or `"8"` (daemons).
    pub section: &'static str,
    /// Sections after the ones made from the definitions, in order, as
    /// `(TITLE, text)`; the text is set as laid out (EXIT STATUS, FILES,
    /// SIGNALS, and ENVIRONMENT when the help has no `Environment:` block).
    pub sections: &'static [(&'static str, &'static str)],
    /// Bash lines appended to the generated completion script: what clap
    /// cannot complete (cnitool's network names), as a function that
    /// replaces the generated one's `complete -F` and calls it for the rest.
    pub bash: &'static str,
}

/// Writes the man page or completion script of `cmd` to `out`.
pub fn write(
    cmd: clap::Command,
    kind: Kind,
    extras: &Extras,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    use clap_complete::Shell;

    let shell = match kind {
        Kind::Man => return man(cmd, extras, out),
        Kind::Bash => Shell::Bash,
        Kind::Zsh => Shell::Zsh,
        Kind::Fish => Shell::Fish,
    };
    // Completions are for the command's own name: clap_complete cannot
    // take a `bin_name` with a space.
    let bin = cmd.get_name().to_owned();
    let mut cmd = cmd.bin_name(&bin);
    clap_complete::generate(shell, &mut cmd, bin, out);
    if kind == Kind::Bash && !extras.bash.is_empty() {
        out.write_all(b"\n")?;
        out.write_all(extras.bash.as_bytes())?;
    }
    Ok(())
}

/// The man page: clap_mangen's title (in `extras.section`), name,
/// synopsis, description and options, then (in place of its list of
/// `NAME-SUB(1)` pages, which are not installed) a COMMANDS section with
/// each subcommand's usage, about and arguments, and those of its own
/// subcommands (`cnitool batch up`), then the text after the help (an
/// `Environment:` block becomes the ENVIRONMENT section, kept as laid
/// out), then the `extras` sections, then the version.
fn man(mut cmd: clap::Command, extras: &Extras, out: &mut dyn Write) -> std::io::Result<()> {
    use clap_mangen::roff::Roff;

    cmd.build();
    let page = clap_mangen::Man::new(cmd.clone()).section(extras.section);
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;
    page.render_options_section(out)?;
    let mut roff = Roff::new();
    if visible_subcommands(&cmd).next().is_some() {
        roff.control("SH", ["COMMANDS"]);
    }
    for sub in visible_subcommands(&cmd) {
        command_entry(&mut roff, sub);
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        let text = after.to_string();
        let (title, body) = match text.split_once('\n') {
            Some(("Environment:", rest)) => ("ENVIRONMENT", rest),
            _ => ("NOTES", text.as_str()),
        };
        verbatim_section(&mut roff, title, body);
    }
    for (title, body) in extras.sections {
        verbatim_section(&mut roff, title, body);
    }
    roff.to_writer(out)?;
    match cmd.get_version() {
        Some(_) => page.render_version_section(out),
        None => Ok(()),
    }
}

fn visible_subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// A section whose text is set as laid out.
fn verbatim_section(roff: &mut clap_mangen::roff::Roff, title: &str, body: &str) {
    use clap_mangen::roff::roman;

    roff.control("SH", [title]);
    roff.control("nf", []);
    for line in body.lines() {
        roff.text([roman(line)]);
    }
    roff.control("fi", []);
}

/// One subcommand of COMMANDS: its usage, about and arguments; then, for
/// a command with commands of its own, each of those, and the paragraphs
/// of its after-help other than its environment (said once, in
/// ENVIRONMENT).
fn command_entry(roff: &mut clap_mangen::roff::Roff, sub: &clap::Command) {
    use clap_mangen::roff::{bold, italic, roman};

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
    for nested in visible_subcommands(sub) {
        command_entry(roff, nested);
    }
    if visible_subcommands(sub).next().is_some()
        && let Some(after) = sub.get_after_long_help().or_else(|| sub.get_after_help())
    {
        let text = after.to_string();
        for para in text.split("\n\n") {
            if !para.starts_with("Environment") {
                roff.control("IP", []);
                roff.text([roman(para.split_whitespace().collect::<Vec<_>>().join(" "))]);
            }
        }
    }
}

/// When the process was started as `NAME --generate KIND`, prints what
/// `KIND` names for the definitions `cmd` builds and returns the exit
/// status; `None` otherwise (parse the command line as usual).
pub fn intercept(cmd: impl FnOnce() -> clap::Command, extras: &Extras) -> Option<ExitCode> {
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
    let done = write(cmd, kind, extras, &mut out).and_then(|()| {
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

    const PLAIN: Extras = Extras {
        section: "1",
        sections: &[],
        bash: "",
    };

    fn text(kind: Kind) -> String {
        text_with(sample(), kind, &PLAIN)
    }

    fn text_with(cmd: clap::Command, kind: Kind, extras: &Extras) -> String {
        let mut out = Vec::new();
        write(cmd, kind, extras, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn extras_set_the_section_add_sections_and_extend_bash_only() {
        let extras = Extras {
            section: "8",
            sections: &[
                ("EXIT STATUS", "0  fine\n1  not"),
                ("SIGNALS", "SIGHUP  reload"),
            ],
            bash: "complete -F _tool_more tool\n",
        };
        let man = text_with(sample(), Kind::Man, &extras);
        assert!(man.contains(".TH tool 8"), "{man}");
        let env = man.find(".SH ENVIRONMENT").unwrap();
        let exit = man
            .find(".SH \"EXIT STATUS\"\n.nf\n0  fine\n1  not\n.fi")
            .unwrap();
        let signals = man.find(".SH SIGNALS").unwrap();
        assert!(env < exit && exit < signals, "{man}");
        let bash = text_with(sample(), Kind::Bash, &extras);
        assert!(bash.ends_with("\ncomplete -F _tool_more tool\n"), "{bash}");
        for kind in [Kind::Zsh, Kind::Fish] {
            assert!(!text_with(sample(), kind, &extras).contains("_tool_more"));
        }
    }

    #[test]
    fn a_command_with_commands_documents_each_of_them() {
        let cmd = clap::Command::new("tool").subcommand(
            clap::Command::new("batch")
                .about("many at once")
                .after_help("Environment (as for tool):\n  X  x\n\nNames are\nP0, P1.")
                .subcommand(
                    clap::Command::new("up")
                        .about("sets up")
                        .arg(clap::Arg::new("count").long("count").value_name("N")),
                )
                .subcommand(clap::Command::new("down").about("tears down")),
        );
        let man = text_with(cmd, Kind::Man, &PLAIN);
        for part in [
            "tool batch up",
            "sets up",
            "\\-\\-count <N>",
            "tool batch down",
            "tears down",
            "Names are P0, P1.",
        ] {
            assert!(man.contains(part), "no {part:?}: {man}");
        }
        assert!(!man.contains("as for tool"), "{man}");
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
