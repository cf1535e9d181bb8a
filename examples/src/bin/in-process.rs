//! Two sandboxes on the bundled bridge network, with the library in-process:
//! set up (both at once), print their addresses, CHECK, ping one from the
//! other, tear down.
//!
//! ```text
//! sudo -E cargo run -p cni-examples --bin in-process
//! sudo -E cargo run -p cni-examples --bin in-process -- --wait   # look around, then Ctrl-C
//! ```
//!
//! It creates its own two network namespaces and deletes them at the end,
//! also after an error and on Ctrl-C or SIGTERM (the signal ends the current
//! step, then everything is torn down). Plugins come from `--plugin-dirs`,
//! `CNI_PATH`, or `/opt/cni/bin:/usr/lib/cni`; the result cache is a temp
//! dir unless `--cache-dir` is given. host-local keeps its reservations in
//! its default `dataDir`, `/var/lib/cni/networks/cnirs-bridge`; the DELs
//! release them, and the dir is removed again when this run created it.
//!
//! Two things about the reference plugins (1.1.1) shape it:
//!
//! - A Linux bridge without a MAC of its own takes the lowest MAC of its
//!   ports, so the bridge plugin's CHECK of the first sandbox fails once the
//!   second has joined ("Bridge interface ... Mac doesn't match"). When the
//!   bridge does not exist yet, the example creates it first with a fixed,
//!   locally administered MAC and deletes it at the end.
//! - portmap's CHECK fails for containers with port mappings whenever
//!   `ip6tables` exists, so the sandboxes here have no `portMappings`
//!   (portmap is in the chain and does nothing for them).
//!
//! Traffic stays on the bridge: the network has no gateway, no masquerading,
//! no default route.

use cni_examples::common;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use clap::Parser;
use cni_async::Cni;
use cni_async::multi::{MultiNetwork, MultiResult, Sandbox};
use cni_async::netns::NetnsGuard;
use cni_core::confdir;
use common::{Bridge, CacheDir, HostLocalDirs, Interrupt, Signals};
use futures::future::join_all;

/// Sets up two sandboxes on a bridge network in-process, CHECKs them, pings
/// one from the other and tears everything down.
#[derive(Debug, Parser)]
#[command(name = "in-process")]
struct Args {
    /// The conf dir to load the network from.
    #[arg(long, value_name = "DIR", default_value = common::DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// The network (its `name`).
    #[arg(long, value_name = "NAME", default_value = "cnirs-bridge")]
    network: String,
    /// Plugin dirs, `:`-separated [default: $CNI_PATH, else /opt/cni/bin:/usr/lib/cni].
    #[arg(long, value_name = "DIRS")]
    plugin_dirs: Option<String>,
    /// The result cache dir [default: a temp dir, removed at the end].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Namespace names (and container IDs) are PREFIX + `a` and PREFIX + `b`
    /// [default: cnirs-ipPID-].
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// After the ping, keep everything up until Ctrl-C or SIGTERM.
    #[arg(long)]
    wait: bool,
}

/// What this run created, for the teardown.
#[derive(Debug, Default)]
struct Created {
    bridge: Option<Bridge>,
    sandboxes: Vec<Member>,
}

#[derive(Debug)]
struct Member {
    label: &'static str,
    netns: NetnsGuard,
    sandbox: Sandbox,
    /// An ADD was started: the teardown owes it a DEL.
    attempted: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("in-process: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode> {
    common::require_root("in-process")?;
    // From here on Ctrl-C no longer kills us: it ends the current step and
    // we tear down.
    let mut signals = Signals::install()?;

    let cache = CacheDir::new(args.cache_dir.clone())?;
    let plugin_dirs = common::plugin_dirs(args.plugin_dirs.as_deref());
    let list = confdir::load_network(&args.conf_dir, &args.network).with_context(|| {
        format!(
            "load network {:?} from {}",
            args.network,
            args.conf_dir.display()
        )
    })?;
    let types: Vec<&str> = list.plugins().iter().map(|p| p.plugin_type()).collect();
    println!(
        "network {} (CNI {}): {}",
        list.name(),
        list.version(),
        types.join(", ")
    );
    println!("plugin dirs: {}", common::show_paths(&plugin_dirs));
    println!("result cache: {}", cache.path().display());

    let cni = Cni::builder()
        .plugin_dirs(&plugin_dirs)
        .cache_dir(cache.path())
        .build();
    // One network, interface eth0 (the list has its own loopback plugin).
    // Each network operation gets 30 s.
    let host_local = HostLocalDirs::of(&list);
    let networks = MultiNetwork::builder(cni)
        .network(list.clone())
        .timeout(Duration::from_secs(30))
        .build()?;

    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("cnirs-ip{}-", std::process::id()));
    let mut created = Created::default();

    let mut stopped_by: Option<Interrupt> = None;
    let outcome = tokio::select! {
        r = demo(&networks, &list, &prefix, &mut created) => r,
        s = signals.recv() => {
            println!("{s}: stopping, tearing down");
            stopped_by = Some(s);
            Ok(())
        }
    };
    if let Err(e) = &outcome {
        eprintln!("in-process: {e:#}");
        println!("failed, tearing down");
    } else if stopped_by.is_none() && args.wait {
        println!(
            "everything is up: try `ip netns exec {prefix}a ip addr`; press Ctrl-C to tear down"
        );
        let s = signals.recv().await;
        println!("{s}: tearing down");
    }

    // The teardown runs to its end; signals meanwhile are only reported.
    let teardown = teardown(&networks, created, &host_local);
    tokio::pin!(teardown);
    let torn_down = loop {
        tokio::select! {
            r = &mut teardown => break r,
            s = signals.recv() => println!("{s}: already tearing down"),
        }
    };
    drop(cache);

