//! `ResultCache::with_inline_io`: the per-attachment disk work runs on the
//! calling thread, never on tokio's blocking pool, with the same results;
//! listings (every record) still go to the pool.

use std::time::Duration;

use cni_async::cache::ResultCache;
use cni_core::RuntimeConf;
use cni_core::cache::CacheRecord;
use serde_json::json;

#[test]
fn inline_io_never_waits_for_the_blocking_pool() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    rt.block_on(async {
        // Occupy the pool's only thread: anything sent to the pool now waits.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || {
            let _ = wait.recv_timeout(Duration::from_secs(30));
        });

        let cache = ResultCache::new(dir.path()).with_inline_io(true);
        let conf = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
        let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.220.0.2/24"}]});
        let rec = CacheRecord::new(
            "net1",
            &conf,
            br#"{"cniVersion":"1.0.0","name":"net1","plugins":[]}"#.to_vec(),
            Some(result.clone()),
        );
        let work = async {
            let lock = cache
                .lock("net1", "c1", "eth0", Duration::from_secs(1))
                .await?;
            cache.write(&rec).await?;
            let entry = cache.read("net1", "c1", "eth0").await?;
            assert_eq!(entry.and_then(|e| e.result().cloned()), Some(result));
            cache.remove("net1", "c1", "eth0").await?;
            assert!(cache.read("net1", "c1", "eth0").await?.is_none());
            drop(lock);
            Ok::<_, cni_async::Error>(())
        };
        tokio::time::timeout(Duration::from_secs(10), work)
            .await
            .expect("inline cache I/O waited for the blocking pool")
            .unwrap();

        // A listing reads every record: it goes to the (busy) pool.
        cache.write(&rec).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), cache.list(None))
                .await
                .is_err(),
            "an inline cache's listing should have waited for the busy pool"
        );

        // Control: the default cache does use the (busy) pool.
        let pooled = ResultCache::new(dir.path());
        let read = pooled.read("net1", "c1", "eth0");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), read)
                .await
                .is_err(),
            "the default cache should have waited for the busy pool"
        );
        release.send(()).unwrap();
        busy.await.unwrap();
        assert_eq!(cache.list(None).await.unwrap().len(), 1);
    });
}
