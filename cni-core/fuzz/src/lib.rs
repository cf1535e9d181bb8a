//! Helpers shared by the fuzz targets in `fuzz_targets/`.
//!
//! Every target takes raw bytes. Targets that need several strings split the
//! input into lines (`\n`), so the seed corpus stays plain text.

use std::borrow::Cow;

/// The input as text (invalid UTF-8 replaced), so that string parsers see
/// every input libFuzzer tries, not only the valid UTF-8 ones.
pub fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`: the spec's pattern for container IDs and
/// network names, written independently of `cni_core::validate`.
pub fn matches_name_pattern(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'.' || *c == b'-')
}

/// Panics unless `s` is safe as one file name component: no `/`, no NUL, not
/// empty, not `.` or `..`. `what` names the validator for the failure message.
#[track_caller]
pub fn assert_safe_component(what: &str, s: &str) {
    assert!(!s.is_empty(), "{what} accepted an empty string");
    assert!(
        !s.contains('/'),
        "{what} accepted {s:?}, which contains '/'"
    );
    assert!(
        !s.contains('\0'),
        "{what} accepted {s:?}, which contains NUL"
    );
    assert!(s != "." && s != "..", "{what} accepted {s:?}");
}
