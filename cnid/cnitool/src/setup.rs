//! Shared setup: the environment turned into [`Settings`] (where configs,
//! plugins and the cache are, the deadline) and into the [`RuntimeConf`] of
//! an attachment (container ID, netns, ifname, `CNI_ARGS`, `CAP_ARGS`);
//! network loading and [`Cni`] building for the local backend.
//!
//! Every function reads the environment through an [`Env`] lookup, so the
//! rules are unit-tested without touching the process environment.
//!
//! Differences from the reference cnitool, on purpose:
//! - `CNI_PATH` unset or empty means the default dirs
//!   (`/opt/cni/bin:/usr/lib/cni`); the reference passes an empty path then,
//!   which finds no plugin at all.
//! - The environment is read before the network is loaded (the reference
//!   loads the network first), so that a daemon backend, which loads the
//!   network on its side, sees the same errors in the same order.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use cni_async::cache::ResultCache;
use cni_async::exec::Timeouts;
use cni_async::{CallOptions, Cni};
use cni_core::error::code;
use cni_core::{CapabilityArgs, CniArgs, NetworkConfigList, RuntimeConf, confdir};
use sha2::{Digest, Sha512};

use crate::report::ToolError;

/// `NETCONFPATH`: the conf dir.
pub(crate) const ENV_NET_DIR: &str = "NETCONFPATH";
/// `CAP_ARGS`: a JSON object.
pub(crate) const ENV_CAP_ARGS: &str = "CAP_ARGS";
/// `CNI_CACHE_DIR`: the result cache dir (not in the reference).
pub(crate) const ENV_CACHE_DIR: &str = "CNI_CACHE_DIR";
/// `CNI_TIMEOUT`: seconds per operation (not in the reference).
pub(crate) const ENV_TIMEOUT: &str = "CNI_TIMEOUT";

/// The reference cnitool's default conf dir.
pub(crate) const DEFAULT_NET_DIR: &str = "/etc/cni/net.d";
/// Prefix of the container IDs cnitool derives.
pub(crate) const CONTAINER_ID_PREFIX: &str = "cnitool-";

/// A lookup of environment variables.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment.
pub(crate) fn process_env(key: &str) -> Option<OsString> {
    std::env::var_os(key)
}

/// A variable's value, `None` when unset or empty.
fn non_empty(env: Env<'_>, key: &str) -> Option<OsString> {
    env(key).filter(|v| !v.is_empty())
}

/// A variable's value as UTF-8 text, `None` when unset or empty.
fn non_empty_text(env: Env<'_>, key: &str) -> Result<Option<String>, ToolError> {
    match non_empty(env, key) {
        None => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|v| {
            ToolError::new(
                code::INVALID_ENVIRONMENT_VARIABLES,
                format!("invalid {key} {v:?}: not valid UTF-8"),
            )
        }),
    }
}

/// Where things are and how long operations may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The conf dir (`NETCONFPATH`).
    pub(crate) net_dir: PathBuf,
    /// Plugin dirs (`CNI_PATH`).
    pub(crate) plugin_dirs: Vec<PathBuf>,
    /// The cache dir (`CNI_CACHE_DIR`).
    pub(crate) cache_dir: PathBuf,
    /// The deadline of each operation (`CNI_TIMEOUT`); `None` = per-verb defaults.
    pub(crate) timeout: Option<Duration>,
}

impl Settings {
    /// Reads `NETCONFPATH`, `CNI_PATH`, `CNI_CACHE_DIR` and `CNI_TIMEOUT`.
    pub(crate) fn from_env(env: Env<'_>) -> Result<Self, ToolError> {
        let net_dir = non_empty(env, ENV_NET_DIR)
            .map_or_else(|| PathBuf::from(DEFAULT_NET_DIR), PathBuf::from);
        let plugin_dirs = match non_empty(env, cni_core::env::CNI_PATH) {
            // Like Go's filepath.SplitList: empty components are kept (and
            // skipped at lookup).
            Some(v) => std::env::split_paths(&v).collect(),
            None => cni_async::ops::DEFAULT_PLUGIN_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
        };
        let cache_dir = non_empty(env, ENV_CACHE_DIR).map_or_else(
            || PathBuf::from(cni_core::cache::DEFAULT_CACHE_DIR),
            PathBuf::from,
        );
        let timeout = non_empty_text(env, ENV_TIMEOUT)?
            .map(|v| parse_timeout(&v))
            .transpose()?;
        Ok(Settings {
            net_dir,
            plugin_dirs,
            cache_dir,
            timeout,
        })
    }

