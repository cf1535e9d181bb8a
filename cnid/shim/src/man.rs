//! `cnid-shim --generate man`: the shim's man page, for `make install`.
//!
//! The other binaries print theirs from their clap definitions
//! (`cnid::generate`); the shim has none (it parses its few flags by hand
//! and builds without clap, see the module docs of [`super`]), so its page
//! is made from the usage text `cnid-shim --help` prints, the one
//! description of its command line there is. No completions: the shim is
//! run by container runtimes and once per node by `install`.

/// Prints the page for `--generate ARGS` (only `man`); returns the exit
/// status.
pub fn generate(args: &[String], usage: &str) -> i32 {
    use std::io::Write;

    if args != ["man"] {
        eprintln!("cnid-shim: --generate takes one argument: man (the shim has no completions)");
        return 2;
    }
    let page = page(usage, env!("CNID_BUILD_VERSION"));
    let mut out = std::io::stdout().lock();
    match out.write_all(page.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cnid-shim: cannot write the man page: {e}");
            1
        }
    }
}

/// The sections after the usage, as `(TITLE, text)`, set as laid out.
pub const SECTIONS: [(&str, &str); 3] = [
    (
        "ENVIRONMENT",
        "\
CNI_COMMAND      set by the runtime: the shim runs as a CNI plugin (ADD, DEL,
                 CHECK, STATUS, GC, VERSION); unset: a set-up subcommand runs
CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS
                 the attachment, handed to cnid with the call
CNI_PATH         not used: cnid runs the plugins from its own plugin dirs",
    ),
    (
        "EXIT STATUS",
        "\
As a plugin: 0 on success, 1 with the CNI error object on stdout (cnid's, or
the shim's own: code 4 for a missing variable, 11 (STATUS: 50) when cnid
cannot be reached).
Subcommands: 0 on success (health: cnid is ready), 1 on failure, 2 for a
usage error.",
    ),
    (
        "FILES",
        "\
/run/cnid/cnid.sock          cnid's socket (the list's \"socket\", --socket)
/etc/cni/net.d/00-cnid.conflist
                             the list install writes into --conf-dir (--file)
/opt/cni/bin/cnid-shim       where install copies the shim (--plugin-dir)",
    ),
];

/// The roff source of the page: NAME from the usage's first line (up to
/// its first comma), the rest verbatim (no filling) under DESCRIPTION,
/// then [`SECTIONS`].
pub fn page(usage: &str, version: &str) -> String {
    let mut lines = usage.lines();
    let first = lines.next().unwrap_or_default();
    let summary = first
        .split_once(": ")
        .map_or(first, |(_, s)| s)
        .split(" (")
        .next()
        .unwrap_or_default();
    let mut out = format!(
        ".TH cnid-shim 1 \"\" \"cnid-shim {}\"\n.SH NAME\ncnid\\-shim \\- {}\n.SH DESCRIPTION\n.nf\n",
        escape(version).replace('"', ""),
        escape(summary)
    );
    out.push_str(&escape(first));
    out.push('\n');
    for line in lines {
        out.push_str(&escape(line));
        out.push('\n');
    }
    out.push_str(".fi\n");
    for (title, body) in SECTIONS {
        // Quoted only with a space, as the clap pages (roff) do.
        if title.contains(' ') {
            out.push_str(&format!(".SH \"{title}\"\n.nf\n"));
        } else {
            out.push_str(&format!(".SH {title}\n.nf\n"));
        }
        for line in body.lines() {
            out.push_str(&escape(line));
            out.push('\n');
        }
        out.push_str(".fi\n");
    }
    out
}

/// Escapes one line of text for roff: backslashes, hyphens (which roff
/// would otherwise typeset as hyphens, not minus signs), and a leading
/// `.` or `'` (which would start a request).
fn escape(line: &str) -> String {
    let body = line.replace('\\', "\\e").replace('-', "\\-");
    if body.starts_with(['.', '\'']) {
        format!("\\&{body}")
    } else {
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_roff_with_the_usage_verbatim() {
        let page = page(
            "tool: does it (once), really\n\n  tool x --flag\n.dot\n'quote \\ back\n",
            "1.0 (commit abc)",
        );
        let lines: Vec<&str> = page.lines().collect();
        assert_eq!(
            lines[0],
            ".TH cnid-shim 1 \"\" \"cnid-shim 1.0 (commit abc)\""
        );
        assert_eq!(lines[2], "cnid\\-shim \\- does it");
        assert!(lines.contains(&"  tool x \\-\\-flag"), "{page}");
        assert!(lines.contains(&"\\&.dot"), "{page}");
        assert!(lines.contains(&"\\&'quote \\e back"), "{page}");
        // Every request line is one the page means.
        for l in lines.iter().filter(|l| l.starts_with(['.', '\''])) {
            assert!(
                [".TH", ".SH", ".nf", ".fi"]
                    .iter()
                    .any(|r| l.starts_with(r)),
                "{l}"
            );
        }
        assert_eq!(lines.last(), Some(&".fi"));
    }
}
