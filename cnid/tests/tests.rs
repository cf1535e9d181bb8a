//! cnid's integration tests, one binary (as ripgrep's `tests/tests.rs`):
//! each `tests/<area>_<topic>.rs` is a module, so a test's full name is
//! `<area>_<topic>::<test>` (`cargo test -p cnid --test integration
//! <area>_<topic>::`), and the workspace links one test binary per package
//! instead of one per file.

mod support;

mod attack_sandbox;
mod binaries_version;
mod cnitool_batch;
mod cnitool_commands;
mod cnitool_env;
mod cnitool_error_object;
mod cnitool_errors;
mod cnitool_exclusive;
mod cnitool_gc_failed;
mod cnitool_gc_stale;
mod cnitool_hints;
mod cnitool_ids;
mod cnitool_networks;
mod cnitool_non_root;
mod cnitool_ops;
mod cnitool_permission_hint;
mod cnitool_pipes;
mod cnitool_real;
mod cnitool_single_binary;
mod cnitool_socket;
mod cnitool_stderr;
mod cnitool_timeout;
mod cnitool_warnings;
mod daemon_bad_input;
mod daemon_commit;
mod daemon_commit_batched;
mod daemon_crash;
mod daemon_crash_interplay;
mod daemon_drain;
mod daemon_error_object;
mod daemon_flood;
mod daemon_gc;
mod daemon_gc_hardening;
mod daemon_lifecycle;
mod daemon_not_ready;
mod daemon_ordering;
mod daemon_orphans;
mod daemon_owner_claims;
mod daemon_owner_conflict;
mod daemon_paging;
mod daemon_plugin_errors;
mod daemon_plugin_stderr;
mod daemon_ready;
mod daemon_real;
mod daemon_reaper;
mod daemon_reaper_attack;
mod daemon_reaper_identity;
mod daemon_reload;
mod daemon_reload_last_good;
mod daemon_restart;
mod daemon_restart_answered;
mod daemon_sandbox;
mod daemon_sandbox_rollback;
mod daemon_self_loop;
mod fault_injection;
mod install;
mod load;
mod readme_snippets;
mod security_control_chars;
mod security_modes;
mod security_names;
mod security_netns;
mod security_socket;
mod security_symlinks;
mod shim_faults;
mod shim_go;
mod shim_setup;
mod soak_crash;
mod soak_restart;
