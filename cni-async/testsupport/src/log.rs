//! An in-memory log: a writer a tracing subscriber formats into
//! (`.with_writer(move || buf.clone())`), read back as text by the test.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

/// A cloneable in-memory writer; every clone appends to the same buffer.
#[derive(Debug, Clone, Default)]
pub struct LogBuf(Arc<Mutex<Vec<u8>>>);

impl LogBuf {
    /// Everything written so far, as text (panics on non-UTF-8: the
    /// subscribers the tests use write text).
    pub fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        String::from_utf8(bytes).expect("the log is UTF-8")
    }
}

impl Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
