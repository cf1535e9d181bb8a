//! A rollback undoes only what the failed ADD made: a plain ADD run again
//! over an attachment recorded before it (what libcni allows) that fails in
//! the bridge plugin ("eth0 already exists") is not rolled back, with
//! `.rollback(true)` nor with `.rollback_on_cancel()`: the record, the
//! interface, its address and host-local's reservation stay, and the
//! attachment still carries traffic. So too over a corrupt record: it is
//! no proof that nothing is attached, and it stays in place until an ADD
//! replaces it or a DEL moves it aside, so an ADD run again after one that
//! failed over it still leaves the attachment (a corrupt record moved aside
//! by the first failed ADD let the second one's rollback DEL it). Real
//! bridge and host-local in namespaces, a bridge and a subnet of the test's
//! own. Needs root.
#![cfg(feature = "netns")]

use std::path::PathBuf;

use crate::support::netns::{
    TestNet, addrs_v4, bridge_ports, host_local_ips, link_exists_in, ping,
};
use crate::support::require_root;
use cni_async::Cni;
use cni_async::cache::ResultCache;
use cni_async::netns::Netns;
use cni_core::{NetworkConfigList, RuntimeConf};
use ipnet::IpNet;

/// An attachment (`eth0` in `ns`) and a peer on the same bridge, both
/// ADDed on real bridge + host-local: what each test runs ADDs again over.
struct Attached {
    net: TestNet,
    data_dir: PathBuf,
    name: String,
    list: NetworkConfigList,
    cni: Cni,
    ns: Netns,
    peer: Netns,
    rt: RuntimeConf,
    peer_rt: RuntimeConf,
    /// The attachment's address and host-local's reservations after the ADDs.
    addr: Vec<IpNet>,
    reserved: Vec<String>,
}

impl Attached {
    /// Network, container and peer container named `<tag>-ID`, `<tag>-ID`
    /// and `<peer_tag>-ID`.
    async fn new(tag: &str, peer_tag: &str) -> Self {
        let mut net = TestNet::new();
        let data_dir = net.data_dir();
        let name = format!("{tag}-{}", net.id());
        let list = net.bridge_list(&name);
        let cni = net.real_cni();
        let (ns, peer) = (net.netns(), net.netns());
        let rt = RuntimeConf::new(
            format!("{tag}-{}", net.id()),
            ns.path().to_str().unwrap(),
            "eth0",
        );
        let peer_rt = RuntimeConf::new(
            format!("{peer_tag}-{}", net.id()),
            peer.path().to_str().unwrap(),
            "eth0",
        );
        cni.add_network_list(&list, &rt).await.expect("first ADD");
        cni.add_network_list(&list, &peer_rt)
            .await
            .expect("peer ADD");
        let addr = addrs_v4(&ns, "eth0");
        assert_eq!(addr.len(), 1);
        let reserved = host_local_ips(&data_dir, &name);
        Attached {
            net,
            data_dir,
            name,
            list,
            cni,
            ns,
            peer,
            rt,
            peer_rt,
            addr,
            reserved,
        }
    }

    /// The attachment as the ADDs left it: `eth0`, its address, the
    /// reservation, and traffic from the peer.
    fn assert_intact(&self, at: &str) {
        assert!(link_exists_in(self.ns.path(), "eth0"), "{at}: eth0 kept");
        assert_eq!(
            addrs_v4(&self.ns, "eth0"),
            self.addr,
            "{at}: its address kept"
        );
        assert_eq!(
            host_local_ips(&self.data_dir, &self.name),
            self.reserved,
            "{at}: the reservation kept"
        );
        assert!(
            ping(&self.peer, self.addr[0].addr()),
            "{at}: still reachable"
        );
    }

    /// DELs the peer (the attachment's DEL is the test's), then checks that
    /// nothing is left: no reservation, no bridge port.
    async fn del_peer_and_check_clean(&self) {
        self.cni
            .del_network_list(&self.list, &self.peer_rt)
            .await
            .expect("peer DEL");
        assert!(host_local_ips(&self.data_dir, &self.name).is_empty());
        assert!(bridge_ports(self.net.bridge()).is_empty());
    }
}

#[tokio::test]
async fn a_failed_add_over_an_existing_record_leaves_the_attachment() {
    require_root!();
    let a = Attached::new("rbx", "rbp").await;
    let (cni, list, rt) = (&a.cni, &a.list, &a.rt);
    let record = cni
        .cached_attachments(Some(&rt.container_id))
        .await
        .unwrap();
    assert_eq!(record.len(), 1);

    for how in ["rollback", "rollback_on_cancel"] {
        let add = cni.add_network_list(list, rt);
        let err = match how {
            "rollback" => add.rollback(true).await,
            _ => add.rollback_on_cancel().await,
        }
        .expect_err("the bridge plugin refuses an eth0 that exists");
        let chain = cni_async::Chain(&err).to_string();
        assert!(chain.contains("already exists"), "{how}: {chain}");

        a.assert_intact(how);
        assert_eq!(
            cni.cached_attachments(Some(&rt.container_id))
                .await
                .unwrap(),
            record,
            "{how}: the record kept"
        );
    }
    cni.wait_detached().await;

    cni.del_network_list(list, rt).await.expect("DEL");
    a.del_peer_and_check_clean().await;
}

/// A working attachment whose record turned corrupt, then ADDs run again
/// over it, each twice (a runtime's retries): exclusive ones (what
/// `MultiNetwork::setup` and cnid run) and plain ones with rollback, each
/// after a CHECK (which fails: no usable record). None may take the
/// attachment down; the DEL that follows still cleans up all (without
/// prevResult) and moves the corrupt file aside.
#[tokio::test]
async fn adds_run_again_over_a_corrupt_record_leave_the_attachment() {
    require_root!();
    let a = Attached::new("rbc", "rbq").await;
    let (cni, list, rt) = (&a.cni, &a.list, &a.rt);
    let file = ResultCache::new(a.net.cache_dir())
        .path(&a.name, &rt.container_id, "eth0")
        .unwrap();
    std::fs::write(&file, b"{\"kind\":\"cniCacheV1\",").unwrap();

    for how in ["exclusive", "rollback"] {
        for attempt in 0..2 {
            cni.check_network_list(list, rt)
                .await
                .expect_err("a CHECK without a usable record");
            let add = cni.add_network_list(list, rt);
            let outcome = match how {
                "exclusive" => add.rollback(true).exclusive().await,
                _ => add.rollback(true).await,
            };
            let err = outcome.expect_err("an ADD over an attachment fails");
            a.assert_intact(&format!("{how} #{attempt}: {err:#}"));
        }
    }

    cni.del_network_list(list, rt).await.expect("DEL");
    assert!(!file.exists(), "the corrupt record is still in results/");
    assert_eq!(
        std::fs::read_dir(a.net.cache_dir().join("corrupt"))
            .unwrap()
            .count(),
        1,
        "the corrupt record kept for a human"
    );
    assert!(!link_exists_in(a.ns.path(), "eth0"));
    a.del_peer_and_check_clean().await;
}
