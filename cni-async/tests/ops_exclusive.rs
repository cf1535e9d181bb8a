//! `.exclusive()`: an ADD that refuses an attachment the cache holds
//! already, checked under the attachment's lock (what cnitool runs).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::support::fake::{Fake, RIG_KILL_GRACE, Response, Rig, conflist};
use crate::support::gate::{Gate, poll_once};
use cni_async::cache::ResultCache;
use cni_async::{Cni, Error, ErrorKind, RawExec, Timeouts};
use cni_core::RuntimeConf;
use serde_json::json;

const RESULT: &str = r#"{"cniVersion":"1.0.0","ips":[{"address":"10.219.1.2/24"}]}"#;

fn list() -> cni_core::NetworkConfigList {
    conflist(
        json!({"cniVersion":"1.0.0","name":"excl","plugins":[{"type":"first"},{"type":"second"}]}),
    )
}

/// A `Cni` over the rig whose cache runs its I/O on the calling thread: a
/// first poll of an ADD then makes its first lock attempt before it
/// returns.
fn inline_cni(rig: &Rig) -> Cni {
    Cni::builder()
        .plugin_dirs(rig.dir.dirs())
        .cache(ResultCache::new(&rig.cache_dir).with_inline_io(true))
        .exec(Arc::new(RawExec::new().with_kill_grace(RIG_KILL_GRACE)))
        .timeouts(Timeouts::uniform(Duration::from_secs(30)))
        .build()
}

#[tokio::test]
async fn an_exclusive_add_of_a_cached_attachment_runs_no_plugin() {
    let rig = Rig::new();
    rig.fake("first", &Fake::new(Response::ok(RESULT)));
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    let cni = rig.cni();
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    cni.add_network_list(&list, &rt)
        .exclusive()
        .await
        .expect("the first exclusive ADD");
    let record = std::fs::read(rig.cache_file("excl", "c1", "eth0")).expect("its record");

    let refused = cni.add_network_list(&list, &rt).exclusive().await;
    let Err(e) = refused else {
        panic!("a second exclusive ADD ran: {refused:?}");
    };
    assert!(matches!(e, Error::AlreadyAttached { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "container \"c1\" interface \"eth0\" is already attached to network \"excl\": DEL it first"
    );
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(
        e.code(),
        cni_core::error::code::INVALID_ENVIRONMENT_VARIABLES
    );
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert_eq!(
        std::fs::read(rig.cache_file("excl", "c1", "eth0")).unwrap(),
        record,
        "the record changed"
    );
    // So does .with_record(), and a detached ADD.
    let refused = cni
        .add_network_list(&list, &rt)
        .exclusive()
        .with_record()
        .await;
    assert!(
        matches!(refused, Err(Error::AlreadyAttached { .. })),
        "{refused:?}"
    );
    let refused = cni
        .add_network_list(&list, &rt)
        .exclusive()
        .rollback_on_cancel()
        .await;
    assert!(
        matches!(refused, Err(Error::AlreadyAttached { .. })),
        "{refused:?}"
    );
    assert_eq!(rig.dir.invocations_of("ADD").len(), 2, "plugins ran again");
    assert_eq!(
        rig.dir.invocations_of("DEL").len(),
        0,
        "something was rolled back"
    );

    // Another interface is another attachment; without exclusive, the ADD
    // runs the plugins over the existing attachment, as libcni does.
    let eth1 = RuntimeConf::new("c1", "/run/netns/c1", "eth1");
    cni.add_network_list(&list, &eth1)
        .exclusive()
        .await
        .expect("eth1");
    cni.add_network_list(&list, &rt)
        .await
        .expect("a plain ADD over it");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 6);
    // After the DEL, an exclusive ADD runs again.
    cni.del_network_list(&list, &rt).await.expect("DEL");
    cni.add_network_list(&list, &rt)
        .exclusive()
        .await
        .expect("after the DEL");
    assert_eq!(rig.dir.invocations_of("ADD").len(), 8);
}

/// Two exclusive ADDs of one attachment at once: the second has tried the
/// lock (so any check it made outside it is made) while the first runs
/// its plugin; once the first is done, the second finds its record and
/// runs nothing.
#[tokio::test]
async fn concurrent_exclusive_adds_of_one_attachment_run_the_plugins_once() {
    let rig = Rig::new();
    let gate = Gate::new(rig.dir.root());
    rig.fake(
        "first",
        &Fake::new(Response::ok("")).on("ADD", Response::ok(RESULT).with_shell(&gate.shell_wait())),
    );
    rig.fake("second", &Fake::new(Response::ok(RESULT)));
    let cni = inline_cni(&rig);
    let list = list();
    let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
    let (first, second) = tokio::join!(cni.add_network_list(&list, &rt).exclusive(), async {
        gate.wait_started(1).await;
        let second = cni.add_network_list(&list, &rt).exclusive().into_future();
        tokio::pin!(second);
        // Inline cache I/O: this poll made a lock attempt, found the lock
        // taken, and now waits to try again.
        let early = poll_once(&mut second).await;
        assert!(early.is_pending(), "the second ADD did not wait: {early:?}");
        gate.release();
        second.await
    });
    first.expect("the first exclusive ADD");
    assert!(
        matches!(second, Err(Error::AlreadyAttached { .. })),
        "{second:?}"
    );
    let adds = rig.dir.invocations_of("ADD");
    assert_eq!(adds.len(), 2, "{adds:?}");
    assert_eq!(gate.started(), 1, "the gated plugin ran twice");
}
