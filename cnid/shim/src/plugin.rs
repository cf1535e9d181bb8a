//! `cnid-shim` as a CNI plugin: one verb from the runtime, forwarded to
//! cnid, the answer turned back into what a plugin prints.
//!
//! | verb | request to cnid | printed on success |
//! |---|---|---|
//! | ADD | `POST /v1/networks/{network}/add` | the result, converted to the shim's `cniVersion` |
//! | CHECK, DEL | `POST .../check`, `.../del` | nothing |
//! | STATUS | `POST .../status` | nothing |
//! | GC | `POST .../gc` with the runtime's valid attachments | nothing |
//! | VERSION | none: answered by the shim | the versions it speaks |
//!
//! ADD, CHECK and DEL carry `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`,
//! `CNI_ARGS` and the `runtimeConfig` of the shim's config as the
//! attachment's capability arguments. `CNI_PATH` is not used: cnid runs
//! the plugins of its own plugin dirs.
//!
//! Errors are the CNI error object cnid answered with (code, msg, details
//! kept; the plugin that failed named in the message when cnid says which),
//! written in the shim's version; an error object is an error whatever the
//! HTTP status, a 2xx too (as a plugin's output, `docs/decisions.md` D18).
//! The shim's own errors:
//!
//! | condition | code |
//! |---|---|
//! | cnid not reachable, closed the connection before answering, no answer in time | 11 (try again later), naming the socket; STATUS: 50 |
//! | an answer that is not HTTP, or a body that is neither the expected JSON nor a CNI error object (an ADD answer without a result's keys: `{}`) | 999, saying what was wrong |
//! | stdin not JSON | 6 |
//! | a bad field in the shim's config, a `prevResult` on ADD, GC without valid attachments | 7, naming the field |
//! | a `cniVersion` the shim does not speak | 1 |
//! | `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_IFNAME` or (ADD, CHECK) `CNI_NETNS` missing | 4 |
//!
//! # A retried ADD
//!
//! A runtime that kills the shim (its deadline passed) does not stop the ADD:
//! cnid finishes it, or rolls it back, whatever happens to its client. The
//! runtime then DELs (containerd and CRI-O do after a failed ADD), and that
//! DEL queues behind the ADD in cnid and undoes it. If the runtime instead
//! retries the ADD, the retry queues behind the first one too; when that
//! one has succeeded, cnid refuses a second ADD of the attachment (409,
//! code 909). The shim then looks the attachment up and, when it was made
//! with the same parameters (netns, `CNI_ARGS` as a set of pairs, capability
//! arguments), returns its cached result as the retry's: the runtime gets
//! the attachment it asked for, exactly once. With other parameters the
//! 409 stands and the runtime must DEL first, as the spec requires.

use std::time::Duration;

use cni_core::error::code;
use cni_core::result::CniResult;
use cni_core::version::PluginInfo;
use cni_core::{Command, ErrorObject, Version};
use serde::Serialize;

use super::conf::ShimConf;
use super::http::{self, Answer, HttpError, preview};
use cnid_api::{
    self as api, AttachmentInfo, AttachmentRequest, AttachmentsResponse, GcRequest, StatusRequest,
};

/// The `CNI_*` environment of one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginEnv {
    /// `CNI_COMMAND`.
    pub command: Option<String>,
    /// `CNI_CONTAINERID`.
    pub container_id: Option<String>,
    /// `CNI_NETNS`.
    pub netns: Option<String>,
    /// `CNI_IFNAME`.
    pub ifname: Option<String>,
    /// `CNI_ARGS`.
    pub args: Option<String>,
    /// `TRACEPARENT`, `TRACESTATE`, `BAGGAGE` (the runtime's trace
    /// context, as libcni's main sets it), forwarded to cnid as headers.
    pub trace: cni_core::trace::TraceContext,
}

impl PluginEnv {
    /// Reads the `CNI_*` variables of this process (a value that is not
    /// UTF-8 reads as the empty string, which validation then refuses).
    pub fn from_process() -> PluginEnv {
        let var = |k: &str| std::env::var_os(k).map(|v| v.into_string().unwrap_or_default());
        PluginEnv {
            command: var(cni_core::env::CNI_COMMAND),
            container_id: var(cni_core::env::CNI_CONTAINERID),
            netns: var(cni_core::env::CNI_NETNS),
            ifname: var(cni_core::env::CNI_IFNAME),
            args: var(cni_core::env::CNI_ARGS),
            trace: cni_core::trace::TraceContext::from_env(),
        }
    }
}

