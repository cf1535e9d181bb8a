//! The few messages of the CRI API (`runtime.v1.RuntimeService`, the same
//! field numbers in `runtime.v1alpha2`) the benchmark sends and reads,
//! encoded by hand: protobuf's wire format is a key (field number << 3 |
//! wire type) then a varint or a length-delimited payload.
//!
//! Only what a pod sandbox with a port mapping needs is written; fields
//! left out are the defaults (empty, zero), as protobuf omits them anyway.

/// Wire type of varints (ints, enums, bools).
const VARINT: u64 = 0;
/// Wire type of strings, bytes, nested messages and map entries.
const LEN: u64 = 2;

/// A message being written.
#[derive(Debug, Default)]
pub(crate) struct Msg(Vec<u8>);

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Msg {
    pub(crate) fn new() -> Msg {
        Msg::default()
    }

    /// A varint field (int32 or uint32 or an enum); zero is omitted.
    pub(crate) fn uint(mut self, field: u64, v: u64) -> Msg {
        if v != 0 {
            varint(&mut self.0, field << 3 | VARINT);
            varint(&mut self.0, v);
        }
        self
    }

    /// A length-delimited field: string, bytes or a message's encoding.
    pub(crate) fn bytes(mut self, field: u64, v: &[u8]) -> Msg {
        varint(&mut self.0, field << 3 | LEN);
        varint(&mut self.0, v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    /// A string field; empty is omitted.
    pub(crate) fn str(self, field: u64, v: &str) -> Msg {
        if v.is_empty() {
            return self;
        }
        self.bytes(field, v.as_bytes())
    }

    /// A nested message.
    pub(crate) fn msg(self, field: u64, m: Msg) -> Msg {
        self.bytes(field, &m.0)
    }

    /// One entry of a `map<string, string>` (a message of key = 1,
    /// value = 2).
    pub(crate) fn map_entry(self, field: u64, k: &str, v: &str) -> Msg {
        self.msg(field, Msg::new().str(1, k).str(2, v))
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        self.0
    }
}

/// The first length-delimited field `field` of `buf` as a string, `None`
/// when absent; an error when `buf` is not a well-formed message.
pub(crate) fn string_field(buf: &[u8], field: u64) -> anyhow::Result<Option<String>> {
    bytes_field(buf, field)?
        .map(|b| {
            String::from_utf8(b.to_vec())
                .map_err(|_| anyhow::anyhow!("protobuf: field {field} is not UTF-8"))
        })
        .transpose()
}

/// The first length-delimited field `field` of `buf` (a string, bytes or a
/// nested message), `None` when absent.
pub(crate) fn bytes_field(buf: &[u8], field: u64) -> anyhow::Result<Option<&[u8]>> {
    let mut i = 0;
    let read = |i: &mut usize| -> anyhow::Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *buf
                .get(*i)
                .ok_or_else(|| anyhow::anyhow!("protobuf: varint cut short"))?;
            *i += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        anyhow::bail!("protobuf: varint longer than 10 bytes")
    };
    while i < buf.len() {
        let key = read(&mut i)?;
        match key & 7 {
            0 => {
                read(&mut i)?;
            }
            1 => i += 8,
            5 => i += 4,
            2 => {
                let n = read(&mut i)? as usize;
                let body = buf
                    .get(i..i.saturating_add(n))
                    .ok_or_else(|| anyhow::anyhow!("protobuf: field {} cut short", key >> 3))?;
                i += n;
                if key >> 3 == field {
                    return Ok(Some(body));
                }
            }
            t => anyhow::bail!("protobuf: wire type {t} (field {}) not read", key >> 3),
        }
    }
    Ok(None)
}

/// `VersionRequest { string version = 1 }`.
pub(crate) fn version_request() -> Vec<u8> {
    Msg::new().str(1, "v1").into_vec()
}

/// What a sandbox of the benchmark looks like: its name, uid and
/// namespace (the pod's metadata, passed to CNI as `K8S_POD_*`), one port
/// mapping (TCP `host_ip:8080` to 80; the portmap plugin's capability
/// arg), a label, and a cgroup parent of the run's own.
#[derive(Debug)]
pub(crate) struct Sandbox<'a> {
    pub(crate) name: &'a str,
    pub(crate) uid: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) host_ip: &'a str,
    pub(crate) cgroup_parent: &'a str,
}

