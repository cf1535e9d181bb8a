//! This crate's error type.
//!
//! Plugin failures keep their evidence: plugin type, command, exit status,
//! the CNI error object the plugin printed (code, msg, details), its stderr and
//! the start of its stdout. Every variant maps to a CNI error code
//! ([`Error::code`]): the plugin's own where it printed one, 6 for output
//! that does not decode, 11 (try again later) for a timeout (usually
//! transient, and the plugin's group is killed by then) or a busy
//! attachment, 7 for a plugin not installed, 5 for I/O, 4 for an
//! attachment taken already; a wrapper has the code of what it wraps. A CLI
//! or daemon answers with the spec's error JSON ([`Error::to_error_object`]).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use cni_core::error::{Chain, code};
use cni_core::{Command, ErrorObject};

/// How a plugin process ended, when it did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PluginExit {
    /// It exited with this status: non-zero, or 0 when it printed a CNI
    /// error object all the same.
    Code(i32),
    /// It was killed by this signal number.
    Signal(i32),
}

impl PluginExit {
    /// From a process exit status; `None` for success.
    pub(crate) fn from_status(status: std::process::ExitStatus) -> Option<Self> {
        use std::os::unix::process::ExitStatusExt;
        if status.success() {
            return None;
        }
        // Stopped/continued statuses (neither) are never returned by wait
        // for an exit.
        let signal = status.signal().map(PluginExit::Signal);
        Some(
            status
                .code()
                .map(PluginExit::Code)
                .or(signal)
                .unwrap_or(PluginExit::Code(-1)),
        )
    }
}

impl fmt::Display for PluginExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginExit::Code(c) => write!(f, "exit status {c}"),
            PluginExit::Signal(s) => match crate::sys::process::signal_name(*s) {
                Some(name) => write!(f, "killed by signal {s} ({name})"),
                None => write!(f, "killed by signal {s}"),
            },
        }
    }
}

/// What kind of failure an [`Error`] is ([`Error::kind`]), so callers
/// branch without matching variants or strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A plugin ran and failed, or printed something that is not a valid
    /// reply ([`Error::Plugin`], [`Error::PluginOutput`],
    /// [`Error::OutputTooLarge`], a bad VERSION reply).
    Plugin,
    /// A deadline expired ([`Error::Timeout`]).
    Timeout,
    /// The plugin binary is not installed ([`Error::PluginNotFound`]).
    PluginNotFound,
    /// No network configuration of that name, or no configurations at all.
    NetworkNotFound,
    /// The attachment has no cached ADD result ([`Error::NotAttached`]).
    NotAttached,
    /// The network configuration (or a CNI version in it) is invalid.
    InvalidConfig,
    /// A parameter of the call is invalid: container ID, interface name,
    /// network name, netns, `CNI_ARGS`, capability arguments.
    InvalidInput,
    /// A result or cache record that does not decode or convert.
    InvalidData,
    /// The command or version is not supported ([`Error::Unsupported`],
    /// an unsupported CNI version).
    Unsupported,
    /// STATUS: a plugin is not ready ([`Error::NotReady`],
    /// [`Error::NotReadyLimitedConnectivity`]).
    NotReady,
    /// The attachment's lock was held until the deadline ([`Error::CacheLocked`]).
    Busy,
    /// [`Error::AttachmentCollision`] or [`Error::AlreadyAttached`].
    Conflict,
    /// An I/O failure: the cache, a file, a plugin's process, a namespace.
    Io,
    /// Anything else (an empty [`Error::Multiple`], a step hook's own error).
    Other,
}

