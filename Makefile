# Two entry points for a fresh machine (see README.md):
#   make demo   cnid and the bundled example network end to end
#   make test   fmt check, clippy -D warnings, the whole test suite, a fuzz smoke run
# Both install what they need first (as root: the reference CNI plugins,
# iproute2, ping and curl from Debian).

CARGO ?= cargo
PLUGIN_DIR ?= /usr/lib/cni

.PHONY: all help setup demo test fmt-check lint lint-deploy unit build shim clean fuzz-install fuzz-build fuzz-smoke fuzz soak stress bench bench-cri deploy-check

all: test ## = make test

# Each target with its `## what it does`, in the order of this file.
help: ## this list
	@echo "make TARGET (README.md: Install, More make targets):"
	@awk -F ':[^#]*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-14s %s\n", $$1, $$2 }' $(firstword $(MAKEFILE_LIST))

# Installs the reference plugins (bridge, host-local, loopback, ptp, tuning,
# portmap, ...), iproute2, ping and curl (the daemon tests talk to cnid's
# socket with it) when any is missing; and Go with the sources of Go's
# libcni and containerd's go-cni, from which the cnid-shim tests build real
# runtime clients (GOPATH mode, no module downloads). Needs root.
GOCODE = /usr/share/gocode/src/github.com
# jq: the README's batch snippet, which cnid/tests/readme_snippets.rs runs.
# python3-venv: make deploy-check's venv.
# e2fsprogs, mount: the crash tests that mount an ext4 image of their own
# (mkfs.ext4, dumpe2fs, losetup).
SETUP_PACKAGES = containernetworking-plugins iproute2 iputils-ping curl jq golang-go golang-github-appc-cni-dev golang-github-containerd-go-cni-dev python3-venv e2fsprogs mount
setup: ## install the reference plugins, iproute2, ping, curl, jq, Go and libcni sources when missing (root)
	@if [ -x $(PLUGIN_DIR)/bridge ] && command -v ip >/dev/null && command -v ping >/dev/null && command -v curl >/dev/null && command -v jq >/dev/null \
		&& command -v mkfs.ext4 >/dev/null && command -v dumpe2fs >/dev/null && command -v losetup >/dev/null \
		&& python3 -c 'import venv, ensurepip' 2>/dev/null \
		&& command -v go >/dev/null && [ -d $(GOCODE)/containernetworking/cni/libcni ] && [ -d $(GOCODE)/containerd/go-cni ]; then \
		echo "setup: plugins in $(PLUGIN_DIR), ip, ping, curl, jq, mkfs.ext4, losetup, python3 venv, go, libcni and go-cni present"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "setup: need root to install $(SETUP_PACKAGES)" >&2; exit 1; \
	else \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $(SETUP_PACKAGES) >/dev/null; \
	fi

build: ## cargo build of the whole workspace, every target
	$(CARGO) build --workspace --all-targets

# cnid-shim as shipped: statically linked (glibc, crt-static), so that the
# copy `cnid-shim install` puts into a node's plugin dir runs whatever the
# host's libc, and starts without the dynamic loader (BENCHMARKS.md). Only
# this binary: the flags apply to the --target build alone.
HOST_TARGET = $(shell rustc -vV | sed -n 's/^host: //p')
SHIM_STATIC = $(abspath $(or $(CARGO_TARGET_DIR),target))/$(HOST_TARGET)/release/cnid-shim
shim: ## cnid-shim as shipped: statically linked, in target/<host>/release/
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p cnid-shim --bin cnid-shim --target $(HOST_TARGET)
	@echo "shim: $(SHIM_STATIC)"

# cnid on a temporary socket with the bundled networks, two namespaces
# attached through it, pinged, listed, torn down (examples/src/bin/demo.rs).
# The demo finds cnid next to itself in the target dir.
demo: setup ## cnid with the bundled networks end to end: two namespaces attached, pinged, torn down
	$(CARGO) build -q -p cnid --bin cnid -p cni-examples --bin demo
	$(CARGO) run -q -p cni-examples --bin demo

fmt-check: ## cargo fmt --check
	$(CARGO) fmt --all -- --check

lint: ## clippy -D warnings (with and without all features) and rustdoc -D warnings
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features

