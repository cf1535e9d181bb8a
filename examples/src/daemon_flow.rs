//! The flow of the `daemon-client` example, shared with `demo`: two
//! sandboxes on a network, through a running cnid and its typed client
//! ([`cnid_client::Client`]). It is the `in-process` example's flow with
//! the daemon running the plugins:
//!
//! 1. the network as the daemon loaded it (`GET /v1/networks/{name}`);
//! 2. its bridge, created first with a fixed MAC when it does not exist
//!    (see [`crate::common::Bridge`] for why);
//! 3. two named namespaces, `PREFIXa` and `PREFIXb` (also the container IDs);
//! 4. ADD of both at once, and their addresses;
//! 5. a ping each way over the bridge;
//! 6. CHECK of both;
//! 7. the daemon's view of the attachments (`GET /v1/attachments`);
//!
//! and [`Flow::teardown`]: DEL of both, the namespaces, the bridge if this
//! run created it, host-local's dir if this run created it; then the daemon
//! must list none of the attachments and host-local must hold no address.
//!
//! Part of the examples' library (`examples/src/lib.rs`), next to `common`.
//!
//! # Caveats
//! The flow runs inside a `select!` with the signals: a signal drops it at
//! an `.await`. Dropping an ADD closes its connection; the daemon then
//! cancels the ADD if it is still queued, or finishes it (or rolls it back)
//! if its plugins already run. Either way the teardown's DEL is queued
//! behind it (one operation per container at a time, in arrival order), so
//! it never races the ADD it undoes.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow, bail};
use cni_async::netns::NetnsGuard;
use cni_core::result::CniResult;
use cni_core::{NetworkConfigList, Version};
use cnid_client::api::{AttachmentInfo, AttachmentRequest};
use cnid_client::{Client, ClientError};
use futures::future::join_all;
use ipnet::IpNet;

use crate::common::{self, Bridge, HostLocalDirs};

/// cnid's socket when neither `--socket` nor `CNID_SOCKET` is given.
pub const DEFAULT_SOCKET: &str = "/run/cnid/cnid.sock";

/// The interface of both sandboxes.
pub const IFNAME: &str = "eth0";

/// Each request's deadline, queueing included.
const TIMEOUT_MS: u64 = 30_000;

/// Whether [`heading`] prints (the demo turns it on).
static HEADINGS: AtomicBool = AtomicBool::new(false);
/// The number of the last heading printed.
static STEP: AtomicU32 = AtomicU32::new(0);

/// Numbered headings before each step from now on (`== 3. ADD ...`).
pub fn enable_headings() {
    HEADINGS.store(true, Ordering::Relaxed);
}

/// Prints the next numbered heading, when [`enable_headings`] was called.
pub fn heading(text: &str) {
    if HEADINGS.load(Ordering::Relaxed) {
        let n = STEP.fetch_add(1, Ordering::Relaxed) + 1;
        println!("\n== {n}. {text}");
    }
}

/// The socket: `--socket`, else `CNID_SOCKET`, else `/run/cnid/cnid.sock`.
pub fn socket_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("CNID_SOCKET")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// Connects to cnid and asks for its health; prints one line about it.
pub async fn connect(socket: &std::path::Path) -> Result<Client> {
    let client = Client::connect(socket).await.with_context(|| {
        format!(
            "is cnid running? (as root: `cnid --socket {} --conf-dir examples/net.d`)",
            socket.display()
        )
    })?;
    let health = client.health().await.context("GET /v1/health")?;
    println!(
        "cnid {} at {}: {}, {} networks, up {} s",
        health.version,
        socket.display(),
        health.status,
        health.networks,
        health.uptime_seconds
    );
    Ok(client)
}

/// One of the two sandboxes.
#[derive(Debug)]
struct Member {
    label: &'static str,
    netns: NetnsGuard,
    req: AttachmentRequest,
    /// An ADD was sent: the teardown owes it a DEL.
    attempted: bool,
    /// Its IPv4 address on [`IFNAME`], from the ADD result.
    ipv4: Option<IpNet>,
}

