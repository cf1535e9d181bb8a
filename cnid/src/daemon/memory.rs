//! The daemon's heap: glibc's allocator tuned at start
//! ([`tune_allocator`]) and free heap given back to the system after a
//! burst ([`HeapTrim`], [`trim_heap`]). The system calls are cni-async's
//! (`cni_async::daemon`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::http::conns::Conns;

/// Asks for the heap to be given back to the system soon (a burst of
/// connections ended, a large answer was sent); see [`trim_heap`].
#[derive(Debug, Default)]
pub(crate) struct HeapTrim {
    wanted: std::sync::atomic::AtomicBool,
    /// The most connections open at once since the last trim.
    high: AtomicUsize,
}

/// Connections open at once from which their end asks for a trim.
const TRIM_BURST: usize = 64;

impl HeapTrim {
    pub(crate) fn want(&self) {
        self.wanted.store(true, Ordering::Release);
    }

    /// Notes that `open` connections are open now.
    pub(crate) fn connections(&self, open: usize) {
        if self.high.fetch_max(open, Ordering::AcqRel).max(open) >= TRIM_BURST {
            self.want();
        }
    }
}

/// Every second: once a trim was asked for and the connections are back
/// to a quarter of their peak, returns the free heap to the system.
///
/// glibc keeps freed memory in its arenas for reuse, so without this the
/// buffers of a thousand stalled connections, or of one large answer, stay
/// in the daemon's RSS after they are freed. `malloc_trim` releases the
/// free pages of every arena (a few ms of CPU, at most once a second, only
/// after such a burst). Large buffers do not need it: [`tune_allocator`]
/// has them mapped on their own and unmapped when freed.
pub(crate) async fn trim_heap(trim: Arc<HeapTrim>, conns: Arc<Conns>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let open = conns.open();
        let high = trim.high.load(Ordering::Acquire);
        if !trim.wanted.load(Ordering::Acquire) || open > high / 4 {
            continue;
        }
        trim.wanted.store(false, Ordering::Release);
        trim.high.store(open, Ordering::Release);
        let _ = tokio::task::spawn_blocking(super::tuning::release_free_heap).await;
    }
}

/// Allocations from this size on get a mapping of their own, unmapped when
/// freed.
pub(crate) const MMAP_THRESHOLD: i32 = 256 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`], where glibc would
/// grow it ([`super::tuning::set_mmap_threshold`]).
pub(crate) fn tune_allocator() {
    super::tuning::set_mmap_threshold(MMAP_THRESHOLD);
}