# CNIRS_TEST_REQUIRE_ROOT=1: a root-only test fails rather than skips when
# this is not run as root (cni-async/testsupport/src/lib.rs).
# The binaries first: tests run the binaries of other packages (cnitool,
# cni-noop) found next to cnid's, which `cargo test` alone does not build.
# RUST_TEST_THREADS: two test threads per CPU. Most tests wait (on plugin
# processes, deadlines, namespaces, a daemon's answer), not compute: cnid's
# integration binary ran in 96 s with 4 threads against 127 s with 2 (2
# CPUs, a busy machine, one paired run); the suite must pass at any count
# (make stress runs two suites at once).
# A plain `cargo test`, not --all-targets: the libraries, the integration
# binaries, the binaries that have tests of their own, the benchmarks (run
# once each, `test = true`) and the doc tests, in one command. The binaries
# marked `test = false` have no tests in their own files; --all-targets
# would compile and link an empty test harness for each.
RUST_TEST_THREADS ?= $(shell echo $$(( $$(nproc) * 2 )))
unit: ## the whole test suite (root: nothing skipped), two test threads per CPU
	$(CARGO) build --workspace --bins --all-features
	CNIRS_TEST_REQUIRE_ROOT=1 RUST_TEST_THREADS=$(RUST_TEST_THREADS) $(CARGO) test --workspace --all-features

# fuzz-smoke last: 10 s per parser target (cargo-fuzz is installed if missing).
# lint and deploy-check run at the same time (lint-deploy): deploy-check
# mostly waits on PyPI for its venv (26 s on a fresh clone), lint on the CPU.
# CARGO_INCREMENTAL=0 (unless set): incremental compilation keeps state for
# the next edit, which costs a one-off build: a fresh `cargo test --no-run`
# of the workspace crates took 153 s of CPU without it against 201 s with
# it (BENCHMARKS.md, "The suite's cost"). `cargo test` after `make test`
# rebuilds the workspace crates once, incrementally; the reverse does not.
test: export CARGO_INCREMENTAL ?= 0
test: setup fmt-check lint-deploy unit fuzz-smoke ## setup, fmt check, lint, deploy-check, the whole suite, a fuzz smoke run

lint-deploy: ## lint and deploy-check at the same time
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint deploy-check

# The DaemonSet (cnid/contrib/kubernetes/cnid.yaml) against Kubernetes' own
# schema, strictly (unknown fields refused), for the oldest supported minor
# and the current one, with kubernetes-validate (PyPI; Debian has none) in
# a venv of its own in the target dir; then the Containerfile linted for
# what the DaemonSet runs and what it builds, and the DaemonSet for where
# cnid runs: the host's PIDs and netns dir (lint.py, with its self-test).
K8S_VERSIONS ?= 1.29.0 1.37.0
KUBERNETES_VALIDATE_VERSION ?= 1.37.0
DEPLOY_VENV = $(abspath $(or $(CARGO_TARGET_DIR),target))/deploy-check-venv
deploy-check: ## the DaemonSet against Kubernetes' schema (strict), the Containerfile linted
	@$(DEPLOY_VENV)/bin/kubernetes-validate --version 2>/dev/null | grep -qx '$(KUBERNETES_VALIDATE_VERSION)' \
		|| { rm -rf $(DEPLOY_VENV) && python3 -m venv $(DEPLOY_VENV) \
			&& $(DEPLOY_VENV)/bin/pip install -q --disable-pip-version-check kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION); }
	@for k in $(K8S_VERSIONS); do \
		$(DEPLOY_VENV)/bin/kubernetes-validate --strict --quiet -k $$k cnid/contrib/kubernetes/cnid.yaml || exit 1; \
		echo "deploy-check: cnid.yaml valid (strict) for Kubernetes $$k"; \
	done
	@# Strict really is: a misspelt field is refused.
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	sed 's/^\( *\)hostNetwork: true/&\n\1hostNetworks: true/' cnid/contrib/kubernetes/cnid.yaml > "$$tmp/typo.yaml"; \
	grep -q hostNetworks "$$tmp/typo.yaml"; \
	if $(DEPLOY_VENV)/bin/kubernetes-validate --strict --quiet "$$tmp/typo.yaml" >/dev/null 2>&1; then \
		echo "deploy-check: a misspelt field passed the strict check" >&2; exit 1; fi
	@$(DEPLOY_VENV)/bin/python cnid/contrib/kubernetes/lint.py --self-test >/dev/null
	@$(DEPLOY_VENV)/bin/python cnid/contrib/kubernetes/lint.py

