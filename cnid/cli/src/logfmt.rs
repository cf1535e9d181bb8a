//! How the binaries (`cnid`, the cnitool family) write log fields: every
//! field value, span field and message with control and other non-printable
//! characters escaped ([`cni_core::validate::Escaped`]).
//!
//! Request values are validated before they are logged, and the libraries
//! format the fields that carry outside text with escapes; this is the net
//! under both. Plugin output (stderr, error messages) and anything a future
//! field carries, `%` (Display) fields included, can never put a raw ESC
//! sequence on an operator's terminal or into a log file.

use std::fmt;

use cni_core::validate::Escaped;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{FormatFields, Writer, debug_fn};

/// The field formatter: `message field=value field=value`, like
/// `tracing_subscriber`'s default (strings in `?` form are quoted, `%`
/// fields are not), with every value escaped.
///
/// ```
/// tracing_subscriber::fmt()
///     .fmt_fields(cnid_cli::logfmt::escaping_fields())
///     .with_writer(std::io::stderr)
///     .init();
/// // Written as `ifname=\u{1b}[2J`.
/// tracing::info!(ifname = %"\u{1b}[2J", "bad name");
/// ```
pub fn escaping_fields() -> impl for<'writer> FormatFields<'writer> + Send + Sync + 'static {
    debug_fn(
        |w: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn fmt::Debug| {
            let value = Escaped(format_args!("{value:?}"));
            if field.name() == "message" {
                write!(w, "{value}")
            } else {
                write!(w, "{field}={value}")
            }
        },
    )
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_field_kind_is_escaped() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(super::escaping_fields())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let bad = "a\u{1b}[2Jb\u{9b}c\u{202e}d\ne";
            let span = tracing::info_span!("op", display = %bad, debug = ?bad, plain = bad);
            let _in = span.enter();
            tracing::info!(field = %bad, "message {bad}");
        });
        let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let esc = r"a\u{1b}[2Jb\u{9b}c\u{202e}d\u{a}e";
        let dbg = r#""a\u{1b}[2Jb\u{9b}c\u{202e}d\ne""#;
        assert_eq!(
            log,
            format!(
                " INFO op{{display={esc} debug={dbg} plain={dbg}}}: message {esc} field={esc}\n"
            )
        );
    }
}
