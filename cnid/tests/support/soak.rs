//! What the crash soaks share: the seed (printed, `SOAK_SEED` replays a
//! run), a small deterministic generator, the daemons' logs of a run, and
//! a sweep of the plugins a killed daemon left running.

use std::path::Path;

/// The run's seed: `SOAK_SEED` (decimal or `0x` hex), or one from the clock.
pub fn seed() -> u64 {
    match std::env::var("SOAK_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("bad SOAK_SEED {s:?}"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1);
            (t ^ u64::from(std::process::id()).rotate_left(32)) | 1
        }
    }
}

/// xorshift64*: small, deterministic.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Every daemon log of the run (`cnid-N.log` in `root`), concatenated.
pub fn support_logs(root: &Path) -> String {
    let mut names: Vec<_> = std::fs::read_dir(root)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("cnid-") && n.ends_with(".log"))
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect()
}

/// Kills, on drop, plugin processes a SIGKILLed daemon left behind that
/// still run from our temp dirs (so a failing run leaves nothing).
pub struct OrphanSweep(pub String);

impl Drop for OrphanSweep {
    fn drop(&mut self) {
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if String::from_utf8_lossy(&environ).contains(&self.0)
                && pid != std::process::id() as i32
            {
                // SAFETY: kill has no memory preconditions.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// Waits (up to `limit`) until the restarted daemon's recovery is over: no
/// intent file left and no operation in flight; `what` names the moment
/// in the failure message.
pub async fn recovery_over(
    dirs: &super::daemon::Dirs,
    client: &cnid::client::Client,
    limit: std::time::Duration,
    what: &str,
) {
    let end = std::time::Instant::now() + limit;
    while !dirs.intents().is_empty()
        || !client
            .operations(None)
            .await
            .expect("operations")
            .is_empty()
    {
        assert!(
            std::time::Instant::now() < end,
            "{what}: recovery not over after {limit:?}: intents {:?}",
            dirs.intents()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
