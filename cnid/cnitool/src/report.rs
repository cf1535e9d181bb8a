//! The failure contract and output helpers.
//!
//! On failure cnitool exits with status 1 and writes to **stderr** either
//! the error chain (`error: ` then the chain joined with `: `) or, with
//! `--json-errors` / `CNITOOL_JSON_ERRORS=1`, the spec's error JSON
//! (`{"cniVersion","code","msg","details"}`, indented as libcni prints it).
//! stdout only ever carries what a command prints on success (the ADD
//! result, a VERSION reply, capabilities), so `cnitool add ... > result.json`
//! never captures an error.
//!
//! The code is the one of the innermost typed error (a `cni_async` or
//! `cni_core` error, cnitool's own [`ToolError`], or an answer of cnid with
//! `--socket`); a plugin's own error object is passed on as the plugin
//! wrote it, and so is cnid's. `cniVersion` is the version of
//! the network that was loaded, or 1.1.0 when none was.

use std::fmt;
use std::io::Write;
use std::process::ExitCode;

use cni_core::error::code;
use cni_core::{ErrorObject, Version};

/// `CNITOOL_JSON_ERRORS`: `1` (or `true`, `yes`) turns on `--json-errors`.
pub(crate) const ENV_JSON_ERRORS: &str = "CNITOOL_JSON_ERRORS";

/// A failure of cnitool itself (a bad environment variable, stdout gone),
/// with the CNI code that fits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolError {
    /// The CNI error code.
    pub(crate) code: u32,
    /// The message.
    pub(crate) msg: String,
    /// Ends with status 1 without a word: stdout's reader went away (a
    /// broken pipe), as a Go cnitool dies of SIGPIPE.
    pub(crate) quiet: bool,
    /// The exit status, when not 1: 128 + the signal that stopped it
    /// (130 for SIGINT), as a shell reports an interrupted command.
    pub(crate) exit_status: Option<u8>,
}

impl ToolError {
    /// A failure with this code and message.
    pub(crate) fn new(code: u32, msg: impl Into<String>) -> Self {
        ToolError {
            code,
            msg: msg.into(),
            quiet: false,
            exit_status: None,
        }
    }

