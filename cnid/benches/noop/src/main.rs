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

const SUPPORTED: &[u8] = br#"["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]"#;

/// The C entry point: std's `lang_start` set-up is skipped, so stdout is
/// flushed by hand and SIGPIPE keeps its default action.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const std::ffi::c_char) -> c_int {
    use std::io::{Read, Write};
    let (mut out, mut input) = (Vec::with_capacity(1024), Vec::with_capacity(4096));
    let var = |k| std::env::var_os(k).unwrap_or_default();
    let status = match std::io::stdin().read_to_end(&mut input) {
        Ok(_) => {
            let ifname = std::env::var_os("CNI_IFNAME").unwrap_or_else(|| "eth0".into());
            let fail = std::env::var_os("CNI_NOOP_FAIL").is_some();
            let (command, netns) = (var("CNI_COMMAND"), var("CNI_NETNS"));
            run(&Env(command, ifname, netns, fail), &input, &mut out)
        }
        Err(_) => fail(&mut out, b"", 5, "cannot read stdin"),
    };
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_all(&out).and_then(|()| stdout.flush());
    if written.is_err() { 1 } else { status }
}

/// What the noop reads from its environment: `CNI_COMMAND`, `CNI_IFNAME`,
/// `CNI_NETNS`, whether `CNI_NOOP_FAIL` is set.
struct Env(OsString, OsString, OsString, bool);

/// The start of every object the noop prints.
const V: &[u8] = br#"{"cniVersion":""#;