/// Everything that can go wrong in `cni-async`.
///
/// Each message names only its own part (the plugin, file or value at
/// fault); its cause is its `source()`. Print the whole chain with [`Chain`]
/// (or anyhow's `{:#}`):
///
/// ```
/// use cni_async::{Chain, Error};
/// let e = Error::Context {
///     context: "network \"n\" (ifname eth0) ADD".into(),
///     source: Box::new(Error::NotAttached {
///         network: "n".into(),
///         container_id: "c1".into(),
///         ifname: "eth0".into(),
///     }),
/// };
/// assert_eq!(e.to_string(), "network \"n\" (ifname eth0) ADD");
/// assert!(Chain(&e).to_string().starts_with("network \"n\" (ifname eth0) ADD: "));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the pure CNI logic (configuration, versions, validation, results).
    #[error(transparent)]
    Core(#[from] cni_core::Error),

    /// No executable file named after the plugin type in any plugin dir.
    #[error("{}", fmt_not_found(plugin_type, dirs, skipped))]
    PluginNotFound {
        /// The plugin type looked for.
        plugin_type: String,
        /// The dirs searched, in order (`CNI_PATH`).
        dirs: Vec<PathBuf>,
        /// Files of that name that were skipped because they are not executable.
        skipped: Vec<PathBuf>,
    },

    /// The plugin binary could not be started (missing, not executable, bad
    /// format, still "text file busy" when the deadline came).
    #[error("cannot execute plugin {} ({plugin_type} {command}){}", path.display(),
        if *attempts > 1 { format!(" after {attempts} attempts") } else { String::new() })]
    Spawn {
        /// The plugin type.
        plugin_type: String,
        /// The command it was to run.
        command: Command,
        /// The binary.
        path: PathBuf,
        /// How many times the spawn was tried (more than 1 after "text file busy").
        attempts: u32,
        /// The error of the last attempt.
        #[source]
        source: std::io::Error,
    },

    /// The plugin ran and failed: it exited non-zero, was killed by a
    /// signal, or printed a CNI error object (whatever its exit status).
    #[error("{}", fmt_plugin(plugin_type, *command, *status, error.as_deref(), stdout, stderr))]
    Plugin {
        /// The plugin type.
        plugin_type: String,
        /// The command it ran.
        command: Command,
        /// How it ended.
        status: PluginExit,
        /// The CNI error object it printed on stdout, if stdout decoded as one
        /// (boxed to keep `Result<_, Error>` small).
        error: Option<Box<ErrorObject>>,
        /// Its stdout (lossy UTF-8, at most the first 4 KiB) when that is not an
        /// error object; empty when it decoded or was empty.
        stdout: String,
        /// Its stderr (lossy UTF-8, at most the first 8 KiB).
        stderr: String,
    },

    /// The plugin did not finish within its deadline; its process group was
    /// killed (SIGTERM, then SIGKILL after a grace period) and it was reaped.
    #[error("plugin {plugin_type} {command} timed out after {} (deadline {}: what was left of the call's timeout when it started){}",
        fmt_duration(*elapsed), fmt_duration(*timeout), fmt_stderr_suffix(stderr_so_far))]
    Timeout {
        /// The plugin type.
        plugin_type: String,
        /// The command it ran.
        command: Command,
        /// Time from spawn until the deadline was noticed.
        elapsed: Duration,
        /// The deadline it had: what was left of the operation's timeout
        /// when it started.
        timeout: Duration,
        /// What it had written to stderr until then (lossy UTF-8, at most 8 KiB).
        stderr_so_far: String,
    },

    /// The plugin wrote more to stdout than the limit allows; its process
    /// group was killed.
    #[error("plugin {plugin_type} {command} wrote more than {limit} bytes to stdout")]
    OutputTooLarge {
        /// The plugin type.
        plugin_type: String,
        /// The command it ran.
        command: Command,
        /// The stdout limit in bytes.
        limit: usize,
    },

    /// Talking to a running plugin failed (reading its pipes, waiting for it).
    #[error("i/o error with plugin {plugin_type} {command} while {during}")]
    Io {
        /// The plugin type.
        plugin_type: String,
        /// The command it ran.
        command: Command,
        /// What was being done: `reading stdout`, `waiting for exit`, ...
        during: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A network-namespace operation failed (feature `netns`).
    #[cfg(feature = "netns")]
    #[error("network namespace {}: {op} failed", path.display())]
    Netns {
        /// The namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`), or
        /// `/run/netns` itself for setting up that directory.
        path: PathBuf,
        /// What was being done: `open`, `unshare(CLONE_NEWNET)`, `setns`,
        /// `unlink`, ``run `ip -j addr show dev eth0` ``, ...
        op: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Not a usable name for a named network namespace (feature `netns`).
    #[cfg(feature = "netns")]
    #[error("invalid network namespace name {name:?}: {reason}")]
    NetnsName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A command run inside a network namespace exited unsuccessfully
    /// (feature `netns`).
    #[cfg(feature = "netns")]
    #[error("`{command}` in network namespace {} failed ({status}){}",
        path.display(), fmt_stderr_suffix(stderr))]
    NetnsCommand {
        /// The namespace file.
        path: PathBuf,
        /// The command line.
        command: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// Its stderr (lossy UTF-8, trailing whitespace trimmed).
        stderr: String,
    },

    /// The plugin exited 0 but its output is not what the command needs
    /// (no result, not a valid result, a bad VERSION reply).
    #[error(
        "plugin {plugin_type} {command} printed an invalid reply: {reason}{}{}",
        fmt_labeled(" stdout: ", stdout),
        fmt_stderr_suffix(stderr)
    )]
    PluginOutput {
        /// The plugin type.
        plugin_type: String,
        /// The command it ran.
        command: Command,
        /// What is wrong with the output.
        reason: String,
        /// Its stdout (lossy UTF-8, at most the first 4 KiB).
        stdout: String,
        /// Its stderr (lossy UTF-8, at most the first 8 KiB).
        stderr: String,
    },

    /// The result cache could not be read or written.
    #[error("result cache {}: {op} failed", path.display())]
    Cache {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// Another process or task held the attachment's lock until the deadline.
    #[error("attachment is busy: lock {} still held after {}", path.display(), fmt_duration(*waited))]
    CacheLocked {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },

    /// The attachment has no cached ADD result (CHECK before ADD, or DEL from
    /// the cache of an attachment that does not exist).
    #[error(
        "no cached ADD result for container {container_id:?} interface {ifname:?} on network {network:?}"
    )]
    NotAttached {
        /// The network.
        network: String,
        /// The container ID.
        container_id: String,
        /// The interface name.
        ifname: String,
    },

    /// The command does not exist at the network's version (CHECK below 0.4.0).
    #[error("network {network:?} is at version {version}, which has no {command} command")]
    Unsupported {
        /// The network.
        network: String,
        /// The command.
        command: Command,
        /// The network's version.
        version: cni_core::Version,
    },

    /// STATUS: a plugin is not ready to ADD (CNI code 50).
    #[error(
        "network {network:?} is not ready: plugin {plugin_type}: {error}{}",
        fmt_stderr_suffix(stderr)
    )]
    NotReady {
        /// The network.
        network: String,
        /// The plugin that said so.
        plugin_type: String,
        /// Its error object.
        error: Box<ErrorObject>,
        /// Its stderr.
        stderr: String,
    },

    /// STATUS: a plugin is not ready, and existing attachments may have
    /// limited connectivity (CNI code 51).
    #[error(
        "network {network:?} is not ready and existing attachments may have limited connectivity: plugin {plugin_type}: {error}{}",
        fmt_stderr_suffix(stderr)
    )]
    NotReadyLimitedConnectivity {
        /// The network.
        network: String,
        /// The plugin that said so.
        plugin_type: String,
        /// Its error object.
        error: Box<ErrorObject>,
        /// Its stderr.
        stderr: String,
    },

    /// The cache file an ADD would write holds another attachment's record
    /// (names with `-` make file names ambiguous); the ADD is refused rather
    /// than overwrite it.
    #[error("result cache {} already holds the record of {occupant}; refusing to overwrite it", path.display())]
    AttachmentCollision {
        /// The cache file.
        path: PathBuf,
        /// The attachment that owns it.
        occupant: String,
    },

    /// An exclusive ADD ([`AddRequest::exclusive`](crate::ops::AddRequest))
    /// found the attachment's record in the cache, under its lock: it ran
    /// no plugin.
    #[error(
        "container {container_id:?} interface {ifname:?} is already attached to network {network:?}: DEL it first"
    )]
    AlreadyAttached {
        /// The network.
        network: String,
        /// The container ID.
        container_id: String,
        /// The interface name.
        ifname: String,
    },

    /// The error of a runtime's own step hook ([`crate::multi::StepHook`]),
    /// carried untouched ([`Error::hook`], [`Error::hook_error`]).
    #[cfg(feature = "daemon")]
    #[error("{0}")]
    Hook(Box<dyn crate::multi::HookError>),

    /// An ADD failed and so did the rollback that followed it.
    #[error("{}; rollback also failed: {}", Chain(&**error), Chain(&**rollback))]
    RollbackFailed {
        /// Why the ADD failed.
        error: Box<Error>,
        /// Why the rollback (DEL of the plugins that ran) failed.
        rollback: Box<Error>,
    },

    /// Several errors from one operation that goes on past errors (GC,
    /// validation): the message is the count, the `source()` an
    /// [`ErrorList`] that prints each error with its causes.
    #[error("{operation} failed with {} error(s)", errors.len())]
    Multiple {
        /// The operation.
        operation: String,
        /// Every error, in order.
        #[source]
        errors: ErrorList,
    },

    /// An error of an ADD, CHECK or DEL of [`Cni`](crate::Cni) on one
    /// network (`network "mynet" (ifname eth0) ADD`), saying when the ADD
    /// left a DEL owed. The error object, kind, code and failed plugin are
    /// the wrapped error's; [`Error::innermost`] unwraps it for a `match`.
    #[error("{}", fmt_operation(network, ifname, *command, *del_owed))]
    Operation {
        /// The network.
        network: String,
        /// The interface name.
        ifname: String,
        /// The verb.
        command: Command,
        /// An ADD that failed part way and was not rolled back (no
        /// [`CallOptions::rollback`](crate::CallOptions::rollback), or a
        /// failed one): what its plugins made stays until the caller DELs
        /// the attachment, as the spec asks after every failed ADD.
        del_owed: bool,
        /// The error.
        #[source]
        source: Box<Error>,
    },

    /// An error with what was being done when it happened.
    #[error("{context}")]
    Context {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: Box<Error>,
    },
}