    /// The [`Cni`] for these settings, for runs of several operations at
    /// once (`batch`): cache I/O on tokio's blocking pool, so that the
    /// fsyncs of different attachments overlap.
    pub(crate) fn build_cni(&self) -> Cni {
        self.cni_with_cache(ResultCache::new(&self.cache_dir))
    }

    /// The [`Cni`] for one operation (`add`, `del`, ...): cache I/O runs on
    /// the calling thread. Such a run has nothing to overlap the disk work
    /// with, so tokio's blocking pool would only add the start of its
    /// thread and a hand-off per call (BENCHMARKS.md has the figures).
    pub(crate) fn build_cni_single(&self) -> Cni {
        self.cni_with_cache(ResultCache::new(&self.cache_dir).with_inline_io(true))
    }

    fn cni_with_cache(&self, cache: ResultCache) -> Cni {
        let mut builder = Cni::builder()
            .plugin_dirs(self.plugin_dirs.iter().cloned())
            .cache(cache)
            // As the reference, any existing path goes to the plugins
            // (`runtime_conf_for_add` refuses a missing one, with hints).
            .check_netns(false)
            .plugin_stderr(crate::passthrough::sink());
        if let Some(t) = self.timeout {
            builder = builder.timeouts(Timeouts::uniform(t));
        }
        builder.build()
    }

    /// The options of every call.
    pub(crate) fn call_options(&self) -> CallOptions {
        CallOptions {
            timeout: self.timeout,
            // As the reference: a failed ADD is left for the user's DEL.
            rollback: false,
        }
    }

    /// Finds a network in the conf dir.
    pub(crate) fn load_network(&self, name: &str) -> Result<NetworkConfigList, cni_core::Error> {
        confdir::load_network(&self.net_dir, name)
    }
}

