//! Reading result JSON field by field, with errors that name the field and
//! the value at fault (`ips[0].address "10.0.0.1": ...`).
//!
//! Results are decoded from a [`serde_json::Value`] by hand instead of with
//! derived `Deserialize` impls: the workspace enables `arbitrary_precision`,
//! every failure must name its path, and libcni's quirks (`null` means absent,
//! empty strings and zero numbers mean unset) need per-field decisions.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::error::Error;
use crate::version::Version;

/// How many characters of an offending value an error message shows.
const SHOW_LIMIT: usize = 64;

/// A JSON object of a result.
pub(crate) type Object = Map<String, Value>;

/// Decoding context: the version the result is read as, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reader {
    pub(crate) version: Version,
}

impl Reader {
    pub(crate) fn new(version: Version) -> Self {
        Reader { version }
    }

    /// An error about `path`, showing `value` when there is one.
    pub(crate) fn fail(&self, path: &str, value: Option<&Value>, msg: impl fmt::Display) -> Error {
        let at = if path.is_empty() { "result" } else { path };
        let reason = match value {
            Some(v) => format!("{at} {}: {msg}", show(v)),
            None => format!("{at}: {msg}"),
        };
        Error::InvalidResult {
            version: self.version.to_string(),
            reason,
        }
    }

    /// `value` as an object.
    pub(crate) fn object<'a>(&self, value: &'a Value, path: &str) -> Result<&'a Object, Error> {
        value.as_object().ok_or_else(|| {
            self.fail(
                path,
                Some(value),
                format_args!("expected an object, got {}", kind(value)),
            )
        })
    }

    /// The array at `obj[key]`; missing or `null` is empty.
    pub(crate) fn array<'a>(
        &self,
        obj: &'a Object,
        path: &str,
        key: &str,
    ) -> Result<&'a [Value], Error> {
        match present(obj, key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(self.fail(
                &join(path, key),
                Some(other),
                format_args!("expected an array, got {}", kind(other)),
            )),
        }
    }

    /// The string at `obj[key]`; missing or `null` is `None`.
    pub(crate) fn string<'a>(
        &self,
        obj: &'a Object,
        path: &str,
        key: &str,
    ) -> Result<Option<&'a str>, Error> {
        match present(obj, key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.fail(
                &join(path, key),
                Some(other),
                format_args!("expected a string, got {}", kind(other)),
            )),
        }
    }

    /// An optional string where `""` means unset (Go's `omitempty`).
    pub(crate) fn opt_string(
        &self,
        obj: &Object,
        path: &str,
        key: &str,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .string(obj, path, key)?
            .filter(|s| !s.is_empty())
            .map(str::to_owned))
    }

    /// A list of strings; missing or `null` is empty.
    pub(crate) fn string_list(
        &self,
        obj: &Object,
        path: &str,
        key: &str,
    ) -> Result<Vec<String>, Error> {
        let base = join(path, key);
        self.array(obj, path, key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.fail(
                    &format!("{base}[{i}]"),
                    Some(other),
                    format_args!("expected a string, got {}", kind(other)),
                )),
            })
            .collect()
    }

    /// An unsigned 32-bit number; missing or `null` is `None`. With
    /// `zero_is_unset`, `0` is `None` too (Go's `int` with `omitempty`).
    pub(crate) fn opt_u32(
        &self,
        obj: &Object,
        path: &str,
        key: &str,
        zero_is_unset: bool,
    ) -> Result<Option<u32>, Error> {
        let Some(value) = present(obj, key) else {
            return Ok(None);
        };
        let n = value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                let what = if value.is_number() {
                    "not an unsigned integer below 2^32".to_owned()
                } else {
                    format!("expected an unsigned integer, got {}", kind(value))
                };
                self.fail(&join(path, key), Some(value), what)
            })?;
        Ok(if zero_is_unset && n == 0 {
            None
        } else {
            Some(n)
        })
    }

    /// An IP address; missing, `null` or `""` is `None` (as Go's `net.IP`).
    pub(crate) fn opt_ip(
        &self,
        obj: &Object,
        path: &str,
        key: &str,
    ) -> Result<Option<IpAddr>, Error> {
        match self.string(obj, path, key)? {
            None | Some("") => Ok(None),
            Some(s) => s.parse::<IpAddr>().map(Some).map_err(|_| {
                self.fail(
                    &join(path, key),
                    obj.get(key),
                    "not an IP address (expected e.g. 10.1.2.1 or fd00::1)",
                )
            }),
        }
    }

    /// A required address in CIDR notation; host bits are kept.
    pub(crate) fn ipnet(&self, obj: &Object, path: &str, key: &str) -> Result<IpNet, Error> {
        let field = join(path, key);
        match self.string(obj, path, key)? {
            None => Err(self.fail(
                &field,
                None,
                "missing (an address in CIDR notation is required)",
            )),
            Some(s) => s.parse::<IpNet>().map_err(|_| {
                self.fail(
                    &field,
                    obj.get(key),
                    "not an address in CIDR notation (expected e.g. 10.1.2.3/24 or fd00::3/64)",
                )
            }),
        }
    }
}