/// `RunPodSandboxRequest { PodSandboxConfig config = 1; string
/// runtime_handler = 2 }` (the default handler).
pub(crate) fn run_pod_sandbox_request(s: &Sandbox<'_>) -> Vec<u8> {
    // PodSandboxMetadata { name = 1, uid = 2, namespace = 3, attempt = 4 }
    let metadata = Msg::new().str(1, s.name).str(2, s.uid).str(3, s.namespace);
    // PortMapping { protocol = 1 (TCP = 0), container_port = 2,
    // host_port = 3, host_ip = 4 }
    let port = Msg::new().uint(2, 80).uint(3, 8080).str(4, s.host_ip);
    // LinuxPodSandboxConfig { cgroup_parent = 1, ... }
    let linux = Msg::new().str(1, s.cgroup_parent);
    // PodSandboxConfig { metadata = 1, hostname = 2, log_directory = 3,
    // dns_config = 4, port_mappings = 5, labels = 6, annotations = 7,
    // linux = 8 }
    let config = Msg::new()
        .msg(1, metadata)
        .str(2, s.name)
        .msg(5, port)
        .map_entry(6, "app", "cnid-bench")
        .msg(8, linux);
    Msg::new().msg(1, config).into_vec()
}

/// `StopPodSandboxRequest` and `RemovePodSandboxRequest`: `{ string
/// pod_sandbox_id = 1 }`.
pub(crate) fn sandbox_id_request(id: &str) -> Vec<u8> {
    Msg::new().str(1, id).into_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_strings_are_protobufs_encoding() {
        // The encoding example of protobuf's docs: field 1 = 150.
        assert_eq!(Msg::new().uint(1, 150).into_vec(), [0x08, 0x96, 0x01]);
        // field 2 = "testing"
        assert_eq!(
            Msg::new().str(2, "testing").into_vec(),
            [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
    }

    #[test]
    fn a_string_field_is_read_past_others() {
        let m = Msg::new()
            .uint(3, 300)
            .msg(7, Msg::new().str(1, "inner"))
            .str(1, "id-1")
            .into_vec();
        assert_eq!(string_field(&m, 1).unwrap().as_deref(), Some("id-1"));
        assert_eq!(string_field(&m, 2).unwrap(), None);
        assert!(string_field(&m[..m.len() - 1], 1).is_err());
    }

    #[test]
    fn a_sandbox_request_puts_each_value_at_its_cri_field() {
        let req = run_pod_sandbox_request(&Sandbox {
            name: "pod-1",
            uid: "uid-1",
            namespace: "ns",
            host_ip: "10.200.0.1",
            cgroup_parent: "/parent",
        });
        let nested = |buf: &[u8], path: &[u64]| -> Option<String> {
            let mut b = buf;
            for f in &path[..path.len() - 1] {
                b = bytes_field(b, *f).unwrap()?;
            }
            string_field(b, path[path.len() - 1]).unwrap()
        };
        // config (1) > metadata (1) > name (1), uid (2), namespace (3)
        assert_eq!(nested(&req, &[1, 1, 1]).as_deref(), Some("pod-1"));
        assert_eq!(nested(&req, &[1, 1, 2]).as_deref(), Some("uid-1"));
        assert_eq!(nested(&req, &[1, 1, 3]).as_deref(), Some("ns"));
        // config > hostname (2)
        assert_eq!(nested(&req, &[1, 2]).as_deref(), Some("pod-1"));
        // config > port_mappings (5) > host_ip (4)
        assert_eq!(nested(&req, &[1, 5, 4]).as_deref(), Some("10.200.0.1"));
        // config > labels (6) > key (1), value (2)
        assert_eq!(nested(&req, &[1, 6, 1]).as_deref(), Some("app"));
        // config > linux (8) > cgroup_parent (1)
        assert_eq!(nested(&req, &[1, 8, 1]).as_deref(), Some("/parent"));
        // No runtime_handler (2): the default.
        assert_eq!(nested(&req, &[2]), None);
    }
}
