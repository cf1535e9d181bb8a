//! Pacing (`--plugin-slots`) and the daemon's own background work: a
//! periodic CHECK waiting for a pacing slot never takes one a runtime
//! request waits for (as with `--max-parallel`'s slots): when the slot
//! frees, the runtime request runs first, though it arrived later.

use std::time::Duration;

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, eventually_async, recording_plugin, runs};
use crate::support::gate::Gate;
use cnid::api::AttachmentRequest;
use cnid::client::Client;
use serde_json::json;

const NET: &str = "pbg";
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_periodic_check_never_takes_the_slot_a_runtime_request_waits_for() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let records = dirs.data.join("records");
    std::fs::create_dir_all(&records).unwrap();
    // `hold`'s ADD holds the only slot until `held` opens; a periodic
    // CHECK of `bg` started once `armed` exists waits at `checked`.
    let held = Gate::new(dirs.root());
    let checked = Gate::new(dirs.root());
    let armed = dirs.data.join("armed");
    dirs.plugin(
        "rec",
        &recording_plugin(
            &records,
            &format!(
                "case \"$CNI_COMMAND:$CNI_CONTAINERID\" in\nADD:hold)\n{}\n;;\nCHECK:bg)\nif [ -e '{}' ]; then\n{}\nfi\n;; esac",
                held.shell_wait(),
                armed.display(),
                checked.shell_wait()
            ),
        ),
    );
    dirs.conf(
        "10-pbg.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "rec"}]}),
    );
    // The CPUs busy, whatever the machine does: the slots hold (nothing
    // is lent a run), as this test needs.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(
        &dirs,
        &["--plugin-slots", "1", "--check-every", "1s"],
        |c| cpus.install(c),
    );
    let client = daemon.client().await;
    let req = |cid: &str| AttachmentRequest::new(cid, dirs.netns(cid), "eth0");
    client.add(NET, &req("bg")).await.expect("ADD bg");
    let hold = {
        let (socket, r) = (daemon.socket.clone(), req("hold"));
        tokio::spawn(async move {
            let c = Client::connect(&socket).await.expect("connect");
            c.add(NET, &r).await.expect("ADD hold");
        })
    };
    held.wait_started(1).await;
    std::fs::write(&armed, b"").unwrap();
    // A periodic CHECK of bg left its queue: it waits for the slot.
    eventually_async(WAIT, "the periodic CHECK of bg running", || async {
        client
            .operations(Some("bg"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.verb == "CHECK" && o.state == "running")
    })
    .await;
    // A runtime ADD arrives after it, and waits for the slot too.
    let rt = {
        let (socket, r) = (daemon.socket.clone(), req("rt"));
        tokio::spawn(async move {
            let c = Client::connect(&socket).await.expect("connect");
            c.add(NET, &r).await.expect("ADD rt");
        })
    };
    eventually_async(WAIT, "the ADD of rt running", || async {
        client
            .operations(Some("rt"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.state == "running")
    })
    .await;
    held.release();
    hold.await.unwrap();
    // The slot goes to rt: its ADD ends while the CHECK (gated) waits or
    // runs. Had the CHECK taken the slot, rt's plugin would start only
    // once the CHECK's lease ended.
    rt.await.unwrap();
    checked.wait_started(1).await;
    checked.release();
    let start = |r: &[crate::support::daemon::Run], cmd: &str, cid: &str, after: u128| {
        r.iter()
            .filter(|x| x.command == cmd && x.container == cid && x.start > after)
            .map(|x| x.start)
            .min()
    };
    let mut r = runs(&records);
    let hold_start = start(&r, "ADD", "hold", 0).expect("hold's ADD recorded");
    eventually_async(WAIT, "the gated CHECK of bg recorded", || {
        r = runs(&records);
        let found = start(&r, "CHECK", "bg", hold_start).is_some();
        async move { found }
    })
    .await;
    let rt_start = start(&r, "ADD", "rt", 0).expect("rt's ADD recorded");
    let check_start = start(&r, "CHECK", "bg", hold_start).unwrap();
    assert!(
        rt_start < check_start,
        "the runtime ADD ran before the background CHECK that waited before it: {r:?}"
    );
}
