//! JSON compared as values, with a readable diff when they differ.

use serde_json::Value;

/// `value` with the keys of every object sorted (for order-free diffs).
pub fn sorted_json(value: &Value) -> Value {
    match value {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_json(&m[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted_json).collect()),
        other => other.clone(),
    }
}

/// Asserts two JSON values are equal (key order aside), showing a line diff
/// of both, pretty-printed with sorted keys, when they are not.
#[track_caller]
pub fn assert_json_eq(actual: &Value, expected: &Value, what: &str) {
    if actual != expected {
        let pretty = |v: &Value| {
            serde_json::to_string_pretty(&sorted_json(v)).expect("JSON value serializes")
        };
        pretty_assertions::assert_eq!(pretty(actual), pretty(expected), "{what}");
        // Same text but unequal values cannot happen; fail anyway.
        panic!("{what}: {actual} != {expected}");
    }
}

/// Parses bytes as JSON, panicking with the text when they are not.
#[track_caller]
pub fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}
