//! `cni-noop`: the cheapest valid CNI plugin, for benchmarks and load tests.
//!
//! - ADD: prints `prevResult` as it came (the same bytes) if the config has
//!   one, otherwise a minimal result of the config's `cniVersion` (one
//!   interface, one address).
//! - DEL, CHECK, STATUS, GC: prints nothing, exits 0.
//! - VERSION: prints the versions it supports.
//!
//! Its own run is a process start, one read of stdin, a scan of the
//! top-level keys of the config and one write: no async runtime, no JSON
//! library (a byte scanner finds `cniVersion`, `prevResult` and `sleepMs`),
//! and no Rust runtime set-up (`no_main`: no stack-guard probe of
//! `/proc/self/maps`, no signal stack). What remains is the dynamic loader
//! and the kernel's exec.
//!
//! Options, for fault and load tests:
//! - `CNI_NOOP_FAIL=1` in the environment makes every ADD fail with a CNI
//!   error (code 100).
//! - `"sleepMs": N` in the plugin's configuration makes ADD sleep N
//!   milliseconds before answering (operations that stay in flight).
#![cfg_attr(not(test), no_main)]

use std::ffi::{OsString, c_int};

const SUPPORTED: &str = r#"["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]"#;

/// The C entry point: std's `lang_start` set-up is skipped, so stdout is
/// flushed by hand and SIGPIPE keeps its default action.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const std::ffi::c_char) -> c_int {
    use std::io::{Read, Write};

    let mut out = Vec::with_capacity(1024);
    let mut input = Vec::with_capacity(4096);
    let status = match std::io::stdin().read_to_end(&mut input) {
        Ok(_) => {
            let env = Env {
                command: std::env::var_os("CNI_COMMAND").unwrap_or_default(),
                ifname: std::env::var_os("CNI_IFNAME").unwrap_or_else(|| "eth0".into()),
                netns: std::env::var_os("CNI_NETNS").unwrap_or_default(),
                fail: std::env::var_os("CNI_NOOP_FAIL").is_some(),
            };
            run(&env, &input, &mut out)
        }
        Err(_) => fail(&mut out, b"", 5, "cannot read stdin"),
    };
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(&out).and_then(|()| stdout.flush());
    if written.is_err() { 1 } else { status }
}

/// What the noop reads from its environment.
struct Env {
    command: OsString,
    ifname: OsString,
    netns: OsString,
    /// `CNI_NOOP_FAIL` is set.
    fail: bool,
}

