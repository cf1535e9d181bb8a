//! Scenario 4 (`--only real`, root): the reference plugins' chain
//! loopback + bridge/host-local + tuning in a real namespace, run by the
//! floor, in-process, by cnitool and through cnid, cache on disk and on
//! tmpfs.

use cnid::client::Client;

use crate::Cx;
use crate::chains::{self, On};
use crate::report::section as md;
use crate::setup::{Daemon, REAL, Storage};

pub(crate) fn section(cx: &mut Cx) -> anyhow::Result<Option<String>> {
    let Some(net) = &cx.real else { return Ok(None) };
    let (tree, bins) = (&cx.tree, &cx.bins);
    let mut tables = Vec::new();
    for storage in Storage::BOTH {
        let daemon = Daemon::start(
            &bins.cnid,
            tree,
            storage,
            &format!("real-{}", storage.short()),
            &[],
        )?;
        let client = cx.tokio.block_on(Client::connect(&daemon.socket))?;
        let list = tree.load(REAL)?;
        let ns = cni_async::netns::Netns::create(&format!("{}real", net.prefix))?;
        let path = ns.path().display().to_string();
        let on = On(&list, &path, tree, storage);
        let cnitool = on.cnitool("cnitool", &bins.cnitool)?;
        let mut runners = vec![
            on.floor()?,
            on.in_process(false, false),
            cnitool,
            on.cnid("cnid", "bench-cnid", client),
        ];
        let label = format!("real chain, {}", storage.label());
        let s = chains::run_loop(&mut runners, &cx.tokio, 2, cx.n(5, 30), &label)
            .map_err(|e| daemon.ctx(e));
        drop(runners);
        ns.delete()?;
        let (bridge, subnet) = (&net.bridge, &net.subnet);
        let title = format!(
            "loopback + bridge/host-local + tuning, {} (bridge {bridge}, {subnet})",
            storage.label()
        );
        let key = format!("real/{}", storage.short());
        tables.push(chains::tabulate(&s?, &title, &key, &mut cx.findings));
    }
    Ok(Some(md(
        "Scenario 4: the real chain in a real namespace",
        "The reference plugins (`/usr/lib/cni`): loopback, bridge with host-local IPAM (no \
         gateway, no masquerade), tuning (one sysctl). One namespace; each runner ADDs, CHECKs \
         and DELs its own container in turn.",
        &tables,
    )))
}
