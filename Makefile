# Two entry points for a fresh machine (see README.md):
#   make demo   runs the bundled example network end to end
#   make test   fmt check, clippy -D warnings, and the whole test suite
# Both install what they need first (as root: the reference CNI plugins,
# iproute2 and ping from Debian).

CARGO ?= cargo
PLUGIN_DIR ?= /usr/lib/cni

.PHONY: all setup demo test fmt-check lint unit build clean

all: test

# Installs the reference plugins (bridge, host-local, loopback, ptp, tuning,
# portmap, ...), iproute2 and ping when any is missing. Needs root.
setup:
	@if [ -x $(PLUGIN_DIR)/bridge ] && command -v ip >/dev/null && command -v ping >/dev/null; then \
		echo "setup: plugins in $(PLUGIN_DIR), ip and ping present"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "setup: need root to install containernetworking-plugins iproute2 iputils-ping" >&2; exit 1; \
	else \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq containernetworking-plugins iproute2 iputils-ping >/dev/null; \
	fi

build:
	$(CARGO) build --workspace --all-targets

demo: setup
	$(CARGO) run -q -p cni-examples --bin show-stdin -- examples/net.d

fmt-check:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --all-targets --all-features
	$(CARGO) test --workspace --doc --all-features

test: setup fmt-check lint unit

clean:
	$(CARGO) clean