/// One call: `input` is the config from stdin; what to print goes to `out`;
/// returns the exit status.
fn run(env: &Env, input: &[u8], out: &mut Vec<u8>) -> c_int {
    let Some(conf) = Conf::scan(input) else {
        return fail(out, b"", 6, "invalid config on stdin: not a JSON object");
    };
    let version = conf.version.unwrap_or(b"0.1.0");
    let mut put = |parts: &[&[u8]]| parts.iter().for_each(|p| out.extend_from_slice(p));
    match env.0.as_encoded_bytes() {
        b"VERSION" => {
            put(&[V, version, br#"","supportedVersions":"#, SUPPORTED, b"}"]);
        }
        b"ADD" if env.3 => {
            return fail(out, version, 100, "cni-noop told to fail (CNI_NOOP_FAIL)");
        }
        b"ADD" => {
            if let Some(ms) = conf.sleep_ms {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            if let Some(prev) = conf.prev_result {
                put(&[prev]);
            } else if version.starts_with(b"0.1") || version.starts_with(b"0.2") {
                let ip4 = br#"","ip4":{"ip":"10.255.0.2/24"},"dns":{}}"#;
                put(&[V, version, ip4]);
            } else {
                put(&[V, version, br#"","interfaces":[{"name":""#]);
                escape(out, env.1.as_encoded_bytes());
                out.extend_from_slice(br#"","sandbox":""#);
                escape(out, env.2.as_encoded_bytes());
                out.extend_from_slice(br#""}],"ips":[{"#);
                if version.starts_with(b"0.") {
                    out.extend_from_slice(br#""version":"4","#);
                }
                out.extend_from_slice(br#""interface":0,"address":"10.255.0.2/24"}],"dns":{}}"#);
            }
        }
        b"DEL" | b"CHECK" | b"STATUS" | b"GC" => {}
        other => {
            let msg = format!("unknown CNI_COMMAND {:?}", String::from_utf8_lossy(other));
            return fail(out, version, 4, &msg);
        }
    }
    0
}

/// Writes a CNI error object; the exit status is 1.
fn fail(out: &mut Vec<u8>, version: &[u8], code: u32, msg: &str) -> c_int {
    out.clear();
    out.extend_from_slice(&[V, version].concat());
    out.extend_from_slice(format!(r#"","code":{code},"msg":""#).as_bytes());
    escape(out, msg.as_bytes());
    out.extend_from_slice(b"\"}");
    1
}

/// Appends `s` as the inside of a JSON string (UTF-8 passed through).
fn escape(out: &mut Vec<u8>, s: &[u8]) {
    for &b in s {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
}

/// What the noop needs from its configuration: the raw bytes inside the
/// `cniVersion` string (versions need no escapes), the raw bytes of the
/// `prevResult` value, `sleepMs` when it is a non-negative integer.
#[derive(Default)]
struct Conf<'a> {
    version: Option<&'a [u8]>,
    prev_result: Option<&'a [u8]>,
    sleep_ms: Option<u64>,
}

impl<'a> Conf<'a> {
    /// Scans the top level of a JSON object. `None` when the input is not
    /// one (the values themselves are skipped, not validated).
    fn scan(input: &'a [u8]) -> Option<Self> {
        let (mut conf, mut s) = (Conf::default(), Scanner { b: input, i: 0 });
        (s.next()? == b'{').then_some(())?;
        let mut c = s.next()?;
        if c == b'}' {
            return Some(conf);
        }
        loop {
            (c == b'"').then_some(())?;
            let key = s.string()?;
            (s.next()? == b':').then_some(())?;
            let value = s.value()?;
            match key {
                b"cniVersion" if value.len() >= 2 && value[0] == b'"' => {
                    conf.version = Some(&value[1..value.len() - 1]);
                }
                b"prevResult" => conf.prev_result = Some(value),
                b"sleepMs" => {
                    conf.sleep_ms = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok())
                }
                _ => {}
            }
            match s.next()? {
                b',' => c = s.next()?,
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
    /// The next byte after whitespace, consumed.
    fn next(&mut self) -> Option<u8> {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
        self.i += 1;
        self.b.get(self.i - 1).copied()
    }

    /// The rest of a string whose quote was consumed: its raw inside
    /// (escapes left as they are).
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'"' => break,
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
        self.i += 1;
        Some(&self.b[start..self.i - 1])
    }

    /// Skips one value, returning its raw bytes: a string, an object or
    /// array (brackets counted outside strings), or a scalar up to the next
    /// delimiter.
    fn value(&mut self) -> Option<&'a [u8]> {
        let c = self.next()?;
        let start = self.i - 1;
        match c {
            b'"' => drop(self.string()?),
            b'{' | b'[' => {
                let mut depth = 1;
                while depth > 0 {
                    match *self.b.get(self.i)? {
                        b'"' => drop((self.i += 1, self.string()?)),
                        b'{' | b'[' => (depth, self.i) = (depth + 1, self.i + 1),
                        b'}' | b']' => (depth, self.i) = (depth - 1, self.i + 1),
                        _ => self.i += 1,
                    }
                }
            }
            b',' | b'}' | b']' => return None,
            _ => {
                let end = |c: &u8| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r');
                while self.b.get(self.i).is_some_and(|c| !end(c)) {
                    self.i += 1;
                }
            }
        }
        Some(&self.b[start..self.i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn finds_top_level_keys_only() {
        let input = br#" { "type": "noop", "args": {"cniVersion": "9.9.9", "prevResult": 1},
            "cniVersion" : "1.0.0", "sleepMs": 25,
            "prevResult": {"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}],"k":"a}\"]b"} } "#;
        let conf = Conf::scan(input).unwrap();
        assert_eq!(conf.version, Some(&b"1.0.0"[..]));
        assert_eq!(conf.sleep_ms, Some(25));
        let prev = br#"{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2/24"}],"k":"a}\"]b"}"#;
        assert_eq!(conf.prev_result, Some(&prev[..]));
    }

    #[test]
    fn refuses_what_is_not_an_object() {
        let bad: [&[u8]; 7] = [
            b"",
            b"[]",
            b"nope",
            br#"{"a" 1}"#,
            br#"{"a":"#,
            br#"{"a":1"#,
            br#"{"a":{"#,
        ];
        for b in bad {
            assert!(Conf::scan(b).is_none(), "{:?}", String::from_utf8_lossy(b));
        }
        assert!(Conf::scan(b" {} ").is_some());
    }

    fn env(command: &str) -> Env {
        Env(
            command.into(),
            "eth1".into(),
            "/run/netns/a\"b".into(),
            false,
        )
    }

    fn call(env: &Env, input: &str) -> (c_int, Value) {
        let mut out = Vec::new();
        let status = run(env, input.as_bytes(), &mut out);
        (
            status,
            if out.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&out).unwrap()
            },
        )
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
            assert_eq!(call(&env(verb), conf), (0, Value::Null));
        }
        let code = |(st, v): (c_int, Value)| (st, v["code"].as_u64());
        assert_eq!(code(call(&env("BOGUS"), conf)), (1, Some(4)));
        let failing = Env(env("ADD").0, "eth1".into(), "n".into(), true);
        assert_eq!(code(call(&failing, conf)), (1, Some(100)));
        assert_eq!(code(call(&env("ADD"), "not json")), (1, Some(6)));
    }

    #[test]
    fn results_and_errors_are_json_objects() {
        let mut out = Vec::new();
        escape(&mut out, b"a\"b\\c\n");
        assert_eq!(out, br#"a\"b\\c\u000a"#);
        let mut out = Vec::new();
        assert_eq!(fail(&mut out, b"1.0.0", 100, "x \"y\""), 1);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (&v["code"], &v["msg"]),
            (&Value::from(100), &Value::from("x \"y\""))
        );
    }
}
