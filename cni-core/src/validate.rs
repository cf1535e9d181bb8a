//! Validation of the names and IDs that end up in plugin environments and
//! cache file paths.
//!
//! libcni validates these on ADD only; we validate on every verb, so no cache
//! path built from them can leave the cache dir (`docs/decisions.md` D7).
//!
//! ```
//! use cni_core::validate;
//!
//! assert!(validate::container_id("3f9a-c0ffee_01").is_ok());
//! assert_eq!(validate::container_id("../etc").unwrap_err().code(), 4);
//! assert_eq!(validate::container_id("").unwrap_err().code(), 3);
//! assert!(validate::interface_name("eth0").is_ok());
//! assert!(validate::interface_name("a-very-long-ifname").is_err());
//! ```

use std::fmt;

use crate::error::{Error, code};

/// Whether `c` cannot be shown as itself in a log line or on a terminal: a
/// control character (C0 such as NUL, TAB, LF or ESC; DEL; C1 such as CSI)
/// or an invisible formatting character (Unicode category Cf: soft hyphen,
/// zero-width characters, bidirectional overrides and isolates, the byte
/// order mark, tags, ...), or a line or paragraph separator.
///
/// Names and paths holding one are refused by the validators of this
/// module: written raw into a log they can rewrite the terminal (ESC
/// sequences) or hide what the line says (bidirectional overrides).
///
/// ```
/// use cni_core::validate::is_unprintable;
///
/// assert!(is_unprintable('\u{1b}'));
/// assert!(is_unprintable('\u{202e}'));
/// assert!(!is_unprintable('é'));
/// assert!(!is_unprintable(' '));
/// ```
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c,
            // Cf (Unicode 15.1), and the separators Zl and Zp.
            '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}')
}

/// Displays a value with every [unprintable](is_unprintable) character
/// escaped as `\u{..}`; everything else (spaces, quotes, non-ASCII letters)
/// as it is. For log fields and messages that carry outside text: request
/// values, plugin output, error messages quoting either.
///
/// ```
/// use cni_core::validate::Escaped;
///
/// assert_eq!(Escaped("\u{1b}[31mred").to_string(), "\\u{1b}[31mred");
/// assert_eq!(Escaped(format_args!("a {}", "b\n")).to_string(), "a b\\u{a}");
/// assert_eq!(Escaped("plain é").to_string(), "plain é");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Escaping<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escaping<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let mut rest = s;
                while let Some((i, c)) = rest.char_indices().find(|(_, c)| is_unprintable(*c)) {
                    self.0.write_str(&rest[..i])?;
                    write!(self.0, "{}", c.escape_unicode())?;
                    rest = &rest[i + c.len_utf8()..];
                }
                self.0.write_str(rest)
            }
        }
        fmt::write(&mut Escaping(f), format_args!("{}", self.0))
    }
}

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
pub const MAX_INTERFACE_NAME_LEN: usize = 15;

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the pattern for container IDs and network names.
fn is_valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn invalid(field: &'static str, value: &str, reason: &str, code: u32) -> Error {
    Error::InvalidParameter {
        field,
        value: value.to_owned(),
        reason: reason.to_owned(),
        code,
    }
}

