//! Pacing (`--plugin-slots`) and cancellation: an operation waiting for a
//! pacing slot has run no plugin yet; when every request for it leaves
//! (the client disconnects), it is cancelled as a queued one is, and
//! never runs once the slot frees.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, eventually_async, gated_network, runs};
use crate::support::gate::Gate;
use cnid::api::AttachmentRequest;
use cnid::client::Client;

const NET: &str = "pcancel";
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_an_add_whose_client_left_while_it_waited_for_a_slot_never_runs() {
    crate::support::require_root!();
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    let records = gated_network(
        &dirs,
        ("10-pcancel.conflist", NET, "rec"),
        r#"[ "$CNI_COMMAND:$CNI_CONTAINERID" = ADD:hold ]"#,
        &gate,
    );
    // The CPUs busy, whatever the machine does: the slots hold (nothing
    // is lent a run), as this test needs.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| cpus.install(c));
    let client = daemon.client().await;
    let hold = {
        let (socket, r) = (
            daemon.socket.clone(),
            AttachmentRequest::new("hold", dirs.netns("hold"), "eth0"),
        );
        tokio::spawn(async move {
            let c = Client::connect(&socket).await.expect("connect");
            c.add(NET, &r).await.expect("ADD hold");
        })
    };
    gate.wait_started(1).await;
    // The ADD of `gone` waits for the slot; then its client leaves.
    let body =
        serde_json::to_string(&AttachmentRequest::new("gone", dirs.netns("gone"), "eth0")).unwrap();
    let mut conn = UnixStream::connect(&dirs.socket).unwrap();
    write!(
        conn,
        "POST /v1/networks/{NET}/add HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    eventually_async(WAIT, "the ADD of gone waiting for the slot", || async {
        client
            .operations(Some("gone"))
            .await
            .unwrap()
            .iter()
            .any(|o| o.state == "running" && o.waiters == 1)
    })
    .await;
    drop(conn);
    eventually_async(WAIT, "the ADD of gone cancelled", || async {
        client.operations(Some("gone")).await.unwrap().is_empty()
    })
    .await;
    gate.release();
    hold.await.unwrap();
    // Only then would it have run.
    client
        .add(
            NET,
            &AttachmentRequest::new("after", dirs.netns("after"), "eth0"),
        )
        .await
        .expect("the next ADD");
    let r = runs(&records);
    assert!(
        r.iter().all(|x| x.container != "gone"),
        "no plugin of the abandoned ADD ran: {r:?}"
    );
    let att = client.attachments(Some("gone")).await.unwrap();
    assert!(att.is_empty(), "{att:?}");
}
