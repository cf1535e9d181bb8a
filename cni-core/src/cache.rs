//! The result cache record, byte-compatible with libcni's `cniCacheV1`.
//!
//! One file per attachment at `<cacheDir>/results/<network>-<containerID>-<ifname>`
//! (default cache dir `/var/lib/cni`), holding:
//!
//! ```json
//! {"kind":"cniCacheV1","containerId":"c1","config":"<base64 of the list bytes>",
//!  "ifName":"eth0","networkName":"net1","netns":"/run/netns/c1",
//!  "cniArgs":[["K","V"]],"capabilityArgs":{...},"result":{...}}
//! ```
//!
//! `netns`, `cniArgs`, `capabilityArgs` and `result` are omitted when empty,
//! as Go's `omitempty` does.
//!
//! Records written by this workspace also carry what the namespace was at
//! ADD ([`NetnsIdentity`], key [`IDENTITY_KEY`]):
//!
//! ```json
//! "netnsIdentity":{"bootId":"0b6c…","dev":4,"ino":4026532290,
//!                  "handle":"241:9e17000000000000000000404e0100f0","pidStartTime":91234}
//! ```
//!
//! a key libcni's `cachedInfo` does not have, which Go's `encoding/json`
//! ignores: libcni reads and DELs such records as its own. `dev`/`ino` are
//! omitted when the netns path could not be looked at, `pidStartTime` when
//! it is not a `/proc/PID/...` path, `handle` (the nsfs file handle: its
//! type, a colon, its bytes in hex) where the kernel has none. A malformed value is read as no
//! identity (the record stays usable; the stale-attachment rules for
//! records without one apply). A file that is a bare result (what libcni wrote
//! before `cniCacheV1`) is read as [`CacheEntry::LegacyResult`].
//!
//! File names are ambiguous when names contain `-` (`a-b` + `c` and `a` +
//! `b-c` give the same name), so a record read for an attachment must be
//! checked with [`CacheRecord::check_matches`] before it is trusted.
//!
//! This module does no I/O except in [`CacheEntry::read`]; the atomic
//! writes, locks and the moving aside of corrupt files live in `cni-async`.
//!
//! ```
//! use cni_core::cache::{CacheRecord, CacheEntry};
//! use cni_core::args::RuntimeConf;
//!
//! let rt = RuntimeConf::new("c1", "/run/netns/c1", "eth0");
//! let rec = CacheRecord::new("net1", &rt, br#"{"name":"net1"}"#.to_vec(), None);
//! let bytes = rec.encode();
//! match CacheEntry::decode(&bytes, "test").unwrap() {
//!     CacheEntry::Record(back) => {
//!         back.check_matches("net1", "c1", "eth0").unwrap();
//!         assert_eq!(back.config, br#"{"name":"net1"}"#);
//!     }
//!     CacheEntry::LegacyResult(_) => unreachable!(),
//! }
//! assert_eq!(cni_core::cache::file_name("net1", "c1", "eth0").unwrap(), "net1-c1-eth0");
//! ```

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value};

use crate::args::{CapabilityArgs, CniArgs, RuntimeConf};
use crate::error::Error;
use crate::validate;

/// The `kind` of current cache records.
pub const KIND_V1: &str = "cniCacheV1";
/// The default cache dir.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
/// The subdirectory of the cache dir that holds result records.
pub const RESULTS_DIR: &str = "results";

/// The file name of an attachment's record: `<network>-<containerID>-<ifname>`.
///
/// All three parts are validated, so the name never contains `/` and never
/// is `.` or `..`: the path cannot leave the results dir.
pub fn file_name(network: &str, container_id: &str, ifname: &str) -> Result<String, Error> {
    validate::network_name(network)?;
    validate::container_id(container_id)?;
    validate::interface_name(ifname)?;
    Ok(format!("{network}-{container_id}-{ifname}"))
}

/// `<cache_dir>/results`.
pub fn results_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join(RESULTS_DIR)
}

/// `<cache_dir>/results/<network>-<containerID>-<ifname>`.
pub fn file_path(
    cache_dir: &Path,
    network: &str,
    container_id: &str,
    ifname: &str,
) -> Result<PathBuf, Error> {
    Ok(results_dir(cache_dir).join(file_name(network, container_id, ifname)?))
}