/// What the flow created, for the teardown.
#[derive(Debug)]
pub struct Flow {
    client: Client,
    network: String,
    prefix: String,
    host_local: Option<HostLocalDirs>,
    bridge: Option<Bridge>,
    members: Vec<Member>,
}

impl Flow {
    /// A flow on `network` with namespaces `PREFIXa` and `PREFIXb`.
    pub fn new(client: Client, network: &str, prefix: &str) -> Flow {
        Flow {
            client,
            network: network.to_owned(),
            prefix: prefix.to_owned(),
            host_local: None,
            bridge: None,
            members: Vec::new(),
        }
    }

    /// The bridge this run created, if any.
    pub fn created_bridge(&self) -> Option<String> {
        self.bridge
            .as_ref()
            .filter(|b| b.created())
            .map(|b| b.name().to_owned())
    }

    /// Steps 1 to 7 (see the module docs). Everything it makes is recorded
    /// before the next `.await`, so that [`Flow::teardown`] finds it however
    /// this ends (error, or dropped on a signal).
    pub async fn run(&mut self) -> Result<()> {
        heading("the network, as cnid loaded it");
        let list = self.load_network().await?;
        heading("the bridge and two network namespaces");
        self.make_bridge(&list)?;
        self.make_namespaces()?;
        heading("ADD both namespaces to the network, through cnid");
        self.add().await?;
        heading("ping between them");
        self.ping().await?;
        heading("CHECK both");
        self.check().await?;
        heading("the daemon's view of the attachments");
        self.show_attachments().await?;
        Ok(())
    }

