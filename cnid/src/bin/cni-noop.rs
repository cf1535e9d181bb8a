//! `cni-noop`: the cheapest valid CNI plugin, for benchmarks and load tests.
//!
//! - ADD: prints `prevResult` if the config has one, otherwise a minimal
//!   result of the config's `cniVersion` (one interface, one address).
//! - DEL, CHECK, STATUS, GC: prints nothing, exits 0.
//! - VERSION: prints the versions it supports.
//!
//! No async runtime, no logging, no allocation beyond reading stdin: its own
//! run is a process start, one small JSON parse and one write.
//!
//! `CNI_NOOP_FAIL=1` makes every ADD fail with a CNI error (code 100), for
//! fault tests.

use std::io::{Read, Write};
use std::process::ExitCode;

const SUPPORTED: &str = r#"["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]"#;

fn main() -> ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let mut input = Vec::with_capacity(4096);
    if std::io::stdin().read_to_end(&mut input).is_err() {
        return fail("", 5, "cannot read stdin");
    }
    let conf: serde_json::Value = match serde_json::from_slice(&input) {
        Ok(v) => v,
        Err(e) => return fail("", 6, &format!("invalid config on stdin: {e}")),
    };
    let version = conf
        .get("cniVersion")
        .and_then(|v| v.as_str())
        .unwrap_or("0.1.0")
        .to_owned();
    let mut out = std::io::stdout().lock();
    match command.as_str() {
        "VERSION" => {
            let _ = write!(
                out,
                r#"{{"cniVersion":"{version}","supportedVersions":{SUPPORTED}}}"#
            );
            ExitCode::SUCCESS
        }
        "ADD" => {
            if std::env::var_os("CNI_NOOP_FAIL").is_some() {
                return fail(&version, 100, "cni-noop told to fail (CNI_NOOP_FAIL)");
            }
            match conf.get("prevResult") {
                Some(prev) => {
                    let _ = serde_json::to_writer(&mut out, prev);
                }
                None if version.starts_with("0.1") || version.starts_with("0.2") => {
                    let _ = write!(
                        out,
                        r#"{{"cniVersion":"{version}","ip4":{{"ip":"10.255.0.2/24"}},"dns":{{}}}}"#
                    );
                }
                None => {
                    let ifname = std::env::var("CNI_IFNAME").unwrap_or_else(|_| "eth0".into());
                    let netns = std::env::var("CNI_NETNS").unwrap_or_default();
                    let ip_version = if version.starts_with("0.") {
                        r#""version":"4","#
                    } else {
                        ""
                    };
                    let _ = write!(
                        out,
                        r#"{{"cniVersion":"{version}","interfaces":[{{"name":"{ifname}","sandbox":"{netns}"}}],"ips":[{{{ip_version}"interface":0,"address":"10.255.0.2/24"}}],"dns":{{}}}}"#
                    );
                }
            }
            ExitCode::SUCCESS
        }
        "DEL" | "CHECK" | "STATUS" | "GC" => ExitCode::SUCCESS,
        other => fail(&version, 4, &format!("unknown CNI_COMMAND {other:?}")),
    }
}

fn fail(version: &str, code: u32, msg: &str) -> ExitCode {
    let obj = serde_json::json!({"cniVersion": version, "code": code, "msg": msg});
    let _ = serde_json::to_writer(std::io::stdout().lock(), &obj);
    ExitCode::FAILURE
}