fn fmt_labeled(label: &str, text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(";{label}{}", text.trim_end())
    }
}

/// The errors of an [`Error::Multiple`], in order, and its `source()`:
/// printed as `[1] error: cause; [2] error: cause`.
#[derive(Debug, Default)]
pub struct ErrorList(pub Vec<Error>);

impl fmt::Display for ErrorList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            let sep = if i > 0 { "; " } else { "" };
            write!(f, "{sep}[{}] {}", i + 1, Chain(e))?;
        }
        Ok(())
    }
}

impl std::error::Error for ErrorList {}

impl From<Vec<Error>> for ErrorList {
    fn from(errors: Vec<Error>) -> Self {
        ErrorList(errors)
    }
}

impl std::ops::Deref for ErrorList {
    type Target = Vec<Error>;
    fn deref(&self) -> &Vec<Error> {
        &self.0
    }
}

// `for e in list` and `for e in &list`, as with the Vec it wraps.
impl IntoIterator for ErrorList {
    type Item = Error;
    type IntoIter = std::vec::IntoIter<Error>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a ErrorList {
    type Item = &'a Error;
    type IntoIter = std::slice::Iter<'a, Error>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Longest stdout kept in [`Error::Plugin`].
pub(crate) const ERROR_STDOUT_MAX: usize = 4 * 1024;
/// Longest stderr kept in [`Error::Plugin`] and [`Error::Timeout`].
pub(crate) const ERROR_STDERR_MAX: usize = 8 * 1024;

/// Lossy UTF-8 of at most `max` bytes, with a marker when cut.
pub(crate) fn lossy_capped(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut s = String::from_utf8_lossy(&bytes[..max]).into_owned();
    s.push_str(&format!("... [{} more bytes]", bytes.len() - max));
    s
}

/// Errors collected by an operation that goes on past them (rollback,
/// validation, GC, the multi-network calls, cnid's merged answers): the
/// one implementation of "several errors become one".
///
/// ```
/// use cni_async::{Error, Errors};
/// let mut errors = Errors::new("GC of network n");
/// assert!(errors.is_empty());
/// errors.push(Error::NotAttached { network: "n".into(), container_id: "c1".into(), ifname: "eth0".into() });
/// errors.push(Error::NotAttached { network: "n".into(), container_id: "c2".into(), ifname: "eth0".into() });
/// let e = errors.into_result().unwrap_err();
/// assert_eq!(e.to_string(), "GC of network n failed with 2 error(s)");
/// ```
#[derive(Debug)]
pub struct Errors {
    operation: String,
    errors: Vec<Error>,
}

impl Errors {
    /// An empty collection for `operation` (named in [`Error::Multiple`]).
    pub fn new(operation: impl Into<String>) -> Self {
        Errors::of(operation, Vec::new())
    }

    /// These errors of `operation`, in order.
    pub(crate) fn of(operation: impl Into<String>, errors: Vec<Error>) -> Self {
        let operation = operation.into();
        Errors { operation, errors }
    }

    /// Adds one.
    pub fn push(&mut self, e: Error) {
        self.errors.push(e);
    }

    /// Adds one; an [`Error::Multiple`] adds its errors one by one.
    pub fn push_flat(&mut self, e: Error) {
        match e {
            Error::Multiple { errors, .. } => self.errors.extend(errors.0),
            e => self.errors.push(e),
        }
    }

    /// Whether none was pushed.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// `Ok` without errors; a single error as it is; several as
    /// [`Error::Multiple`].
    pub fn into_result(mut self) -> Result<(), Error> {
        match self.errors.len() {
            0 => Ok(()),
            1 => Err(self.errors.remove(0)),
            _ => Err(self.into_multiple()),
        }
    }

    /// `Ok` without errors; otherwise [`Error::Multiple`], also for one
    /// error, for calls whose documented error is always the list.
    pub fn into_result_listed(self) -> Result<(), Error> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.into_multiple())
        }
    }

    pub(crate) fn into_multiple(self) -> Error {
        Error::Multiple {
            operation: self.operation,
            errors: self.errors.into(),
        }
    }
}

