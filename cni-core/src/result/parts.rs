//! The top-level keys of a result's parts in any version: what tells a
//! result from an error object (`ErrorObject::decode_on_success`) or from
//! any other JSON object. A leaf, so that the error module, below the
//! result types, can read it.

/// The top-level keys of a result's parts in any version (0.1.0 to 1.1.0),
/// `cniVersion` aside: an object with none of them is no result.
pub const RESULT_PARTS: [&str; 6] = ["interfaces", "ips", "routes", "dns", "ip4", "ip6"];
