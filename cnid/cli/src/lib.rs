//! What cnid's binaries (`cnid`, `cnitool`) share on their command lines:
//!
//! - [`generate`]: man pages and shell completions from a binary's clap
//!   definitions, behind the hidden `--generate` (for `make install`).
//! - [`logfmt`]: the log-field formatter that escapes control characters in
//!   every field, so plugin output never reaches a terminal raw.
#![warn(missing_docs)]

pub mod generate;
pub mod logfmt;
