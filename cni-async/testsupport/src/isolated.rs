//! A host of the test's own: a network and a mount namespace in which the
//! host-global names (`/run/netns/NAME`, `/run/cnid`, `/var/lib/cni`, a
//! bridge such as the bundled networks' `cnirs-br0`, iptables chains) are
//! the test's alone.
//!
//! Tests that run the bundled networks, the examples or the demo use names
//! fixed by those files. Anything else on the host may use the same names
//! at the same time (a developer running `make demo`, a second copy of the
//! suite), and one run's set-up or tidy-up would change the other's
//! outcome. [`on_own_host`] runs such a test on a dedicated thread that has
//! unshared its network and mount namespaces, with fresh tmpfs mounts on
//! `/run` and `/var/lib`, mount propagation to the host off, and loopback
//! up. Processes the closure starts inherit that thread's namespaces; the
//! host never sees their bridges, namespaces, caches or reservations, and
//! everything goes away with the last process inside.
//!
//! The README snippet test (`cnid/tests/readme_snippets.rs`) builds the
//! same sandbox with `unshare(1)` for a shell script.
//!
//! # Caveats
//!
//! - Only the dedicated thread (and threads it spawns, and processes any of
//!   them start) is inside. Anything the closure hands to another thread
//!   (a tokio runtime built outside it, a thread pool) runs on the host:
//!   build runtimes inside the closure.
//! - The host's `/run` and `/var/lib` are hidden inside: a tool that needs
//!   them (cargo's build of a missing binary, say) must run before.
//! - Needs root (`unshare`, `mount`).

use std::any::Any;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

/// The directories that get a fresh, empty tmpfs inside (they hold every
/// host-global path the workspace's tests meet: `/run/netns`, `/run/cnid`,
/// `/var/run` (a link to `/run`), `/var/lib/cni`, `/var/lib/cnid`).
pub const FRESH_DIRS: [&str; 2] = ["/run", "/var/lib"];

/// Runs `f` on a thread with a network and mount namespace of its own (see
/// the module docs) and returns what it returns; a panic in `f` is resumed
/// on the caller's thread with its own message. Panics, naming the step,
/// when the sandbox cannot be made (not root, say).
pub fn on_own_host<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let outcome: Result<T, Box<dyn Any + Send>> = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name(crate::current_test("on_own_host"))
            .spawn_scoped(scope, move || {
                enter();
                f()
            })
            .expect("spawn the sandbox thread")
            .join()
    });
    match outcome {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Moves the calling thread into its own namespaces and makes the sandbox.
fn enter() {
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .unwrap_or_else(|e| panic!("unshare the network and mount namespaces: {e}"));
    // Nothing mounted from here on may reach the host's mount namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("make / private in the sandbox: {e}"));
    for dir in FRESH_DIRS {
        mount(
            Some("tmpfs"),
            Path::new(dir),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs on {dir} in the sandbox: {e}"));
    }
    let status = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .stdin(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run ip link set lo up in the sandbox: {e}"));
    assert!(
        status.success(),
        "ip link set lo up in the sandbox: {status}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn links() -> String {
        let out = Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the sandbox creates under the fixed names never reaches the
    /// host, and what the host has under them is not seen inside.
    #[test]
    fn names_made_inside_are_the_sandboxs_alone() {
        crate::require_root!("unshares namespaces and mounts tmpfs");
        let name = format!("iso{}", crate::netns::unique_id());
        let inside = on_own_host(|| {
            let before = links();
            let ok = Command::new("ip")
                .args(["link", "add", &name, "type", "bridge"])
                .status()
                .unwrap();
            assert!(ok.success());
            fs::create_dir_all("/var/lib/cni/networks/iso").unwrap();
            fs::write("/run/iso-marker", b"inside").unwrap();
            let after = links();
            (before, after)
        });
        assert_eq!(inside.0.lines().count(), 1, "only lo inside: {}", inside.0);
        assert!(inside.1.contains(&name), "the bridge exists inside");
        assert!(!links().contains(&name), "the host never sees the bridge");
        assert!(!Path::new("/run/iso-marker").exists());
        assert!(!Path::new("/var/lib/cni/networks/iso").exists());
    }

    /// The bundled network's names taken outside (here by an outer sandbox
    /// standing in for the host, so the real host is left alone) are free
    /// inside: a test on its own host cannot meet a user's `cnirs-br0`.
    #[test]
    fn the_bundled_names_taken_outside_are_free_inside() {
        crate::require_root!("unshares namespaces and mounts tmpfs");
        on_own_host(|| {
            let ok = Command::new("ip")
                .args(["link", "add", "cnirs-br0", "type", "bridge"])
                .status()
                .unwrap();
            assert!(ok.success());
            fs::create_dir_all("/var/lib/cni/networks/cnirs-bridge").unwrap();
            fs::write("/var/lib/cni/networks/cnirs-bridge/10.253.10.10", b"x").unwrap();
            fs::create_dir_all("/run/netns").unwrap();
            fs::write("/run/netns/cnirs-a", b"").unwrap();
            let inner = on_own_host(|| {
                (
                    links(),
                    Path::new("/var/lib/cni/networks").exists(),
                    Path::new("/run/netns").exists(),
                )
            });
            assert_eq!(inner.0.lines().count(), 1, "only lo inside: {}", inner.0);
            assert!(!inner.1 && !inner.2, "fresh /var/lib and /run inside");
            assert!(links().contains("cnirs-br0"), "the outer one still has it");
        });
    }

    #[test]
    fn a_panic_inside_keeps_its_message() {
        crate::require_root!("unshares namespaces and mounts tmpfs");
        let n = std::process::id();
        let panic = std::panic::catch_unwind(|| on_own_host(|| panic!("inside: {n}")))
            .expect_err("the panic comes out");
        assert_eq!(
            panic.downcast_ref::<String>().map(String::as_str),
            Some(format!("inside: {n}").as_str())
        );
    }
}
