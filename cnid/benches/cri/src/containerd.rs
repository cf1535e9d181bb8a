//! containerd of the run's own: its own config, root, state dir and
//! socket, its CRI plugin's CNI conf dir and bin dir in the run's temp
//! dir, so no other containerd on the host is touched, and the cleanup of
//! what its sandboxes leave when a round fails.
//!
//! # Caveats
//!
//! - containerd's runc shims listen on `/run/containerd/s/<hash of our
//!   socket and the sandbox>` whatever the config says: names of their
//!   own, in a directory other containerds share. A shim left behind is
//!   recognised by its `-address` argument (our socket) and killed by pid.
//! - Pod processes are recognised by the run's own cgroup parent
//!   (`/proc/PID/cgroup`), and killed by pid; the parent is removed when
//!   empty.
//! - Namespace and rootfs mounts live under our state dir
//!   (`netns_mounts_under_state_dir`); those left behind are lazily
//!   unmounted before the temp dir is removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::grpc::{self, Client};
use crate::proto;

/// The sandbox image's name (`mkimage.sh`'s default).
pub(crate) const IMAGE: &str = "docker.io/cnid-bench/pause:1";

/// The directories of the run's containerd.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) dir: PathBuf,
    pub(crate) socket: PathBuf,
    pub(crate) bin_dir: PathBuf,
    pub(crate) cgroup_parent: String,
    /// The runc the shims run (`BinaryName`); empty: runc from PATH.
    pub(crate) runc: String,
}

impl Layout {
    pub(crate) fn new(dir: &Path, bin_dir: &Path) -> Layout {
        Layout {
            dir: dir.to_owned(),
            socket: dir.join("containerd.sock"),
            bin_dir: bin_dir.to_owned(),
            cgroup_parent: format!("/cnid-bench-cri-{}", std::process::id()),
            runc: String::new(),
        }
    }

    /// The config (version 2, containerd 1.6) with `conf_dir` as the CRI
    /// plugin's CNI conf dir.
    fn config(&self, conf_dir: &Path) -> String {
        let d = self.dir.display();
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
# Plugins that would look outside the run's dirs or are not needed.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  # The pause container's oom_score_adj (-998) clamped to ours: lowering
  # it needs CAP_SYS_RESOURCE, which a sandboxed root may not have.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        # runc's state of our own, not /run/containerd/runc.
        Root = "{d}/runc"
"#,
            socket = self.socket.display(),
            bin = self.bin_dir.display(),
            conf = conf_dir.display(),
            runc = self.runc,
        )
    }
}

/// A running containerd; killed on drop if not stopped.
#[derive(Debug)]
pub(crate) struct Containerd {
    child: Option<Child>,
    log: PathBuf,
    pub(crate) client: Client,
    /// The CRI service path prefix it answers (`/runtime.v1.RuntimeService`
    /// or `/runtime.v1alpha2.RuntimeService`).
    pub(crate) service: &'static str,
    pub(crate) version: String,
}

const SERVICES: [&str; 2] = [
    "/runtime.v1.RuntimeService",
    "/runtime.v1alpha2.RuntimeService",
];

