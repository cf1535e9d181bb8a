//! [`Hidden`]: an optional callback in a struct that derives `Debug`.

use std::fmt;

/// An optional value, such as a callback, whose `Debug` says only whether
/// it is set: what lets a builder holding one derive `Debug`.
#[derive(Clone)]
pub(crate) struct Hidden<T>(pub(crate) Option<T>);

impl<T> Default for Hidden<T> {
    fn default() -> Self {
        Hidden(None)
    }
}

impl<T> fmt::Debug for Hidden<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}