# The long runs at full size (make test runs them reduced): the crash soak
# (300 operations over 30 containers on the real bridge, 10 kill -9 of cnid;
# SOAK_SEED=0x... replays one), the restart soak (200 rounds of 6 ADDs on
# the real bridge + host-local, kill -9 of cnid inside plugins and while it
# waits for orphans, immediate restarts, every DEL sent at once and
# answered 2xx, no reservation left), the load test (2,000 requests from 200 clients) and the journal's
# crash-point enumeration with every first start killed in its turn too,
# and every restart after a kill -9 killed in its turn before a power loss
# (cnid/src/daemon/intents/tests/crash_points.rs; the soak profile: the dev one,
# optimised, one thread per CPU). Prints their figures;
# docs/reliability.md keeps the last ones.
soak: setup ## the crash and restart soaks, the load test and the crash enumeration at full size
	SOAK_SCALE=full $(CARGO) test -p cnid --test integration -- --nocapture soak_crash:: soak_restart:: load::
	CNID_CRASH_EXHAUSTIVE=1 $(CARGO) test --profile soak -p cnid --lib -- --nocapture intents::tests::crash_points::

# The suite on a busy machine, as developers run it before they stop: this
# checkout's suite (make unit) while a second copy of it runs from another
# clone with its own target dir (target/stress, kept between runs), the demo
# runs in a loop on the host's own bundled network, and STRESS_BURNERS (2)
# CPU burners and a fork-and-exec loop run (cni-async/testsupport/stress.sh).
# Both suites must pass. Needs root, like make test.
stress: setup ## the suite beside a second copy of it, the demo in a loop and CPU burners
	CARGO="$(CARGO)" cni-async/testsupport/stress.sh

clean: ## cargo clean
	$(CARGO) clean

