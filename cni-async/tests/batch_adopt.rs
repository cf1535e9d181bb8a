//! `BatchBuilder::adopt`: tearing down a batch another process set up and
//! left (what `cnitool batch down` runs on). Fake plugins; needs root (the
//! namespaces are real).
#![cfg(feature = "netns")]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use crate::support::fake::{Fake, Response, Rig, conflist};
use crate::support::netns::BatchNamespaces;
use crate::support::require_root;
use cni_async::Error;
use cni_async::batch::{BatchBuilder, BatchEventKind};
use cni_async::multi::{MultiNetwork, NetworkRequest, Sandbox};
use cni_async::netns::Netns;
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.2.3/24"}]}"#;
const NETWORK: &str = "adopted";

/// The container ID of a member: not its name, as cnitool derives it.
fn derive(path: &str) -> String {
    format!("id-{}", path.rsplit('/').next().unwrap_or_default())
}

fn list() -> cni_core::NetworkConfigList {
    conflist(json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": [{"type": "p"}]}))
}

fn multi(rig: &Rig) -> MultiNetwork {
    MultiNetwork::builder(rig.cni())
        .network_with_ifname(list(), "eth3")
        .build()
        .expect("valid networks")
}

/// The batch `PREFIX*` on [`multi`], container IDs derived, with one label.
fn builder(rig: &Rig, ns: &BatchNamespaces, (key, value): (&str, &str)) -> BatchBuilder {
    BatchBuilder::new(multi(rig))
        .prefix(&ns.0)
        .container_ids(derive)
        .sandbox_template(
            Sandbox::new("", "")
                .with_ignore_unknown(false)
                .with_label(key, value),
        )
}

/// Sets up `count` members with `FOO=bar` and leaves them, as a killed
/// harness or `cnitool batch up` would.
async fn leave_a_batch(rig: &Rig, ns: &BatchNamespaces, count: usize) {
    let batch = builder(rig, ns, ("FOO", "bar"))
        .count(count)
        .setup()
        .await
        .expect("setup");
    assert_eq!(batch.counts().attached, count, "{batch:?}");
    assert_eq!(batch.keep().len(), count);
}

/// A rig whose plugin `p` answers ADD with [`RESULT`], and a batch of
/// `count` it set up and left.
async fn a_left_batch(count: usize) -> (Rig, BatchNamespaces) {
    let rig = Rig::new();
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT)),
    );
    let ns = BatchNamespaces::new("cnba");
    leave_a_batch(&rig, &ns, count).await;
    (rig, ns)
}

/// The DELs run so far: (container ID, ifname, CNI_ARGS).
fn dels(rig: &Rig) -> BTreeSet<(String, String, String)> {
    rig.dir
        .invocations_of("DEL")
        .iter()
        .map(|r| {
            let var = |k| r.var(k).unwrap_or_default().to_owned();
            (var("CNI_CONTAINERID"), var("CNI_IFNAME"), var("CNI_ARGS"))
        })
        .collect()
}

async fn cached(rig: &Rig) -> usize {
    rig.cni()
        .cached_attachments(None)
        .await
        .expect("list the cache")
        .len()
}

#[tokio::test]
async fn adopt_dels_every_cached_attachment_with_its_args_and_the_rest_as_the_template_says() {
    require_root!();
    let (rig, ns) = a_left_batch(3).await;
    // Member 1 has a second attachment, on another interface.
    let path1 = ns.path("1");
    let rt = RuntimeConf::new(derive(&path1), &path1, "eth7");
    rig.cni()
        .add_network_list(&list(), &rt)
        .await
        .expect("second ADD");
    // A namespace of the batch with nothing cached (a setup killed
    // mid-ADD), and names that are not the batch's.
    Netns::create(&ns.name("3")).expect("create 3");
    Netns::create(&ns.name("x")).expect("create x");
    // The empty file an interrupted create leaves: deleted by name.
    std::fs::write(ns.path("4"), b"").expect("empty file 4");
    Netns::create(&ns.name("2x")).expect("create 2x");
    assert_eq!(cached(&rig).await, 4);
    rig.dir.clear_records();

    let batch = builder(&rig, &ns, ("X", "y")).adopt().await.expect("adopt");
    let members: Vec<(String, String, usize, bool)> = batch
        .members()
        .iter()
        .map(|m| {
            (
                m.name().to_owned(),
                m.container_id().to_owned(),
                m.cached_attachments().len(),
                m.is_adopted() && m.has_name(),
            )
        })
        .collect();
    let expected: Vec<(String, String, usize, bool)> =
        [("0", 1), ("1", 2), ("2", 1), ("3", 0), ("4", 0)]
            .iter()
            .map(|(i, n)| (ns.name(i), derive(&ns.path(i)), *n, true))
            .collect();
    assert!(batch.members()[4].netns().is_none(), "not a namespace");
    assert_eq!(members, expected);
    assert!(rig.dir.invocations().is_empty(), "adopt runs no plugin");

    batch.teardown().await.expect("teardown");
    // The cached attachments with their own args and interfaces; member 3
    // as the template says.
    let id = |i: &str| derive(&ns.path(i));
    let want: BTreeSet<(String, String, String)> = [
        (id("0"), "eth3", "FOO=bar"),
        (id("1"), "eth3", "FOO=bar"),
        (id("1"), "eth7", ""),
        (id("2"), "eth3", "FOO=bar"),
        (id("3"), "eth3", "X=y"),
        (id("4"), "eth3", "X=y"),
    ]
    .into_iter()
    .map(|(c, i, a)| (c, i.to_owned(), a.to_owned()))
    .collect();
    assert_eq!(dels(&rig), want);
    assert_eq!(cached(&rig).await, 0);
    // Only the batch's names are gone.
    assert_eq!(ns.existing(), ns.names(&["x", "2x"]));
}

