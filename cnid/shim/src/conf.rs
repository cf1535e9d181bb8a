//! The shim's own configuration: the plugin object the runtime writes to
//! its stdin, and durations as the shim's config and flags spell them.

use std::path::PathBuf;
use std::time::Duration;

use cni_core::error::code;
use cni_core::stdin::{GcAttachment, LEGACY_ATTACHMENTS_KEY, VALID_ATTACHMENTS_KEY};
use cni_core::{CapabilityArgs, ErrorObject, Version};
use serde_json::{Map, Value};

/// The socket cnid listens on by default (cnid's own default).
pub const DEFAULT_SOCKET: &str = "/run/cnid/cnid.sock";

/// The deadline passed to cnid when the config has no `timeout`: below the
/// kubelet's 2-minute runtime request timeout, equal to cnid's own default
/// for ADD, DEL and CHECK.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The longest `timeout` accepted (cnid caps deadlines at its
/// `--max-timeout` in any case).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// How much longer than the deadline the shim waits for cnid's answer: a
/// failed or timed-out ADD is rolled back, with a fresh deadline, before
/// cnid answers.
pub const ANSWER_GRACE: Duration = Duration::from_secs(30);

/// The shim's plugin configuration (its stdin), with the defaults applied.
///
/// ```json
/// {"cniVersion": "1.0.0", "name": "podnet", "type": "cnid-shim",
///  "socket": "/run/cnid/cnid.sock", "network": "podnet", "timeout": "60s",
///  "runtimeConfig": {"portMappings": [...]}}
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ShimConf {
    /// `cniVersion`: the version the runtime speaks; results and errors are
    /// written in it.
    pub version: Version,
    /// `name`: the runtime's network name.
    pub name: String,
    /// `network`: cnid's network to run (default: `name`).
    pub network: String,
    /// `socket`: cnid's socket (default [`DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// `timeout`: the deadline passed to cnid (default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// `runtimeConfig`: the capability arguments the runtime passed.
    pub capability_args: CapabilityArgs,
    /// Whether the config has a `prevResult`.
    pub has_prev_result: bool,
    /// GC: `cni.dev/valid-attachments` (or the older `cni.dev/attachments`),
    /// when present.
    pub valid_attachments: Option<Vec<GcAttachment>>,
}

/// A configuration error: code 7 (invalid network config) naming the field.
fn invalid(version: &str, field: &str, what: impl Into<String>) -> ErrorObject {
    ErrorObject::new(
        version,
        code::INVALID_NETWORK_CONFIG,
        format!(
            "cnid-shim: invalid \"{field}\" in the network configuration: {}",
            what.into()
        ),
        "",
    )
}

impl ShimConf {
    /// Parses the plugin configuration from stdin. Errors are the CNI error
    /// object to print (code 6 for bytes that are not a JSON object, 1 for a
    /// version the shim does not speak, 7 for a bad field).
    pub fn parse(stdin: &[u8]) -> Result<ShimConf, ErrorObject> {
        let current = Version::CURRENT.to_string();
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            ErrorObject::new(
                &current,
                code::DECODING_FAILURE,
                format!("cnid-shim: the network configuration on stdin is not valid JSON: {e}"),
                "",
            )
        })?;
        let Value::Object(obj) = value else {
            return Err(ErrorObject::new(
                &current,
                code::DECODING_FAILURE,
                "cnid-shim: the network configuration on stdin is not a JSON object",
                "",
            ));
        };
        let version_text = match obj.get("cniVersion") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(invalid(
                    &current,
                    "cniVersion",
                    format!("{other} is not a string"),
                ));
            }
        };
        let version = match Version::parse(&version_text) {
            Ok(v) if v.is_supported() => v,
            _ => {
                return Err(ErrorObject::new(
                    &current,
                    code::INCOMPATIBLE_VERSION,
                    format!("cnid-shim: unsupported CNI version {version_text:?}"),
                    format!("supported: {}", supported_list()),
                ));
            }
        };
        let v = version.to_string();
        let string = |field: &str| -> Result<Option<String>, ErrorObject> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if s.is_empty() => Err(invalid(&v, field, "empty")),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(invalid(&v, field, format!("{other} is not a string"))),
            }
        };
        let name = string("name")?.ok_or_else(|| invalid(&v, "name", "missing"))?;
        let network = string("network")?.unwrap_or_else(|| name.clone());
        let socket = PathBuf::from(string("socket")?.unwrap_or_else(|| DEFAULT_SOCKET.to_owned()));
        if !socket.is_absolute() {
            return Err(invalid(
                &v,
                "socket",
                format!("{:?} is not an absolute path", socket.display().to_string()),
            ));
        }
        let timeout = match obj.get("timeout") {
            None | Some(Value::Null) => DEFAULT_TIMEOUT,
            Some(t) => parse_timeout(t).map_err(|e| invalid(&v, "timeout", e))?,
        };
        let capability_args = match obj.get("runtimeConfig") {
            None | Some(Value::Null) => CapabilityArgs::new(),
            Some(Value::Object(m)) => CapabilityArgs(m.clone()),
            Some(other) => {
                return Err(invalid(
                    &v,
                    "runtimeConfig",
                    format!("{other} is not an object"),
                ));
            }
        };
        let valid_attachments = attachments(&obj, &v)?;
        Ok(ShimConf {
            version,
            name,
            network,
            socket,
            timeout,
            capability_args,
            has_prev_result: obj.get("prevResult").is_some_and(|p| !p.is_null()),
            valid_attachments,
        })
    }

    /// The time to wait for cnid's answer: the deadline plus
    /// [`ANSWER_GRACE`] for a rollback.
    pub fn answer_timeout(&self) -> Duration {
        self.timeout + ANSWER_GRACE
    }
}

