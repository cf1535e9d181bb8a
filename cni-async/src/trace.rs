//! The trace context of the operations a task runs: every plugin an
//! operation runs inside [`scope`] gets its `TRACEPARENT`, `TRACESTATE`
//! and `BAGGAGE` ([`TraceContext::env`]), the way libcni hands the span of
//! its caller's `context.Context` to plugins.
//!
//! Outside any scope, plugins inherit those variables from the runtime's
//! own environment (as with libcni); inside one, the scope's values replace
//! them, the absent ones set empty.
//!
//! ```no_run
//! # async fn demo(cni: cni_async::Cni, list: cni_core::NetworkConfigList, rt: cni_core::RuntimeConf) {
//! use cni_async::trace::{TraceContext, scope};
//!
//! let ctx = TraceContext::new(
//!     Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None, None);
//! let result = scope(ctx, cni.add_network_list(&list, &rt)).await;
//! # let _ = result;
//! # }
//! ```
//!
//! # Caveats
//! - The scope is a tokio task-local: it does not follow work into
//!   `tokio::spawn`; wrap the spawned future in [`scope`] again
//!   ([`current`] gives the context to carry). The library does so for the
//!   task of a detached ADD (`rollback_on_cancel`).

use std::future::{Future, IntoFuture};
use std::sync::Arc;

pub use cni_core::trace::TraceContext;

tokio::task_local! {
    static CURRENT: Arc<TraceContext>;
}

/// Runs `fut` (a future, or a request such as
/// [`AddRequest`](crate::AddRequest)) with `ctx` as the trace context of
/// its operations.
pub async fn scope<F: IntoFuture>(ctx: impl Into<Arc<TraceContext>>, fut: F) -> F::Output {
    CURRENT.scope(ctx.into(), fut.into_future()).await
}

/// The trace context of the current task's [`scope`], if any.
pub fn current() -> Option<Arc<TraceContext>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// `fut` in the current scope, if there is one: for work handed to
/// another task.
pub(crate) async fn carry<F: Future>(ctx: Option<Arc<TraceContext>>, fut: F) -> F::Output {
    match ctx {
        Some(ctx) => CURRENT.scope(ctx, fut).await,
        None => fut.await,
    }
}

/// The plugin environment's trace variables in the current scope (none
/// outside one).
pub(crate) fn env() -> Vec<(String, String)> {
    current().map(|c| c.env()).unwrap_or_default()
}
