//! Helpers shared by cni-core's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// Compares two JSON values and, when they differ, panics with a line diff
/// of their pretty-printed forms.
#[track_caller]
pub fn assert_json_eq(got: &serde_json::Value, want: &serde_json::Value) {
    if got != want {
        let got = serde_json::to_string_pretty(got).unwrap();
        let want = serde_json::to_string_pretty(want).unwrap();
        pretty_assertions::assert_eq!(got, want, "JSON differs (left: got, right: want)");
    }
}

/// Parses bytes as JSON, panicking with the text when they are not.
#[track_caller]
pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

/// A temp conf dir with helpers to write files into it.
pub struct ConfDir {
    pub dir: tempfile::TempDir,
}

impl ConfDir {
    pub fn new() -> Self {
        ConfDir {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `name` (relative, may contain a subdir) with `content`.
    pub fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, content).unwrap();
        p
    }
}

/// A minimal conflist with one plugin of type `ty`.
pub fn conflist(name: &str, ty: &str) -> String {
    format!(r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[{{"type":"{ty}"}}]}}"#)
}

/// A minimal single conf.
pub fn conf(name: &str, ty: &str) -> String {
    format!(r#"{{"cniVersion":"0.4.0","name":"{name}","type":"{ty}"}}"#)
}