/// The key of [`NetnsIdentity`] in a record.
pub const IDENTITY_KEY: &str = "netnsIdentity";

/// What an attachment's network namespace was at ADD: enough to prove
/// later that it is gone (another boot; or not at its path and held by
/// nothing) rather than infer it from a path and a clock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NetnsIdentity {
    /// `bootId`: `/proc/sys/kernel/random/boot_id` at ADD.
    pub boot_id: String,
    /// `dev` and `ino`: the nsfs device and inode of the netns path
    /// (`stat`, symbolic links followed) at ADD; `None` when it could not
    /// be looked at or was no namespace.
    pub ns: Option<(u64, u64)>,
    /// `handle`: the namespace's nsfs file handle (`name_to_handle_at`,
    /// Linux 6.18+) as its type and bytes, written `TYPE:HEX`: it reopens
    /// the namespace while anything holds it.
    pub handle: Option<(i32, Vec<u8>)>,
    /// `pidStartTime`: for a `/proc/PID/ns/net` (or
    /// `/proc/PID/task/TID/ns/net`) path, the process's start time (field
    /// 22 of `/proc/PID/stat`, clock ticks since boot) at ADD: a later
    /// process with the same PID starts at another time.
    pub pid_start_time: Option<u64>,
}

impl NetnsIdentity {
    /// The identity as the JSON object stored under [`IDENTITY_KEY`].
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("bootId".into(), self.boot_id.clone().into());
        if let Some((dev, ino)) = self.ns {
            m.insert("dev".into(), dev.into());
            m.insert("ino".into(), ino.into());
        }
        if let Some((kind, bytes)) = &self.handle {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            m.insert("handle".into(), format!("{kind}:{hex}").into());
        }
        if let Some(t) = self.pid_start_time {
            m.insert("pidStartTime".into(), t.into());
        }
        Value::Object(m)
    }

    /// Reads the object stored under [`IDENTITY_KEY`]; `None` when it is
    /// not one this module writes (no `bootId` string, `dev` without
    /// `ino`, a number that is not an unsigned integer).
    pub fn from_value(v: &Value) -> Option<NetnsIdentity> {
        let m = v.as_object()?;
        let boot_id = m.get("bootId")?.as_str()?.to_owned();
        if boot_id.is_empty() {
            return None;
        }
        let num = |k: &str| -> Result<Option<u64>, ()> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or(()),
            }
        };
        let ns = match (num("dev").ok()?, num("ino").ok()?) {
            (Some(d), Some(i)) => Some((d, i)),
            (None, None) => None,
            _ => return None,
        };
        let handle = match m.get("handle") {
            None | Some(Value::Null) => None,
            Some(v) => Some(parse_handle(v.as_str()?)?),
        };
        Some(NetnsIdentity {
            boot_id,
            ns,
            handle,
            pid_start_time: num("pidStartTime").ok()?,
        })
    }
}

/// `TYPE:HEX` (a file handle) as its type and bytes.
fn parse_handle(s: &str) -> Option<(i32, Vec<u8>)> {
    let (kind, hex) = s.split_once(':')?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 256 {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((kind.parse().ok()?, bytes))
}

/// The PID of a `/proc/PID/ns/net` or `/proc/PID/task/TID/ns/net` path
/// (the thread's id for the latter: its start time is the thread's), or
/// `None` for any other path (`/proc/self/...` included: "self" is
/// whoever looks).
pub fn proc_netns_pid(netns: &str) -> Option<u32> {
    let rest = netns.strip_prefix("/proc/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    match parts.as_slice() {
        [pid, "ns", "net"] => num(pid),
        [pid, "task", tid, "ns", "net"] => num(pid).and(num(tid)),
        _ => None,
    }
}

/// A `cniCacheV1` record.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheRecord {
    /// `containerId`.
    pub container_id: String,
    /// `config`: the network configuration list's bytes (base64 on disk).
    pub config: Vec<u8>,
    /// `ifName`.
    pub if_name: String,
    /// `networkName`.
    pub network_name: String,
    /// `netns` (empty = omitted).
    pub netns: String,
    /// `cniArgs`, as `[[k, v], ...]`.
    pub cni_args: CniArgs,
    /// `capabilityArgs`.
    pub capability_args: CapabilityArgs,
    /// `result`: the final ADD result as JSON, in the list's version.
    pub result: Option<Value>,
    /// [`IDENTITY_KEY`]: the namespace's identity at ADD (`None` in
    /// records of other writers and older ones).
    pub identity: Option<NetnsIdentity>,
}