    let failed = outcome.is_err() || torn_down.is_err();
    if let Err(e) = torn_down {
        eprintln!("in-process: teardown: {e:#}");
    }
    Ok(match stopped_by {
        _ if failed => ExitCode::FAILURE,
        Some(s) => ExitCode::from(s.exit_code()),
        None => ExitCode::SUCCESS,
    })
}

/// Bridge, namespaces, setup, CHECK, ping. Everything it makes goes into
/// `created` first, so that the teardown finds it however this ends
/// (error, or dropped on a signal).
async fn demo(
    networks: &MultiNetwork,
    list: &cni_core::NetworkConfigList,
    prefix: &str,
    created: &mut Created,
) -> Result<()> {
    if let Some(name) = common::bridge_of(list) {
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
        created.bridge = Some(bridge);
    }

    for label in ["a", "b"] {
        let name = format!("{prefix}{label}");
        let netns = NetnsGuard::create(&name)?;
        let sandbox = Sandbox::new(&name, netns.path().display().to_string())
            .with_label("K8S_POD_NAME", format!("example-{label}"));
        println!(
            "sandbox {label}: namespace {} (container ID {name})",
            netns.path().display()
        );
        created.sandboxes.push(Member {
            label,
            netns,
            sandbox,
            attempted: false,
        });
    }

    // Both ADDs at once: different containers, so the spec allows it.
    for m in &mut created.sandboxes {
        m.attempted = true;
    }
    let started = Instant::now();
    let outcomes = join_all(created.sandboxes.iter().map(|m| networks.setup(&m.sandbox))).await;
    let mut results = Vec::new();
    for (m, outcome) in created.sandboxes.iter().zip(outcomes) {
        results.push(outcome.with_context(|| format!("set up sandbox {}", m.label))?);
    }
    println!(
        "setup: both sandboxes in {:.0} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let ifname = networks.networks()[0].ifname().to_owned();
    for (m, result) in created.sandboxes.iter().zip(&results) {
        print_result(m.label, &ifname, result);
    }

    for m in &created.sandboxes {
        networks
            .check(&m.sandbox)
            .await
            .with_context(|| format!("CHECK sandbox {}", m.label))?;
        println!("CHECK sandbox {}: ok", m.label);
    }

    // a -> b and b -> a, over the bridge.
    for (from, to) in [(0, 1), (1, 0)] {
        let src = &created.sandboxes[from];
        let dst = &created.sandboxes[to];
        let ip = ipv4_of(&results[to], &ifname)
            .ok_or_else(|| anyhow!("sandbox {} got no IPv4 address on {ifname}", dst.label))?;
        let ping = common::ping(&src.netns, ip, 3).await?;
        if !ping.ok {
            return Err(anyhow!(
                "ping {} -> {} ({ip}): no answer after {} attempts (a host firewall dropping \
                 bridged traffic, e.g. FORWARD policy DROP with br_netfilter?)",
                src.label,
                dst.label,
                ping.attempts
            ));
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

fn print_result(label: &str, ifname: &str, result: &MultiResult) {
    let addrs: Vec<String> = result
        .addresses(ifname)
        .iter()
        .map(ToString::to_string)
        .collect();
    let mac = result
        .interface(ifname)
        .and_then(|i| i.mac.as_deref())
        .unwrap_or("?");
    println!("sandbox {label}: {ifname} {} (mac {mac})", addrs.join(" "));
    // The other interfaces the chain reported: lo in the sandbox, the
    // bridge and the veth on the host.
    for (name, iface) in &result.interfaces {
        if name == ifname {
            continue;
        }
        let where_ = if iface.sandbox.is_some() {
            "sandbox"
        } else {
            "host"
        };
        let mut line = format!("  {where_} interface {name}");
        for ip in &iface.ip_configs {
            line.push_str(&format!(" {}", ip.address));
        }
        if let Some(mac) = &iface.mac {
            line.push_str(&format!(" (mac {mac})"));
        }
        println!("{line}");
    }
}

fn ipv4_of(result: &MultiResult, ifname: &str) -> Option<std::net::IpAddr> {
    result
        .addresses(ifname)
        .into_iter()
        .map(|n| n.addr())
        .find(std::net::IpAddr::is_ipv4)
}

/// DEL of every sandbox an ADD was started for, then the namespaces, the
/// bridge (if this run created it) and host-local's dir (if this run
/// created it and it is empty again). Goes on past errors.
async fn teardown(
    networks: &MultiNetwork,
    created: Created,
    host_local: &HostLocalDirs,
) -> Result<()> {
    let mut errors: Vec<String> = Vec::new();
    for m in created.sandboxes.iter().rev().filter(|m| m.attempted) {
        match networks.remove(&m.sandbox).await {
            Ok(()) => println!("DEL sandbox {}: ok", m.label),
            Err(e) => errors.push(format!(
                "DEL sandbox {}: {:#}",
                m.label,
                anyhow::Error::new(e)
            )),
        }
    }
    for m in created.sandboxes {
        let path = m.netns.path().display().to_string();
        match m.netns.delete() {
            Ok(()) => println!("namespace {path}: deleted"),
            Err(e) => errors.push(format!(
                "delete namespace {path}: {:#}",
                anyhow::Error::new(e)
            )),
        }
    }
    if let Some(bridge) = created.bridge {
        match bridge.release() {
            Ok(what) => println!("{what}"),
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
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
    if errors.is_empty() {
        println!("teardown: done");
        Ok(())
    } else {
        Err(anyhow!(errors.join("; ")))
    }
}