/// One call: `input` is the config from stdin; what to print goes to `out`;
/// returns the exit status.
fn run(env: &Env, input: &[u8], out: &mut Vec<u8>) -> c_int {
    let conf = match Conf::scan(input) {
        Some(c) => c,
        None => return fail(out, b"", 6, "invalid config on stdin: not a JSON object"),
    };
    let version = conf.version.unwrap_or(b"0.1.0");
    match env.command.as_encoded_bytes() {
        b"VERSION" => {
            out.extend_from_slice(br#"{"cniVersion":""#);
            out.extend_from_slice(version);
            out.extend_from_slice(br#"","supportedVersions":"#);
            out.extend_from_slice(SUPPORTED.as_bytes());
            out.push(b'}');
            0
        }
        b"ADD" => {
            if env.fail {
                return fail(out, version, 100, "cni-noop told to fail (CNI_NOOP_FAIL)");
            }
            if let Some(ms) = conf.sleep_ms {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            match conf.prev_result {
                Some(prev) => out.extend_from_slice(prev),
                None if version.starts_with(b"0.1") || version.starts_with(b"0.2") => {
                    out.extend_from_slice(br#"{"cniVersion":""#);
                    out.extend_from_slice(version);
                    out.extend_from_slice(br#"","ip4":{"ip":"10.255.0.2/24"},"dns":{}}"#);
                }
                None => {
                    out.extend_from_slice(br#"{"cniVersion":""#);
                    out.extend_from_slice(version);
                    out.extend_from_slice(br#"","interfaces":[{"name":""#);
                    escape(out, env.ifname.as_encoded_bytes());
                    out.extend_from_slice(br#"","sandbox":""#);
                    escape(out, env.netns.as_encoded_bytes());
                    out.extend_from_slice(br#""}],"ips":[{"#);
                    if version.starts_with(b"0.") {
                        out.extend_from_slice(br#""version":"4","#);
                    }
                    out.extend_from_slice(
                        br#""interface":0,"address":"10.255.0.2/24"}],"dns":{}}"#,
                    );
                }
            }
            0
        }
        b"DEL" | b"CHECK" | b"STATUS" | b"GC" => 0,
        other => {
            let msg = format!("unknown CNI_COMMAND {:?}", String::from_utf8_lossy(other));
            fail(out, version, 4, &msg)
        }
    }
}

/// Writes a CNI error object; the exit status is 1.
fn fail(out: &mut Vec<u8>, version: &[u8], code: u32, msg: &str) -> c_int {
    out.clear();
    out.extend_from_slice(br#"{"cniVersion":""#);
    out.extend_from_slice(version);
    out.extend_from_slice(format!(r#"","code":{code},"msg":""#).as_bytes());
    escape(out, msg.as_bytes());
    out.extend_from_slice(b"\"}");
    1
}

/// Appends `s` as the inside of a JSON string (UTF-8 passed through).
fn escape(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
}

/// What the noop needs from its configuration.
#[derive(Default)]
struct Conf<'a> {
    /// The raw bytes inside the `cniVersion` string (versions need no escapes).
    version: Option<&'a [u8]>,
    /// The raw bytes of the `prevResult` value.
    prev_result: Option<&'a [u8]>,
    /// `sleepMs`, when it is a non-negative integer.
    sleep_ms: Option<u64>,
}

impl<'a> Conf<'a> {
    /// Scans the top level of a JSON object. `None` when the input is not
    /// one (the values themselves are skipped, not validated).
    fn scan(input: &'a [u8]) -> Option<Self> {
        let mut conf = Conf::default();
        let mut s = Scanner { b: input, i: 0 };
        s.expect(b'{')?;
        if s.peek()? == b'}' {
            return Some(conf);
        }
        loop {
            let key = s.string()?;
            s.expect(b':')?;
            let start = s.ws();
            s.value()?;
            let value = &input[start..s.i];
            match key {
                b"cniVersion" if value.len() >= 2 && value[0] == b'"' => {
                    conf.version = Some(&value[1..value.len() - 1]);
                }
                b"prevResult" => conf.prev_result = Some(value),
                b"sleepMs" => {
                    conf.sleep_ms = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                }
                _ => {}
            }
            match s.next_token()? {
                b',' => {}
                b'}' => return Some(conf),
                _ => return None,
            }
        }
    }
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    /// Skips whitespace; returns the position reached.
    fn ws(&mut self) -> usize {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
        self.i
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn next_token(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        (self.next_token()? == c).then_some(())
    }

    /// A string; returns its raw inside (escapes left as they are).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.expect(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    /// Skips one value: a string, an object or array (brackets counted
    /// outside strings), or a scalar up to the next delimiter.
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match *self.b.get(self.i)? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.b.len()
                    && !matches!(
                        self.b[self.i],
                        b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_top_level_keys_only() {
        let input = br#" { "type": "noop", "args": {"cniVersion": "9.9.9", "prevResult": 1},
            "cniVersion" : "1.0.0", "sleepMs": 25,
            "prevResult": {"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}],"k":"a}\"]b"} } "#;
        let conf = Conf::scan(input).unwrap();
        assert_eq!(conf.version, Some(&b"1.0.0"[..]));
        assert_eq!(conf.sleep_ms, Some(25));
        assert_eq!(
            conf.prev_result,
            Some(&br#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}],"k":"a}\"]b"}"#[..])
        );
    }

    #[test]
    fn refuses_what_is_not_an_object() {
        for bad in [
            &b""[..],
            b"[]",
            b"nope",
            br#"{"a" 1}"#,
            br#"{"a":"#,
            br#"{"a":1"#,
            br#"{"a":{"#,
        ] {
            assert!(
                Conf::scan(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(Conf::scan(b" {} ").is_some());
    }

    fn env(command: &str) -> Env {
        Env {
            command: command.into(),
            ifname: "eth1".into(),
            netns: "/run/netns/a\"b".into(),
            fail: false,
        }
    }

    fn call(env: &Env, input: &str) -> (c_int, serde_json::Value) {
        let mut out = Vec::new();
        let status = run(env, input.as_bytes(), &mut out);
        let v = if out.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&out).unwrap()
        };
        (status, v)
    }

    #[test]
    fn every_verb() {
        let conf = r#"{"cniVersion":"1.0.0","name":"n","type":"noop"}"#;
        let (st, v) = call(&env("ADD"), conf);
        assert_eq!(st, 0);
        assert_eq!(v["interfaces"][0]["name"], "eth1");
        assert_eq!(v["interfaces"][0]["sandbox"], "/run/netns/a\"b");
        assert_eq!(v["ips"][0]["address"], "10.255.0.2/24");
        assert!(v["ips"][0].get("version").is_none());
        let (_, v) = call(&env("ADD"), r#"{"cniVersion":"0.4.0","type":"noop"}"#);
        assert_eq!(v["ips"][0]["version"], "4");
        let (_, v) = call(&env("ADD"), r#"{"cniVersion":"0.2.0","type":"noop"}"#);
        assert_eq!(v["ip4"]["ip"], "10.255.0.2/24");
        let prev = r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.9.0.2/24"}]}}"#;
        let (_, v) = call(&env("ADD"), prev);
        assert_eq!(v["ips"][0]["address"], "10.9.0.2/24");
        let (st, v) = call(&env("VERSION"), conf);
        assert_eq!((st, v["supportedVersions"][6].as_str()), (0, Some("1.1.0")));
        for verb in ["DEL", "CHECK", "STATUS", "GC"] {
            assert_eq!(call(&env(verb), conf), (0, serde_json::Value::Null));
        }
        let (st, v) = call(&env("BOGUS"), conf);
        assert_eq!((st, v["code"].as_u64()), (1, Some(4)));
        let (st, v) = call(
            &Env {
                fail: true,
                ..env("ADD")
            },
            conf,
        );
        assert_eq!((st, v["code"].as_u64()), (1, Some(100)));
        let (st, v) = call(&env("ADD"), "not json");
        assert_eq!((st, v["code"].as_u64()), (1, Some(6)));
    }

    #[test]
    fn results_and_errors_are_json_objects() {
        let mut out = Vec::new();
        escape(&mut out, b"a\"b\\c\n");
        assert_eq!(out, br#"a\"b\\c\u000a"#);
        let mut out = Vec::new();
        assert_eq!(fail(&mut out, b"1.0.0", 100, "x \"y\""), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["code"], 100);
        assert_eq!(v["msg"], "x \"y\"");
    }
}
