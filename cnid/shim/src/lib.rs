//! `cnid-shim`: a CNI plugin that container runtimes (containerd through
//! go-cni, CRI-O, Podman, anything on libcni) run like any other, and that
//! hands the call to cnid on its Unix socket; cnid runs the real chain of
//! one of its networks, with its ordering, deadlines, crash-safe ADDs, GC
//! and metrics.
//!
//! - [`plugin`]: the plugin itself (every verb; results in the shim's
//!   `cniVersion`; errors; a retried ADD).
//! - [`conf`]: its configuration (`socket`, `network`, `timeout`).
//! - [`http`]: the minimal blocking HTTP/1.1 client it talks to cnid with.
//! - [`man`]: its man page (`cnid-shim --generate man`, for `make install`).
//! - [`setup`]: `cnid-shim config|install|uninstall|health`, which write
//!   the runtime's list from a cnid network and probe cnid.
//!
//! It needs no async runtime: `std`, `serde_json` and the workspace's
//! blocking crates (`cni-core`, `cnid-api`, `cni-durable`) only.
//!
//! # The two conf dirs
//! cnid must not read the runtime's conf dir: the runtime would run the
//! real chain itself as well. The runtime's dir (`/etc/cni/net.d`) holds the
//! shim's list (written by `cnid-shim install`); cnid's own dir
//! (`/etc/cnid/net.d`, `cnid --conf-dir`) holds the real networks. Their
//! caches must differ too (`cnid --cache-dir /var/lib/cnid/cache`): libcni
//! caches the shim's result under `/var/lib/cni/results` with the same
//! network name.

pub mod conf;
pub mod http;
pub mod man;
pub mod plugin;
pub mod setup;

/// The entry point of the `cnid-shim` binary: a plugin call when
/// `CNI_COMMAND` is set, a subcommand otherwise. Writes stdout and stderr,
/// returns the exit status.
pub fn main() -> i32 {
    use std::io::Write;

    // Lossy: `std::env::args` would panic on an argument that is not UTF-8.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if std::env::var_os(cni_core::env::CNI_COMMAND).is_none() {
        let status = setup::main(&args);
        // No std runtime set-up, so no flush at exit either.
        let _ = std::io::stdout().flush();
        return status;
    }
    let env = plugin::PluginEnv::from_process();
    let mut input = Vec::with_capacity(4096);
    let output = match std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut input) {
        Ok(_) => plugin::run(&env, &input),
        Err(e) => plugin::Output {
            stdout: cni_core::ErrorObject::new(
                cni_core::Version::CURRENT.to_string(),
                cni_core::error::code::IO_FAILURE,
                format!("cnid-shim: cannot read the network configuration from stdin: {e}"),
                "",
            )
            .to_json()
            .into_bytes(),
            stderr: Vec::new(),
            status: 1,
        },
    };
    let mut err = std::io::stderr().lock();
    for line in &output.stderr {
        let _ = writeln!(err, "{line}");
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(&output.stdout).and_then(|()| out.flush()) {
        Ok(()) => output.status,
        Err(_) => 1,
    }
}