impl Error {
    /// What kind of failure this is, looking through the wrappers
    /// ([`Error::Context`], [`Error::Operation`], the ADD's error of
    /// [`Error::RollbackFailed`], the first of [`Error::Multiple`]).
    ///
    /// ```
    /// use cni_async::{Error, ErrorKind};
    /// let e = Error::Context {
    ///     context: "network \"n\" (ifname eth0) DEL".into(),
    ///     source: Box::new(Error::NotAttached {
    ///         network: "n".into(),
    ///         container_id: "c1".into(),
    ///         ifname: "eth0".into(),
    ///     }),
    /// };
    /// assert_eq!(e.kind(), ErrorKind::NotAttached);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        use cni_core::Error as C;
        match self {
            Error::Core(e) => match e {
                C::Io { .. } => ErrorKind::Io,
                C::InvalidConfig { .. } | C::InvalidVersion { .. } => ErrorKind::InvalidConfig,
                C::UnsupportedVersion { .. } => ErrorKind::Unsupported,
                C::InvalidVersionReply { .. } => ErrorKind::Plugin,
                C::NoConfigs { .. } | C::NetworkNotFound { .. } => ErrorKind::NetworkNotFound,
                C::InvalidParameter { .. }
                | C::InvalidCniArgs { .. }
                | C::InvalidCapabilityArgs { .. } => ErrorKind::InvalidInput,
                C::InvalidResult { .. } | C::Conversion { .. } | C::InvalidCacheRecord { .. } => {
                    ErrorKind::InvalidData
                }
                _ => ErrorKind::Other,
            },
            Error::PluginNotFound { .. } => ErrorKind::PluginNotFound,
            Error::Spawn { .. } | Error::Io { .. } | Error::Cache { .. } => ErrorKind::Io,
            Error::Plugin { .. } | Error::PluginOutput { .. } | Error::OutputTooLarge { .. } => {
                ErrorKind::Plugin
            }
            Error::Timeout { .. } => ErrorKind::Timeout,
            #[cfg(feature = "netns")]
            Error::Netns { .. } | Error::NetnsCommand { .. } => ErrorKind::Io,
            #[cfg(feature = "netns")]
            Error::NetnsName { .. } => ErrorKind::InvalidInput,
            Error::CacheLocked { .. } => ErrorKind::Busy,
            Error::NotAttached { .. } => ErrorKind::NotAttached,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::NotReady { .. } | Error::NotReadyLimitedConnectivity { .. } => {
                ErrorKind::NotReady
            }
            Error::AttachmentCollision { .. } | Error::AlreadyAttached { .. } => {
                ErrorKind::Conflict
            }
            #[cfg(feature = "daemon")]
            Error::Hook(_) => ErrorKind::Other,
            Error::RollbackFailed { error, .. } => error.kind(),
            Error::Multiple { errors, .. } => errors.first().map_or(ErrorKind::Other, Error::kind),
            Error::Context { source, .. } | Error::Operation { source, .. } => source.kind(),
        }
    }

    /// The plugin whose run this error is about, with the verb it ran
    /// (`Some(("bridge", Command::Check))`), looking through the wrappers
    /// as [`Error::kind`] does; `None` for errors that are not a plugin's.
    pub fn failed_plugin(&self) -> Option<(&str, Command)> {
        match self {
            Error::Plugin {
                plugin_type,
                command,
                ..
            }
            | Error::Timeout {
                plugin_type,
                command,
                ..
            }
            | Error::PluginOutput {
                plugin_type,
                command,
                ..
            }
            | Error::OutputTooLarge {
                plugin_type,
                command,
                ..
            } => Some((plugin_type.as_str(), *command)),
            Error::NotReady { plugin_type, .. }
            | Error::NotReadyLimitedConnectivity { plugin_type, .. } => {
                Some((plugin_type.as_str(), Command::Status))
            }
            #[cfg(feature = "daemon")]
            Error::Hook(hook) => hook.failed_plugin(),
            Error::Context { source, .. } | Error::Operation { source, .. } => {
                source.failed_plugin()
            }
            Error::RollbackFailed { error, .. } => error.failed_plugin(),
            Error::Multiple { errors, .. } => errors.iter().find_map(Error::failed_plugin),
            _ => None,
        }
    }

    /// The CNI error code that fits this error (see the module docs).
    pub fn code(&self) -> u32 {
        match self {
            Error::Core(e) => e.code(),
            Error::PluginNotFound { .. } => code::INVALID_NETWORK_CONFIG,
            Error::Spawn { .. }
            | Error::OutputTooLarge { .. }
            | Error::Io { .. }
            | Error::Cache { .. } => code::IO_FAILURE,
            Error::Plugin { error, stdout, .. } => match error {
                Some(obj) => obj.code,
                None if !stdout.is_empty() => code::DECODING_FAILURE,
                None => code::INTERNAL,
            },
            Error::Timeout { .. } => code::TRY_AGAIN_LATER,
            #[cfg(feature = "netns")]
            Error::Netns { .. } | Error::NetnsCommand { .. } => code::IO_FAILURE,
            #[cfg(feature = "netns")]
            Error::NetnsName { .. } => code::INVALID_ENVIRONMENT_VARIABLES,
            Error::PluginOutput { .. } => code::DECODING_FAILURE,
            Error::CacheLocked { .. } => code::TRY_AGAIN_LATER,
            Error::AttachmentCollision { .. } | Error::AlreadyAttached { .. } => {
                code::INVALID_ENVIRONMENT_VARIABLES
            }
            #[cfg(feature = "daemon")]
            Error::Hook(hook) => hook.to_error_object("").code,
            Error::NotAttached { .. } => code::UNKNOWN_CONTAINER,
            Error::Unsupported { .. } => code::INCOMPATIBLE_VERSION,
            Error::NotReady { .. } => code::PLUGIN_NOT_AVAILABLE,
            Error::NotReadyLimitedConnectivity { .. } => {
                code::PLUGIN_NOT_AVAILABLE_LIMITED_CONNECTIVITY
            }
            Error::RollbackFailed { error, .. } => error.code(),
            Error::Multiple { errors, .. } => errors.first().map_or(code::INTERNAL, Error::code),
            Error::Context { source, .. } | Error::Operation { source, .. } => source.code(),
        }
    }

    /// This error as the spec's error JSON object, written in `cni_version`.
    ///
    /// A plugin's own error object passes as the plugin wrote it, as libcni
    /// does; any other error gives its chain as `msg` and the plugin's
    /// stderr (if any) as `details`; a wrapper keeps the details of the
    /// error whose code it has.
    pub fn to_error_object(&self, cni_version: &str) -> ErrorObject {
        let details = match self {
            Error::Core(e) => return e.to_error_object(cni_version),
            Error::Plugin {
                error: Some(obj), ..
            } => return ErrorObject::new(cni_version, obj.code, &obj.msg, &obj.details),
            #[cfg(feature = "daemon")]
            Error::Hook(hook) => return hook.to_error_object(cni_version),
            Error::Operation { source, .. } => return source.to_error_object(cni_version),
            Error::Plugin { stderr, .. }
            | Error::Timeout {
                stderr_so_far: stderr,
                ..
            } => stderr.trim_end().to_owned(),
            Error::Context { source: inner, .. } | Error::RollbackFailed { error: inner, .. } => {
                inner.to_error_object(cni_version).details
            }
            Error::Multiple { errors, .. } => errors
                .first()
                .map(|e| e.to_error_object(cni_version).details)
                .unwrap_or_default(),
            _ => String::new(),
        };
        ErrorObject::new(cni_version, self.code(), Chain(self).to_string(), details)
    }

    /// Whether this is a plugin that ran and failed ([`Error::Plugin`]) with
    /// this CNI code, looking through [`Error::Operation`] and
    /// [`Error::Context`].
    pub fn is_plugin_code(&self, wanted: u32) -> bool {
        matches!(self.innermost(), Error::Plugin { error: Some(obj), .. } if obj.code == wanted)
    }

    /// The error under [`Error::Operation`] and [`Error::Context`] (the
    /// error itself when it is neither), to `match` on a variant:
    /// `matches!(e.innermost(), Error::Timeout { .. })`.
    pub fn innermost(&self) -> &Error {
        match self {
            Error::Operation { source, .. } | Error::Context { source, .. } => source.innermost(),
            other => other,
        }
    }

    /// [`Error::innermost`], owned.
    pub fn into_innermost(self) -> Error {
        match self {
            Error::Operation { source, .. } | Error::Context { source, .. } => {
                source.into_innermost()
            }
            other => other,
        }
    }

    /// Whether the attachment is owed a DEL after this error
    /// ([`Error::Operation`]'s `del_owed`, or [`Error::RollbackFailed`]).
    pub fn del_owed(&self) -> bool {
        match self {
            Error::Operation {
                del_owed, source, ..
            } => *del_owed || source.del_owed(),
            Error::RollbackFailed { .. } => true,
            Error::Context { source, .. } => source.del_owed(),
            _ => false,
        }
    }

    /// A step hook's own error ([`crate::multi::StepHook`]), carried
    /// untouched through the sandbox orchestration.
    #[cfg(feature = "daemon")]
    pub fn hook(error: impl crate::multi::HookError) -> Error {
        Error::Hook(Box::new(error))
    }

    /// The step hook's own error this is, when it is one of type `E`
    /// (this error itself, not one it wraps).
    #[cfg(feature = "daemon")]
    pub fn hook_error<E: crate::multi::HookError>(&self) -> Option<&E> {
        match self {
            Error::Hook(hook) => (&**hook as &(dyn std::error::Error + 'static)).downcast_ref(),
            _ => None,
        }
    }

    /// This error after a rollback that ended as `rollback`: as it is, or
    /// [`Error::RollbackFailed`] when the rollback failed too.
    pub(crate) fn after_rollback(self, rollback: Result<(), Error>) -> Error {
        match rollback {
            Ok(()) => self,
            Err(rb) => Error::RollbackFailed {
                error: Box::new(self),
                rollback: Box::new(rb),
            },
        }
    }

    /// [`Error::NotAttached`] for `network` and `rt`'s container and
    /// interface.
    pub(crate) fn not_attached(network: &str, rt: &cni_core::RuntimeConf) -> Error {
        Error::NotAttached {
            network: network.to_owned(),
            container_id: rt.container_id.clone(),
            ifname: rt.ifname.clone(),
        }
    }

    /// `e` as an [`Error::Operation`] of `command` on `network` and
    /// `ifname`; one already stays as it is, and so does an [`Error::Core`],
    /// which names its input itself (and may come before the names were
    /// validated).
    pub(crate) fn in_operation(
        network: &str,
        ifname: &str,
        command: Command,
        del_owed: bool,
        e: Error,
    ) -> Error {
        if matches!(e, Error::Operation { .. }) || (!del_owed && matches!(e, Error::Core(_))) {
            return e;
        }
        Error::Operation {
            network: network.to_owned(),
            ifname: ifname.to_owned(),
            command,
            del_owed: del_owed || matches!(e, Error::RollbackFailed { .. }),
            source: Box::new(e),
        }
    }
}

/// The message of [`Error::Operation`].
fn fmt_operation(network: &str, ifname: &str, command: Command, del_owed: bool) -> String {
    let mut s = format!("network {network:?} (ifname {ifname}) {command}");
    if del_owed {
        s.push_str(
            " (not rolled back: what its plugins made, such as an address, \
             stays until this attachment is DELed)",
        );
    }
    s
}

fn fmt_duration(d: Duration) -> String {
    if d.as_secs() >= 10 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn fmt_stderr_suffix(stderr: &str) -> String {
    let s = stderr.trim_end();
    if s.is_empty() {
        String::new()
    } else {
        format!("; stderr: {s:?}")
    }
}

fn fmt_not_found(plugin_type: &str, dirs: &[PathBuf], skipped: &[PathBuf]) -> String {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let mut s = if dirs.is_empty() {
        format!("plugin {plugin_type:?} not found: no plugin dirs given (CNI_PATH is empty)")
    } else {
        format!("plugin {plugin_type:?} not found in {}", dirs.join(":"))
    };
    if !skipped.is_empty() {
        let files: Vec<String> = skipped.iter().map(|p| p.display().to_string()).collect();
        s.push_str(&format!(" (not executable: {})", files.join(", ")));
    }
    s
}

/// The message of [`Error::Plugin`]. The spec's rule for a non-zero exit with
/// empty stdout: the message is the stderr or, failing that, the exit status.
fn fmt_plugin(
    plugin_type: &str,
    command: Command,
    status: PluginExit,
    error: Option<&ErrorObject>,
    stdout: &str,
    stderr: &str,
) -> String {
    let head = format!("plugin {plugin_type} {command} failed");
    let stderr = stderr.trim_end();
    match error {
        Some(obj) => format!("{head} ({status}): {obj}{}", fmt_stderr_suffix(stderr)),
        None if stdout.is_empty() => {
            if stderr.is_empty() {
                format!("{head}: {status}")
            } else {
                format!("{head} ({status}): {stderr}")
            }
        }
        None => format!(
            "{head} ({status}) with undecodable output {stdout:?}{}",
            fmt_stderr_suffix(stderr)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(error: Option<ErrorObject>, stdout: &str, stderr: &str) -> Error {
        let error = error.map(Box::new);
        Error::Plugin {
            plugin_type: "bridge".into(),
            command: Command::Add,
            status: PluginExit::Code(1),
            error,
            stdout: stdout.into(),
            stderr: stderr.into(),
        }
    }

    #[test]
    fn plugin_error_messages_and_codes() {
        let e = plugin(
            Some(ErrorObject::new(
                "1.0.0",
                101,
                "no IPs left",
                "range 10.0.0.0/24",
            )),
            "",
            "oops\n",
        );
        assert_eq!(
            e.to_string(),
            "plugin bridge ADD failed (exit status 1): no IPs left; range 10.0.0.0/24 (CNI code 101); stderr: \"oops\""
        );
        assert_eq!(e.code(), 101);
        assert!(e.is_plugin_code(101));
        let obj = e.to_error_object("1.1.0");
        assert_eq!(
            obj,
            ErrorObject::new("1.1.0", 101, "no IPs left", "range 10.0.0.0/24")
        );

        let e = plugin(None, "", "cannot open file\n");
        assert_eq!(
            e.to_string(),
            "plugin bridge ADD failed (exit status 1): cannot open file"
        );
        assert_eq!(e.code(), code::INTERNAL);
        assert_eq!(e.to_error_object("1.1.0").details, "cannot open file");

        let e = plugin(None, "", "");
        assert_eq!(e.to_string(), "plugin bridge ADD failed: exit status 1");

        let e = plugin(None, "garbage", "");
        assert_eq!(
            e.to_string(),
            "plugin bridge ADD failed (exit status 1) with undecodable output \"garbage\""
        );
        assert_eq!(e.code(), code::DECODING_FAILURE);
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(
            PluginExit::Signal(9).to_string(),
            "killed by signal 9 (SIGKILL)"
        );
        assert_eq!(PluginExit::Code(2).to_string(), "exit status 2");
    }

    #[test]
    fn timeout_and_core_codes() {
        let e = Error::Timeout {
            plugin_type: "slow".into(),
            command: Command::Del,
            elapsed: Duration::from_millis(1500),
            timeout: Duration::from_millis(1500),
            stderr_so_far: "waiting\n".into(),
        };
        assert_eq!(e.code(), 11);
        assert_eq!(
            e.to_string(),
            "plugin slow DEL timed out after 1500ms (deadline 1500ms: what was left of the \
             call's timeout when it started); stderr: \"waiting\""
        );
        let core: Error = cni_core::validate::plugin_type("a/b").unwrap_err().into();
        assert_eq!(core.code(), 7);
    }

    #[test]
    fn not_found_lists_dirs_and_skipped() {
        let e = Error::PluginNotFound {
            plugin_type: "bridge".into(),
            dirs: vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()],
            skipped: vec!["/opt/cni/bin/bridge".into()],
        };
        assert_eq!(
            e.to_string(),
            "plugin \"bridge\" not found in /opt/cni/bin:/usr/lib/cni (not executable: /opt/cni/bin/bridge)"
        );
        assert_eq!(e.code(), 7);
    }

    #[test]
    fn kind_looks_through_wrappers() {
        let timeout = || Error::Timeout {
            plugin_type: "slow".into(),
            command: Command::Add,
            elapsed: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            stderr_so_far: String::new(),
        };
        let not_attached = || Error::NotAttached {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
        };
        let wrapped = Error::Context {
            context: "network \"n\" (ifname eth0) ADD".into(),
            source: Box::new(Error::RollbackFailed {
                error: Box::new(timeout()),
                rollback: Box::new(not_attached()),
            }),
        };
        assert_eq!(wrapped.kind(), ErrorKind::Timeout);
        let multiple = Error::Multiple {
            operation: "remove".into(),
            errors: vec![not_attached(), timeout()].into(),
        };
        assert_eq!(multiple.kind(), ErrorKind::NotAttached);
        let core: Error = cni_core::validate::container_id("../x").unwrap_err().into();
        assert_eq!(core.kind(), ErrorKind::InvalidInput);
        assert_eq!(plugin(None, "", "").kind(), ErrorKind::Plugin);
        assert_eq!(
            Error::Multiple {
                operation: "x".into(),
                errors: vec![].into()
            }
            .kind(),
            ErrorKind::Other
        );
    }

    #[test]
    fn several_errors_become_one() {
        let e = |n: u32| {
            Error::Core(cni_core::Error::InvalidCniArgs {
                pair: format!("p{n}"),
                reason: "r".into(),
            })
        };
        assert!(Errors::new("op").into_result().is_ok());
        assert!(Errors::new("op").into_result_listed().is_ok());
        let mut one = Errors::new("op");
        one.push(e(1));
        assert!(matches!(one.into_result(), Err(Error::Core(_))));
        let mut one = Errors::new("op");
        one.push(e(1));
        assert!(
            matches!(one.into_result_listed(), Err(Error::Multiple { errors, .. }) if errors.len() == 1)
        );
        let mut two = Errors::new("op");
        two.push(e(1));
        two.push(e(2));
        assert!(
            matches!(two.into_result(), Err(Error::Multiple { operation, errors }) if operation == "op" && errors.len() == 2)
        );
    }

    #[test]
    fn capped_text() {
        assert_eq!(lossy_capped(b"abc", 3), "abc");
        assert_eq!(lossy_capped(b"abcdef", 3), "abc... [3 more bytes]");
    }
}