/// What one call prints and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Stdout: a result, the VERSION reply, an error object, or nothing.
    pub stdout: Vec<u8>,
    /// Lines for stderr (notes for the runtime's log).
    pub stderr: Vec<String>,
    /// The exit status: 0, or 1 with an error object on stdout.
    pub status: i32,
}

impl Output {
    fn ok(stdout: Vec<u8>) -> Output {
        Output {
            stdout,
            stderr: Vec::new(),
            status: 0,
        }
    }

    fn error(e: &ErrorObject) -> Output {
        Output {
            stdout: e.to_json().into_bytes(),
            stderr: Vec::new(),
            status: 1,
        }
    }

    fn note(mut self, line: String) -> Output {
        self.stderr.push(line);
        self
    }
}

/// Runs one plugin call: `env` from the process, `stdin` the plugin's
/// configuration. Never panics on any input.
pub fn run(env: &PluginEnv, stdin: &[u8]) -> Output {
    let current = Version::CURRENT.to_string();
    let command = match env.command.as_deref() {
        None | Some("") => {
            return Output::error(&ErrorObject::new(
                &current,
                code::INVALID_ENVIRONMENT_VARIABLES,
                "cnid-shim: CNI_COMMAND is not set",
                "",
            ));
        }
        Some(c) => match c.parse::<Command>() {
            Ok(c) => c,
            Err(e) => return Output::error(&e.to_error_object(&current)),
        },
    };
    if command == Command::Version {
        let reply = serde_json::to_vec(&PluginInfo::ours()).unwrap_or_default();
        return Output::ok(reply);
    }
    let conf = match ShimConf::parse(stdin) {
        Ok(c) => c,
        Err(e) => return Output::error(&e),
    };
    let shim = Shim {
        conf: &conf,
        command,
        trace: &env.trace,
    };
    match shim.call(env) {
        Ok(o) => o,
        Err(e) => Output::error(&e),
    }
}

struct Shim<'a> {
    conf: &'a ShimConf,
    command: Command,
    trace: &'a cni_core::trace::TraceContext,
}