    async fn load_network(&mut self) -> Result<NetworkConfigList> {
        let info = match self.client.network(&self.network).await {
            Ok(info) => info,
            Err(e @ ClientError::Api { status: 404, .. }) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "cnid has no network {:?} (start it with `--conf-dir examples/net.d`)",
                    self.network
                )));
            }
            Err(e) => return Err(e).context(format!("GET /v1/networks/{}", self.network)),
        };
        println!(
            "network {} (CNI {}) from {}: {}",
            info.name,
            info.cni_version,
            info.file,
            info.plugins.join(", ")
        );
        let config = info.config.ok_or_else(|| {
            anyhow!(
                "cnid sent network {:?} without its configuration",
                info.name
            )
        })?;
        let list = NetworkConfigList::from_value(&config)
            .with_context(|| format!("the configuration of {:?} as cnid sent it", info.name))?;
        // host-local runs on this host (cnid's plugins are children of
        // cnid, which listens on a local socket): its dir is ours to check.
        self.host_local = Some(HostLocalDirs::of(&list));
        Ok(list)
    }

    fn make_bridge(&mut self, list: &NetworkConfigList) -> Result<()> {
        let Some(name) = common::bridge_of(list) else {
            return Ok(());
        };
        let bridge = Bridge::ensure(&name)?;
        if bridge.created() {
            println!(
                "bridge {name}: created with MAC {}",
                common::bridge_mac(&name)
            );
        } else if !bridge.has_fixed_mac() {
            println!(
                "bridge {name}: exists without a MAC of its own; the bridge plugin's CHECK \
                 may fail once a second container joins (delete the bridge and rerun)"
            );
        } else {
            println!("bridge {name}: exists");
        }
        self.bridge = Some(bridge);
        Ok(())
    }

    fn make_namespaces(&mut self) -> Result<()> {
        for label in ["a", "b"] {
            let name = format!("{}{label}", self.prefix);
            let netns = NetnsGuard::create(&name)
                .with_context(|| format!("create network namespace {name}"))?;
            let mut req = AttachmentRequest::new(&name, netns.path().display().to_string(), IFNAME);
            // Labels as a runtime sends them; IgnoreUnknown=1 because the
            // reference plugins refuse CNI_ARGS keys they do not know.
            req.cni_args = format!("IgnoreUnknown=1;K8S_POD_NAME=example-{label}");
            req.timeout_ms = Some(TIMEOUT_MS);
            println!(
                "sandbox {label}: namespace {} (container ID {name})",
                netns.path().display()
            );
            self.members.push(Member {
                label,
                netns,
                req,
                attempted: false,
                ipv4: None,
            });
        }
        Ok(())
    }

    async fn add(&mut self) -> Result<()> {
        // Both at once: different containers run in parallel in cnid.
        for m in &mut self.members {
            m.attempted = true;
        }
        let started = Instant::now();
        let outcomes = join_all(
            self.members
                .iter()
                .map(|m| self.client.add(&self.network, &m.req)),
        )
        .await;
        let mut results = Vec::new();
        for (m, outcome) in self.members.iter().zip(outcomes) {
            results.push(outcome.with_context(|| format!("ADD sandbox {}", m.label))?);
        }
        println!(
            "ADD: both sandboxes in {:.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
        for (m, result) in self.members.iter_mut().zip(&results) {
            let parsed = CniResult::from_value(result, Version::CURRENT)
                .with_context(|| format!("the ADD result of sandbox {}", m.label))?;
            print_result(m.label, &parsed);
            m.ipv4 = sandbox_addresses(&parsed)
                .into_iter()
                .find(|a| a.addr().is_ipv4());
        }
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        for (from, to) in [(0, 1), (1, 0)] {
            let src = &self.members[from];
            let dst = &self.members[to];
            let ip: IpAddr = dst
                .ipv4
                .ok_or_else(|| anyhow!("sandbox {} got no IPv4 address on {IFNAME}", dst.label))?
                .addr();
            let ping = common::ping(&src.netns, ip, 3).await?;
            if !ping.ok {
                bail!(
                    "ping {} -> {} ({ip}): no answer after {} attempts (a host firewall dropping \
                     bridged traffic, e.g. FORWARD policy DROP with br_netfilter?)",
                    src.label,
                    dst.label,
                    ping.attempts
                );
            }
            println!(
                "ping {} -> {} ({ip}): ok, time {}",
                src.label,
                dst.label,
                ping.rtt.as_deref().unwrap_or("?")
            );
        }
        Ok(())
    }

    async fn check(&self) -> Result<()> {
        for m in &self.members {
            self.client
                .check(&self.network, &m.req)
                .await
                .with_context(|| format!("CHECK sandbox {}", m.label))?;
            println!("CHECK sandbox {}: ok", m.label);
        }
        Ok(())
    }

    async fn show_attachments(&self) -> Result<()> {
        let all = self
            .client
            .attachments(None)
            .await
            .context("GET /v1/attachments")?;
        let ours: Vec<&AttachmentInfo> = all
            .iter()
            .filter(|a| {
                self.members
                    .iter()
                    .any(|m| m.req.container_id == a.container_id)
            })
            .collect();
        println!(
            "GET /v1/attachments: {} attachments, {} of them ours",
            all.len(),
            ours.len()
        );
        for a in &ours {
            let ips = a
                .result
                .as_ref()
                .and_then(|r| CniResult::from_value(r, Version::CURRENT).ok())
                .map(|r| sandbox_addresses(&r))
                .unwrap_or_default();
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            println!(
                "  attachment {} {} {}: netns {}, ips {}, args {}",
                a.network,
                a.container_id,
                a.ifname,
                a.netns,
                if ips.is_empty() {
                    "-".to_owned()
                } else {
                    ips.join(" ")
                },
                if a.cni_args.is_empty() {
                    "-"
                } else {
                    &a.cni_args
                },
            );
        }
        // The daemon's view matches what ADD answered.
        for m in &self.members {
            let listed = ours.iter().any(|a| {
                a.container_id == m.req.container_id
                    && a.ifname == m.req.ifname
                    && a.network == self.network
                    && a.netns == m.req.netns
            });
            if !listed {
                bail!(
                    "cnid does not list the attachment of sandbox {} ({} {} {})",
                    m.label,
                    self.network,
                    m.req.container_id,
                    m.req.ifname
                );
            }
        }
        Ok(())
    }

    /// DEL of every sandbox an ADD was sent for, then the namespaces, the
    /// bridge (if this run created it), and host-local's dir (if this run
    /// created it and it is empty again); then checks that cnid lists none
    /// of our attachments and host-local holds no address. Goes on past
    /// errors and reports them all.
    pub async fn teardown(self) -> Result<()> {
        let mut errors: Vec<String> = Vec::new();
        for m in self.members.iter().rev().filter(|m| m.attempted) {
            match self.client.del(&self.network, &m.req).await {
                Ok(()) => println!("DEL sandbox {}: ok", m.label),
                Err(e) => errors.push(format!(
                    "DEL sandbox {}: {:#}",
                    m.label,
                    anyhow::Error::new(e)
                )),
            }
        }
        if self.members.iter().any(|m| m.attempted) {
            match self.client.attachments(None).await {
                Ok(all) => {
                    let left: Vec<String> = all
                        .iter()
                        .filter(|a| {
                            self.members
                                .iter()
                                .any(|m| m.req.container_id == a.container_id)
                        })
                        .map(|a| format!("{} {} {}", a.network, a.container_id, a.ifname))
                        .collect();
                    if left.is_empty() {
                        println!("GET /v1/attachments: none of ours left");
                    } else {
                        errors.push(format!("cnid still lists {left:?}"));
                    }
                }
                Err(e) => errors.push(format!("GET /v1/attachments: {:#}", anyhow::Error::new(e))),
            }
        }
        for m in self.members {
            let path = m.netns.path().display().to_string();
            match m.netns.delete() {
                Ok(()) => println!("namespace {path}: deleted"),
                Err(e) => errors.push(format!(
                    "delete namespace {path}: {:#}",
                    anyhow::Error::new(e)
                )),
            }
        }
        if let Some(bridge) = self.bridge {
            match bridge.release() {
                Ok(what) => println!("{what}"),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if let Some(host_local) = &self.host_local {
            match host_local.reserved() {
                Ok(ips) if ips.is_empty() => {}
                Ok(ips) => errors.push(format!(
                    "host-local still holds {ips:?} in {:?}",
                    host_local.paths().collect::<Vec<_>>()
                )),
                Err(e) => errors.push(format!("{e:#}")),
            }
            match host_local.tidy() {
                Ok(removed) => {
                    for dir in removed {
                        println!("removed {}", dir.display());
                    }
                }
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if errors.is_empty() {
            println!("teardown: done");
            Ok(())
        } else {
            Err(anyhow!(errors.join("; ")))
        }
    }
}

/// The addresses of the sandbox's [`IFNAME`] in a result (all addresses
/// when the result names no interface, as a 0.2.0 one).
fn sandbox_addresses(result: &CniResult) -> Vec<IpNet> {
    let r = result.to_current();
    let index = r
        .interfaces
        .iter()
        .position(|i| i.name == IFNAME && i.sandbox.is_some());
    r.ips
        .iter()
        .filter(|ip| match (index, ip.interface) {
            (Some(want), Some(got)) => usize::try_from(got).is_ok_and(|g| g == want),
            (None, _) => true,
            (Some(_), None) => false,
        })
        .map(|ip| ip.address)
        .collect()
}

fn print_result(label: &str, result: &CniResult) {
    let addrs: Vec<String> = sandbox_addresses(result)
        .iter()
        .map(ToString::to_string)
        .collect();
    let r = result.to_current();
    let mac = r
        .interfaces
        .iter()
        .find(|i| i.name == IFNAME && i.sandbox.is_some())
        .and_then(|i| i.mac.as_deref())
        .unwrap_or("?");
    println!("sandbox {label}: {IFNAME} {} (mac {mac})", addrs.join(" "));
    // The other interfaces the chain reported: lo in the sandbox, the
    // bridge and the veth on the host.
    for (n, iface) in r.interfaces.iter().enumerate() {
        if iface.name == IFNAME && iface.sandbox.is_some() {
            continue;
        }
        let where_ = if iface.sandbox.is_some() {
            "sandbox"
        } else {
            "host"
        };
        let mut line = format!("  {where_} interface {}", iface.name);
        for ip in r.ips.iter().filter(|ip| {
            ip.interface
                .is_some_and(|i| usize::try_from(i).is_ok_and(|i| i == n))
        }) {
            line.push_str(&format!(" {}", ip.address));
        }
        if let Some(mac) = &iface.mac {
            line.push_str(&format!(" (mac {mac})"));
        }
        println!("{line}");
    }
}