/// Parses `CNI_TIMEOUT`: a positive, finite number of seconds (`30`, `0.5`).
pub(crate) fn parse_timeout(value: &str) -> Result<Duration, ToolError> {
    let bad = |why: &str| {
        ToolError::new(
            code::INVALID_ENVIRONMENT_VARIABLES,
            format!("invalid {ENV_TIMEOUT} {value:?}: {why}"),
        )
    };
    let secs: f64 = value
        .trim()
        .parse()
        .map_err(|_| bad("expected a number of seconds, such as 30 or 0.5"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(bad("expected a positive number of seconds"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| bad("too large"))
}

/// `gc` and `status` take the netns argument as the reference does: when
/// given it is parsed with the environment (so bad input is refused the same
/// way), and then not used.
pub(crate) fn check_unused_netns(
    env: Env<'_>,
    netns: Option<&str>,
    ifname: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(netns) = netns {
        runtime_conf(env, netns, ifname)?;
    }
    Ok(())
}

/// The attachment of `add`, `check`, `del` (and, parsed but unused as in the
/// reference, `gc` and `status`): container ID from the netns path, the
/// interface name from `-i`, `CNI_IFNAME` or `eth0`, `CNI_ARGS`, `CAP_ARGS`.
pub(crate) fn runtime_conf(
    env: Env<'_>,
    netns: &str,
    ifname_flag: Option<&str>,
) -> anyhow::Result<RuntimeConf> {
    let cap_args = match non_empty_text(env, ENV_CAP_ARGS)? {
        Some(v) => {
            CapabilityArgs::from_json(&v).with_context(|| format!("{ENV_CAP_ARGS} {v:?}"))?
        }
        None => CapabilityArgs::new(),
    };
    let args = match non_empty_text(env, cni_core::env::CNI_ARGS)? {
        // The message names the pair, as the reference's does.
        Some(v) => CniArgs::parse(&v)?,
        None => CniArgs::new(),
    };
    let ifname = match ifname_flag.filter(|i| !i.is_empty()) {
        Some(i) => i.to_owned(),
        None => non_empty_text(env, cni_core::env::CNI_IFNAME)?
            .unwrap_or_else(|| cnid_api::DEFAULT_IFNAME.to_owned()),
    };
    let netns = absolute_path(env, netns)?;
    let mut rt = RuntimeConf::new(container_id(&netns), netns, ifname);
    rt.args = args;
    rt.capability_args = cap_args;
    Ok(rt)
}

/// `cnitool-` + lowercase hex of the first 10 bytes of SHA-512 of the
/// (absolute) netns path: the reference cnitool's container ID, so an
/// attachment made by either tool can be checked and deleted by the other.
pub(crate) fn container_id(netns: &str) -> String {
    let digest = Sha512::digest(netns.as_bytes());
    let mut id = String::with_capacity(CONTAINER_ID_PREFIX.len() + 20);
    id.push_str(CONTAINER_ID_PREFIX);
    for b in &digest[..10] {
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    id
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Go's `filepath.Abs`: an absolute path is cleaned; a relative one is
/// joined to the working directory and cleaned. Lexical only: symlinks are
/// not resolved.
pub(crate) fn absolute_path(env: Env<'_>, path: &str) -> Result<String, ToolError> {
    if path.starts_with('/') {
        return Ok(clean(path));
    }
    let wd = working_dir(env)?;
    Ok(clean(&format!("{wd}/{path}")))
}

/// A hint for a failure to use the result cache for lack of permission
/// (a non-root cnitool on `/var/lib/cni`, say): the error says only
/// "Permission denied" on some file under the cache dir.
pub(crate) fn cache_permission_hint(err: &anyhow::Error, cache_dir: &Path) -> Option<String> {
    let denied = err.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
    });
    let dir = cache_dir.display().to_string();
    (denied && format!("{err:#}").contains(&dir)).then(|| {
        format!(
            "cnitool needs root, or read and write access to the result cache dir {dir} \
             (set {} to use another dir)",
            ENV_CACHE_DIR
        )
    })
}

/// What the bridge plugin says when CHECK finds the bridge's MAC changed
/// since the ADD ("Bridge interface cni0 Mac doesn't match: ...").
const BRIDGE_MAC_MISMATCH: &str = "Mac doesn't match";

/// What cnid says when it refuses a netns and interface that are another
/// container's (409).
const OWNER_REFUSAL: &str = "set \"force\": true";

/// A hint for a failure whose message alone leaves the user stuck: the
/// bridge plugin's CHECK of a bridge whose MAC moved (a bridge without a
/// fixed MAC takes the lowest MAC of its ports, so it changes as
/// containers join, and the CHECK of every container but the last fails),
/// and cnid's refusal of another container's netns (cnitool's `--force`).
pub(crate) fn error_hint(err: &anyhow::Error) -> Option<String> {
    let text = format!("{err:#}");
    if text.contains(BRIDGE_MAC_MISMATCH) && text.contains("Bridge interface") {
        return Some(
            "the bridge's MAC changed since the ADD: a bridge without a fixed MAC takes the \
             lowest MAC of its ports, which changes as containers join. Create the bridge \
             with a fixed MAC before the first ADD (`ip link add BRIDGE type bridge && ip link \
             set BRIDGE address 02:..`; the plugin keeps an existing bridge as it is), or set \
             \"disableCheck\": true on the network"
                .to_owned(),
        );
    }
    if text.contains(OWNER_REFUSAL) {
        return Some(
            "cnitool derives the container ID from the netns path; if this is meant \
             (the attachment's own container is gone), repeat with --force"
                .to_owned(),
        );
    }
    None
}

/// ADD and CHECK: a bare NAME that is not a file in the working directory
/// but is a named namespace in `run_dir` is refused with a hint, instead of
/// resolving it against the working directory (as the reference does) and
/// failing later. `resolved` is the absolute path the argument became.
pub(crate) fn bare_netns_hint(netns: &str, resolved: &str, run_dir: &Path) -> Option<String> {
    if netns.is_empty() || netns.contains('/') || netns == "." || netns == ".." {
        return None;
    }
    let named = run_dir.join(netns);
    if Path::new(resolved).exists() || !named.exists() {
        return None;
    }
    Some(format!(
        "netns {netns:?} is a path relative to the working directory ({resolved} does not exist); did you mean {}?",
        named.display()
    ))
}

/// An absolute netns path that does not exist, beside an entry of a near
/// name (a typo: `/run/netns/m2` for `/run/netns/m1`): the message
/// [`runtime_conf_for_add`] refuses it with (and [`missing_netns`] leads a
/// plugin's error with). Only the words depend on the near name: whether
/// an ADD runs depends on the path alone, never on what else the host
/// holds.
pub(crate) fn typo_netns_hint(netns: &str, resolved: &str) -> Option<String> {
    if !netns.starts_with('/') {
        return None;
    }
    let path = Path::new(resolved);
    let (parent, name) = (path.parent()?, path.file_name()?.to_str()?);
    if name.chars().count() < 3 || path.exists() {
        return None;
    }
    let names: Vec<String> = std::fs::read_dir(parent)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.chars().count() >= 3)
        .collect();
    let near = cni_core::error::closest(name, &names)?;
    Some(format!(
        "netns {resolved:?} does not exist; did you mean {}?",
        parent.join(near).display()
    ))
}

/// [`runtime_conf`] for ADD and CHECK: a netns path that does not exist
/// is refused before any plugin runs (code 4, the path named; with
/// [`bare_netns_hint`] or [`typo_netns_hint`] when a named namespace is
/// near), instead of the plugin's `failed to Statfs` (code 999). DEL takes
/// a gone netns, as the spec says.
pub(crate) fn runtime_conf_for_add(
    env: Env<'_>,
    netns: &str,
    ifname_flag: Option<&str>,
) -> anyhow::Result<RuntimeConf> {
    let rt = runtime_conf(env, netns, ifname_flag)?;
    if rt.netns.is_empty() || Path::new(&rt.netns).exists() {
        return Ok(rt);
    }
    let why = bare_netns_hint(netns, &rt.netns, Path::new(cni_async::netns::NETNS_RUN_DIR))
        .or_else(|| typo_netns_hint(&rt.netns, &rt.netns))
        .unwrap_or_else(|| format!("netns {:?} does not exist", rt.netns));
    Err(ToolError::new(code::INVALID_ENVIRONMENT_VARIABLES, why).into())
}

/// An ADD or CHECK that failed on its netns path, which does not exist
/// (the error names the path: the bridge's `failed to Statfs
/// "/run/netns/nope"`, code 999): the error led by that cause; the
/// plugin's words and code follow.
pub(crate) fn missing_netns(e: anyhow::Error, rt: &RuntimeConf) -> anyhow::Error {
    if rt.netns.is_empty()
        || Path::new(&rt.netns).exists()
        || !format!("{e:#}").contains(rt.netns.as_str())
    {
        return e;
    }
    let cause = typo_netns_hint(&rt.netns, &rt.netns)
        .unwrap_or_else(|| format!("netns {:?} does not exist", rt.netns));
    e.context(cause)
}

/// Go's `os.Getwd`: `$PWD` when it is absolute and names the current
/// directory (so a path through a symlink is kept, as the shell shows it),
/// otherwise the kernel's answer. Matching Go here keeps container IDs equal
/// to the reference cnitool's for relative netns paths.
fn working_dir(env: Env<'_>) -> Result<String, ToolError> {
    let io = |what: &str, e: std::io::Error| {
        ToolError::new(
            code::IO_FAILURE,
            format!("cannot make the netns path absolute: {what}: {e}"),
        )
    };
    let dot = std::fs::metadata(".").map_err(|e| io("stat .", e))?;
    if let Some(pwd) = env("PWD").filter(|p| p.as_bytes().first() == Some(&b'/')) {
        let same = std::fs::metadata(Path::new(&pwd))
            .is_ok_and(|m| m.dev() == dot.dev() && m.ino() == dot.ino());
        if same && let Some(pwd) = pwd.to_str() {
            return Ok(pwd.to_owned());
        }
    }
    let wd = std::env::current_dir().map_err(|e| io("current directory", e))?;
    wd.into_os_string().into_string().map_err(|wd| {
        ToolError::new(
            code::INVALID_ENVIRONMENT_VARIABLES,
            format!(
                "cannot make the netns path absolute: current directory {:?} is not valid UTF-8",
                OsStr::new(&wd)
            ),
        )
    })
}

/// Go's `path.Clean` for slash-separated paths: collapses `//`, drops `.`,
/// resolves `..` lexically (`/..` is `/`), no trailing slash; `""` is `.`.
pub(crate) fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if rooted => {}
                _ => parts.push(".."),
            },
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

/// CAP_NET_ADMIN's bit in the capability sets of `/proc/PID/status`.
const CAP_NET_ADMIN: u32 = 12;

/// Fails when this process cannot run a DEL's plugins at all: it lacks
/// CAP_NET_ADMIN (in its own user namespace, so a rootless runtime's
/// namespace passes), which every network plugin needs to change an
/// interface. What cannot be read proves nothing: then the plugins run
/// and say for themselves.
pub(crate) fn check_del_privilege() -> Result<(), ToolError> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Ok(());
    };
    match effective_caps(&status) {
        Some(caps) if caps & (1 << CAP_NET_ADMIN) == 0 => Err(ToolError::new(
            code::IO_FAILURE,
            "permission denied: `cnitool del` needs root (CAP_NET_ADMIN) to run the plugins; none was run",
        )),
        _ => Ok(()),
    }
}