impl CacheRecord {
    /// A record for an attachment of `network` described by `rt`.
    pub fn new(network: &str, rt: &RuntimeConf, config: Vec<u8>, result: Option<Value>) -> Self {
        CacheRecord {
            container_id: rt.container_id.clone(),
            config,
            if_name: rt.ifname.clone(),
            network_name: network.to_owned(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result,
            identity: None,
        }
    }

    /// The record with `identity` ([`IDENTITY_KEY`]).
    pub fn with_identity(mut self, identity: Option<NetnsIdentity>) -> Self {
        self.identity = identity;
        self
    }

    /// The runtime parameters stored in the record.
    pub fn runtime_conf(&self) -> RuntimeConf {
        RuntimeConf {
            container_id: self.container_id.clone(),
            netns: self.netns.clone(),
            ifname: self.if_name.clone(),
            args: self.cni_args.clone(),
            capability_args: self.capability_args.clone(),
        }
    }

    /// The record as a JSON object, with libcni's key order.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), KIND_V1.into());
        m.insert("containerId".into(), self.container_id.clone().into());
        m.insert("config".into(), BASE64.encode(&self.config).into());
        m.insert("ifName".into(), self.if_name.clone().into());
        m.insert("networkName".into(), self.network_name.clone().into());
        if !self.netns.is_empty() {
            m.insert("netns".into(), self.netns.clone().into());
        }
        if !self.cni_args.is_empty() {
            let pairs = self
                .cni_args
                .pairs()
                .iter()
                .map(|(k, v)| Value::Array(vec![k.clone().into(), v.clone().into()]))
                .collect();
            m.insert("cniArgs".into(), Value::Array(pairs));
        }
        if !self.capability_args.is_empty() {
            m.insert(
                "capabilityArgs".into(),
                Value::Object(self.capability_args.as_map().clone()),
            );
        }
        if let Some(r) = &self.result {
            m.insert("result".into(), r.clone());
        }
        if let Some(id) = &self.identity {
            m.insert(IDENTITY_KEY.into(), id.to_value());
        }
        Value::Object(m)
    }

    /// The bytes to write to the cache file.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_value()).expect("a JSON value always serializes")
    }

    /// Checks that the record belongs to the attachment asked for. File names
    /// are ambiguous when names contain `-`; the fields inside are not.
    pub fn check_matches(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Result<(), Error> {
        for (field, want, got) in [
            ("networkName", network, self.network_name.as_str()),
            ("containerId", container_id, self.container_id.as_str()),
            ("ifName", ifname, self.if_name.as_str()),
        ] {
            if want != got {
                return Err(Error::InvalidCacheRecord {
                    origin: format!("for {network}/{container_id}/{ifname}"),
                    reason: format!("field '{field}' is {got:?}, expected {want:?}"),
                });
            }
        }
        Ok(())
    }
}

/// What a cache file holds.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // read once per operation; boxing buys nothing
pub enum CacheEntry {
    /// A `cniCacheV1` record.
    Record(CacheRecord),
    /// A bare result written by an old libcni (no attachment metadata).
    LegacyResult(Value),
}

