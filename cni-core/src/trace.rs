//! W3C trace context for plugins: `traceparent`, `tracestate` and
//! `baggage`, validated, as the environment variables `TRACEPARENT`,
//! `TRACESTATE` and `BAGGAGE` (OpenTelemetry's environment carriers, the
//! names libcni's main sets for the plugins it runs).
//!
//! A runtime takes the values from wherever its caller put them (HTTP
//! headers, its own environment) with [`TraceContext::new`], which keeps
//! only what is well-formed:
//! - `traceparent`: `VERSION-TRACEID-PARENTID-FLAGS`, lower-case hex, the
//!   trace and parent ids not all zeros, version `ff` refused; version
//!   `00` exactly 55 characters, a later version at least that and
//!   continued by `-` (a reader of version 00 reads its first four
//!   fields). Passed on unaltered: no span is made here, so the caller's
//!   span is the plugins' parent.
//! - `tracestate`: only with a valid `traceparent` (the W3C rule), at most
//!   512 characters.
//! - `baggage`: on its own, at most 8,192 characters (the W3C limit).
//! - Every value: printable ASCII only (no control character reaches a
//!   plugin's environment or a log), no surrounding whitespace.
//!
//! A value that fails is dropped whole, with a `debug` event naming it and
//! why (not a warning: a caller's tracing must never fail or flood a
//! network operation).
//!
//! ```
//! use cni_core::trace::TraceContext;
//!
//! let t = TraceContext::new(
//!     Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
//!     Some("congo=t61rcWkgMzE"),
//!     Some("userId=alice"),
//! );
//! assert_eq!(t.trace_id(), Some("0af7651916cd43dd8448eb211c80319c"));
//! assert_eq!(t.env()[0], ("TRACEPARENT".to_owned(),
//!     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()));
//!
//! // A malformed traceparent is dropped, and its tracestate with it.
//! let bad = TraceContext::new(Some("00-xyz"), Some("congo=1"), None);
//! assert!(bad.is_empty());
//! ```

/// The variable carrying `traceparent`.
pub const TRACEPARENT: &str = "TRACEPARENT";
/// The variable carrying `tracestate`.
pub const TRACESTATE: &str = "TRACESTATE";
/// The variable carrying `baggage`.
pub const BAGGAGE: &str = "BAGGAGE";

/// The longest `tracestate` passed on (W3C: at least 512 must be kept).
pub const MAX_TRACESTATE: usize = 512;
/// The longest `baggage` passed on (the W3C baggage limit).
pub const MAX_BAGGAGE: usize = 8192;

/// Validated trace context of one operation (see the module docs). The
/// default is none at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: Option<String>,
    tracestate: Option<String>,
    baggage: Option<String>,
}

impl TraceContext {
    /// Keeps what is well-formed of the three values (absent or empty ones
    /// are none); see the module docs for the rules.
    pub fn new(traceparent: Option<&str>, tracestate: Option<&str>, baggage: Option<&str>) -> Self {
        fn given(v: Option<&str>) -> Option<&str> {
            v.filter(|v| !v.is_empty())
        }
        let traceparent = given(traceparent).and_then(|v| keep(TRACEPARENT, v, check_traceparent));
        let tracestate = given(tracestate).and_then(|v| match traceparent {
            Some(_) => keep(TRACESTATE, v, |v| check_list(v, MAX_TRACESTATE)),
            None => {
                drop_value(TRACESTATE, v, "no valid traceparent to go with it");
                None
            }
        });
        let baggage = given(baggage).and_then(|v| keep(BAGGAGE, v, |v| check_list(v, MAX_BAGGAGE)));
        TraceContext {
            traceparent,
            tracestate,
            baggage,
        }
    }

    /// From environment variables `TRACEPARENT`, `TRACESTATE` and
    /// `BAGGAGE` as `lookup` finds them (`std::env::var(..).ok()` for the
    /// process's own).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let (p, s, b) = (lookup(TRACEPARENT), lookup(TRACESTATE), lookup(BAGGAGE));
        TraceContext::new(p.as_deref(), s.as_deref(), b.as_deref())
    }

    /// The process's own `TRACEPARENT`, `TRACESTATE` and `BAGGAGE`.
    pub fn from_env() -> Self {
        TraceContext::from_lookup(|k| std::env::var(k).ok())
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.traceparent.is_none() && self.tracestate.is_none() && self.baggage.is_none()
    }

    /// The `traceparent`, if a valid one was given.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The `tracestate`, if kept.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The `baggage`, if kept.
    pub fn baggage(&self) -> Option<&str> {
        self.baggage.as_deref()
    }

    /// The trace id (32 hex digits) of the `traceparent`, for logs.
    pub fn trace_id(&self) -> Option<&str> {
        self.traceparent.as_deref().map(|p| &p[3..35])
    }

    /// The three variables for a plugin's environment, always all three:
    /// an absent value is the empty string, so that a value inherited
    /// from the runtime's own environment does not reach the plugin as
    /// if it were this operation's (what [`crate::env`] does for the
    /// `CNI_*` variables).
    pub fn env(&self) -> Vec<(String, String)> {
        let pair = |k: &str, v: &Option<String>| (k.to_owned(), v.clone().unwrap_or_default());
        vec![
            pair(TRACEPARENT, &self.traceparent),
            pair(TRACESTATE, &self.tracestate),
            pair(BAGGAGE, &self.baggage),
        ]
    }

    /// The values kept, by their HTTP header names (`traceparent`,
    /// `tracestate`, `baggage`), for a client that forwards them.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("traceparent", self.traceparent.as_deref()),
            ("tracestate", self.tracestate.as_deref()),
            ("baggage", self.baggage.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
    }
}

