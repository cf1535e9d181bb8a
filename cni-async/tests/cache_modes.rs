//! The cache's own dirs are 0700 (libcni's layout; `docs/decisions.md` D22), also
//! when they existed with a looser mode: `results/` is tightened on the
//! next write, `corrupt/` on the next move, all three by
//! `ResultCache::tighten_dirs`. The cache dir itself keeps its mode (it is
//! shared with other tools).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::support::fake::{Fake, Response, Rig, conflist, runtime};
use cni_durable::{PrivateDir, ensure_private_dir};
use serde_json::json;

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test]
async fn an_open_results_dir_is_tightened_on_write() {
    let rig = Rig::new();
    rig.fake(
        "p",
        &Fake::new(Response::ok("")).on(
            "ADD",
            Response::ok(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}]}"#),
        ),
    );
    mkdir(&rig.cache_dir, 0o755);
    mkdir(&rig.cache_dir.join("results"), 0o755);
    let list = conflist(json!({"cniVersion":"1.0.0","name":"m","plugins":[{"type":"p"}]}));
    rig.cni()
        .add_network_list(&list, &runtime("c1", "eth0"))
        .await
        .unwrap();
    assert_eq!(mode(&rig.cache_dir.join("results")), 0o700);
    assert_eq!(mode(&rig.cache_file("m", "c1", "eth0")), 0o600);
    assert_eq!(mode(&rig.cache_dir.join("locks")), 0o700);
    assert_eq!(mode(&rig.lock_file("m", "c1", "eth0")), 0o600);
    assert_eq!(mode(&rig.cache_dir), 0o755, "the cache dir keeps its mode");
}

#[cfg(feature = "daemon")]
#[test]
fn tighten_dirs_covers_every_dir_of_ours_that_exists() {
    use cni_async::cache::ResultCache;
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    mkdir(&cache, 0o755);
    for sub in ["results", "locks", "corrupt"] {
        mkdir(&cache.join(sub), 0o775);
    }
    mkdir(&cache.join("networks"), 0o755); // host-local's, not ours
    ResultCache::new(&cache).tighten_dirs();
    for sub in ["results", "locks", "corrupt"] {
        assert_eq!(mode(&cache.join(sub)), 0o700, "{sub}");
    }
    assert_eq!(mode(&cache.join("networks")), 0o755);
    assert_eq!(mode(&cache), 0o755);
    // Nothing is created.
    let empty = tmp.path().join("empty");
    mkdir(&empty, 0o700);
    ResultCache::new(&empty).tighten_dirs();
    assert_eq!(fs::read_dir(&empty).unwrap().count(), 0);
}

#[test]
fn ensure_private_dir_reports_what_it_did() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("a/b");
    assert_eq!(ensure_private_dir(&d).unwrap(), PrivateDir::Private);
    assert_eq!(mode(&d), 0o700);
    fs::set_permissions(&d, fs::Permissions::from_mode(0o751)).unwrap();
    assert_eq!(
        ensure_private_dir(&d).unwrap(),
        PrivateDir::Tightened { was: 0o751 }
    );
    assert_eq!(mode(&d), 0o700);
    // Giving it away needs root (the tests run as root).
    std::os::unix::fs::chown(&d, Some(65534), None).expect("chown (run the tests as root)");
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        ensure_private_dir(&d).unwrap(),
        PrivateDir::Foreign {
            owner: 65534,
            mode: 0o755
        }
    );
    assert_eq!(mode(&d), 0o755, "someone else's dir is left alone");
}
