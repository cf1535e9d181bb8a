//! What a failed setup's undo touches: only what the call set up.
//!
//! - A setup run again over a sandbox that is set up (a runtime's retry
//!   after a lost answer) is refused as already attached, and leaves the
//!   working sandbox alone: eth0 with its address, lo up, host-local's
//!   reservation, and traffic to it from another namespace.
//! - A setup of another sandbox in the same namespace fails at eth0, and
//!   its undo of lo (which the loopback plugin set up again there) runs
//!   without the namespace: the first sandbox's lo stays up.
//!
//! Real loopback, bridge and host-local in namespaces, a bridge and a
//! subnet of the test's own. Needs root.
#![cfg(feature = "netns")]

use crate::support::netns::{
    TestNet, addrs_v4, bridge_ports, exec_ok, host_local_ips, link_exists_in, ping,
};
use crate::support::require_root;
use cni_async::cache::ResultCache;
use cni_async::multi::{MultiNetwork, Sandbox, SetupMode};
use cni_async::netns::Netns;
use cni_async::{Cni, ErrorKind};
use cni_core::error::Chain;
use ipnet::IpNet;

/// Whether `lo` in `ns` is administratively up (`ip -o link show lo`
/// lists `UP` among its flags).
fn lo_up(ns: &Netns) -> bool {
    let out = exec_ok(ns, "ip", &["-o", "link", "show", "lo"]);
    let flags = out
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map(|(flags, _)| flags.to_owned())
        .unwrap_or_default();
    flags.split(',').any(|f| f == "UP")
}

#[tokio::test]
async fn a_setup_run_again_is_refused_and_the_sandbox_keeps_working() {
    require_root!();
    let mut net = TestNet::new();
    let data_dir = net.data_dir();
    let name = format!("retry-{}", net.id());
    let list = net.bridge_list(&name);
    let cni = net.real_cni();

    for (i, mode) in [SetupMode::Serial, SetupMode::Parallel]
        .into_iter()
        .enumerate()
    {
        let (ns_a, ns_b) = (net.netns(), net.netns());
        let multi = MultiNetwork::builder(cni.clone())
            .loopback()
            .network(list.clone())
            .mode(mode)
            .build()
            .unwrap();
        let a = Sandbox::new(format!("ra{i}-{}", net.id()), ns_a.path().to_str().unwrap());
        let b = Sandbox::new(format!("rb{i}-{}", net.id()), ns_b.path().to_str().unwrap());
        multi.setup(&a).await.expect("setup of a");
        multi.setup(&b).await.expect("setup of b");
        let addr_a = addrs_v4(&ns_a, "eth0");
        assert_eq!(addr_a.len(), 1, "{mode:?}: one address on a's eth0");
        assert!(ping(&ns_b, addr_a[0].addr()), "{mode:?}: b reaches a");
        let reserved = host_local_ips(&data_dir, &name);
        let records = cni.cached_attachments(Some(&a.container_id)).await.unwrap();

        // The retry: refused, nothing run over or undone.
        let err = multi.setup(&a).await.unwrap_err();

        assert!(
            link_exists_in(ns_a.path(), "eth0"),
            "{mode:?}: a's eth0 kept"
        );
        assert_eq!(
            addrs_v4(&ns_a, "eth0"),
            addr_a,
            "{mode:?}: a's address kept"
        );
        assert!(lo_up(&ns_a), "{mode:?}: a's lo still up");
        assert_eq!(
            host_local_ips(&data_dir, &name),
            reserved,
            "{mode:?}: a's address still reserved"
        );
        assert_eq!(
            cni.cached_attachments(Some(&a.container_id)).await.unwrap(),
            records,
            "{mode:?}: a's records kept"
        );
        assert!(
            ping(&ns_b, addr_a[0].addr()),
            "{mode:?}: b still reaches a after the refused retry"
        );
        assert!(
            ping(&ns_a, "127.0.0.1".parse().unwrap()),
            "{mode:?}: a's loopback still answers"
        );
        assert_eq!(err.kind(), ErrorKind::Conflict, "{mode:?}: {err:#}");
        let chain = Chain(&err).to_string();
        assert!(chain.contains("already attached"), "{mode:?}: {chain}");

        multi.remove(&a).await.expect("remove of a");
        multi.remove(&b).await.expect("remove of b");
        assert!(host_local_ips(&data_dir, &name).is_empty());
        assert!(bridge_ports(net.bridge()).is_empty());
    }
}

/// Sandbox `a` and a peer, each in a namespace of its own, set up on the
/// loopback and a bridge of the test's own: the working sandbox each
/// test then fails a setup next to.
struct TwoSandboxes {
    net: TestNet,
    name: String,
    cni: Cni,
    multi: MultiNetwork,
    ns: Netns,
    peer: Netns,
    a: Sandbox,
    p: Sandbox,
    /// a's address and host-local's reservations after both setups.
    addr: Vec<IpNet>,
    reserved: Vec<String>,
}

