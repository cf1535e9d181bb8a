//! One round: containerd started on one conf dir, N pod sandboxes run at
//! concurrency C through the CRI API (each RunPodSandbox timed), then all
//! stopped and removed at C (StopPodSandbox + RemovePodSandbox timed as
//! one), containerd stopped. CPU of containerd and cnid is read from
//! `/proc` around each half.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::Semaphore;

use crate::containerd::{Containerd, Layout};
use crate::proto::{self, Sandbox};

/// The longest a single CRI call may take (the kubelet's default runtime
/// request timeout is 2 minutes; a loaded 2-CPU machine needs more).
const CALL: Duration = Duration::from_secs(300);

/// The ways a round sets its sandboxes' network up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// The chain in containerd's conf dir.
    Direct,
    /// `cnid-shim config`'s list in containerd's conf dir, cnid (default
    /// options) runs the chain.
    Cnid,
    /// The same through a second cnid that paces bursts
    /// (`--plugin-slots N`, `--paced N`).
    Paced,
}

impl Way {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Cnid => "cnid",
            Way::Paced => "paced",
        }
    }

    /// How the report names it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Way::Direct => "direct",
            Way::Cnid => "via cnid",
            Way::Paced => "via cnid, paced",
        }
    }
}

/// CPU seconds (user + system) of a process and of its reaped children.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    pub(crate) own: f64,
    pub(crate) children: f64,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, o: Cpu) -> Cpu {
        Cpu {
            own: self.own - o.own,
            children: self.children - o.children,
        }
    }
}

/// `/proc/PID/stat`'s utime + stime and cutime + cstime.
pub(crate) fn proc_cpu(pid: i32) -> anyhow::Result<Cpu> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The fields after the command (which may hold spaces), from state on.
    let rest = s
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("/proc/{pid}/stat: no ')'"))?;
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(f64::NAN))
        .collect();
    anyhow::ensure!(f.len() == 4, "/proc/{pid}/stat: short");
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(Cpu {
        own: (f[0] + f[1]) / tick,
        children: (f[2] + f[3]) / tick,
    })
}

/// One half of a round (the runs or the removals).
#[derive(Debug, Default, Clone)]
pub(crate) struct Half {
    /// Per-sandbox call times, seconds, sorted.
    pub(crate) calls: Vec<f64>,
    /// Wall time of the whole burst, seconds.
    pub(crate) wall: f64,
    pub(crate) containerd: Cpu,
    pub(crate) cnid: Cpu,
}

/// A round's figures.
#[derive(Debug, Clone)]
pub(crate) struct Round {
    pub(crate) run: Half,
    pub(crate) remove: Half,
    /// The 1-minute load average at the start and at the end.
    pub(crate) load: (f64, f64),
}

pub(crate) fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// What a round needs to know.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub(crate) layout: &'a Layout,
    pub(crate) direct_conf: &'a Path,
    pub(crate) cnid_conf: &'a Path,
    pub(crate) cnid_pid: i32,
    /// The pacing cnid's list and pid (`--paced`).
    pub(crate) paced: Option<(&'a Path, i32)>,
    pub(crate) host_ip: String,
    /// host-local's dir for the network: one file per address it gave.
    pub(crate) leases: &'a Path,
}

/// The addresses host-local holds for the network (files named by IP).
fn leases(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok())
            })
            .count()
    })
}

