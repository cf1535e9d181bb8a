//! cni-core's integration tests, one binary (as ripgrep's `tests/tests.rs`):
//! each `tests/<area>_<topic>.rs` is a module, so a test's full name is
//! `<area>_<topic>::<test>` (`cargo test -p cni-core --test integration
//! <area>_<topic>::`), and the workspace links one test binary per package
//! instead of one per file.

mod support;

mod cache_record;
mod confdir_error_chain;
mod confdir_lookup;
mod result_conversion;
mod result_errors;
mod result_properties;
mod stdin_building;
