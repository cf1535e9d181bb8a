//! Prometheus metrics, hand-written text exposition format 0.0.4.
//!
//! Every metric, its type and labels: `cnid/API.md` ("Metrics").
//!
//! Per-plugin figures come from [`TimedExec`], a [`PluginExec`] that wraps
//! the real executor and times every run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::daemon::lock;
use cni_async::exec::{ExecOutput, ExecRequest, PluginExec};
use cni_core::Command;

/// Bucket upper bounds in seconds.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Bucket upper bounds of the admission's histogram, in seconds: it is
/// meant to stay well under 1 ms (the goal: ≤ 0.1 ms at any cache size,
/// 10,000 attachments included), where [`BUCKETS`] start.
const ADMISSION_BUCKETS: [f64; 12] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1.0,
];

/// A fixed-bucket histogram of durations ([`BUCKETS`] unless made
/// [`Histogram::with_bounds`]).
#[derive(Debug)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl Histogram {
    /// A histogram with these bucket upper bounds (seconds, ascending).
    pub(crate) fn with_bounds(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, le) in self.bounds.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        // An observation counts its bucket before its total: a scrape in
        // between must not read a `+Inf` (the total) below the last bucket,
        // or the histogram is not cumulative.
        let count = self.count.load(Ordering::Relaxed).max(cumulative);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

/// The verbs the daemon runs, as metric labels and array indexes.
pub(crate) const VERBS: [Command; 5] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Status,
    Command::Gc,
];

fn verb_index(c: Command) -> usize {
    index_in(&VERBS, c)
}

#[derive(Debug)]
struct VerbMetrics {
    ok: AtomicU64,
    failed: AtomicU64,
    coalesced: AtomicU64,
    duration: Histogram,
    queue: Histogram,
    /// [`Metrics::admitted`].
    admission: Histogram,
}

impl Default for VerbMetrics {
    fn default() -> Self {
        VerbMetrics {
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            duration: Histogram::default(),
            queue: Histogram::default(),
            admission: Histogram::with_bounds(&ADMISSION_BUCKETS),
        }
    }
}

#[derive(Debug, Default)]
struct PluginMetrics {
    duration: Histogram,
    errors: AtomicU64,
}

/// All of the daemon's metrics.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    verbs: [VerbMetrics; VERBS.len()],
    errors: Mutex<BTreeMap<(usize, u32), u64>>,
    plugins: Mutex<BTreeMap<(String, usize), Arc<PluginMetrics>>>,
    http: Mutex<BTreeMap<u16, u64>>,
    pub(crate) in_flight: AtomicI64,
    pub(crate) queued: AtomicI64,
    pub(crate) connections: AtomicI64,
    pub(crate) refused: AtomicU64,
    pub(crate) conn_timed_out: AtomicU64,
    pub(crate) conn_replaced: AtomicU64,
    pub(crate) conn_rejected: AtomicU64,
    pub(crate) networks: AtomicI64,
    pub(crate) config_errors: AtomicI64,
    pub(crate) reloads: AtomicU64,
    pub(crate) recovered_ok: AtomicU64,
    pub(crate) recovered_failed: AtomicU64,
    /// Stale attachments reaped: `[rebooted, namespace gone] x [ok, error]`.
    pub(crate) reaped: [[AtomicU64; 2]; 2],
    pub(crate) stale: AtomicI64,
    /// Namespace gone, waiting for `--stale-after`.
    pub(crate) gone: AtomicI64,
    /// Periodic CHECKs that came to a verdict: `[passed, failed]`.
    pub(crate) checks: [AtomicU64; 2],
    /// Attachments whose last periodic CHECK failed.
    pub(crate) drifted: AtomicI64,
    /// 1 when the reaper sees the host's mounts and processes.
    pub(crate) host_mounts_visible: AtomicI64,
    /// Paced operations by how they ran: `[in a slot, lent a run while a
    /// CPU idled, without a slot after waiting out the bound]` (`pace`).
    pub(crate) paced: [AtomicU64; 3],
}

