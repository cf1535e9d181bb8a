//! Progress of `cnitool batch` on stderr.
//!
//! - stderr is a terminal: one line redrawn in place (`\r`, then erase to
//!   the end of the line), at most every 50 ms and always for the last
//!   update: `[#####---------------] 23/50 attached, 0 failed, 1.2s`.
//! - otherwise (a log file, CI): one line each time another tenth of the
//!   batch is done: `batch up: 10/50 done (20%): 9 attached, 1 failed, 0.4s`.
//! - `--quiet`: nothing.
//!
//! Writes go to stderr unbuffered and their errors are ignored: progress must
//! never fail the command.

use std::io::IsTerminal;

use crate::report::write_stderr;
use std::time::{Duration, Instant};

/// Width of the bar, in characters.
const BAR_WIDTH: usize = 20;
/// Minimum time between two redraws on a terminal.
const REDRAW_EVERY: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Bar,
    Lines,
}

/// A progress display for `total` items.
#[derive(Debug)]
pub(crate) struct Progress {
    mode: Mode,
    /// What is shown in the line mode before the counts (`batch up`).
    what: &'static str,
    /// The verb of the successes (`attached`) and of the failures (`failed`).
    done_word: &'static str,
    failed_word: &'static str,
    total: usize,
    started: Instant,
    last_draw: Option<Instant>,
    /// Tenths reported so far (line mode).
    tenths: usize,
    /// A bar is on screen and needs a newline before anything else.
    bar_shown: bool,
}

impl Progress {
    /// A display for `total` items; off when `quiet`, a bar when stderr is a
    /// terminal, lines otherwise.
    pub(crate) fn new(
        what: &'static str,
        done_word: &'static str,
        failed_word: &'static str,
        total: usize,
        quiet: bool,
    ) -> Self {
        let mode = if quiet || total == 0 {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Bar
        } else {
            Mode::Lines
        };
        Progress {
            mode,
            what,
            done_word,
            failed_word,
            total,
            started: Instant::now(),
            last_draw: None,
            tenths: 0,
            bar_shown: false,
        }
    }

    /// Shows that `ok + failed` of the items are done.
    pub(crate) fn update(&mut self, ok: usize, failed: usize) {
        let done = (ok + failed).min(self.total);
        let last = done == self.total;
        match self.mode {
            Mode::Off => {}
            Mode::Bar => {
                let now = Instant::now();
                if !last
                    && self
                        .last_draw
                        .is_some_and(|t| now.duration_since(t) < REDRAW_EVERY)
                {
                    return;
                }
                self.last_draw = Some(now);
                let line = format!("\r{}\x1b[K", self.bar_line(ok, failed));
                write_stderr(&line);
                self.bar_shown = true;
                if last {
                    self.end_line();
                }
            }
            Mode::Lines => {
                let tenths = done * 10 / self.total;
                if tenths > self.tenths {
                    self.tenths = tenths;
                    let line = format!(
                        "{}: {done}/{} done ({}%): {ok} {}{}\n",
                        self.what,
                        self.total,
                        done * 100 / self.total,
                        self.done_word,
                        self.tail(failed)
                    );
                    write_stderr(&line);
                }
            }
        }
    }

    /// Ends the bar's line, if one is shown (before other output, or when
    /// the work stops early).
    pub(crate) fn end_line(&mut self) {
        if self.bar_shown {
            write_stderr("\n");
            self.bar_shown = false;
        }
    }

    fn bar_line(&self, ok: usize, failed: usize) -> String {
        let done = (ok + failed).min(self.total);
        let filled = done * BAR_WIDTH / self.total;
        format!(
            "[{}{}] {ok}/{} {}{}",
            "#".repeat(filled),
            "-".repeat(BAR_WIDTH - filled),
            self.total,
            self.done_word,
            self.tail(failed)
        )
    }

    /// `, 3 failed, 1.2s`.
    fn tail(&self, failed: usize) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        format!(", {failed} {}, {secs:.1}s", self.failed_word)
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.end_line();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(mode: Mode, total: usize) -> Progress {
        let mut p = Progress::new("batch up", "attached", "failed", total, true);
        p.mode = mode;
        p
    }

    #[test]
    fn bar_fills_with_the_items_done() {
        let p = progress(Mode::Bar, 50);
        let line = p.bar_line(20, 3);
        assert!(
            line.starts_with("[#########-----------] 20/50 attached, 3 failed, "),
            "{line}"
        );
        assert!(
            p.bar_line(50, 0)
                .starts_with("[####################] 50/50 ")
        );
        assert!(p.bar_line(0, 0).starts_with("[--------------------] 0/50 "));
    }

    #[test]
    fn lines_come_once_per_tenth() {
        let mut p = progress(Mode::Lines, 25);
        let mut tenths = Vec::new();
        for done in 1..=25 {
            p.update(done, 0);
            tenths.push(p.tenths);
        }
        // 25 items: a line at 3, 5, 8, 10, 13, 15, 18, 20, 23 and 25 done.
        let changes = tenths.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(changes, 10);
        assert_eq!(p.tenths, 10);
    }

    #[test]
    fn quiet_and_empty_batches_show_nothing() {
        assert_eq!(Progress::new("x", "a", "f", 10, true).mode, Mode::Off);
        assert_eq!(Progress::new("x", "a", "f", 0, false).mode, Mode::Off);
    }
}
