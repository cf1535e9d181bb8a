//! cnid of the run's own (socket, conf, cache and state dirs in the run's
//! temp dir, the reference plugins), and the list `cnid-shim config`
//! writes for containerd's conf dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running cnid; killed on drop.
#[derive(Debug)]
pub(crate) struct Cnid {
    child: Child,
    pub(crate) socket: PathBuf,
    log: PathBuf,
}

impl Cnid {
    /// Starts `bin` as `name` (`dir`/`name`.sock, its log, cache and state
    /// dirs named the same) with `conf` as its conf dir and `extra`
    /// arguments, and waits until it listens.
    pub(crate) fn start(
        bin: &Path,
        name: &str,
        dir: &Path,
        conf: &Path,
        plugins: &str,
        extra: &[String],
    ) -> anyhow::Result<Cnid> {
        let socket = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .arg("--socket")
            .arg(&socket)
            .arg("--conf-dir")
            .arg(conf)
            .arg("--cache-dir")
            .arg(dir.join(format!("{name}-cache")))
            .arg("--state-dir")
            .arg(dir.join(format!("{name}-state")))
            .arg("--plugin-dir")
            .arg(plugins)
            .args(extra)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let mut d = Cnid { child, socket, log };
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&d.socket).is_err() {
            if let Some(st) = d.child.try_wait()? {
                bail!("cnid exited at start ({st}): {}", d.log_tail());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("cnid not listening after 60 s: {}", d.log_tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// How its paced operations ran (`cnid_paced_operations_total`, the
    /// whole run, warm-ups included), as `slot N, lent N, waited_out N`.
    pub(crate) async fn paced_counts(&self) -> anyhow::Result<String> {
        let text = cnid_client::Client::connect(&self.socket)
            .await?
            .metrics()
            .await?;
        let counts: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("cnid_paced_operations_total{how=\""))
            .filter_map(|l| l.split_once("\"} "))
            .map(|(how, n)| format!("{how} {n}"))
            .collect();
        if counts.is_empty() {
            bail!("no cnid_paced_operations_total in cnid's /metrics");
        }
        Ok(counts.join(", "))
    }

    pub(crate) fn log_tail(&self) -> String {
        crate::log_tail(&self.log)
    }
}

impl Drop for Cnid {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(20) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Writes the list `cnid-shim config` prints for `network` (on cnid's
/// `socket`) into `conf_dir`.
pub(crate) fn shim_list(
    shim: &Path,
    socket: &Path,
    network: &str,
    conf_dir: &Path,
) -> anyhow::Result<()> {
    let list = crate::output_ok(
        Command::new(shim)
            .args(["config", "--socket"])
            .arg(socket)
            .args(["--network", network, "--timeout", "120s"])
            .env_remove("CNI_COMMAND"),
        "cnid-shim config",
    )?;
    std::fs::write(conf_dir.join("00-cnid.conflist"), list)?;
    Ok(())
}