/// The effective capability set (`CapEff:`, hex) of a `/proc/PID/status`.
fn effective_caps(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn effective_caps_reads_cap_eff() {
        let status = "Name:\tcnitool\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000001000\n";
        assert_eq!(effective_caps(status), Some(1 << CAP_NET_ADMIN));
        assert_eq!(effective_caps("CapEff:\tzz\n"), None);
        assert_eq!(effective_caps("Name:\tx\n"), None);
    }

    #[test]
    fn clean_matches_go() {
        // Cases from Go's path/filepath tests.
        for (input, want) in [
            ("", "."),
            ("abc", "abc"),
            ("abc/def", "abc/def"),
            ("a/b/c", "a/b/c"),
            (".", "."),
            ("..", ".."),
            ("../..", "../.."),
            ("../../abc", "../../abc"),
            ("/abc", "/abc"),
            ("/", "/"),
            ("abc/", "abc"),
            ("abc/def/", "abc/def"),
            ("/abc/", "/abc"),
            ("//abc", "/abc"),
            ("abc//def//ghi", "abc/def/ghi"),
            ("abc/./def", "abc/def"),
            ("/./abc/def", "/abc/def"),
            ("abc/.", "abc"),
            ("abc/def/ghi/../jkl", "abc/def/jkl"),
            ("abc/def/../ghi/../jkl", "abc/jkl"),
            ("abc/def/..", "abc"),
            ("abc/def/../..", "."),
            ("/abc/def/../..", "/"),
            ("abc/def/../../..", ".."),
            ("/abc/def/../../..", "/"),
            ("abc/def/../../../ghi/jkl/../../../mno", "../../mno"),
            ("/../abc", "/abc"),
            ("abc/./../def", "def"),
            ("abc//./../def", "def"),
            ("abc/../../././../def", "../../def"),
        ] {
            assert_eq!(clean(input), want, "clean({input:?})");
        }
    }

    #[test]
    fn a_missing_absolute_netns_beside_a_near_name_gets_a_hint() {
        let run = tempfile::tempdir().unwrap();
        std::fs::write(run.path().join("pod-m1"), b"").unwrap();
        let typo = run.path().join("pod-m2").display().to_string();
        let hint = typo_netns_hint(&typo, &typo).unwrap();
        assert_eq!(
            hint,
            format!(
                "netns {typo:?} does not exist; did you mean {}/pod-m1?",
                run.path().display()
            )
        );
        // Nothing near, existing, relative or short: no hint.
        let far = run.path().join("elsewhere").display().to_string();
        assert_eq!(typo_netns_hint(&far, &far), None);
        let there = run.path().join("pod-m1").display().to_string();
        assert_eq!(typo_netns_hint(&there, &there), None);
        assert_eq!(typo_netns_hint("pod-m2", &typo), None);
        let short = run.path().join("m2").display().to_string();
        std::fs::write(run.path().join("m1"), b"").unwrap();
        assert_eq!(typo_netns_hint(&short, &short), None);
    }

    #[test]
    fn a_bare_name_of_a_named_netns_gets_a_hint() {
        let run = tempfile::tempdir().unwrap();
        let wd = tempfile::tempdir().unwrap();
        std::fs::write(run.path().join("nu-c2"), b"").unwrap();
        let resolved = wd.path().join("nu-c2").display().to_string();
        let hint = bare_netns_hint("nu-c2", &resolved, run.path()).unwrap();
        assert!(
            hint.ends_with(&format!("did you mean {}/nu-c2?", run.path().display())),
            "{hint}"
        );
        // Not named there, a path, or a file of the working dir: no hint.
        assert_eq!(bare_netns_hint("other", &resolved, run.path()), None);
        assert_eq!(bare_netns_hint("./nu-c2", &resolved, run.path()), None);
        std::fs::write(wd.path().join("nu-c2"), b"").unwrap();
        assert_eq!(bare_netns_hint("nu-c2", &resolved, run.path()), None);
    }

    #[test]
    fn absolute_paths_are_cleaned_only() {
        let env = env_of(&[]);
        assert_eq!(
            absolute_path(&env, "/var/run/netns/../netns//x/").unwrap(),
            "/var/run/netns/x"
        );
    }

    #[test]
    fn relative_paths_join_the_working_dir() {
        let env = env_of(&[]);
        let wd = std::env::current_dir().unwrap();
        let wd = wd.to_str().unwrap();
        assert_eq!(absolute_path(&env, "a/./b").unwrap(), format!("{wd}/a/b"));
        assert_eq!(absolute_path(&env, "").unwrap(), clean(wd));
    }

    #[test]
    fn pwd_is_used_only_when_it_names_the_working_dir() {
        let wd = std::env::current_dir().unwrap();
        let wd = wd.to_str().unwrap();
        let env = env_of(&[("PWD", "/")]);
        if wd != "/" {
            assert_eq!(absolute_path(&env, "x").unwrap(), format!("{wd}/x"));
        }
        let env = env_of(&[("PWD", "relative")]);
        assert_eq!(absolute_path(&env, "x").unwrap(), format!("{wd}/x"));
        let with_dot = format!("{wd}/.");
        let env = env_of(&[("PWD", with_dot.as_str())]);
        assert_eq!(absolute_path(&env, "x").unwrap(), format!("{wd}/x"));
    }

    #[test]
    fn container_id_is_sha512_prefix() {
        // printf '%s' /var/run/netns/test | sha512sum | cut -c1-20
        assert_eq!(
            container_id("/var/run/netns/test"),
            "cnitool-7b8a61d5d8e94d07cbe4"
        );
        assert_eq!(container_id("").len(), "cnitool-".len() + 20);
    }

    #[test]
    fn settings_defaults_and_overrides() {
        let s = Settings::from_env(&env_of(&[("CNI_PATH", ""), ("NETCONFPATH", "")])).unwrap();
        assert_eq!(
            s,
            Settings {
                net_dir: "/etc/cni/net.d".into(),
                plugin_dirs: vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()],
                cache_dir: "/var/lib/cni".into(),
                timeout: None,
            }
        );
        let s = Settings::from_env(&env_of(&[
            ("CNI_PATH", "/a::/b"),
            ("NETCONFPATH", "/n"),
            ("CNI_CACHE_DIR", "/c"),
            ("CNI_TIMEOUT", "1.5"),
        ]))
        .unwrap();
        assert_eq!(s.plugin_dirs, [PathBuf::from("/a"), "".into(), "/b".into()]);
        assert_eq!(s.net_dir, PathBuf::from("/n"));
        assert_eq!(s.cache_dir, PathBuf::from("/c"));
        assert_eq!(s.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(s.call_options().timeout, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn timeouts_must_be_positive_numbers() {
        assert_eq!(parse_timeout(" 2 ").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_timeout("0.25").unwrap(), Duration::from_millis(250));
        for bad in ["", "abc", "0", "-1", "inf", "NaN", "1e30", "5s"] {
            let e = parse_timeout(bad).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("invalid CNI_TIMEOUT {bad:?}")),
                "{e}"
            );
            assert_eq!(e.code, 4);
        }
    }

    #[test]
    fn runtime_conf_from_env() {
        let env = env_of(&[
            ("CNI_ARGS", "A=1;B=2"),
            ("CAP_ARGS", r#"{"mac":"aa:bb:cc:dd:ee:ff"}"#),
            ("CNI_IFNAME", "net5"),
        ]);
        let rt = runtime_conf(&env, "/run/netns/x", None).unwrap();
        assert_eq!(rt.container_id, container_id("/run/netns/x"));
        assert_eq!(rt.ifname, "net5");
        assert_eq!(rt.args.to_string(), "A=1;B=2");
        assert!(rt.capability_args.get("mac").is_some());
        let rt = runtime_conf(&env, "/run/netns/x", Some("eth9")).unwrap();
        assert_eq!(rt.ifname, "eth9");
        // `-i ""` counts as not given, as in the reference.
        let rt = runtime_conf(&env_of(&[]), "/run/netns/x", Some("")).unwrap();
        assert_eq!(rt.ifname, "eth0");
    }

    #[test]
    fn bad_env_names_the_value() {
        let e = runtime_conf(&env_of(&[("CNI_ARGS", "A=1;oops")]), "/x", None).unwrap_err();
        assert!(
            format!("{e:#}").starts_with("invalid CNI_ARGS pair \"oops\""),
            "{e:#}"
        );
        let e = runtime_conf(&env_of(&[("CAP_ARGS", "[1]")]), "/x", None).unwrap_err();
        assert!(format!("{e:#}").starts_with("CAP_ARGS \"[1]\": "), "{e:#}");
    }
}