/// `obj[key]` unless it is missing or `null` (Go leaves the field unset for both).
pub(crate) fn present<'a>(obj: &'a Object, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// `path.key`, or `key` at the top level.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// What kind of JSON value this is, for messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value as shown in an error: strings quoted, everything cut to a readable length.
pub(crate) fn show(v: &Value) -> String {
    let text = match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    if text.chars().count() <= SHOW_LIMIT {
        text
    } else {
        let cut: String = text.chars().take(SHOW_LIMIT).collect();
        format!("{cut}...")
    }
}

/// Builds a JSON object from `(key, value)` pairs, in order.
pub(crate) fn object_of(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Object(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reader() -> Reader {
        Reader::new(Version::V1_0_0)
    }

    #[test]
    fn numbers_are_checked_for_range_and_sign() {
        let obj = json!({"a": 99999999999999999999u128, "b": -1, "c": 1.5, "d": "7", "e": 0, "f": 4294967295u64});
        let obj = obj.as_object().unwrap();
        let r = reader();
        let err = r
            .opt_u32(obj, "ips[0]", "a", false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "invalid 1.0.0 result: ips[0].a 99999999999999999999: not an unsigned integer below 2^32"
        );
        assert!(r.opt_u32(obj, "", "b", false).is_err());
        assert!(r.opt_u32(obj, "", "c", false).is_err());
        let err = r.opt_u32(obj, "", "d", false).unwrap_err().to_string();
        assert!(
            err.contains(r#"d "7": expected an unsigned integer, got a string"#),
            "{err}"
        );
        assert_eq!(r.opt_u32(obj, "", "e", true).unwrap(), None);
        assert_eq!(r.opt_u32(obj, "", "e", false).unwrap(), Some(0));
        assert_eq!(r.opt_u32(obj, "", "f", false).unwrap(), Some(u32::MAX));
        assert_eq!(r.opt_u32(obj, "", "missing", false).unwrap(), None);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "x".repeat(200);
        let shown = show(&Value::String(long));
        assert_eq!(shown.chars().count(), SHOW_LIMIT + 3);
        assert!(shown.ends_with("..."));
        // Multi-byte characters are cut on a character boundary.
        let shown = show(&Value::String("é".repeat(100)));
        assert!(shown.ends_with("..."));
    }

    #[test]
    fn null_is_absent_and_empty_address_is_none() {
        let obj = json!({"gw": "", "s": null, "n": null});
        let obj = obj.as_object().unwrap();
        let r = reader();
        assert_eq!(r.opt_ip(obj, "", "gw").unwrap(), None);
        assert_eq!(r.opt_string(obj, "", "s").unwrap(), None);
        assert!(r.array(obj, "", "n").unwrap().is_empty());
        let err = r.ipnet(obj, "routes[1]", "dst").unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid 1.0.0 result: routes[1].dst: missing (an address in CIDR notation is required)"
        );
    }
}