impl CacheEntry {
    /// Decodes a cache file's bytes. `origin` names the file in errors.
    ///
    /// A JSON object with `kind` = `cniCacheV1` must be a well-formed record;
    /// an object without `kind` is taken as a legacy bare result; anything
    /// else is an error.
    pub fn decode(bytes: &[u8], origin: &str) -> Result<CacheEntry, Error> {
        let bad = |reason: String| Error::InvalidCacheRecord {
            origin: origin.to_owned(),
            reason,
        };
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Value::Object(mut m) = value else {
            return Err(bad("expected a JSON object".into()));
        };
        match m.get("kind") {
            None => return Ok(CacheEntry::LegacyResult(Value::Object(m))),
            Some(Value::String(k)) if k == KIND_V1 => {}
            Some(other) => return Err(bad(format!("unknown kind {other}"))),
        }
        let mut string = |key: &str, required: bool| -> Result<String, Error> {
            match m.shift_remove(key) {
                Some(Value::String(s)) => Ok(s),
                None | Some(Value::Null) if !required => Ok(String::new()),
                None | Some(Value::Null) => Err(bad(format!("missing field '{key}'"))),
                Some(_) => Err(bad(format!("field '{key}' must be a string"))),
            }
        };
        let container_id = string("containerId", true)?;
        let config_b64 = string("config", false)?;
        let if_name = string("ifName", true)?;
        let network_name = string("networkName", true)?;
        let netns = string("netns", false)?;
        let config = BASE64
            .decode(config_b64.as_bytes())
            .map_err(|e| bad(format!("field 'config' is not base64: {e}")))?;
        let cni_args = match m.shift_remove("cniArgs") {
            None | Some(Value::Null) => CniArgs::new(),
            Some(Value::Array(items)) => {
                let mut pairs = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        Value::Array(kv) if kv.len() == 2 => match (&kv[0], &kv[1]) {
                            (Value::String(k), Value::String(v)) => {
                                pairs.push((k.clone(), v.clone()))
                            }
                            _ => {
                                return Err(bad(format!(
                                    "field 'cniArgs[{i}]' must hold two strings"
                                )));
                            }
                        },
                        _ => {
                            return Err(bad(format!(
                                "field 'cniArgs[{i}]' must be a [key, value] pair"
                            )));
                        }
                    }
                }
                CniArgs(pairs)
            }
            Some(_) => return Err(bad("field 'cniArgs' must be an array".into())),
        };
        let capability_args = match m.shift_remove("capabilityArgs") {
            None | Some(Value::Null) => CapabilityArgs::new(),
            Some(Value::Object(o)) => CapabilityArgs(o),
            Some(_) => return Err(bad("field 'capabilityArgs' must be an object".into())),
        };
        let result = match m.shift_remove("result") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v),
            Some(_) => return Err(bad("field 'result' must be an object".into())),
        };
        let identity = m
            .shift_remove(IDENTITY_KEY)
            .as_ref()
            .and_then(NetnsIdentity::from_value);
        Ok(CacheEntry::Record(CacheRecord {
            identity,
            container_id,
            config,
            if_name,
            network_name,
            netns,
            cni_args,
            capability_args,
            result,
        }))
    }

    /// Reads and decodes a cache file; `Ok(None)` when it does not exist.
    pub fn read(path: &Path) -> Result<Option<CacheEntry>, Error> {
        match std::fs::read(path) {
            Ok(bytes) => CacheEntry::decode(&bytes, &path.display().to_string()).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// The result this entry holds, if any.
    pub fn result(&self) -> Option<&Value> {
        match self {
            CacheEntry::Record(r) => r.result.as_ref(),
            CacheEntry::LegacyResult(v) => Some(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_validated() {
        assert_eq!(file_name("n", "c", "eth0").unwrap(), "n-c-eth0");
        assert!(file_name("../n", "c", "eth0").is_err());
        assert!(file_name("n", "../../etc/passwd", "eth0").is_err());
        assert!(file_name("n", "c", "..").is_err());
        assert!(file_name("n", "c", "a/b").is_err());
        assert_eq!(
            file_path(Path::new("/var/lib/cni"), "n", "c", "eth0").unwrap(),
            Path::new("/var/lib/cni/results/n-c-eth0")
        );
    }

    #[test]
    fn mismatched_fields_are_refused() {
        // "a-b" + "c" and "a" + "b-c" share the file name "a-b-c-eth0".
        let rt = RuntimeConf::new("b-c", "", "eth0");
        let rec = CacheRecord::new("a", &rt, Vec::new(), None);
        assert_eq!(
            file_name("a", "b-c", "eth0").unwrap(),
            file_name("a-b", "c", "eth0").unwrap()
        );
        rec.check_matches("a", "b-c", "eth0").unwrap();
        let e = rec.check_matches("a-b", "c", "eth0").unwrap_err();
        assert!(e.to_string().contains("networkName"), "{e}");
    }

    #[test]
    fn identity_round_trips_and_bad_ones_read_as_none() {
        let rt = RuntimeConf::new("c", "/proc/42/ns/net", "eth0");
        let id = NetnsIdentity {
            boot_id: "b1".into(),
            ns: Some((4, 4026532290)),
            handle: Some((241, vec![0x9e, 0x17, 0, 0xf0])),
            pid_start_time: Some(91234),
        };
        let rec = CacheRecord::new("n", &rt, Vec::new(), None).with_identity(Some(id.clone()));
        let bytes = rec.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.ends_with(
                r#""netnsIdentity":{"bootId":"b1","dev":4,"ino":4026532290,"handle":"241:9e1700f0","pidStartTime":91234}}"#
            ),
            "{text}"
        );
        let CacheEntry::Record(back) = CacheEntry::decode(&bytes, "x").unwrap() else {
            panic!()
        };
        assert_eq!(back.identity, Some(id));
        let only_boot = NetnsIdentity {
            boot_id: "b1".into(),
            ..Default::default()
        };
        assert_eq!(
            NetnsIdentity::from_value(&only_boot.to_value()),
            Some(only_boot)
        );
        for bad in [
            serde_json::json!("b1"),
            serde_json::json!({"bootId": ""}),
            serde_json::json!({"bootId": "b", "dev": 4}),
            serde_json::json!({"bootId": "b", "dev": -4, "ino": 1}),
            serde_json::json!({"bootId": "b", "pidStartTime": "1"}),
            serde_json::json!({"bootId": "b", "handle": "241:9e1"}),
            serde_json::json!({"bootId": "b", "handle": "x:9e"}),
            serde_json::json!({"bootId": "b", "handle": "241:zz"}),
        ] {
            assert_eq!(NetnsIdentity::from_value(&bad), None, "{bad}");
            let rec = serde_json::json!({"kind":"cniCacheV1","containerId":"c","ifName":"e",
                "networkName":"n", IDENTITY_KEY: bad});
            let CacheEntry::Record(r) =
                CacheEntry::decode(rec.to_string().as_bytes(), "x").unwrap()
            else {
                panic!()
            };
            assert_eq!(r.identity, None);
        }
    }

    #[test]
    fn proc_netns_pids() {
        assert_eq!(proc_netns_pid("/proc/42/ns/net"), Some(42));
        assert_eq!(proc_netns_pid("/proc/42/task/43/ns/net"), Some(43));
        assert_eq!(proc_netns_pid("/proc/self/ns/net"), None);
        assert_eq!(proc_netns_pid("/proc/42/ns/mnt"), None);
        assert_eq!(proc_netns_pid("/run/netns/x"), None);
        assert_eq!(proc_netns_pid("/proc//ns/net"), None);
    }

    #[test]
    fn decode_errors() {
        for (bytes, want) in [
            (&b"{"[..], "not valid JSON"),
            (b"[]", "expected a JSON object"),
            (br#"{"kind":"cniCacheV2"}"#, "unknown kind"),
            (br#"{"kind":"cniCacheV1","ifName":"e","networkName":"n"}"#, "missing field 'containerId'"),
            (br#"{"kind":"cniCacheV1","containerId":"c","ifName":"e","networkName":"n","config":"!!"}"#, "base64"),
            (br#"{"kind":"cniCacheV1","containerId":"c","ifName":"e","networkName":"n","cniArgs":[["a"]]}"#, "cniArgs[0]"),
            (br#"{"kind":"cniCacheV1","containerId":"c","ifName":"e","networkName":"n","result":[]}"#, "'result'"),
        ] {
            let e = CacheEntry::decode(bytes, "/c/results/x").unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
            assert!(e.to_string().contains("/c/results/x"), "{e}");
        }
    }
}