# Fuzzing (cargo fuzz, libFuzzer) of every parser of outside input, in two
# fuzz crates beside what they fuzz: cni-core/fuzz (configs, results,
# version replies, CNI_ARGS, cache records) and cnid/api/fuzz (cnid's
# request decoding); seeds in <crate>/corpus/<target>.
#   make fuzz-smoke   each target for FUZZ_SMOKE_SECONDS (10); fails on a crash
#   make fuzz         each target for FUZZ_SECONDS (600); prints exec counts
# Runs use scratch copies of the seeds (cni-core/fuzz/run.sh, which finds
# each target's crate), so the corpus in git never grows; crash inputs land
# in <crate>/artifacts/.
# cargo-fuzz needs a nightly flag (-Zsanitizer); RUSTC_BOOTSTRAP=1 lets the
# stable toolchain build it. FUZZ_SANITIZER=none runs 4-10x more inputs than
# address (our code has no unsafe); address hunts memory errors in deps.
FUZZ_DIRS = cni-core/fuzz cnid/api/fuzz
FUZZ_TARGETS ?= conflist result version_reply cni_args cache_record daemon_request
FUZZ_SMOKE_SECONDS ?= 10
FUZZ_SECONDS ?= 600
FUZZ_JOBS ?= 2
FUZZ_SANITIZER ?= none
CARGO_FUZZ_VERSION ?= 0.13.2
# One target dir for both fuzz crates (same flags, same lock versions): the
# dependencies they share (cni-core, serde_json, libfuzzer-sys) build once.
FUZZ_TARGET_DIR ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/fuzz
FUZZ_FLAGS = -O -a -s $(FUZZ_SANITIZER) --target-dir $(FUZZ_TARGET_DIR)
# libFuzzer itself (C++) prebuilt: libfuzzer-sys compiles it from source
# otherwise, about 65 s of CPU, the largest single part of a fresh
# fuzz-build. Debian's libfuzzer-N-dev of the LLVM major rustc is built on
# (fuzz-install installs it when apt has it; else libfuzzer-sys builds its
# own, as before). The same variable must reach `cargo fuzz run`, or it
# would rebuild.
RUSTC_LLVM_MAJOR = $(shell rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
LIBFUZZER_A = /usr/lib/llvm-$(RUSTC_LLVM_MAJOR)/lib/libFuzzer.a
FUZZ_ENV = RUSTC_BOOTSTRAP=1 $(if $(wildcard $(LIBFUZZER_A)),CUSTOM_LIBFUZZER_PATH=$(LIBFUZZER_A))
FUZZ_RUN = $(FUZZ_ENV) CARGO="$(CARGO)" FUZZ_FLAGS="$(FUZZ_FLAGS)" FUZZ_JOBS=$(FUZZ_JOBS) FUZZ_DIRS="$(FUZZ_DIRS)" cni-core/fuzz/run.sh

fuzz-install: ## cargo-fuzz (and Debian's prebuilt libFuzzer) when missing
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked --version $(CARGO_FUZZ_VERSION)
	@[ -f $(LIBFUZZER_A) ] || [ "$$(id -u)" != 0 ] \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuzzer-$(RUSTC_LLVM_MAJOR)-dev >/dev/null 2>&1 \
		|| echo "fuzz-install: no libfuzzer-$(RUSTC_LLVM_MAJOR)-dev from apt; libfuzzer-sys builds libFuzzer itself"

fuzz-build: fuzz-install ## build every fuzz target
	cd cni-core && $(FUZZ_ENV) $(CARGO) fuzz build $(FUZZ_FLAGS)
	cd cnid/api && $(FUZZ_ENV) $(CARGO) fuzz build $(FUZZ_FLAGS)

fuzz-smoke: fuzz-build ## each fuzz target for FUZZ_SMOKE_SECONDS (10)
	$(FUZZ_RUN) $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

fuzz: fuzz-build ## each fuzz target for FUZZ_SECONDS (600)
	$(FUZZ_RUN) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# Benchmarks (never part of `make test`, which only compiles them): cni-core's
# criterion micro-benchmarks, then cnid/benches/overhead, which measures the
# runtimes (in-process, cnitool, cnid) against the floor, and what cnid-shim
# adds to a direct cnid request (the static build, `make shim`), on the binaries as
# shipped (`cargo build --release`, copied aside: a `cargo bench` build of
# them would carry the dev-dependencies' features). Writes
# $(BENCH_TARGET)/bench/overhead.md and the generated part of BENCHMARKS.md.
# Root for the real-chain and batch scenarios. About 3 minutes of measuring
# on 2 CPUs, plus the build. BENCH_FLAGS=--quick for a smoke run.
# Go's cnitool (on libcni, cnid/tests/go/cnitool) runs in the same noop
# loops and start-up run; `setup` installs Go and libcni's source.
#
# cnitool is measured statically linked (glibc, crt-static: static-pie), as
# cnid-shim ships: no dynamic loader, no symbol lookups, no libgcc_s probe,
# 0.45 ms less per run here (BENCHMARKS.md, "One cnitool ADD"). It uses no
# NSS (no getpwnam, getaddrinfo): the link gives no warning. cnid stays
# dynamic (--group resolves a group name through NSS). The flag applies to
# the --target build only, so build scripts and proc macros are unaffected.
# BENCH_CNITOOL_STATIC= (empty) measures the dynamic cnitool and cni-noop instead.
# The noop loops' plugin is cni-noop built the same way (static: no dynamic
# loader, 0.34 ms less per plugin run, as cheap as a static C program);
# beside it, the static C noop (cnid/benches/noop/c/noop.c, built with
# $(CC) -static when there is one) and the dynamic cni-noop are measured
# in the plugin's own-run table, and Go's cnitool against ours also runs
# with the C noop as the plugin (a plugin that costs only a process start,
# so the tools' own cost shows). The floor also runs as a
# process, the static C driver (cnid/benches/overhead/floor_driver.c, built
# the same way as cni-floor-c): cnitool's ratio to the floor (≤ 2.5x for
# one plugin, ≤ 1.8x for eight) is judged against it, as it too pays for
# a process start.
# cnid-shim's start-up is measured against an empty static C program
# (cnid/benches/overhead/empty.c, built the same way as cni-empty-c).
# The scale section (cnid with 0, 1,000 and 10,000 attachments in its
# cache and journal; goals at 10,000: ready ≤ 1 s, RSS ≤ 64 MiB,
# admission ≤ 0.1 ms) takes 1–3 minutes with a baseline
# on a 2-CPU machine, most of it the GCs of 10,000 attachments
# (BENCHMARKS.md); it runs another cnid build alongside when
# BENCH_SCALE_BASELINE names its binary (before/after).
# The batch1000 section (1,000 namespaces on the real
# chain through `cnitool batch up|down`, against a loop of Go's cnitool and
# the floor, at concurrency 1, 4 and 8) takes about 10 minutes here;
# BENCH_FLAGS="--only batch1000 --batch1000-count 100" runs a quick one.
# The burst section (containerd's go-cni setting up 100 sandboxes
# at concurrency 16 and 32 through cnid-shim into cnid, against go-cni
# straight on bridge + host-local + portmap, paired rounds) takes 5–10
# minutes on a busy 2-CPU machine; BENCH_FLAGS="--only burst" runs it alone
# (after the build and the criterion part; `cargo bench -p cnid --bench
# overhead -- --only burst --bin-dir DIR` skips those).
# The hop section runs only when BENCH_HOP_BASELINE names another cnid
# build: it alternates with ours in one loop (a change to cnid may add at
# most +0.05 ms to the ADD hop).
# The trace section (about 2 minutes) runs one cnid for a client sending a
# W3C traceparent and one sending none, alternating in one loop
# (BENCH_FLAGS="--only trace" alone).
BENCH_TARGET ?= $(abspath $(or $(CARGO_TARGET_DIR),target))
BENCH_FLAGS ?=
BENCH_SCALE_BASELINE ?=
BENCH_HOP_BASELINE ?=
BENCH_CNITOOL_STATIC ?= 1
STATIC_RUSTFLAGS = -C target-feature=+crt-static

bench: setup shim ## the benchmarks; writes the tables of BENCHMARKS.md (root)
	@[ -x /usr/bin/time ] || { [ "$$(id -u)" = 0 ] && export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && apt-get install -y -qq time >/dev/null; } || { echo "bench: need GNU time (apt-get install time)" >&2; exit 1; }
	$(CARGO) build --release -p cnid -p cnitool --bins -p cni-noop
	mkdir -p $(BENCH_TARGET)/bench/bin
	cp $(BENCH_TARGET)/release/cnitool $(BENCH_TARGET)/release/cnid $(BENCH_TARGET)/release/cni-noop $(BENCH_TARGET)/bench/bin/
	cp $(BENCH_TARGET)/release/cni-noop $(BENCH_TARGET)/bench/bin/cni-noop-dynamic
	if [ -n "$(BENCH_CNITOOL_STATIC)" ]; then \
		RUSTFLAGS="$(STATIC_RUSTFLAGS)" $(CARGO) build --release -p cnitool -p cni-noop --bins --target $(HOST_TARGET) && \
		cp $(BENCH_TARGET)/$(HOST_TARGET)/release/cnitool $(BENCH_TARGET)/$(HOST_TARGET)/release/cni-noop $(BENCH_TARGET)/bench/bin/; \
	fi
	rm -f $(BENCH_TARGET)/bench/bin/cni-noop-c
	if command -v $(CC) >/dev/null && $(CC) -O2 -static -o $(BENCH_TARGET)/bench/bin/cni-noop-c cnid/benches/noop/c/noop.c; then :; \
	else echo "bench: no static C noop ($(CC) -static failed): its rows are skipped" >&2; fi
	rm -f $(BENCH_TARGET)/bench/bin/cni-empty-c
	if command -v $(CC) >/dev/null && $(CC) -O2 -static -o $(BENCH_TARGET)/bench/bin/cni-empty-c cnid/benches/overhead/empty.c; then :; \
	else echo "bench: no static empty C program ($(CC) -static failed): the shim start-up rows are skipped" >&2; fi
	rm -f $(BENCH_TARGET)/bench/bin/cni-floor-c
	if command -v $(CC) >/dev/null && $(CC) -O2 -static -o $(BENCH_TARGET)/bench/bin/cni-floor-c cnid/benches/overhead/floor_driver.c; then :; \
	else echo "bench: no static C driver ($(CC) -static failed): goal 2 is judged against the in-process floor" >&2; fi
	cp $(SHIM_STATIC) $(BENCH_TARGET)/bench/bin/cnid-shim
	$(CARGO) bench -p cni-core --bench core -- --warm-up-time 1 --measurement-time 3 --noplot
	$(CARGO) bench -p cnid --bench overhead -- --bin-dir $(BENCH_TARGET)/bench/bin --update $(CURDIR)/BENCHMARKS.md $(if $(BENCH_SCALE_BASELINE),--scale-baseline $(BENCH_SCALE_BASELINE)) $(if $(BENCH_HOP_BASELINE),--hop-baseline $(BENCH_HOP_BASELINE)) $(BENCH_FLAGS)

# Pod sandboxes through containerd's CRI API (cnid/benches/cri): 100 per
# round at concurrency 16 and 32, RunPodSandbox then StopPodSandbox +
# RemovePodSandbox, via cnid-shim into cnid against the chain straight in
# containerd's conf dir, paired rounds (BENCHMARKS.md). Installs containerd
# and runc with apt-get when missing (root). A containerd, cnid, bridge and
# subnet of the run's own; the sandbox image is built locally (no
# registry). Release cnid and a dynamically linked release cnid-shim, as
# the burst section runs them. About 15 minutes with the defaults on a busy
# 2-CPU machine; BENCH_CRI_FLAGS="--concurrency 16 --reps 1" runs a quick one,
# BENCH_CRI_FLAGS="--paced 4" adds a second cnid (--plugin-slots 4) as a
# third way in the same repetitions; with "--cnid-args=--plugin-slots=0"
# the first cnid runs unpaced (cnid paces by default).
BENCH_CRI_FLAGS ?=
bench-cri: setup ## containerd's CRI: pod sandboxes via cnid against direct (root; installs containerd, runc)
	@if command -v containerd >/dev/null && command -v ctr >/dev/null && command -v runc >/dev/null; then :; \
	elif [ "$$(id -u)" != 0 ]; then echo "bench-cri: need root to install containerd and runc" >&2; exit 1; \
	else export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq containerd runc >/dev/null; fi
	$(CARGO) build --release -p cnid --bin cnid -p cnid-shim --bin cnid-shim -p cni-bench-cri --bin cni-bench-cri
	$(BENCH_TARGET)/release/cni-bench-cri --cnid $(BENCH_TARGET)/release/cnid --shim $(BENCH_TARGET)/release/cnid-shim $(BENCH_CRI_FLAGS)

# ---- install / uninstall ---------------------------------------------------
# `make install` builds the shipped binaries (release profile; cnid-shim
# statically linked, as `make shim`) and installs, under $(DESTDIR)$(PREFIX):
#   bin/                 cnid; cnitool (one file, statically linked as
#                        benchmarked); cnid-shim, a command an
#                        operator runs (`cnid-shim install` copies it into
#                        the runtime's plugin dir, e.g. /opt/cni/bin)
#   lib/systemd/system/  cnid.service (ExecStart= the installed cnid) and
#                        cnid.socket
#   share/man/           man8/cnid.8, man1/cnitool.1, man1/cnid-shim.1
#   share/bash-completion/completions, share/zsh/site-functions,
#   share/fish/vendor_completions.d: completions of cnid and cnitool
#   share/doc/cnid/      API.md, LICENSE
# Man pages and completions are printed by the installed binaries from
# their clap definitions (hidden `--generate`, cnid/cli/src/generate.rs). Not
# installed: cni-noop (benchmark plugin), the examples, test binaries.
# INSTALL_FROM=DIR installs the binaries found in DIR instead of building
# (the tests install target/debug; a dynamically linked cnitool or
# cnid-shim there is warned about); `make uninstall` with the same
# DESTDIR/PREFIX/... removes every file `make install` put there and the
# dirs it created (share/doc/cnid/installed-dirs lists them). Neither
# touches cnid's state (/var/lib/cnid, /run/cnid) or cache (README).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
DOCDIR ?= $(DATADIR)/doc/cnid
UNITDIR ?= $(PREFIX)/lib/systemd/system
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
ZSHCOMPDIR ?= $(DATADIR)/zsh/site-functions
FISHCOMPDIR ?= $(DATADIR)/fish/vendor_completions.d
INSTALL_FROM ?=
INSTALL ?= install

INSTALL_BINS = cnid cnitool cnid-shim
# NAME:SECTION (cnid is a daemon: section 8).
INSTALL_MAN = cnid:8 cnitool:1 cnid-shim:1
INSTALL_COMPLETE = cnid cnitool
INSTALL_UNITS = cnid.service cnid.socket
INSTALL_DOCS = cnid/API.md LICENSE
INSTALLED_FILES = $(addprefix $(BINDIR)/,$(INSTALL_BINS)) \
	$(foreach m,$(INSTALL_MAN),$(MANDIR)/man$(lastword $(subst :, ,$(m)))/$(subst :,.,$(m))) \
	$(addprefix $(BASHCOMPDIR)/,$(INSTALL_COMPLETE)) \
	$(patsubst %,$(ZSHCOMPDIR)/_%,$(INSTALL_COMPLETE)) \
	$(patsubst %,$(FISHCOMPDIR)/%.fish,$(INSTALL_COMPLETE)) \
	$(addprefix $(UNITDIR)/,$(INSTALL_UNITS)) \
	$(addprefix $(DOCDIR)/,$(notdir $(INSTALL_DOCS)))

# The dirs install puts files in; those it had to create are listed in
# INSTALLED_DIRS_LIST (kept across installs), for uninstall.
INSTALL_DIRS = $(BINDIR) $(MANDIR)/man1 $(MANDIR)/man8 $(UNITDIR) $(DOCDIR) $(BASHCOMPDIR) $(ZSHCOMPDIR) $(FISHCOMPDIR)
INSTALLED_DIRS_LIST = $(DOCDIR)/installed-dirs

# Where the binaries come from: INSTALL_FROM, or the release build.
INSTALL_SRC = $(if $(INSTALL_FROM),$(INSTALL_FROM),$(abspath $(or $(CARGO_TARGET_DIR),target))/release)
INSTALL_SHIM = $(if $(INSTALL_FROM),$(INSTALL_FROM)/cnid-shim,$(SHIM_STATIC))
CNITOOL_STATIC = $(abspath $(or $(CARGO_TARGET_DIR),target))/$(HOST_TARGET)/release/cnitool
INSTALL_CNITOOL = $(if $(INSTALL_FROM),$(INSTALL_FROM)/cnitool,$(CNITOOL_STATIC))

.PHONY: install uninstall install-build
# Two cargo builds, not three: cnid dynamic (NSS for --group), with
# --workspace (the features a workspace release build resolved, so that
# build is reused; `-p cnid` resolves them differently and rebuilt cnid and
# its dependencies); cnitool and cnid-shim statically linked, in one
# build: one compile of the dependencies they share (as two builds, each
# package's own feature set compiled them twice: cnitool's tokio and nix
# have features the shim's have not (signal; inotify), and so every crate
# above them differed). The shim built so has the same size
# as built alone (4,156,680 bytes): what it does not call is not linked.
install-build: ## the release binaries make install installs (two cargo builds)
	$(if $(INSTALL_FROM),,$(CARGO) build --release --workspace --bin cnid)
	$(if $(INSTALL_FROM),,RUSTFLAGS="$(STATIC_RUSTFLAGS)" $(CARGO) build --release -p cnitool --bin cnitool -p cnid-shim --bin cnid-shim --target $(HOST_TARGET))

install: install-build ## install cnid, cnitool, cnid-shim, units, man pages, completions under PREFIX
	@for b in cnid; do [ -x "$(INSTALL_SRC)/$$b" ] || { echo "install: $(INSTALL_SRC)/$$b is missing" >&2; exit 1; }; done
	@for f in "$(INSTALL_CNITOOL)" "$(INSTALL_SHIM)"; do [ -x "$$f" ] || { echo "install: $$f is missing" >&2; exit 1; }; done
	@for f in "$(INSTALL_CNITOOL)" "$(INSTALL_SHIM)"; do \
		if ! command -v readelf >/dev/null; then echo "install: warning: readelf missing, cannot check that $$f is statically linked" >&2; \
		elif readelf -l "$$f" | grep -q 'program interpreter'; then \
			echo "install: warning: $$f is dynamically linked (make install without INSTALL_FROM builds it statically, as the README says)" >&2; fi; \
	done
	@set -e; new=$$(for d in $(INSTALL_DIRS); do \
		while [ "$$d" != / ] && [ "$$d" != . ] && [ ! -e "$(DESTDIR)$$d" ]; do echo "$$d"; d=$$(dirname "$$d"); done; \
	done); \
	$(INSTALL) -d -m 755 $(addprefix $(DESTDIR),$(INSTALL_DIRS)); \
	{ cat "$(DESTDIR)$(INSTALLED_DIRS_LIST)" 2>/dev/null || true; [ -z "$$new" ] || echo "$$new"; } | sort -u > "$(DESTDIR)$(INSTALLED_DIRS_LIST).new"; \
	mv "$(DESTDIR)$(INSTALLED_DIRS_LIST).new" "$(DESTDIR)$(INSTALLED_DIRS_LIST)"; chmod 644 "$(DESTDIR)$(INSTALLED_DIRS_LIST)"
	$(INSTALL) -m 755 $(INSTALL_SRC)/cnid $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 755 $(INSTALL_CNITOOL) $(DESTDIR)$(BINDIR)/cnitool
	$(INSTALL) -m 755 $(INSTALL_SHIM) $(DESTDIR)$(BINDIR)/cnid-shim
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for m in $(INSTALL_MAN); do \
		b=$${m%:*}; sec=$${m#*:}; \
		"$(DESTDIR)$(BINDIR)/$$b" --generate man > "$$tmp/$$b.$$sec"; \
		$(INSTALL) -m 644 "$$tmp/$$b.$$sec" $(DESTDIR)$(MANDIR)/man$$sec/; \
	done; \
	for b in $(INSTALL_COMPLETE); do \
		"$(DESTDIR)$(BINDIR)/$$b" --generate complete-bash > "$$tmp/$$b"; \
		"$(DESTDIR)$(BINDIR)/$$b" --generate complete-zsh > "$$tmp/_$$b"; \
		"$(DESTDIR)$(BINDIR)/$$b" --generate complete-fish > "$$tmp/$$b.fish"; \
		$(INSTALL) -m 644 "$$tmp/$$b" $(DESTDIR)$(BASHCOMPDIR)/; \
		$(INSTALL) -m 644 "$$tmp/_$$b" $(DESTDIR)$(ZSHCOMPDIR)/; \
		$(INSTALL) -m 644 "$$tmp/$$b.fish" $(DESTDIR)$(FISHCOMPDIR)/; \
	done; \
	for u in $(INSTALL_UNITS); do \
		sed -e 's|/usr/bin/cnid|$(BINDIR)/cnid|g' -e 's|/usr/share/doc/cnid/|$(DOCDIR)/|g' \
			cnid/contrib/systemd/$$u > "$$tmp/$$u"; \
		$(INSTALL) -m 644 "$$tmp/$$u" $(DESTDIR)$(UNITDIR)/; \
	done; \
	grep -q '^ExecStart=$(BINDIR)/cnid ' $(DESTDIR)$(UNITDIR)/cnid.service \
		|| { echo "install: cnid.service does not start $(BINDIR)/cnid (cnid/contrib/systemd/cnid.service changed?)" >&2; exit 1; }
	$(INSTALL) -m 644 $(INSTALL_DOCS) $(DESTDIR)$(DOCDIR)/
	@echo "install: cnid, cnitool and cnid-shim in $(DESTDIR)$(BINDIR); units in $(DESTDIR)$(UNITDIR) (systemctl daemon-reload)"

# The dirs install created (listed in INSTALLED_DIRS_LIST) go too, deepest
# first, each only when empty; dirs that were there before stay.
uninstall: ## remove what install put there (same variables)
	rm -f $(addprefix $(DESTDIR),$(INSTALLED_FILES))
	@set -e; list="$(DESTDIR)$(INSTALLED_DIRS_LIST)"; \
	dirs=$$(sort -r "$$list" 2>/dev/null || true); rm -f "$$list"; \
	for d in $$dirs $(DOCDIR); do rmdir "$(DESTDIR)$$d" 2>/dev/null || true; done