fn keep(name: &str, value: &str, check: impl Fn(&str) -> Result<(), String>) -> Option<String> {
    match check(value) {
        Ok(()) => Some(value.to_owned()),
        Err(why) => {
            drop_value(name, value, &why);
            None
        }
    }
}

fn drop_value(name: &str, value: &str, why: &str) {
    let shown: String = value.chars().take(64).collect();
    tracing::debug!(
        field = name,
        value = %crate::validate::Escaped(&shown),
        len = value.len(),
        reason = why,
        "trace context value dropped"
    );
}

/// Printable ASCII, no leading or trailing space.
fn check_chars(v: &str) -> Result<(), String> {
    if let Some(c) = v.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!("character {:?} (printable ASCII only)", c));
    }
    if v.starts_with(' ') || v.ends_with(' ') {
        return Err("leading or trailing space".into());
    }
    Ok(())
}

fn check_list(v: &str, max: usize) -> Result<(), String> {
    if v.len() > max {
        return Err(format!("{} characters, more than {max}", v.len()));
    }
    check_chars(v)
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check_traceparent(v: &str) -> Result<(), String> {
    check_chars(v)?;
    // Longer than any version 00 reader needs, shorter than a header a
    // server takes: a later version may add fields, not kilobytes.
    if v.len() > 512 {
        return Err(format!("{} characters", v.len()));
    }
    if v.len() < 55 {
        return Err(format!("{} characters, 55 needed", v.len()));
    }
    let b = v.as_bytes();
    if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return Err("not VERSION-TRACEID-PARENTID-FLAGS".into());
    }
    let (version, trace_id, parent_id, flags) = (&v[0..2], &v[3..35], &v[36..52], &v[53..55]);
    for (what, part) in [
        ("version", version),
        ("trace id", trace_id),
        ("parent id", parent_id),
        ("flags", flags),
    ] {
        if !is_lower_hex(part) {
            return Err(format!("{what} is not lower-case hex"));
        }
    }
    if version == "ff" {
        return Err("version ff is invalid".into());
    }
    if version == "00" && v.len() != 55 {
        return Err("version 00 is exactly 55 characters".into());
    }
    if v.len() > 55 && b[55] != b'-' {
        return Err("the flags are not followed by '-'".into());
    }
    if trace_id.bytes().all(|c| c == b'0') {
        return Err("the trace id is all zeros".into());
    }
    if parent_id.bytes().all(|c| c == b'0') {
        return Err("the parent id is all zeros".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn tp(v: &str) -> Option<String> {
        TraceContext::new(Some(v), None, None)
            .traceparent()
            .map(str::to_owned)
    }

    #[test]
    fn valid_traceparents_pass_unaltered() {
        assert_eq!(tp(TP).as_deref(), Some(TP));
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert_eq!(tp(later).as_deref(), Some(later));
        let t = TraceContext::new(Some(TP), None, None);
        assert_eq!(t.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
    }

    #[test]
    fn malformed_traceparents_are_dropped() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é1",
        ] {
            assert_eq!(tp(bad), None, "{bad:?}");
        }
        let long = format!("01-{}", "a".repeat(600));
        assert_eq!(tp(&long), None);
    }

    #[test]
    fn tracestate_needs_a_traceparent_and_fits_the_cap() {
        let t = TraceContext::new(
            Some(TP),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
            None,
        );
        assert_eq!(
            t.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        let orphan = TraceContext::new(None, Some("rojo=1"), None);
        assert!(orphan.is_empty());
        let at_cap = format!("a={}", "b".repeat(MAX_TRACESTATE - 2));
        assert!(
            TraceContext::new(Some(TP), Some(&at_cap), None)
                .tracestate()
                .is_some()
        );
        let over = format!("a={}", "b".repeat(MAX_TRACESTATE - 1));
        let t = TraceContext::new(Some(TP), Some(&over), None);
        assert_eq!(t.tracestate(), None);
        assert_eq!(t.traceparent(), Some(TP), "the traceparent stays");
        let ctl = TraceContext::new(Some(TP), Some("a=1\u{1b}[2J"), None);
        assert_eq!(ctl.tracestate(), None);
    }

    #[test]
    fn baggage_stands_alone_and_fits_the_cap() {
        let t = TraceContext::new(None, None, Some("userId=alice,k=v%20w"));
        assert_eq!(t.baggage(), Some("userId=alice,k=v%20w"));
        assert_eq!(t.traceparent(), None);
        let over = format!("k={}", "v".repeat(MAX_BAGGAGE));
        assert!(TraceContext::new(None, None, Some(&over)).is_empty());
        assert!(TraceContext::new(None, None, Some("k=v\r\nX: y")).is_empty());
    }

    #[test]
    fn env_masks_what_is_absent() {
        let t = TraceContext::new(Some(TP), None, None);
        assert_eq!(
            t.env(),
            vec![
                ("TRACEPARENT".to_owned(), TP.to_owned()),
                ("TRACESTATE".to_owned(), String::new()),
                ("BAGGAGE".to_owned(), String::new()),
            ]
        );
        assert_eq!(t.headers().collect::<Vec<_>>(), [("traceparent", TP)]);
        let from_env = TraceContext::from_lookup(|k| match k {
            "TRACEPARENT" => Some(TP.to_owned()),
            "BAGGAGE" => Some("a=1".to_owned()),
            _ => None,
        });
        assert_eq!(from_env.traceparent(), Some(TP));
        assert_eq!(from_env.baggage(), Some("a=1"));
    }
}
