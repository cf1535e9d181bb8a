//! Validation of the names and IDs that end up in plugin environments and
//! cache file paths.
//!
//! libcni validates these on ADD only; we validate on every verb, so no cache
//! path built from them can leave the cache dir (spec-digest 10.7).
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

use crate::error::{Error, code};

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
/// environment variable or file name can hold).
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
    Ok(())
}

/// Checks a plugin `type`: non-empty, no path separator, not `.` or `..`,
/// no NUL (code 7). The type is a file name looked up in the plugin dirs,
/// never a path.
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

    #[test]
    fn plugin_types() {
        plugin_type("bridge").unwrap();
        plugin_type("host-local").unwrap();
        for bad in ["", "/usr/bin/x", "../bridge", "a\\b", ".", "..", "a\0b"] {
            assert!(plugin_type(bad).is_err(), "{bad:?}");
        }
    }
}