fn attachments(
    obj: &Map<String, Value>,
    v: &str,
) -> Result<Option<Vec<GcAttachment>>, ErrorObject> {
    for key in [VALID_ATTACHMENTS_KEY, LEGACY_ATTACHMENTS_KEY] {
        match obj.get(key) {
            None | Some(Value::Null) => continue,
            Some(list) => {
                return serde_json::from_value(list.clone()).map(Some).map_err(|e| {
                    invalid(
                        v,
                        key,
                        format!("not a list of {{\"containerID\", \"ifname\"}}: {e}"),
                    )
                });
            }
        }
    }
    Ok(None)
}

/// The versions the shim speaks, for messages.
fn supported_list() -> String {
    cni_core::version::SUPPORTED_VERSIONS
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A `timeout`: a JSON number of seconds, or a string `N`, `Nms`, `Ns`,
/// `Nm` (whole numbers); more than zero, at most [`MAX_TIMEOUT`].
pub fn parse_timeout(v: &Value) -> Result<Duration, String> {
    let d = match v {
        Value::Number(n) => {
            let secs = n
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| format!("{n} is not a number of seconds"))?;
            if secs > MAX_TIMEOUT.as_secs_f64() {
                return Err(format!("{n} is longer than {}s", MAX_TIMEOUT.as_secs()));
            }
            Duration::from_secs_f64(secs)
        }
        Value::String(s) => parse_duration(s)?,
        other => {
            return Err(format!(
                "{other} is neither a number of seconds nor a string such as \"30s\""
            ));
        }
    };
    if d.is_zero() {
        return Err(format!("{v} is zero"));
    }
    if d > MAX_TIMEOUT {
        return Err(format!("{v} is longer than {}s", MAX_TIMEOUT.as_secs()));
    }
    Ok(d)
}

/// `N` (seconds), `Nms`, `Ns` or `Nm`, whole numbers.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as \"500ms\", \"30s\" or \"2m\""))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{s:?} has an unknown unit (ms, s or m)")),
    };
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ShimConf, ErrorObject> {
        ShimConf::parse(&serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn defaults_and_fields() {
        let c =
            parse(json!({"cniVersion": "0.4.0", "name": "podnet", "type": "cnid-shim"})).unwrap();
        assert_eq!(c.version, Version::V0_4_0);
        assert_eq!((c.name.as_str(), c.network.as_str()), ("podnet", "podnet"));
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert!(c.capability_args.is_empty() && !c.has_prev_result);
        assert_eq!(c.valid_attachments, None);

        let c = parse(json!({
            "cniVersion": "1.1.0", "name": "podnet", "type": "cnid-shim",
            "network": "real", "socket": "/x/cnid.sock", "timeout": "1500ms",
            "runtimeConfig": {"portMappings": [{"hostPort": 80}]},
            "prevResult": {"cniVersion": "1.1.0"},
            "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}],
            "unknown": true
        }))
        .unwrap();
        assert_eq!(c.network, "real");
        assert_eq!(c.socket, PathBuf::from("/x/cnid.sock"));
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(c.answer_timeout(), Duration::from_millis(31_500));
        assert_eq!(
            c.capability_args.get("portMappings"),
            Some(&json!([{"hostPort": 80}]))
        );
        assert!(c.has_prev_result);
        assert_eq!(c.valid_attachments.unwrap()[0].container_id, "c1");
        // The older GC key.
        let c =
            parse(json!({"cniVersion": "1.1.0", "name": "n", "cni.dev/attachments": []})).unwrap();
        assert_eq!(c.valid_attachments, Some(vec![]));
    }

    #[test]
    fn bad_configs_name_the_field() {
        for (conf, code, want) in [
            (json!({"cniVersion": "1.0.0"}), 7, "\"name\""),
            (json!({"cniVersion": "1.0.0", "name": ""}), 7, "\"name\""),
            (
                json!({"cniVersion": "9.0.0", "name": "n"}),
                1,
                "unsupported CNI version \"9.0.0\"",
            ),
            (json!({"cniVersion": 1, "name": "n"}), 7, "\"cniVersion\""),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "socket": "run/x.sock"}),
                7,
                "\"socket\"",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "socket": 5}),
                7,
                "\"socket\"",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "timeout": "0s"}),
                7,
                "\"timeout\"",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "timeout": "5h"}),
                7,
                "unknown unit",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "timeout": -1}),
                7,
                "\"timeout\"",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "timeout": 99999}),
                7,
                "longer than",
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "runtimeConfig": []}),
                7,
                "\"runtimeConfig\"",
            ),
            (
                json!({"cniVersion": "1.1.0", "name": "n", "cni.dev/valid-attachments": [{"x": 1}]}),
                7,
                "cni.dev/valid-attachments",
            ),
            (json!([1]), 6, "not a JSON object"),
        ] {
            let e = parse(conf.clone()).unwrap_err();
            assert_eq!(e.code, code, "{conf}: {e:?}");
            assert!(e.msg.contains(want), "{conf}: {:?} lacks {want:?}", e.msg);
        }
        let e = ShimConf::parse(b"{not json").unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("not valid JSON"), "{e:?}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(45));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(
            parse_timeout(&json!(2.5)).unwrap(),
            Duration::from_millis(2500)
        );
    }
}
