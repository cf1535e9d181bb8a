//! What the five requests share: one [`Request`] that holds the [`Cni`],
//! the call's options and what the verb runs ([`Operation`]); each verb
//! names its own ([`AddRequest`](super::AddRequest), ...).

use std::future::{Future, IntoFuture};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::error::Error;
#[cfg(doc)]
use crate::exec::Timeouts;

use super::{CallOptions, Cni};

/// An operation ready to run ([`AddRequest`](super::AddRequest), ...):
/// `.await` it, after setting options if needed.
#[must_use = "an operation does nothing until it is awaited"]
#[derive(Debug)]
pub struct Request<'a, Op> {
    pub(super) cni: &'a Cni,
    pub(super) op: Op,
    pub(super) opts: CallOptions,
}

impl<'a, Op> Request<'a, Op> {
    /// A request of `op` with the default options.
    pub(super) fn new(cni: &'a Cni, op: Op) -> Self {
        Request {
            cni,
            op,
            opts: CallOptions::default(),
        }
    }

    /// Replaces this call's options.
    pub fn options(mut self, opts: &CallOptions) -> Self {
        self.opts = *opts;
        self
    }

    setters! {
        /// The deadline for the whole operation (instead of the
        /// per-verb default of [`Timeouts`]).
        pub fn timeout(opts.timeout: Duration, Some);
    }
}

/// What a verb runs when its [`Request`] is awaited (sealed: outside this
/// crate it cannot be named, so only the verbs here have one).
pub trait Operation<'a> {
    /// What the verb answers on success.
    type Output;

    /// Runs the verb with the call's options.
    fn run(
        self,
        cni: &'a Cni,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Self::Output, Error>> + Send + 'a;
}

impl<'a, Op: Operation<'a>> IntoFuture for Request<'a, Op> {
    type Output = Result<Op::Output, Error>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.op.run(self.cni, self.opts))
    }
}