impl Shim<'_> {
    fn version(&self) -> String {
        self.conf.version.to_string()
    }

    fn err(&self, code: u32, msg: String, details: impl Into<String>) -> ErrorObject {
        ErrorObject::new(self.version(), code, msg, details)
    }

    fn call(&self, env: &PluginEnv) -> Result<Output, ErrorObject> {
        let timeout_ms = u64::try_from(self.conf.timeout.as_millis()).unwrap_or(u64::MAX);
        let ans = match self.command {
            Command::Add | Command::Check | Command::Del => {
                let req = self.attachment_request(env, timeout_ms)?;
                let ans = self.post(&req)?;
                if self.command == Command::Add {
                    return self.add_answer(&req, ans);
                }
                ans
            }
            Command::Status => self.post(&StatusRequest {
                timeout_ms: Some(timeout_ms),
            })?,
            Command::Gc => {
                let Some(valid) = self.conf.valid_attachments.clone() else {
                    return Err(self.err(
                        code::INVALID_NETWORK_CONFIG,
                        format!(
                            "cnid-shim: GC without \"{}\" in the network configuration: refused, since cnid would delete every attachment of network {:?}",
                            cni_core::stdin::VALID_ATTACHMENTS_KEY,
                            self.conf.network
                        ),
                        "",
                    ));
                };
                self.post(&GcRequest {
                    valid_attachments: valid,
                    timeout_ms: Some(timeout_ms),
                })?
            }
            Command::Version => return Ok(Output::ok(Vec::new())),
        };
        self.expect_success(ans).map(|_| Output::ok(Vec::new()))
    }

    fn attachment_request(
        &self,
        env: &PluginEnv,
        timeout_ms: u64,
    ) -> Result<AttachmentRequest, ErrorObject> {
        let required = |name: &str, v: &Option<String>| match v.as_deref() {
            Some(s) if !s.is_empty() => Ok(s.to_owned()),
            _ => Err(self.err(
                code::INVALID_ENVIRONMENT_VARIABLES,
                format!("cnid-shim: {name} is not set"),
                format!("required for {}", self.command),
            )),
        };
        let container_id = required("CNI_CONTAINERID", &env.container_id)?;
        let ifname = required("CNI_IFNAME", &env.ifname)?;
        let netns = match self.command {
            Command::Del => env.netns.clone().unwrap_or_default(),
            _ => required("CNI_NETNS", &env.netns)?,
        };
        if self.command == Command::Add && self.conf.has_prev_result {
            return Err(self.err(
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "cnid-shim must be the first plugin of network {:?}: it got a prevResult on ADD, but cnid runs the whole chain of network {:?}",
                    self.conf.name, self.conf.network
                ),
                "",
            ));
        }
        Ok(AttachmentRequest {
            container_id,
            netns,
            ifname,
            cni_args: env.args.clone().unwrap_or_default(),
            capability_args: self.conf.capability_args.clone(),
            timeout_ms: Some(timeout_ms),
            force: false,
        })
    }

    fn verb_path(&self) -> String {
        let verb = self.command.as_str().to_ascii_lowercase();
        format!(
            "{}/networks/{}/{verb}",
            api::PREFIX,
            api::encode(&self.conf.network)
        )
    }

    fn post(&self, body: &impl Serialize) -> Result<Answer, ErrorObject> {
        let body = serde_json::to_vec(body).map_err(|e| {
            self.err(
                code::INTERNAL,
                format!("cnid-shim: cannot encode the request: {e}"),
                "",
            )
        })?;
        self.request("POST", &self.verb_path(), Some(&body))
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, ErrorObject> {
        let rid = format!("cnid-shim-{}", std::process::id());
        let mut headers = vec![(api::REQUEST_ID_HEADER, rid.as_str())];
        headers.extend(self.trace.headers());
        http::request(
            &self.conf.socket,
            method,
            path,
            &headers,
            body,
            (self.conf.answer_timeout(), self.conf.timeout),
        )
        .map_err(|e| self.unreachable(&e))
    }

    /// An answer that never came (or is not HTTP) as the runtime sees it.
    fn unreachable(&self, e: &HttpError) -> ErrorObject {
        let verb = self.command;
        // STATUS has codes of its own for "cannot service ADD now".
        let again = if verb == Command::Status {
            code::PLUGIN_NOT_AVAILABLE
        } else {
            code::TRY_AGAIN_LATER
        };
        match e {
            HttpError::Connect { socket, source } => self.err(
                again,
                format!("cnid-shim: cnid is not reachable on {}: {source}", socket.display()),
                "is cnid running? try again later",
            ),
            HttpError::Closed { socket, what } => self.err(
                again,
                format!(
                    "cnid-shim: cnid on {} closed the connection before answering {verb} (stopped or restarted?): {what}",
                    socket.display()
                ),
                if verb == Command::Add {
                    "cnid rolls an unfinished ADD back when it starts again; DEL the attachment or try again later"
                } else {
                    "try again later"
                },
            ),
            HttpError::Timeout { socket, after } => self.err(
                again,
                format!(
                    "cnid-shim: no answer from cnid on {} to {verb} within {}",
                    socket.display(),
                    fmt_duration(*after)
                ),
                timeout_hint(verb),
            ),
            HttpError::Malformed { socket, what } => self.err(
                code::INTERNAL,
                format!(
                    "cnid-shim: malformed answer from cnid on {} to {verb}: {what}",
                    socket.display()
                ),
                "",
            ),
        }
    }

    /// A 2xx answer passes; anything else is the error cnid answered with.
    /// A 2xx whose body is a CNI error object is that error all the same,
    /// as a plugin's output is (`docs/decisions.md` D18).
    fn expect_success(&self, ans: Answer) -> Result<Answer, ErrorObject> {
        if !(200..300).contains(&ans.status) {
            return Err(self.answer_error(&ans));
        }
        match ErrorObject::decode_on_success(&ans.body) {
            None => Ok(ans),
            Some(mut e) => {
                e.cni_version = self.version();
                e.msg = format!(
                    "cnid-shim: cnid on {} answered HTTP {} with an error object: {}",
                    self.conf.socket.display(),
                    ans.status,
                    e.msg
                );
                Err(e)
            }
        }
    }

    /// cnid's error object (code, msg, details kept), in the shim's version,
    /// with the failing plugin in the message when cnid named it.
    fn answer_error(&self, ans: &Answer) -> ErrorObject {
        match ErrorObject::decode(&ans.body) {
            Some(mut e) => {
                e.cni_version = self.version();
                if let Some(plugin) = ans.header(api::PLUGIN_HEADER).filter(|p| !p.is_empty()) {
                    e.msg = format!(
                        "plugin type={plugin:?} failed ({}): {}",
                        self.command.as_str().to_ascii_lowercase(),
                        e.msg
                    );
                }
                e
            }
            None => self.err(
                code::INTERNAL,
                format!(
                    "cnid-shim: malformed answer from cnid on {} to {}: HTTP {} with a body that is not a CNI error object: {}",
                    self.conf.socket.display(),
                    self.command,
                    ans.status,
                    preview(&ans.body)
                ),
                "",
            ),
        }
    }

    fn add_answer(&self, req: &AttachmentRequest, ans: Answer) -> Result<Output, ErrorObject> {
        if ans.status == 409 {
            let refusal = self.answer_error(&ans);
            if refusal.code == api::code::ALREADY_ATTACHED {
                return match self.same_attachment(req)? {
                    Some(result) => Ok(Output::ok(self.convert(&result)?).note(format!(
                        "cnid-shim: container {:?} interface {:?} was already attached to network {:?} with the same parameters (a retried ADD): returning that attachment's result",
                        req.container_id, req.ifname, self.conf.network
                    ))),
                    None => Err(refusal),
                };
            }
            return Err(refusal);
        }
        let ans = self.expect_success(ans)?;
        let result: serde_json::Value = serde_json::from_slice(&ans.body).map_err(|e| {
            self.malformed(format!(
                "the ADD result is not JSON ({e}): {}",
                preview(&ans.body)
            ))
        })?;
        // A result of any version has its version or one of its parts; `{}`
        // (or any other object without them) is no result.
        let is_result = result.as_object().is_some_and(|o| {
            o.contains_key("cniVersion")
                || cni_core::result::RESULT_PARTS
                    .iter()
                    .any(|k| o.contains_key(*k))
        });
        if !is_result {
            return Err(self.malformed(format!(
                "the ADD answer (HTTP {}) is not a CNI result: {}",
                ans.status,
                preview(&ans.body)
            )));
        }
        Ok(Output::ok(self.convert(&result)?))
    }

    fn malformed(&self, what: String) -> ErrorObject {
        self.err(
            code::INTERNAL,
            format!(
                "cnid-shim: malformed answer from cnid on {}: {what}",
                self.conf.socket.display()
            ),
            "",
        )
    }

    /// The result in the shim's version, as JSON bytes.
    fn convert(&self, result: &serde_json::Value) -> Result<Vec<u8>, ErrorObject> {
        let parsed = CniResult::from_value(result, self.conf.version)
            .map_err(|e| self.malformed(format!("the ADD result does not decode: {e}")))?;
        let converted = parsed.convert(self.conf.version).map_err(|e| {
            let mut obj = e.to_error_object(&self.version());
            obj.msg = format!("cnid-shim: {}", obj.msg);
            obj
        })?;
        Ok(converted.to_json().into_bytes())
    }

    /// The cached result of the attachment `req` names, if cnid has it with
    /// the same parameters.
    fn same_attachment(
        &self,
        req: &AttachmentRequest,
    ) -> Result<Option<serde_json::Value>, ErrorObject> {
        let path = format!(
            "{}/attachments?containerId={}",
            api::PREFIX,
            api::encode(&req.container_id)
        );
        let ans = self.request("GET", &path, None)?;
        let ans = self.expect_success(ans)?;
        let list: AttachmentsResponse = serde_json::from_slice(&ans.body).map_err(|e| {
            self.malformed(format!(
                "the attachment list does not decode ({e}): {}",
                preview(&ans.body)
            ))
        })?;
        Ok(list
            .attachments
            .into_iter()
            .find(|a| {
                a.network == self.conf.network
                    && a.container_id == req.container_id
                    && a.ifname == req.ifname
                    && same_parameters(a, req)
            })
            .and_then(|a| a.result))
    }
}