impl Containerd {
    /// Starts containerd with `conf_dir` as its CNI conf dir (log in
    /// `tag`.log) and waits until its CRI service answers Version.
    pub(crate) async fn start(
        layout: &Layout,
        conf_dir: &Path,
        tag: &str,
    ) -> anyhow::Result<Containerd> {
        let config = layout.dir.join(format!("config-{tag}.toml"));
        std::fs::write(&config, layout.config(conf_dir))
            .with_context(|| format!("write {}", config.display()))?;
        let log = layout.dir.join(format!("containerd-{tag}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start containerd (apt-get install containerd runc)")?;
        let mut c = ContainerdStarting { child: Some(child) };
        let start = Instant::now();
        loop {
            if let Some(st) = c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten()) {
                bail!(
                    "containerd exited at start ({st}): {}",
                    crate::log_tail(&log)
                );
            }
            if start.elapsed() > Duration::from_secs(120) {
                bail!(
                    "containerd not answering after 120 s: {}",
                    crate::log_tail(&log)
                );
            }
            if let Ok(client) = Client::connect(&layout.socket).await {
                match version(&client).await {
                    Ok((service, version)) => {
                        return Ok(Containerd {
                            child: c.child.take(),
                            log,
                            client,
                            service,
                            version,
                        });
                    }
                    Err(e) if is_unimplemented(&e) => {
                        bail!("containerd serves no CRI: {e:#}; {}", crate::log_tail(&log))
                    }
                    Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub(crate) fn log_tail(&self) -> String {
        crate::log_tail(&self.log)
    }

    /// SIGTERM, then SIGKILL after 30 s.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        let child = self.child.take();
        stop_child(child)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = stop_child(self.child.take());
    }
}

/// containerd before it answers: killed if the wait fails.
struct ContainerdStarting {
    child: Option<Child>,
}

impl Drop for ContainerdStarting {
    fn drop(&mut self) {
        let _ = stop_child(self.child.take());
    }
}

fn stop_child(child: Option<Child>) -> anyhow::Result<()> {
    let Some(mut child) = child else {
        return Ok(());
    };
    let pid = child.id() as i32;
    // SAFETY: kill(2) on our own child's pid, not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            if !st.success() && !terminated(st) {
                bail!("containerd exited with {st}");
            }
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            child.kill()?;
            child.wait()?;
            bail!("containerd did not stop within 30 s of SIGTERM: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn terminated(st: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    st.signal() == Some(libc::SIGTERM)
}

fn is_unimplemented(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<grpc::Status>()
            .is_some_and(|s| s.code == grpc::UNIMPLEMENTED)
    })
}

/// Version on runtime.v1, then v1alpha2 if v1 is not served.
async fn version(client: &Client) -> anyhow::Result<(&'static str, String)> {
    let mut last = None;
    for service in SERVICES {
        match client
            .call(
                &format!("{service}/Version"),
                &proto::version_request(),
                Duration::from_secs(10),
            )
            .await
        {
            Ok(resp) => {
                // VersionResponse { version = 1, runtime_name = 2,
                // runtime_version = 3, runtime_api_version = 4 }
                let name = proto::string_field(&resp, 2)?.unwrap_or_default();
                let v = proto::string_field(&resp, 3)?.unwrap_or_default();
                let api = proto::string_field(&resp, 4)?.unwrap_or_default();
                return Ok((service, format!("{name} {v}, CRI {api}")));
            }
            Err(e) if is_unimplemented(&e) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no CRI service")))
}

/// Imports the OCI archive `image` into the `k8s.io` namespace of the
/// containerd on `layout`'s socket (unpacked for overlayfs).
pub(crate) fn import_image(layout: &Layout, image: &Path) -> anyhow::Result<()> {
    crate::output_ok(
        Command::new("ctr")
            .arg("--address")
            .arg(&layout.socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(image),
        &format!("ctr images import {}", image.display()),
    )?;
    Ok(())
}

/// What a failed run left: shims of our containerd (by their `-address`),
/// processes in our cgroup parent, our cgroup dirs, mounts under our dir.
/// Returns what it did, for the report.
pub(crate) fn sweep(layout: &Layout) -> Vec<String> {
    let mut done = Vec::new();
    let socket = layout.socket.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            let shim = args.windows(2).any(|w| {
                (w[0] == b"-address" || w[0] == b"--address") && w[1] == socket.as_bytes()
            });
            let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
            let ours = cg.lines().any(|l| {
                l.split(':').nth(2).is_some_and(|p| {
                    p == layout.cgroup_parent
                        || p.starts_with(&format!("{}/", layout.cgroup_parent))
                })
            });
            if shim || ours {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        // SAFETY: kill(2); the pid was just matched by our socket or cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        done.push(format!("killed pid {pid}"));
    }
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for ctl in rd.flatten() {
            let top = ctl
                .path()
                .join(layout.cgroup_parent.trim_start_matches('/'));
            if let Ok(kids) = std::fs::read_dir(&top) {
                for k in kids.flatten() {
                    if k.path().is_dir() {
                        let _ = std::fs::remove_dir(k.path());
                    }
                }
                if std::fs::remove_dir(&top).is_err() {
                    done.push(format!("kept cgroup {} (not empty)", top.display()));
                }
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir = layout.dir.to_string_lossy().into_owned();
    let mut under: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&format!("{dir}/")))
        .collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in under {
        let ok = Command::new("umount")
            .args(["-l", m])
            .status()
            .is_ok_and(|s| s.success());
        done.push(format!(
            "{} {m}",
            if ok { "unmounted" } else { "could not unmount" }
        ));
    }
    done
}