/// Runs one round of `way`: `n` sandboxes at `concurrency`; `tag` names
/// its sandboxes and log.
pub(crate) async fn round(
    ctx: &Ctx<'_>,
    way: Way,
    tag: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(Round, String)> {
    let (conf, cnid_pid) = match (way, ctx.paced) {
        (Way::Direct, _) => (ctx.direct_conf, ctx.cnid_pid),
        (Way::Cnid, _) => (ctx.cnid_conf, ctx.cnid_pid),
        (Way::Paced, Some(p)) => p,
        (Way::Paced, None) => bail!("no pacing cnid (--paced)"),
    };
    let load0 = load1();
    let cd = Containerd::start(ctx.layout, conf, tag).await?;
    let version = cd.version.clone();
    let res = bursts(ctx, &cd, cnid_pid, tag, n, concurrency).await;
    let res = res.map_err(|e| e.context(cd.log_tail()));
    let stopped = cd.stop();
    let (run, remove) = res?;
    stopped?;
    Ok((
        Round {
            run,
            remove,
            load: (load0, load1()),
        },
        version,
    ))
}

/// The run burst and the removal burst; every sandbox that ran is removed
/// even when the run burst failed.
async fn bursts(
    ctx: &Ctx<'_>,
    cd: &Containerd,
    cnid_pid: i32,
    tag: &str,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(Half, Half)> {
    let sem = Arc::new(Semaphore::new(concurrency));
    let cpu0 = (proc_cpu(cd.pid())?, proc_cpu(cnid_pid)?);
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let client = cd.client.clone();
        let path = format!("{}/RunPodSandbox", cd.service);
        let name = format!("{tag}-{i}");
        let uid = format!("{}-{tag}-{i}", std::process::id());
        let req = proto::run_pod_sandbox_request(&Sandbox {
            name: &name,
            uid: &uid,
            namespace: "cnid-bench",
            host_ip: &ctx.host_ip,
            cgroup_parent: &ctx.layout.cgroup_parent,
        });
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let t = Instant::now();
            let resp = client.call(&path, &req, CALL).await?;
            let took = t.elapsed().as_secs_f64();
            let id = proto::string_field(&resp, 1)?
                .filter(|id| !id.is_empty())
                .context("RunPodSandbox answered no pod_sandbox_id")?;
            anyhow::Ok((id, took))
        }));
    }
    let mut ids = Vec::with_capacity(n);
    let mut run = Half::default();
    let mut first_err = None;
    for t in tasks {
        match t.await? {
            Ok((id, took)) => {
                ids.push(id);
                run.calls.push(took);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    run.wall = t0.elapsed().as_secs_f64();
    let cpu1 = (proc_cpu(cd.pid())?, proc_cpu(cnid_pid)?);
    let failed_runs = n - ids.len();
    // The chain really ran: one address per sandbox (checked untimed).
    let held = leases(ctx.leases);
    if first_err.is_none() && held != ids.len() {
        first_err = Some(anyhow::anyhow!(
            "{} sandboxes run but host-local holds {held} addresses in {}",
            ids.len(),
            ctx.leases.display()
        ));
    }

    let t1 = Instant::now();
    let mut tasks = Vec::with_capacity(ids.len());
    for id in ids {
        let client = cd.client.clone();
        let stop = format!("{}/StopPodSandbox", cd.service);
        let remove = format!("{}/RemovePodSandbox", cd.service);
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let t = Instant::now();
            let req = proto::sandbox_id_request(&id);
            client.call(&stop, &req, CALL).await?;
            client.call(&remove, &req, CALL).await?;
            anyhow::Ok(t.elapsed().as_secs_f64())
        }));
    }
    let mut remove = Half::default();
    let mut failed_removals = 0;
    for t in tasks {
        match t.await? {
            Ok(took) => remove.calls.push(took),
            Err(e) => {
                failed_removals += 1;
                if first_err.is_none() {
                    first_err = Some(e);
                }
            }
        }
    }
    remove.wall = t1.elapsed().as_secs_f64();
    let cpu2 = (proc_cpu(cd.pid())?, proc_cpu(cnid_pid)?);
    let held = leases(ctx.leases);
    if first_err.is_none() && held != 0 {
        first_err = Some(anyhow::anyhow!(
            "every sandbox removed but host-local still holds {held} addresses in {}",
            ctx.leases.display()
        ));
    }
    if let Some(e) = first_err {
        bail!(
            "{tag}: {failed_runs} of {n} RunPodSandbox and {failed_removals} Stop+Remove failed; first: {e:#}"
        );
    }
    run.containerd = cpu1.0 - cpu0.0;
    run.cnid = cpu1.1 - cpu0.1;
    remove.containerd = cpu2.0 - cpu1.0;
    remove.cnid = cpu2.1 - cpu1.1;
    run.calls.sort_by(f64::total_cmp);
    remove.calls.sort_by(f64::total_cmp);
    Ok((run, remove))
}