/// Whether an attachment was made with the parameters of `req` (netns,
/// `CNI_ARGS` as a set of pairs, capability arguments).
pub fn same_parameters(a: &AttachmentInfo, req: &AttachmentRequest) -> bool {
    req.made(a)
}

/// What a runtime owes after the shim gave up waiting for cnid's answer.
/// cnid runs an ADD with rollback: one it cannot finish by its deadline
/// (the `timeout` the shim passed) is rolled back; one it finished late is
/// cached, and the runtime's DEL after a failed ADD (what every runtime
/// sends) removes it.
fn timeout_hint(verb: Command) -> &'static str {
    match verb {
        Command::Add => {
            "cnid rolls back an ADD it cannot finish by its deadline; one it finished late stays attached until DELed: DEL the attachment (harmless when it was rolled back)"
        }
        Command::Del => "the DEL may still finish in cnid; send it again (DEL is idempotent)",
        _ => "try again later",
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(command: &str) -> PluginEnv {
        PluginEnv {
            command: Some(command.into()),
            container_id: Some("c1".into()),
            netns: Some("/run/netns/c1".into()),
            ifname: Some("eth0".into()),
            args: None,
            trace: Default::default(),
        }
    }

    fn conf(extra: serde_json::Value) -> Vec<u8> {
        let mut v = json!({"cniVersion": "1.0.0", "name": "podnet", "type": "cnid-shim",
                           "socket": "/nonexistent/cnid-shim-test.sock"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::to_vec(&v).unwrap()
    }

    fn error_of(o: &Output) -> ErrorObject {
        assert_eq!(o.status, 1, "{o:?}");
        ErrorObject::decode(&o.stdout).unwrap_or_else(|| panic!("not an error object: {o:?}"))
    }

    #[test]
    fn version_is_answered_by_the_shim() {
        let o = run(&env("VERSION"), b"{\"cniVersion\":\"1.0.0\"}");
        assert_eq!(o.status, 0);
        let info = PluginInfo::decode(&o.stdout).unwrap();
        for v in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            assert!(info.supports(v.parse().unwrap()), "{v}");
        }
    }

    #[test]
    fn missing_environment_is_code_4() {
        let mut e = env("ADD");
        e.netns = None;
        let err = error_of(&run(&e, &conf(json!({}))));
        assert_eq!(
            (err.code, err.msg.as_str()),
            (4, "cnid-shim: CNI_NETNS is not set")
        );
        assert_eq!(err.cni_version, "1.0.0");
        let mut e = env("DEL");
        e.container_id = Some(String::new());
        assert!(
            error_of(&run(&e, &conf(json!({}))))
                .msg
                .contains("CNI_CONTAINERID")
        );
        let err = error_of(&run(&env("BOGUS"), &conf(json!({}))));
        assert_eq!(err.code, 4);
        let err = error_of(&run(&PluginEnv::default(), &conf(json!({}))));
        assert_eq!(err.code, 4);
    }

    #[test]
    fn prev_result_on_add_and_gc_without_attachments_are_refused() {
        let err = error_of(&run(
            &env("ADD"),
            &conf(json!({"prevResult": {"cniVersion": "1.0.0"}})),
        ));
        assert_eq!(err.code, 7);
        assert!(err.msg.contains("first plugin"), "{err:?}");
        let err = error_of(&run(&env("GC"), &conf(json!({"cniVersion": "1.1.0"}))));
        assert_eq!(err.code, 7);
        assert!(err.msg.contains("cni.dev/valid-attachments"), "{err:?}");
    }

    #[test]
    fn a_timed_out_add_says_what_the_runtime_owes() {
        let add = timeout_hint(Command::Add);
        assert!(add.contains("rolls back") && add.contains("DEL"), "{add}");
        assert!(timeout_hint(Command::Del).contains("idempotent"));
        assert_eq!(timeout_hint(Command::Check), "try again later");
    }

    #[test]
    fn unreachable_cnid_is_code_11_naming_the_socket_and_50_for_status() {
        let err = error_of(&run(&env("ADD"), &conf(json!({}))));
        assert_eq!(err.code, 11);
        assert!(
            err.msg.contains("/nonexistent/cnid-shim-test.sock"),
            "{err:?}"
        );
        let err = error_of(&run(&env("STATUS"), &conf(json!({"cniVersion": "1.1.0"}))));
        assert_eq!(err.code, 50);
    }

    #[test]
    fn same_parameters_ignores_the_order_of_cni_args() {
        let mut req = AttachmentRequest::new("c1", "/run/netns/c1", "eth0");
        req.cni_args = "A=1;B=2".into();
        req.capability_args
            .insert("portMappings", json!([{"hostPort": 1}]));
        let mut a = AttachmentInfo {
            network: "n".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/run/netns/c1".into(),
            state: None,
            gone_since_ms: None,
            reap_error: None,
            check_error: None,
            cni_args: "B=2;A=1".into(),
            capability_args: req.capability_args.clone(),
            result: None,
        };
        assert!(same_parameters(&a, &req));
        a.cni_args = "A=1".into();
        assert!(!same_parameters(&a, &req));
        a.cni_args = "A=1;B=2".into();
        a.netns = "/run/netns/other".into();
        assert!(!same_parameters(&a, &req));
        a.netns = req.netns.clone();
        a.capability_args = Default::default();
        assert!(!same_parameters(&a, &req));
    }
}