impl TwoSandboxes {
    /// The network is `<tag>-ID`, the sandboxes' container IDs
    /// `<tag_a>-ID` and `<tag_p>-ID`.
    async fn new(tag: &str, tag_a: &str, tag_p: &str) -> Self {
        let mut net = TestNet::new();
        let name = format!("{tag}-{}", net.id());
        let cni = net.real_cni();
        let multi = MultiNetwork::builder(cni.clone())
            .loopback()
            .network(net.bridge_list(&name))
            .build()
            .unwrap();
        let (ns, peer) = (net.netns(), net.netns());
        let a = Sandbox::new(format!("{tag_a}-{}", net.id()), ns.path().to_str().unwrap());
        let p = Sandbox::new(
            format!("{tag_p}-{}", net.id()),
            peer.path().to_str().unwrap(),
        );
        multi.setup(&a).await.expect("setup of a");
        multi.setup(&p).await.expect("setup of the peer");
        let addr = addrs_v4(&ns, "eth0");
        let reserved = host_local_ips(&net.data_dir(), &name);
        TwoSandboxes {
            net,
            name,
            cni,
            multi,
            ns,
            peer,
            a,
            p,
            addr,
            reserved,
        }
    }

    /// Sandbox `a` as set up: lo up and answering, eth0 with its address,
    /// the reservation, and traffic from the peer.
    fn assert_working(&self, at: &str) {
        let ns = &self.ns;
        assert!(lo_up(ns), "{at}: a's lo still up");
        assert!(
            ping(ns, "127.0.0.1".parse().unwrap()),
            "{at}: a's loopback answers"
        );
        assert_eq!(addrs_v4(ns, "eth0"), self.addr, "{at}: a's eth0 kept");
        assert_eq!(
            host_local_ips(&self.net.data_dir(), &self.name),
            self.reserved,
            "{at}: the reservation kept"
        );
        assert!(
            ping(&self.peer, self.addr[0].addr()),
            "{at}: the peer reaches a"
        );
    }

    /// Removes both sandboxes; nothing is left (no reservation, no port).
    async fn remove_both(&self) {
        self.multi.remove(&self.a).await.expect("remove of a");
        self.multi
            .remove(&self.p)
            .await
            .expect("remove of the peer");
        assert!(host_local_ips(&self.net.data_dir(), &self.name).is_empty());
        assert!(bridge_ports(self.net.bridge()).is_empty());
    }
}

#[tokio::test]
async fn a_failed_setup_in_another_sandboxs_namespace_leaves_its_lo_up() {
    require_root!();
    let s = TwoSandboxes::new("share", "sa", "sp").await;
    let other = Sandbox::new(format!("sb-{}", s.net.id()), s.ns.path().to_str().unwrap());

    // Another sandbox in a's namespace: lo is set up (the loopback plugin
    // succeeds on an lo that is up), eth0 fails, lo is undone.
    let err = s.multi.setup(&other).await.unwrap_err();
    assert!(
        Chain(&err).to_string().contains("already exists"),
        "{}",
        Chain(&err)
    );

    s.assert_working("after the other sandbox's setup");
    assert!(
        s.cni
            .cached_attachments(Some(&other.container_id))
            .await
            .unwrap()
            .is_empty(),
        "nothing of the failed sandbox is left"
    );

    s.remove_both().await;
}

/// A set-up sandbox whose loopback record turned corrupt, set up again (a
/// runtime's retry): in doubt, lo counts as attached. The loopback plugin
/// would succeed again over it and eth0 be refused, and the undo of that
/// "newly set up" lo took the working sandbox's lo down. The retry fails
/// and the sandbox keeps working; its removal still cleans up all.
#[tokio::test]
async fn a_setup_run_again_over_a_corrupt_record_leaves_the_sandbox() {
    require_root!();
    let s = TwoSandboxes::new("corr", "ca", "cp").await;
    let lo = s
        .cni
        .cached_attachments(Some(&s.a.container_id))
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.if_name == "lo")
        .expect("a's loopback record");
    let file = ResultCache::new(s.net.cache_dir())
        .path(&lo.network_name, &s.a.container_id, "lo")
        .unwrap();
    std::fs::write(&file, b"{\"kind\":\"cniCacheV1\",").unwrap();

    for attempt in 0..2 {
        let err = s.multi.setup(&s.a).await.unwrap_err();
        s.assert_working(&format!("#{attempt}: {}", Chain(&err)));
    }

    s.remove_both().await;
    assert!(!file.exists(), "the corrupt record is still in results/");
}
