//! Pacing (`--plugin-slots`) keeps a request's deadline: a burst larger
//! than the slots, every plugin hung, each request with a short deadline,
//! is answered within its deadline (the wait for a slot included), and the
//! daemon serves the next request at once.

use std::time::{Duration, Instant};

use crate::support::cpus::{Cpus, FakeCpus};
use crate::support::daemon::{Daemon, Dirs, gated_network, raise_nofile};
use crate::support::gate::{Gate, LOAD_MARGIN};
use cnid::api::AttachmentRequest;
use cnid::client::Client;

const NET: &str = "pdead";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_pacing_a_burst_larger_than_the_slots_keeps_each_short_deadline() {
    crate::support::require_root!();
    raise_nofile();
    const N: usize = 8;
    const DEADLINE: Duration = Duration::from_secs(2);
    let dirs = Dirs::new();
    let gate = Gate::new(dirs.root());
    gated_network(
        &dirs,
        ("10-pdead.conflist", NET, "rec"),
        r#"[ "$CNI_COMMAND" = ADD ]"#,
        &gate,
    );
    // The CPUs busy, whatever the machine does: the slots hold (nothing
    // is lent a run), as this test needs.
    let cpus = FakeCpus::new(dirs.root(), Cpus::Busy);
    let daemon = Daemon::start_with(&dirs, &["--plugin-slots", "1"], |c| cpus.install(c));
    let adds: Vec<_> = (0..N)
        .map(|i| {
            let cid = format!("d-{i}");
            let mut r = AttachmentRequest::new(&cid, dirs.netns(&cid), "eth0");
            r.timeout_ms = Some(DEADLINE.as_millis() as u64);
            let socket = daemon.socket.clone();
            tokio::spawn(async move {
                let c = Client::connect(&socket).await.expect("connect");
                let sent = Instant::now();
                let r = c.add(NET, &r).await;
                (r, sent.elapsed())
            })
        })
        .collect();
    for a in adds {
        let (r, took) = a.await.unwrap();
        assert!(r.is_err(), "a hung ADD past its deadline fails: {r:?}");
        assert!(
            took < DEADLINE + LOAD_MARGIN,
            "answered after {took:?}, deadline {DEADLINE:?}"
        );
    }
    gate.release();
    let client = daemon.client().await;
    client
        .add(
            NET,
            &AttachmentRequest::new("after", dirs.netns("after"), "eth0"),
        )
        .await
        .expect("the next ADD");
}
