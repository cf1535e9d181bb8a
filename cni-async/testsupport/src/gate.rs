//! Ordering a test's events without sleeps: a [`Gate`] that fake plugins
//! block on until the test opens it, with a "started" marker per run that
//! the test waits for; and [`LOAD_MARGIN`], what a busy machine may add to
//! a time bound.
//!
//! ```text
//! let gate = Gate::new(dir.root());
//! dir.fake("slow", &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT).with_shell(&gate.shell_wait())));
//! let add = tokio::spawn(/* an ADD that runs `slow` */);
//! gate.wait_started(1).await; // the ADD is now running its plugin, and stays so
//! // ... do what must happen while it runs ...
//! gate.release();             // every run waiting, and every later one, goes on
//! ```
//!
//! A gated run marks itself started (a file per run), then polls for the
//! gate's "open" file. It also stops waiting (exit 1) when the gate's dir is
//! gone, so a plugin can never outlive its test's temp dir. Dropping the
//! gate opens it. A gate never released is a plugin that hangs until it is
//! killed (or the test ends).

use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

/// What a loaded 2-core machine may add to a time bound the code keeps
/// (process start-up, scheduling, a kill grace being honoured): bounds are
/// "what the code guarantees plus this", never tens of milliseconds.
pub const LOAD_MARGIN: Duration = Duration::from_secs(3);

/// How long [`Gate::wait_started`] waits before it fails the test.
pub const GATE_WAIT_LIMIT: Duration = Duration::from_secs(60);

/// A gate for fake plugins, in a dir of its own.
#[derive(Debug)]
pub struct Gate {
    dir: PathBuf,
}

impl Gate {
    /// A closed gate in a new dir under `parent` (a test's temp dir).
    pub fn new(parent: &Path) -> Gate {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = parent.join(format!("gate-{}", N.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Gate { dir }
    }

    /// Shell lines for a fake plugin: mark this run started, then block
    /// until the gate is released (or its dir is gone).
    pub fn shell_wait(&self) -> String {
        let g = format!(
            "'{}'",
            self.dir.display().to_string().replace('\'', r"'\''")
        );
        format!(
            "mktemp {g}/run.XXXXXXXX >/dev/null\n\
             while [ ! -e {g}/open ]; do [ -d {g} ] || exit 1; sleep 0.05; done"
        )
    }

    /// How many runs have reached the gate so far.
    pub fn started(&self) -> usize {
        fs::read_dir(&self.dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with("run."))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits until at least `n` runs have reached the gate; fails the test
    /// after [`GATE_WAIT_LIMIT`].
    pub async fn wait_started(&self, n: usize) {
        let end = Instant::now() + GATE_WAIT_LIMIT;
        while !self.reached(n, end) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// [`Gate::wait_started`] for tests without a runtime.
    pub fn wait_started_blocking(&self, n: usize) {
        let end = Instant::now() + GATE_WAIT_LIMIT;
        while !self.reached(n, end) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether `n` runs have reached the gate; fails the test once `end`
    /// has passed without.
    #[track_caller]
    fn reached(&self, n: usize, end: Instant) -> bool {
        let started = self.started();
        assert!(
            started >= n || Instant::now() < end,
            "{started} of {n} runs reached the gate {} within {GATE_WAIT_LIMIT:?}",
            self.dir.display()
        );
        started >= n
    }

    /// Opens the gate: the runs waiting go on, later ones pass at once.
    pub fn release(&self) {
        // Ignore a dir already gone (the temp dir dropped first).
        let _ = fs::write(self.dir.join("open"), b"");
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.release();
    }
}

/// Polls `fut` once: `Poll::Pending` means it is now waiting on something
/// (a timer, I/O) after running as far as it could without waiting.
pub async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx))).await
}
