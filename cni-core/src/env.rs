//! The environment a plugin gets for each verb, as a list of pairs the
//! executor applies on top of the inherited environment.
//!
//! | verb | variables |
//! |---|---|
//! | ADD, DEL, CHECK | `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH` |
//! | STATUS, GC, VERSION | `CNI_COMMAND`, `CNI_PATH`; the other four set empty |
//!
//! The plugin inherits the caller's environment; these pairs override it. For
//! the network-level verbs the four attachment variables are set to the empty
//! string (as libcni does) so that values inherited from the caller's own
//! environment (a runtime that is itself run as a plugin, say) do not leak
//! into the call.
//!
//! ```
//! use cni_core::{Command, args::RuntimeConf, env::plugin_env};
//!
//! let rt = RuntimeConf::new("c1", "/run/netns/blue", "eth0");
//! let env = plugin_env(Command::Add, Some(&rt), "/opt/cni/bin:/usr/lib/cni");
//! assert_eq!(env[0], ("CNI_COMMAND".to_string(), "ADD".to_string()));
//! ```

use crate::args::RuntimeConf;
use crate::command::Command;

/// `CNI_COMMAND`.
pub const CNI_COMMAND: &str = "CNI_COMMAND";
/// `CNI_CONTAINERID`.
pub const CNI_CONTAINERID: &str = "CNI_CONTAINERID";
/// `CNI_NETNS`.
pub const CNI_NETNS: &str = "CNI_NETNS";
/// `CNI_IFNAME`.
pub const CNI_IFNAME: &str = "CNI_IFNAME";
/// `CNI_ARGS`.
pub const CNI_ARGS: &str = "CNI_ARGS";
/// `CNI_PATH`.
pub const CNI_PATH: &str = "CNI_PATH";

/// Joins plugin dirs into a `CNI_PATH` value (`:`-separated).
pub fn join_path<P: AsRef<std::path::Path>>(dirs: &[P]) -> String {
    dirs.iter()
        .map(|d| d.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

/// The `CNI_*` variables for one plugin call.
///
/// `rt` is used only for ADD, DEL and CHECK (and must be given for them;
/// missing fields are passed as empty strings).
pub fn plugin_env(
    command: Command,
    rt: Option<&RuntimeConf>,
    cni_path: &str,
) -> Vec<(String, String)> {
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let (cid, netns, ifname, args) = match (command.is_attachment_command(), rt) {
        (true, Some(rt)) => (
            rt.container_id.as_str(),
            rt.netns.as_str(),
            rt.ifname.as_str(),
            rt.args.to_string(),
        ),
        _ => ("", "", "", String::new()),
    };
    vec![
        pair(CNI_COMMAND, command.as_str()),
        pair(CNI_CONTAINERID, cid),
        pair(CNI_NETNS, netns),
        pair(CNI_IFNAME, ifname),
        pair(CNI_ARGS, &args),
        pair(CNI_PATH, cni_path),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::CniArgs;

    #[test]
    fn attachment_verbs_get_all_six() {
        let mut rt = RuntimeConf::new("c1", "/run/netns/a", "eth1");
        rt.args = CniArgs::parse("A=1;B=2").unwrap();
        for cmd in [Command::Add, Command::Del, Command::Check] {
            let env = plugin_env(cmd, Some(&rt), "/a:/b");
            assert_eq!(
                env,
                vec![
                    ("CNI_COMMAND".into(), cmd.as_str().into()),
                    ("CNI_CONTAINERID".into(), "c1".into()),
                    ("CNI_NETNS".into(), "/run/netns/a".into()),
                    ("CNI_IFNAME".into(), "eth1".into()),
                    ("CNI_ARGS".into(), "A=1;B=2".into()),
                    ("CNI_PATH".into(), "/a:/b".into()),
                ]
            );
        }
    }

    #[test]
    fn network_verbs_blank_attachment_vars() {
        let rt = RuntimeConf::new("c1", "/run/netns/a", "eth1");
        for cmd in [Command::Status, Command::Gc, Command::Version] {
            let env = plugin_env(cmd, Some(&rt), "/a");
            assert_eq!(env[0].1, cmd.as_str());
            assert!(env[1..5].iter().all(|(_, v)| v.is_empty()), "{env:?}");
            assert_eq!(env[5], ("CNI_PATH".into(), "/a".into()));
        }
    }

    #[test]
    fn join() {
        assert_eq!(
            join_path(&["/opt/cni/bin", "/usr/lib/cni"]),
            "/opt/cni/bin:/usr/lib/cni"
        );
        assert_eq!(join_path::<&str>(&[]), "");
    }
}