    /// This failure, ending with `status` instead of 1.
    pub(crate) fn with_exit_status(mut self, status: u8) -> Self {
        self.exit_status = Some(status);
        self
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for ToolError {}

/// Whether `CNITOOL_JSON_ERRORS` asks for JSON errors.
pub(crate) fn json_errors_from_env() -> bool {
    std::env::var(ENV_JSON_ERRORS).is_ok_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// The spec's error object for `err`, written in `version`.
pub(crate) fn error_object(err: &anyhow::Error, version: Option<Version>) -> ErrorObject {
    let v = version.unwrap_or(Version::CURRENT).to_string();
    for (depth, cause) in err.chain().enumerate() {
        let obj = if let Some(e) = cause.downcast_ref::<cni_async::Error>() {
            e.to_error_object(&v)
        } else if let Some(e) = cause.downcast_ref::<cni_core::Error>() {
            e.to_error_object(&v)
        } else if let Some(e) = cause.downcast_ref::<ToolError>() {
            ErrorObject::new(v.as_str(), e.code, e.msg.as_str(), "")
        } else if let Some(e) = cause.downcast_ref::<ErrorObject>() {
            // An error object someone else wrote (cnid's answer, with
            // --socket): passed on as it is, whatever context is on top.
            return e.clone();
        } else {
            continue;
        };
        if depth == 0 {
            return obj;
        }
        // Context was added on top (e.g. which variable held the value):
        // keep the typed error's code and details, and the whole message.
        return ErrorObject {
            msg: format!("{err:#}"),
            ..obj
        };
    }
    ErrorObject::new(v, code::INTERNAL, format!("{err:#}"), "")
}

/// Reports a failure on stderr and gives exit status 1 (quietly when
/// stdout's reader went away).
pub(crate) fn failure(err: &anyhow::Error, version: Option<Version>, json: bool) -> ExitCode {
    failure_with_hint(err, version, json, None)
}

/// [`failure`] with a hint for the reader: a line of its own after the
/// message, or the error object's `details` (after them, if any).
pub(crate) fn failure_with_hint(
    err: &anyhow::Error,
    version: Option<Version>,
    json: bool,
    hint: Option<&str>,
) -> ExitCode {
    let quiet = err
        .chain()
        .any(|c| c.downcast_ref::<ToolError>().is_some_and(|t| t.quiet));
    if quiet {
        return ExitCode::FAILURE;
    }
    let status = err
        .chain()
        .find_map(|c| c.downcast_ref::<ToolError>()?.exit_status)
        .map_or(ExitCode::FAILURE, ExitCode::from);
    if json {
        let mut obj = error_object(err, version);
        if let Some(hint) = hint {
            obj.details = if obj.details.is_empty() {
                hint.to_owned()
            } else {
                format!("{}; {hint}", obj.details)
            };
        }
        write_stderr(&format!("{}\n", pretty_json(&obj)));
    } else {
        match hint {
            Some(hint) => write_stderr(&format!("error: {err:#}\nhint: {hint}\n")),
            None => write_stderr(&format!("error: {err:#}\n")),
        }
    }
    status
}

/// Writes `text` to stderr; a closed stderr (`2>&1 | head`) is ignored,
/// never a panic.
pub(crate) fn write_stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Reports a command-line error. `--help` and `--version` go to stdout with
/// status 0; usage errors to stderr with status 1 (as cobra's cnitool), as
/// the error JSON with code 4 when JSON errors are asked for (the arguments
/// stand for `CNI_NETNS`, `CNI_IFNAME`, ...: invalid parameters).
pub(crate) fn usage_error(err: &clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        return match print_stdout(&err.render().to_string()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    if json {
        // clap renders "error: WHAT\n  DETAIL\n\nUsage: ...": the first
        // paragraph on one line is the message, the usage the details.
        let text = err.render().to_string();
        let text = text.trim();
        let (head, usage) = text.split_once("\n\n").unwrap_or((text, ""));
        let head = head.strip_prefix("error: ").unwrap_or(head);
        let msg: Vec<&str> = head.lines().map(str::trim).collect();
        let obj = ErrorObject::new(
            Version::CURRENT.to_string(),
            code::INVALID_ENVIRONMENT_VARIABLES,
            msg.join(" "),
            usage.trim(),
        );
        write_stderr(&format!("{}\n", pretty_json(&obj)));
    } else {
        // clap's own rendering: "error: ..." and the usage line.
        write_stderr(&err.render().to_string());
    }
    ExitCode::FAILURE
}

/// JSON indented by four spaces, as libcni's `Print`.
pub(crate) fn pretty_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    match value.serialize(&mut ser) {
        Ok(()) => String::from_utf8_lossy(&buf).into_owned(),
        Err(e) => format!("{{\"error\": \"cannot encode JSON: {e}\"}}"),
    }
}

/// Writes `text` and a newline to stdout; a closed stdout is an error
/// (code 5), not a panic, and a quiet one when the reader went away.
pub(crate) fn print_stdout(text: &str) -> Result<(), ToolError> {
    let mut out = std::io::stdout().lock();
    let mut text = text.to_owned();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| ToolError {
            quiet: e.kind() == std::io::ErrorKind::BrokenPipe,
            ..ToolError::new(code::IO_FAILURE, format!("cannot write to stdout: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn typed_errors_keep_their_code() {
        let core = cni_core::CniArgs::parse("x").unwrap_err();
        let err = anyhow::Error::from(core);
        let obj = error_object(&err, Some(Version::V1_0_0));
        assert_eq!(obj.code, 4);
        assert_eq!(obj.cni_version, "1.0.0");
        assert!(
            obj.msg.starts_with("invalid CNI_ARGS pair \"x\""),
            "{}",
            obj.msg
        );
    }

    #[test]
    fn context_goes_into_msg() {
        let err = Err::<(), _>(cni_core::CapabilityArgs::from_json("[1]").unwrap_err())
            .context("CAP_ARGS \"[1]\"")
            .unwrap_err();
        let obj = error_object(&err, None);
        assert_eq!(obj.code, 7);
        assert_eq!(obj.cni_version, "1.1.0");
        assert!(
            obj.msg.starts_with("CAP_ARGS \"[1]\": invalid capability"),
            "{}",
            obj.msg
        );
    }

    #[test]
    fn tool_and_untyped_errors() {
        let err = anyhow::Error::from(ToolError::new(4, "invalid CNI_TIMEOUT \"x\""));
        assert_eq!(
            error_object(&err, None),
            ErrorObject::new("1.1.0", 4, "invalid CNI_TIMEOUT \"x\"", "")
        );
        let err = anyhow::anyhow!("something else");
        assert_eq!(error_object(&err, None).code, code::INTERNAL);
    }

    #[test]
    fn pretty_json_uses_four_spaces() {
        let obj = ErrorObject::new("1.1.0", 3, "m", "");
        assert_eq!(
            pretty_json(&obj),
            "{\n    \"cniVersion\": \"1.1.0\",\n    \"code\": 3,\n    \"msg\": \"m\"\n}"
        );
    }
}
