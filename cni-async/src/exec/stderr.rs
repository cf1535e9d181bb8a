//! What a successful plugin wrote to stderr: handed to the caller's sink
//! ([`CniBuilder::plugin_stderr`](crate::ops::CniBuilder::plugin_stderr))
//! and logged as a tracing event (`docs/decisions.md` D20).

use crate::hidden::Hidden;
use std::sync::Arc;

use cni_core::Command;
use cni_core::validate::Escaped;

/// The stderr of one plugin run that succeeded, as handed to a
/// [`StderrSink`]. Borrowed: copy what you keep.
///
/// A plugin that fails does not come here: its stderr is part of the
/// error ([`Error::Plugin`](crate::Error::Plugin), capped there at 8 KiB).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PluginStderr<'a> {
    /// The plugin's `type`.
    pub plugin_type: &'a str,
    /// The verb it ran (ADD, DEL, CHECK, STATUS or GC).
    pub command: Command,
    /// The network (list) name.
    pub network: &'a str,
    /// The container ID (`CNI_CONTAINERID`); `None` for STATUS and GC.
    pub container_id: Option<&'a str>,
    /// The interface name (`CNI_IFNAME`); `None` for STATUS and GC.
    pub ifname: Option<&'a str>,
    /// The bytes, exactly as written, up to
    /// [`OutputLimits::stderr`](crate::OutputLimits::stderr) (1 MiB by
    /// default; the rest was read and dropped). Never empty.
    pub bytes: &'a [u8],
}

/// Where the stderr of successful plugin runs goes: called once per run
/// with non-empty stderr, on the task that runs the operation, after the
/// plugin exited (so it must not block for long).
pub type StderrSink = Arc<dyn Fn(&PluginStderr<'_>) + Send + Sync>;

/// How much of the stderr a tracing event shows; the event also gives the
/// total.
pub const LOG_STDERR_MAX: usize = 4 * 1024;

/// An optional sink, in a builder that derives `Debug`.
pub(crate) type SinkSlot = Hidden<StderrSink>;

impl SinkSlot {
    /// Logs non-empty stderr of a successful run and hands it to the sink.
    /// At `info`: a plugin that succeeded often chatters; a CLI that shows
    /// warnings only (cnitool) passes the bytes through itself.
    pub(crate) fn emit(&self, s: &PluginStderr<'_>) {
        if s.bytes.is_empty() {
            return;
        }
        let shown = &s.bytes[..s.bytes.len().min(LOG_STDERR_MAX)];
        let text = String::from_utf8_lossy(shown);
        tracing::info!(
            plugin = %Escaped(s.plugin_type),
            command = %s.command,
            network = %Escaped(s.network),
            container = s.container_id.map(|c| tracing::field::display(Escaped(c))),
            ifname = s.ifname.map(|i| tracing::field::display(Escaped(i))),
            stderr_bytes = s.bytes.len(),
            shown_bytes = shown.len(),
            stderr = %Escaped(text.trim_end()),
            "plugin succeeded with output on stderr"
        );
        if let Some(sink) = &self.0 {
            sink(s);
        }
    }
}
