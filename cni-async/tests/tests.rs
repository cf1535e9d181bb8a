//! cni-async's integration tests, one binary (as ripgrep's `tests/tests.rs`):
//! each `tests/<area>_<topic>.rs` is a module, so a test's full name is
//! `<area>_<topic>::<test>` (`cargo test -p cni-async --test integration
//! <area>_<topic>::`), and the workspace links one test binary per package
//! instead of one per file.
//!
//! Three files stay binaries of their own, since each needs a process to
//! itself: `exec_env` sets variables in our environment before any thread
//! exists, `exec_stderr` installs the process's global log subscriber, and
//! `exec_log_escaping` a thread-local one (which another test's callsites
//! could race with over tracing's interest cache).

mod support;

mod batch_adopt;
mod batch_bridge;
mod batch_options;
mod cache_handoffs;
mod cache_inline;
mod cache_layout;
mod cache_lock_files;
mod cache_locks;
mod cache_modes;
mod confwatch_error_chain;
mod confwatch_readiness;
mod confwatch_reload;
mod confwatch_symlink_swap;
mod error_chain;
mod exec_deadline;
mod exec_error_object;
mod exec_lookup;
mod exec_output;
mod exec_pipes;
mod exec_spawn;
mod exec_spawn_attack;
mod multi_bridge;
mod multi_concurrent;
mod multi_fake;
mod multi_runtime_real;
mod multi_sandbox;
mod multi_undo;
mod netns_lifecycle;
mod netns_rule;
mod netns_run;
mod netns_support;
mod ops_cache_faults;
mod ops_check_status;
mod ops_deadline;
mod ops_del_cache;
mod ops_error_context;
mod ops_exclusive;
mod ops_gc;
mod ops_gc_deadline;
mod ops_gc_failed;
mod ops_netns_check;
mod ops_output;
mod ops_readd_del;
mod ops_real_chain;
mod ops_rollback;
mod ops_rollback_existing;
mod ops_rollback_on_cancel;
mod ops_rollback_owner;
mod ops_single;
mod ops_stdin_env;
mod ops_trace;
mod ops_validation;
mod ops_with_record;
mod stale_attack;
mod stale_identity;
mod stale_scan;