impl Metrics {
    pub(crate) fn operation_done(
        &self,
        verb: Command,
        queued: Duration,
        ran: Duration,
        error: Option<u32>,
    ) {
        let v = &self.verbs[verb_index(verb)];
        v.queue.observe(queued);
        v.duration.observe(ran);
        match error {
            None => v.ok.fetch_add(1, Ordering::Relaxed),
            Some(code) => {
                *lock(&self.errors)
                    .entry((verb_index(verb), code))
                    .or_default() += 1;
                v.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// One request's admission ([`crate::daemon::engine`]'s `admit` and
    /// `admit_sandbox`: the network, the netns, the owners' refresh, check
    /// and claim, the deadline), wall time, admitted or refused.
    pub(crate) fn admitted(&self, verb: Command, took: Duration) {
        self.verbs[verb_index(verb)].admission.observe(took);
    }

    pub(crate) fn coalesced(&self, verb: Command) {
        let v = &self.verbs[verb_index(verb)];
        v.coalesced.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn http_response(&self, status: u16) {
        *lock(&self.http).entry(status).or_default() += 1;
    }

    fn plugin(&self, plugin_type: &str, command: Command) -> Arc<PluginMetrics> {
        let mut map = lock(&self.plugins);
        let key = (plugin_type.to_owned(), index_in(&Command::ALL, command));
        map.entry(key).or_default().clone()
    }

    /// The text exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.render_operations(&mut out);
        self.render_plugins(&mut out);
        self.render_http(&mut out);
        self.render_gauges(&mut out);
        self.render_recovery(&mut out);
        self.render_pacing(&mut out);
        out
    }

    /// How paced operations ran (`pace`).
    fn render_pacing(&self, out: &mut String) {
        family(
            out,
            "cnid_paced_operations_total",
            "Operations paced by --plugin-slots, by how they ran: in a slot, lent a run while a CPU idled, or without a slot once their wait was up.",
            "counter",
            ["slot", "lent", "waited_out"]
                .iter()
                .zip(&self.paced)
                .map(|(how, n)| (format!("how=\"{how}\""), counter(n))),
        );
    }

    /// Operations by verb: counts, errors by code, run and queue times.
    fn render_operations(&self, out: &mut String) {
        let outcomes = VERBS.iter().zip(&self.verbs).flat_map(|(verb, v)| {
            [
                ("ok", &v.ok),
                ("error", &v.failed),
                ("coalesced", &v.coalesced),
            ]
            .map(|(o, n)| (format!("verb=\"{verb}\",outcome=\"{o}\""), counter(n)))
        });
        family(
            out,
            "cnid_operations_total",
            "Operations finished, by verb and outcome.",
            "counter",
            outcomes,
        );
        let errors = lock(&self.errors)
            .iter()
            .map(|((verb, code), n)| (format!("verb=\"{}\",code=\"{code}\"", VERBS[*verb]), *n))
            .collect::<Vec<_>>();
        family(
            out,
            "cnid_operation_errors_total",
            "Failed operations, by verb and CNI error code.",
            "counter",
            errors,
        );
        type Of = fn(&VerbMetrics) -> &Histogram;
        let histograms: [(&str, &str, Of); 3] = [
            (
                "cnid_operation_duration_seconds",
                "Time operations ran (after leaving the queue).",
                |v| &v.duration,
            ),
            (
                "cnid_operation_queue_seconds",
                "Time operations waited for their turn.",
                |v| &v.queue,
            ),
            (
                "cnid_admission_duration_seconds",
                "Time to admit a request before it is queued (network, netns and owner checks, the owners' claim), admitted or refused.",
                |v| &v.admission,
            ),
        ];
        for (name, help, histogram) in histograms {
            header(out, name, help, "histogram");
            for (v, verb) in self.verbs.iter().zip(VERBS) {
                histogram(v).write(out, name, &format!("verb=\"{verb}\""));
            }
        }
    }

    /// Plugin executions by plugin and command: times and failures.
    fn render_plugins(&self, out: &mut String) {
        let plugins: Vec<_> = lock(&self.plugins)
            .iter()
            .map(|((plugin, cmd), m)| {
                let labels = format!(
                    "plugin=\"{}\",command=\"{}\"",
                    escape_label(plugin),
                    Command::ALL[*cmd]
                );
                (labels, m.clone())
            })
            .collect();
        let name = "cnid_plugin_exec_duration_seconds";
        header(
            out,
            name,
            "Wall time of each plugin execution.",
            "histogram",
        );
        for (labels, m) in &plugins {
            m.duration.write(out, name, labels);
        }
        let errors = plugins.iter().map(|(l, m)| (l.clone(), counter(&m.errors)));
        family(
            out,
            "cnid_plugin_exec_errors_total",
            "Plugin executions that failed or timed out.",
            "counter",
            errors,
        );
    }

    /// HTTP responses by status.
    fn render_http(&self, out: &mut String) {
        let statuses = lock(&self.http)
            .iter()
            .map(|(s, n)| (format!("status=\"{s}\""), *n))
            .collect::<Vec<_>>();
        family(
            out,
            "cnid_http_responses_total",
            "HTTP responses, by status.",
            "counter",
            statuses,
        );
    }

    /// The single-value gauges and counters: operations, connections, networks.
    fn render_gauges(&self, out: &mut String) {
        for (name, help, kind, value) in [
            (
                "cnid_operations_in_flight",
                "Operations running plugins now.",
                "gauge",
                self.in_flight.load(Ordering::Relaxed),
            ),
            (
                "cnid_operations_queued",
                "Operations waiting for their turn.",
                "gauge",
                self.queued.load(Ordering::Relaxed),
            ),
            (
                "cnid_connections",
                "Open client connections.",
                "gauge",
                self.connections.load(Ordering::Relaxed),
            ),
            (
                "cnid_connections_refused_total",
                "Connections from peers whose uid/gid is not allowed.",
                "counter",
                counter(&self.refused),
            ),
            (
                "cnid_connections_timed_out_total",
                "Connections closed because their request was not complete within the request timeout.",
                "counter",
                counter(&self.conn_timed_out),
            ),
            (
                "cnid_connections_replaced_total",
                "Connections closed at the connection cap to make room for a new one.",
                "counter",
                counter(&self.conn_replaced),
            ),
            (
                "cnid_connections_rejected_total",
                "Connections answered 503 at the connection cap (every one busy).",
                "counter",
                counter(&self.conn_rejected),
            ),
            (
                "cnid_networks",
                "Networks loaded from the conf dir.",
                "gauge",
                self.networks.load(Ordering::Relaxed),
            ),
            (
                "cnid_config_errors",
                "Configuration files that could not be used.",
                "gauge",
                self.config_errors.load(Ordering::Relaxed),
            ),
            (
                "cnid_config_reloads_total",
                "Reloads of the conf dir.",
                "counter",
                counter(&self.reloads),
            ),
        ] {
            family(out, name, help, kind, [("", value)]);
        }
    }

    /// What the start's recovery and the stale-attachment reaper did.
    fn render_recovery(&self, out: &mut String) {
        let gauge = |g: &AtomicI64| g.load(Ordering::Relaxed);
        let reaped = ["rebooted", "namespace_gone"]
            .into_iter()
            .zip(&self.reaped)
            .flat_map(|(reason, r)| {
                ["ok", "error"]
                    .into_iter()
                    .zip(r)
                    .map(move |(o, n)| (format!("reason=\"{reason}\",outcome=\"{o}\""), counter(n)))
            });
        type Samples = Vec<(String, i64)>;
        let families: [(&str, &str, &str, Samples); 6] = [
            (
                "cnid_recovered_intents_total",
                "Unfinished ADDs found at start and deleted, by outcome.",
                "counter",
                vec![
                    ("outcome=\"ok\"".into(), counter(&self.recovered_ok)),
                    ("outcome=\"error\"".into(), counter(&self.recovered_failed)),
                ],
            ),
            (
                "cnid_stale_reaped_total",
                "Stale cached attachments (namespace gone) deleted by the reaper, by reason and outcome.",
                "counter",
                reaped.collect(),
            ),
            (
                "cnid_stale_attachments",
                "Cached attachments whose namespace the reaper's last scan found gone, by state (gone: waiting for --stale-after; stale: to be reaped).",
                "gauge",
                vec![
                    ("state=\"gone\"".into(), gauge(&self.gone)),
                    ("state=\"stale\"".into(), gauge(&self.stale)),
                ],
            ),
            (
                "cnid_periodic_checks_total",
                "Periodic CHECKs (--check-every) that came to a verdict, by outcome.",
                "counter",
                vec![
                    ("outcome=\"ok\"".into(), counter(&self.checks[0])),
                    ("outcome=\"drift\"".into(), counter(&self.checks[1])),
                ],
            ),
            (
                "cnid_drifted_attachments",
                "Cached attachments whose last periodic CHECK failed.",
                "gauge",
                vec![(String::new(), gauge(&self.drifted))],
            ),
            (
                "cnid_stale_host_mounts_visible",
                "1 when the reaper sees the host's mounts and processes; 0: it reaps only attachments of an earlier boot.",
                "gauge",
                vec![(String::new(), gauge(&self.host_mounts_visible))],
            ),
        ];
        for (name, help, kind, samples) in families {
            family(out, name, help, kind, samples);
        }
    }
}

/// Metric `name`'s header and one sample a `(labels, value)` (no braces
/// where the labels are empty).
fn family<L: AsRef<str>, V: std::fmt::Display>(
    out: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) {
    header(out, name, help, kind);
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{} {value}", braces(labels.as_ref()));
    }
}

/// `{labels}`, or nothing where there are none.
fn braces(labels: &str) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    }
}