#[tokio::test]
async fn adopt_uses_the_cached_config_when_the_network_is_gone() {
    require_root!();
    let (rig, ns) = a_left_batch(2).await;
    // Member 1's namespace is gone already; its attachment is still cached.
    Netns::delete_named(&ns.name("1")).expect("delete 1");
    rig.dir.clear_records();

    // No configuration of the network: the batch names it.
    let empty = MultiNetwork::builder(rig.cni())
        .allow_empty()
        .build()
        .expect("an empty set");
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let batch = BatchBuilder::new(empty)
        .prefix(&ns.0)
        .container_ids(derive)
        .on_event(move |e| {
            seen.lock()
                .expect("events")
                .push((e.kind, e.name.to_owned(), e.counts.deleted))
        })
        .sandbox_template(
            Sandbox::new("", "").with_network(NetworkRequest::new(NETWORK).with_ifname("eth3")),
        )
        .adopt()
        .await
        .expect("adopt");
    assert_eq!(batch.members().len(), 2);
    assert!(batch.members()[0].netns().is_some());
    assert!(!batch.members()[1].has_name());
    batch.teardown().await.expect("teardown");

    let runs = rig.dir.invocations_of("DEL");
    let got: BTreeSet<(String, String)> = runs
        .iter()
        .map(|r| {
            (
                r.var("CNI_CONTAINERID").unwrap_or_default().to_owned(),
                r.var("CNI_NETNS").unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: BTreeSet<(String, String)> = [
        (derive(&ns.path("0")), ns.path("0")),
        // Gone: `Cni::del_cached` passes the cached path (stale, which the
        // spec allows).
        (derive(&ns.path("1")), ns.path("1")),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want);
    for r in &runs {
        // The cached configuration, cached args.
        assert_eq!(r.stdin_json()["name"], NETWORK);
        assert_eq!(r.var("CNI_ARGS"), Some("FOO=bar"));
    }
    assert_eq!(cached(&rig).await, 0);
    assert_eq!(ns.existing(), Vec::<String>::new());
    // Both torn down; one namespace deleted (the other was gone).
    let mut events = events.lock().expect("events").clone();
    events.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        events
            .iter()
            .map(|e| (e.0, e.1.clone()))
            .collect::<Vec<_>>(),
        [
            (BatchEventKind::Deleted, ns.name("0")),
            (BatchEventKind::Deleted, ns.name("1"))
        ]
    );
    assert_eq!(events.iter().map(|e| e.2).max(), Some(1));
}

#[tokio::test]
async fn adopt_refuses_namespaces_nothing_ties_to_the_batch() {
    require_root!();
    let rig = Rig::new();
    let ns = BatchNamespaces::new("cnba");
    Netns::create(&ns.name("0")).expect("create 0");
    let empty = || {
        MultiNetwork::builder(rig.cni())
            .allow_empty()
            .build()
            .expect("an empty set")
    };
    let err = BatchBuilder::new(empty())
        .prefix(&ns.0)
        .sandbox_template(Sandbox::new("", "").with_network(NetworkRequest::new("typo")))
        .adopt()
        .await
        .expect_err("nothing says these are the batch's");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("({})", ns.name("0"))) && msg.contains("\"typo\""),
        "{msg}"
    );
    assert_eq!(ns.existing(), ns.names(&["0"]), "left alone");

    // A prefix that would claim another's names.
    let err = BatchBuilder::new(empty())
        .prefix(format!("{}1", ns.0))
        .adopt()
        .await
        .expect_err("prefix ends with a digit");
    assert!(matches!(err, Error::NetnsName { .. }), "{err:?}");

    // With the network known, the namespace is the batch's (DEL as the
    // template says, then deleted).
    rig.fake("p", &Fake::new(Response::ok("")));
    let batch = BatchBuilder::new(multi(&rig))
        .prefix(&ns.0)
        .adopt()
        .await
        .expect("adopt");
    batch.teardown().await.expect("teardown");
    assert_eq!(rig.dir.invocations_of("DEL").len(), 1);
    assert_eq!(ns.existing(), Vec::<String>::new());
}

#[tokio::test]
async fn an_adopted_namespace_whose_del_fails_is_kept_for_the_next_try() {
    require_root!();
    let rig = Rig::new();
    let marker = rig.dir.scratch("fail-del");
    std::fs::write(&marker, b"").expect("marker");
    let fail = format!(
        r#"if [ -e '{}' ]; then echo '{{"cniVersion":"1.0.0","code":100,"msg":"del refused"}}'; exit 1; fi"#,
        marker.display()
    );
    rig.fake(
        "p",
        &Fake::new(Response::ok("").with_shell(&fail)).on("ADD", Response::ok(RESULT)),
    );
    let ns = BatchNamespaces::new("cnba");
    leave_a_batch(&rig, &ns, 2).await;

    let adopt = || {
        BatchBuilder::new(multi(&rig))
            .prefix(&ns.0)
            .container_ids(derive)
            .adopt()
    };
    let err = adopt()
        .await
        .expect("adopt")
        .teardown()
        .await
        .expect_err("DEL fails");
    let err = cni_async::Chain(&err).to_string();
    assert!(err.contains("del refused"), "{err}");
    // Kept, with their cache records: the next adopt retries.
    assert_eq!(ns.existing(), ns.names(&["0", "1"]));
    assert_eq!(cached(&rig).await, 2);

    std::fs::remove_file(&marker).expect("remove marker");
    let batch = adopt().await.expect("adopt again");
    assert_eq!(batch.members().len(), 2);
    batch.teardown().await.expect("teardown");
    assert_eq!(ns.existing(), Vec::<String>::new());
    assert_eq!(cached(&rig).await, 0);
}
