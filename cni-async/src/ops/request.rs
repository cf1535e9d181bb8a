//! What the five requests share.

macro_rules! common_request_methods {
    ($ty:ident) => {
        impl $ty<'_> {
            /// Replaces this call's options.
            pub fn options(mut self, opts: &CallOptions) -> Self {
                self.opts = opts.clone();
                self
            }

            /// The deadline for the whole operation (instead of the
            /// per-verb default of [`Timeouts`](crate::exec::Timeouts)).
            pub fn timeout(mut self, timeout: Duration) -> Self {
                self.opts.timeout = Some(timeout);
                self
            }
        }
    };
}