/// Checks a container ID: non-empty (code 3), and matching
/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$` (code 4).
pub fn container_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(invalid(
            "container ID",
            id,
            "missing container ID",
            code::UNKNOWN_CONTAINER,
        ));
    }
    if !is_valid_name(id) {
        return Err(invalid(
            "container ID",
            id,
            "invalid characters (allowed: letters, digits, '_', '.', '-', starting with a letter or digit)",
            code::INVALID_ENVIRONMENT_VARIABLES,
        ));
    }
    Ok(())
}

/// Checks a network name: non-empty and matching the container ID pattern (code 7).
pub fn network_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(invalid(
            "network name",
            name,
            "missing network name",
            code::INVALID_NETWORK_CONFIG,
        ));
    }
    if !is_valid_name(name) {
        return Err(invalid(
            "network name",
            name,
            "invalid characters (allowed: letters, digits, '_', '.', '-', starting with a letter or digit)",
            code::INVALID_NETWORK_CONFIG,
        ));
    }
    Ok(())
}

/// Checks an interface name (code 4): non-empty, at most 15 bytes, not `.`
/// or `..`, and without `/`, `:`, whitespace or NUL (which no kernel name,
/// environment variable or file name can hold), nor any other control or
/// [unprintable](is_unprintable) character (ESC and friends would reach
/// logs and terminals).
pub fn interface_name(name: &str) -> Result<(), Error> {
    let bad = |reason: &str| {
        invalid(
            "interface name",
            name,
            reason,
            code::INVALID_ENVIRONMENT_VARIABLES,
        )
    };
    if name.is_empty() {
        return Err(bad("interface name is empty"));
    }
    if name.len() > MAX_INTERFACE_NAME_LEN {
        return Err(bad("interface name is longer than 15 bytes"));
    }
    if name == "." || name == ".." {
        return Err(bad("interface name is . or .."));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace())
    {
        return Err(bad("interface name contains '/', ':', NUL or whitespace"));
    }
    if name.chars().any(is_unprintable) {
        return Err(bad(UNPRINTABLE));
    }
    Ok(())
}

/// The reason given for a value holding an [unprintable](is_unprintable)
/// character.
pub(crate) const UNPRINTABLE: &str = "contains a control or other non-printable character";

/// Checks a plugin `type`: non-empty, no path separator, not `.` or `..`,
/// no NUL nor other [unprintable](is_unprintable) character (code 7). The
/// type is a file name looked up in the plugin dirs, never a path.
pub fn plugin_type(ty: &str) -> Result<(), Error> {
    let bad = |reason: &str| invalid("plugin type", ty, reason, code::INVALID_NETWORK_CONFIG);
    if ty.is_empty() {
        return Err(bad("plugin type is empty"));
    }
    if ty.contains('/') || ty.contains('\\') {
        return Err(bad("plugin type must not contain a path separator"));
    }
    if ty == "." || ty == ".." {
        return Err(bad("plugin type is . or .."));
    }
    if ty.contains('\0') {
        return Err(bad("plugin type contains NUL"));
    }
    if ty.chars().any(is_unprintable) {
        return Err(bad(UNPRINTABLE));
    }
    Ok(())
}

/// Checks a netns path as every verb needs it (code 4): valid UTF-8 (no
/// U+FFFD, which stands for bytes that were not), no NUL, no other
/// [unprintable](is_unprintable) character. The empty path (DEL of a
/// namespace that is gone) passes; whether the path is absolute and names a
/// network namespace is the caller's check (`cni_async` has one).
pub fn netns_path(path: &str) -> Result<(), Error> {
    let bad = |reason: &str| {
        invalid(
            "netns path",
            path,
            reason,
            code::INVALID_ENVIRONMENT_VARIABLES,
        )
    };
    if path.contains(char::REPLACEMENT_CHARACTER) {
        // What `RuntimeConf::new` stores for a path that is not UTF-8.
        return Err(bad(
            "not valid UTF-8 (CNI_NETNS reaches plugins as a string; use a UTF-8 path)",
        ));
    }
    if path.contains('\0') {
        return Err(bad("contains NUL"));
    }
    if path.chars().any(is_unprintable) {
        return Err(bad(UNPRINTABLE));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids() {
        for ok in ["a", "0", "abc-DEF_1.2", "cnitool-0123456789abcdef0123"] {
            container_id(ok).unwrap();
        }
        assert_eq!(container_id("").unwrap_err().code(), 3);
        for bad in [
            "-a", "_a", ".a", "a/b", "../x", "a b", "a:b", "é", "a\n", "a\0",
        ] {
            let e = container_id(bad).unwrap_err();
            assert_eq!(e.code(), 4, "{bad:?}");
            assert!(e.to_string().contains("container ID"), "{e}");
        }
    }

    #[test]
    fn network_names() {
        network_name("my-net.1_x").unwrap();
        assert_eq!(network_name("").unwrap_err().code(), 7);
        assert_eq!(network_name("a/b").unwrap_err().code(), 7);
        assert_eq!(network_name("..").unwrap_err().code(), 7);
    }

    #[test]
    fn interface_names() {
        for ok in ["eth0", "a", "123456789012345", "net1.100", "veth-é"] {
            interface_name(ok).unwrap();
        }
        for bad in [
            "",
            "1234567890123456",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "a\u{a0}b",
        ] {
            assert_eq!(interface_name(bad).unwrap_err().code(), 4, "{bad:?}");
        }
    }

    #[test]
    fn interface_name_with_nul_is_refused() {
        // Found by the cni_args fuzz target: NUL passed, and would have made
        // the CNI_IFNAME variable and the cache file path unusable.
        for bad in ["a\0b", "\0", "eth0\0"] {
            let e = interface_name(bad).unwrap_err();
            assert_eq!(e.code(), 4, "{bad:?}");
            assert!(e.to_string().contains("NUL"), "{e}");
        }
    }

    /// One character of each class [`is_unprintable`] covers, and a
    /// printable neighbour of each that must pass.
    const UNPRINTABLES: [char; 16] = [
        '\u{1}',
        '\u{7}',
        '\u{8}',
        '\u{1b}',
        '\u{1f}', // C0: SOH, BEL, BS, ESC, US
        '\u{7f}', // DEL
        '\u{80}',
        '\u{85}',
        '\u{9b}',
        '\u{9f}', // C1: PAD, NEL, CSI, APC
        '\u{ad}',
        '\u{200b}',
        '\u{202e}',
        '\u{2066}',
        '\u{feff}',  // Cf
        '\u{e0041}', // Cf: tag
    ];

    #[test]
    fn unprintable_classes() {
        for c in UNPRINTABLES {
            assert!(is_unprintable(c), "{c:?}");
        }
        for c in ['\u{2028}', '\u{2029}', '\n', '\t', '\r', '\0'] {
            assert!(is_unprintable(c), "{c:?}");
        }
        for c in [
            ' ', 'a', '~', 'é', '\u{a0}', '\u{2010}', '\u{3000}', '中', '🙂',
        ] {
            assert!(!is_unprintable(c), "{c:?}");
        }
    }

    #[test]
    fn escaped_shows_unprintables_as_escapes() {
        assert_eq!(Escaped("eth0").to_string(), "eth0");
        assert_eq!(
            Escaped("\u{1b}[31mX\u{7f}\u{9b}\u{202e}é").to_string(),
            "\\u{1b}[31mX\\u{7f}\\u{9b}\\u{202e}é"
        );
        assert_eq!(Escaped("a\nb\r\tc").to_string(), "a\\u{a}b\\u{d}\\u{9}c");
        // Any Display, written in pieces.
        let e = invalid("interface name", "\u{1b}x", "reason \u{1b}", 4);
        assert_eq!(
            Escaped(&e).to_string(),
            "invalid interface name \"\\u{1b}x\": reason \\u{1b}"
        );
        for c in UNPRINTABLES {
            assert!(!Escaped(format!("a{c}b")).to_string().contains(c), "{c:?}");
        }
    }

    /// Every validated name refuses every class of control character and
    /// names the field; the value in the message is escaped.
    #[test]
    fn control_characters_are_refused_everywhere() {
        for c in UNPRINTABLES.into_iter().chain(['\u{2028}']) {
            let value = format!("a{c}b");
            type Check = fn(&str) -> Result<(), Error>;
            let checks: [(&str, Check, u32); 5] = [
                ("interface name", interface_name, 4),
                ("container ID", container_id, 4),
                ("network name", network_name, 7),
                ("plugin type", plugin_type, 7),
                ("netns path", netns_path, 4),
            ];
            for (field, check, code) in checks {
                let e = check(&value).unwrap_err();
                assert_eq!(e.code(), code, "{field} {value:?}");
                let msg = e.to_string();
                assert!(msg.starts_with(&format!("invalid {field} ")), "{msg}");
                assert!(!msg.contains(c), "{field}: raw {c:?} in {msg:?}");
                assert!(
                    msg.contains(&format!("{value:?}")),
                    "{field}: value not shown escaped in {msg:?}"
                );
            }
        }
        // The reported case.
        let e = interface_name("\u{1b}[31mX").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid interface name \"\\u{1b}[31mX\": contains a control or other non-printable character"
        );
        netns_path("").unwrap();
        netns_path("/run/netns/with space-é").unwrap();
    }

    #[test]
    fn plugin_types() {
        plugin_type("bridge").unwrap();
        plugin_type("host-local").unwrap();
        for bad in ["", "/usr/bin/x", "../bridge", "a\\b", ".", "..", "a\0b"] {
            assert!(plugin_type(bad).is_err(), "{bad:?}");
        }
    }
}
