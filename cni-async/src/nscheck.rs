//! The netns rule of ADD and CHECK: `CNI_NETNS` must be an absolute path to
//! a network namespace. Every [`Cni`] refuses an empty or relative netns
//! for ADD and CHECK ([`check_netns_path`]); by default
//! ([`CniBuilder::check_netns`]) it also refuses a path that is not a
//! network namespace ([`check_netns`]), before any plugin runs. libcni
//! passes any netns through (`docs/decisions.md` D23).
//!
//! | verb | netns |
//! |---|---|
//! | ADD, CHECK | an absolute path to a network namespace: a bind mount such as `/run/netns/NAME` (what `ip netns add` makes) or `/proc/PID/ns/net` |
//! | DEL | anything the character check of [`RuntimeConf::validate`] allows, also empty: the namespace may be gone |
//! | STATUS, GC, VERSION | none (not looked at) |
//!
//! A path that is not a network namespace is refused with one answer,
//! `not a network namespace`, whatever it is: a caller learns nothing else
//! about the file system.
//!
//! ```
//! use cni_async::check_netns;
//! use cni_core::Command;
//!
//! check_netns("/proc/self/ns/net", Command::Add)?;
//! let e = check_netns("/etc", Command::Add).unwrap_err();
//! assert_eq!(e.to_string(), r#"invalid netns path "/etc": not a network namespace"#);
//! assert_eq!(e.code(), 4);
//! check_netns("", Command::Del)?;
//! # Ok::<(), cni_async::Error>(())
//! ```
//!
//! [`CniBuilder::check_netns`]: crate::CniBuilder::check_netns
//! [`Cni`]: crate::Cni
//! [`RuntimeConf::validate`]: cni_core::RuntimeConf::validate

use std::path::Path;

use cni_core::Command;
use cni_core::error::code;

use crate::error::Error;

/// The answer for every path that is not a network namespace.
pub const NOT_A_NETWORK_NAMESPACE: &str = "not a network namespace";

/// The part of the rule every [`Cni`](crate::Cni) applies: for ADD and
/// CHECK, `netns` must be a non-empty absolute path (and pass the
/// character check of [`cni_core::validate::netns_path`]); other commands
/// pass. Errors as [`check_netns`].
pub fn check_netns_path(netns: &str, command: Command) -> Result<(), Error> {
    if !matches!(command, Command::Add | Command::Check) {
        return Ok(());
    }
    if netns.is_empty() {
        return Err(bad(netns, "required for ADD and CHECK"));
    }
    if !netns.starts_with('/') {
        return Err(bad(netns, "must be an absolute path"));
    }
    Ok(cni_core::validate::netns_path(netns)?)
}

/// Checks `netns` for `command` (see the [module docs](self)): what
/// [`check_netns_path`] checks, and that the path is a network namespace.
/// Errors are [`cni_core::Error::InvalidParameter`] for the field
/// `netns path`, CNI code 4.
pub fn check_netns(netns: &str, command: Command) -> Result<(), Error> {
    check_netns_path(netns, command)?;
    if matches!(command, Command::Add | Command::Check)
        && !crate::sys::nsfs::is_network_namespace(Path::new(netns))
    {
        return Err(bad(netns, NOT_A_NETWORK_NAMESPACE));
    }
    Ok(())
}

fn bad(netns: &str, reason: &str) -> Error {
    Error::Core(cni_core::Error::InvalidParameter {
        field: "netns path",
        value: netns.to_owned(),
        reason: reason.to_owned(),
        code: code::INVALID_ENVIRONMENT_VARIABLES,
    })
}