/// The `# HELP` and `# TYPE` lines of metric `name`.
fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn counter(c: &AtomicU64) -> i64 {
    i64::try_from(c.load(Ordering::Relaxed)).unwrap_or(i64::MAX)
}

/// `c`'s index in `list` (0 when not there).
fn index_in(list: &[Command], c: Command) -> usize {
    list.iter().position(|v| *v == c).unwrap_or(0)
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A [`PluginExec`] that times every run of the executor it wraps.
#[derive(Debug)]
pub(crate) struct TimedExec {
    pub(crate) inner: Arc<dyn PluginExec>,
    pub(crate) metrics: Arc<Metrics>,
}

impl PluginExec for TimedExec {
    fn exec<'a>(
        &'a self,
        req: ExecRequest<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<ExecOutput, cni_async::Error>> + Send + 'a>> {
        Box::pin(async move {
            let m = self.metrics.plugin(req.plugin_type, req.command);
            let started = Instant::now();
            let out = self.inner.exec(req).await;
            m.duration.observe(started.elapsed());
            if out.is_err() {
                m.errors.fetch_add(1, Ordering::Relaxed);
            }
            out
        })
    }

    fn find_plugin(
        &self,
        plugin_type: &str,
        dirs: &[std::path::PathBuf],
    ) -> Result<std::path::PathBuf, cni_async::Error> {
        self.inner.find_plugin(plugin_type, dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_text() {
        let m = Metrics::default();
        m.operation_done(
            Command::Add,
            Duration::from_millis(1),
            Duration::from_millis(30),
            None,
        );
        m.operation_done(
            Command::Add,
            Duration::ZERO,
            Duration::from_secs(2),
            Some(7),
        );
        let text = m.render();
        assert!(text.contains("cnid_operations_total{verb=\"ADD\",outcome=\"ok\"} 1"));
        assert!(text.contains("cnid_operation_errors_total{verb=\"ADD\",code=\"7\"} 1"));
        assert!(
            text.contains("cnid_operation_duration_seconds_bucket{verb=\"ADD\",le=\"0.05\"} 1")
        );
        assert!(
            text.contains("cnid_operation_duration_seconds_bucket{verb=\"ADD\",le=\"+Inf\"} 2")
        );
        assert!(text.contains("cnid_operation_duration_seconds_count{verb=\"ADD\"} 2"));
        assert!(text.contains("# TYPE cnid_operations_in_flight gauge"));
    }

    /// Defect: a scrape between an
    /// observation's bucket increment and its total's (`observe` counts
    /// the bucket first, concurrent ADDs and scrapes do interleave so)
    /// read a `+Inf` bucket and `_count` below the last finite bucket: a
    /// histogram that is not cumulative. Played here by half an
    /// observation.
    #[test]
    fn a_scrape_amid_an_observation_reads_a_cumulative_histogram() {
        let h = Histogram::with_bounds(&ADMISSION_BUCKETS);
        h.observe(Duration::from_micros(20));
        h.buckets[0].fetch_add(1, Ordering::Relaxed);
        let mut text = String::new();
        h.write(&mut text, "x", "");
        let values: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("x_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]), "{text}");
        assert!(text.contains("x_count 2"), "{text}");
    }

    /// The admission's histogram has buckets from 10 µs (the goal is 0.1
    /// ms), and its sum and count give the mean exactly.
    #[test]
    fn admission_histogram_text() {
        let m = Metrics::default();
        m.admitted(Command::Add, Duration::from_micros(20));
        m.admitted(Command::Add, Duration::from_micros(80));
        m.admitted(Command::Del, Duration::from_millis(3));
        let text = m.render();
        for line in [
            "# TYPE cnid_admission_duration_seconds histogram",
            "cnid_admission_duration_seconds_bucket{verb=\"ADD\",le=\"0.00001\"} 0",
            "cnid_admission_duration_seconds_bucket{verb=\"ADD\",le=\"0.000025\"} 1",
            "cnid_admission_duration_seconds_bucket{verb=\"ADD\",le=\"0.0001\"} 2",
            "cnid_admission_duration_seconds_bucket{verb=\"ADD\",le=\"+Inf\"} 2",
            "cnid_admission_duration_seconds_sum{verb=\"ADD\"} 0.0001",
            "cnid_admission_duration_seconds_count{verb=\"ADD\"} 2",
            "cnid_admission_duration_seconds_bucket{verb=\"DEL\",le=\"0.0025\"} 0",
            "cnid_admission_duration_seconds_bucket{verb=\"DEL\",le=\"0.005\"} 1",
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
    }
}
