# Two entry points for a fresh machine (see README.md):
#   make demo   cnid and the bundled example network end to end
#   make test   fmt check, clippy -D warnings, the whole test suite, a fuzz smoke run
# Both install what they need first (as root: the reference CNI plugins,
# iproute2, ping and curl from Debian).

CARGO ?= cargo
PLUGIN_DIR ?= /usr/lib/cni

.PHONY: all setup demo test fmt-check lint unit build shim clean fuzz-install fuzz-build fuzz-smoke fuzz soak bench

all: test

# Installs the reference plugins (bridge, host-local, loopback, ptp, tuning,
# portmap, ...), iproute2, ping and curl (the daemon tests talk to cnid's
# socket with it) when any is missing; and Go with the sources of Go's
# libcni and containerd's go-cni, from which the cnid-shim tests build real
# runtime clients (GOPATH mode, no module downloads). Needs root.
GOCODE = /usr/share/gocode/src/github.com
SETUP_PACKAGES = containernetworking-plugins iproute2 iputils-ping curl golang-go golang-github-appc-cni-dev golang-github-containerd-go-cni-dev
setup:
	@if [ -x $(PLUGIN_DIR)/bridge ] && command -v ip >/dev/null && command -v ping >/dev/null && command -v curl >/dev/null \
		&& command -v go >/dev/null && [ -d $(GOCODE)/containernetworking/cni/libcni ] && [ -d $(GOCODE)/containerd/go-cni ]; then \
		echo "setup: plugins in $(PLUGIN_DIR), ip, ping, curl, go, libcni and go-cni present"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "setup: need root to install $(SETUP_PACKAGES)" >&2; exit 1; \
	else \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $(SETUP_PACKAGES) >/dev/null; \
	fi

build:
	$(CARGO) build --workspace --all-targets

# cnid-shim as shipped: statically linked (glibc, crt-static), so that the
# copy `cnid-shim install` puts into a node's plugin dir runs whatever the
# host's libc, and starts without the dynamic loader (BENCHMARKS.md). Only
# this binary: the flags apply to the --target build alone.
HOST_TARGET = $(shell rustc -vV | sed -n 's/^host: //p')
SHIM_STATIC = $(abspath $(or $(CARGO_TARGET_DIR),target))/$(HOST_TARGET)/release/cnid-shim
shim:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release -p cnid --bin cnid-shim --target $(HOST_TARGET)
	@echo "shim: $(SHIM_STATIC)"

# cnid on a temporary socket with the bundled networks, two namespaces
# attached through it, pinged, listed, torn down (examples/src/bin/demo.rs).
# The demo finds cnid next to itself in the target dir.
demo: setup
	$(CARGO) build -q -p cnid --bin cnid -p cni-examples --bin demo
	$(CARGO) run -q -p cni-examples --bin demo

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --all-features

unit:
	$(CARGO) test --workspace --all-targets --all-features
	$(CARGO) test --workspace --doc --all-features

# fuzz-smoke last: 30 s per parser target (cargo-fuzz is installed if missing).
test: setup fmt-check lint unit fuzz-smoke

# The long runs at full size (make test runs them reduced): the crash soak
# (300 operations over 30 containers on the real bridge, 10 kill -9 of cnid;
# SOAK_SEED=0x... replays one) and the load test (2,000 requests from 200
# clients). Prints their figures; docs/reliability.md keeps the last ones.
soak: setup
	SOAK_SCALE=full $(CARGO) test -p cnid --test soak_crash --test load -- --nocapture

clean:
	$(CARGO) clean

# Fuzzing (cargo fuzz, libFuzzer) of every parser of outside input, in two
# fuzz crates beside what they fuzz: cni-core/fuzz (configs, results,
# version replies, CNI_ARGS, cache records) and cnid/api/fuzz (cnid's
# request decoding); seeds in <crate>/corpus/<target>.
#   make fuzz-smoke   each target for FUZZ_SMOKE_SECONDS (30); fails on a crash
#   make fuzz         each target for FUZZ_SECONDS (600); prints exec counts
# Runs use scratch copies of the seeds (cni-core/fuzz/run.sh, which finds
# each target's crate), so the corpus in git never grows; crash inputs land
# in <crate>/artifacts/.
# cargo-fuzz needs a nightly flag (-Zsanitizer); RUSTC_BOOTSTRAP=1 lets the
# stable toolchain build it. FUZZ_SANITIZER=none runs 4-10x more inputs than
# address (our code has no unsafe); address hunts memory errors in deps.
FUZZ_DIRS = cni-core/fuzz cnid/api/fuzz
FUZZ_TARGETS ?= conflist result version_reply cni_args cache_record daemon_request
FUZZ_SMOKE_SECONDS ?= 30
FUZZ_SECONDS ?= 600
FUZZ_JOBS ?= 2
FUZZ_SANITIZER ?= none
CARGO_FUZZ_VERSION ?= 0.13.2
FUZZ_FLAGS = -O -a -s $(FUZZ_SANITIZER)
FUZZ_RUN = CARGO="$(CARGO)" FUZZ_FLAGS="$(FUZZ_FLAGS)" FUZZ_JOBS=$(FUZZ_JOBS) FUZZ_DIRS="$(FUZZ_DIRS)" cni-core/fuzz/run.sh

fuzz-install:
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked --version $(CARGO_FUZZ_VERSION)

fuzz-build: fuzz-install
	cd cni-core && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz build $(FUZZ_FLAGS)
	cd cnid/api && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz build $(FUZZ_FLAGS)

fuzz-smoke: fuzz-build
	$(FUZZ_RUN) $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

fuzz: fuzz-build
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
BENCH_TARGET ?= $(abspath $(or $(CARGO_TARGET_DIR),target))
BENCH_FLAGS ?=

bench: setup shim
	@[ -x /usr/bin/time ] || { [ "$$(id -u)" = 0 ] && export DEBIAN_FRONTEND=noninteractive && apt-get update -qq && apt-get install -y -qq time >/dev/null; } || { echo "bench: need GNU time (apt-get install time)" >&2; exit 1; }
	$(CARGO) build --release -p cnid --bins
	mkdir -p $(BENCH_TARGET)/bench/bin
	cp $(BENCH_TARGET)/release/cnitool $(BENCH_TARGET)/release/cnid $(BENCH_TARGET)/release/cni-noop $(BENCH_TARGET)/bench/bin/
	cp $(SHIM_STATIC) $(BENCH_TARGET)/bench/bin/cnid-shim
	$(CARGO) bench -p cni-core --bench core -- --warm-up-time 1 --measurement-time 3 --noplot
	$(CARGO) bench -p cnid --bench overhead -- --bin-dir $(BENCH_TARGET)/bench/bin --update $(CURDIR)/BENCHMARKS.md $(BENCH_FLAGS)
