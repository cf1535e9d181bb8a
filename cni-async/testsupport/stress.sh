#!/usr/bin/env bash
# `make stress`: the whole suite on a busy machine, as developers run it
# before they stop. While this checkout's suite runs:
#   - a second copy of the suite runs at the same time, from another clone of
#     this checkout's HEAD with a target dir of its own (same host-global
#     names, same subnets, same /run/netns);
#   - a user runs the demo in a loop (the bundled network on the host itself:
#     bridge cnirs-br0, /run/netns, /var/lib/cni);
#   - STRESS_BURNERS processes burn CPU and one loop forks and execs
#     short-lived processes without pause.
# Both suites must pass. Both are built first, so that their test runs
# overlap. The second clone and its target dir are kept in STRESS_DIR
# (default target/stress), so a later run builds only what changed.
#
# Usage: cni-async/testsupport/stress.sh   (from the workspace root, as root)
set -uo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
CARGO=${CARGO:-cargo}
STRESS_DIR=${STRESS_DIR:-$root/target/stress}
STRESS_BURNERS=${STRESS_BURNERS:-2}
STRESS_DEMO=${STRESS_DEMO:-1}
second=$STRESS_DIR/second
logs=$STRESS_DIR/logs
mkdir -p "$logs"

say() { printf 'stress: %s\n' "$*" >&2; }

# The second copy: a clone of HEAD (what is committed), updated in place.
head=$(git rev-parse HEAD)
if [ -d "$second/.git" ]; then
	git -C "$second" fetch -q "$root" HEAD && git -C "$second" checkout -q --detach "$head" || exit 1
else
	git clone -q --no-hardlinks "$root" "$second" && git -C "$second" checkout -q --detach "$head" || exit 1
fi
say "second copy: $second at $(git -C "$second" rev-parse --short HEAD)"

unit() { # DIR: the suite as `make unit` runs it, in DIR with its own target dir
	(cd "$1" && CARGO_TARGET_DIR="$1/target" CNIRS_TEST_REQUIRE_ROOT=1 \
		"$CARGO" test --workspace --all-features --no-fail-fast)
}
build() {
	(cd "$1" && CARGO_TARGET_DIR="$1/target" "$CARGO" build -q --workspace --bins --all-features &&
		CARGO_TARGET_DIR="$1/target" "$CARGO" test -q --workspace --all-features --no-run)
}

say "building both copies"
build "$root" > "$logs/build-first.log" 2>&1 || { say "build of $root failed: $logs/build-first.log"; exit 1; }
build "$second" > "$logs/build-second.log" 2>&1 || { say "build of $second failed: $logs/build-second.log"; exit 1; }
if [ "$STRESS_DEMO" = 1 ]; then
	(cd "$second" && CARGO_TARGET_DIR="$second/target" "$CARGO" build -q -p cnid --bin cnid -p cni-examples --bin demo) \
		> "$logs/build-demo.log" 2>&1 || { say "build of the demo failed: $logs/build-demo.log"; exit 1; }
fi

pids=()
demo_pid=
stop=$logs/stop-demo
rm -f "$stop"
cleanup() {
	for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done
	# The demo finishes the run it is in (and tears it down) before it stops.
	if [ -n "$demo_pid" ]; then
		touch "$stop"
		wait "$demo_pid" 2>/dev/null
	fi
	wait 2>/dev/null
	pids=()
	demo_pid=
}
trap cleanup EXIT
set -m # each background job in a process group of its own, stopped whole

for _ in $(seq "$STRESS_BURNERS"); do
	(while :; do :; done) &
	pids+=($!)
done
(while :; do /bin/true; done) &
pids+=($!)
if [ "$STRESS_DEMO" = 1 ]; then
	(cd "$second" && i=0 && while [ ! -e "$stop" ]; do
		i=$((i + 1))
		echo "--- demo run $i"
		"$second/target/debug/demo" --cnid "$second/target/debug/cnid" || echo "demo run $i failed: exit $?"
	done) > "$logs/demo.log" 2>&1 &
	demo_pid=$!
fi

say "running both suites (logs in $logs)"
start=$(date +%s)
unit "$second" > "$logs/second.log" 2>&1 &
second_pid=$!
unit "$root" > "$logs/first.log" 2>&1
first_rc=$?
first_s=$(($(date +%s) - start))
wait "$second_pid"
second_rc=$?
second_s=$(($(date +%s) - start))
cleanup
trap - EXIT

demo_runs=$(grep -c '^--- demo run' "$logs/demo.log" 2>/dev/null)
demo_failed=$(grep -c '^demo run .* failed' "$logs/demo.log" 2>/dev/null)
result() { # NAME RC SECONDS LOG
	local passed failed
	passed=$(grep -Eo '[0-9]+ passed' "$4" | awk '{s += $1} END {print s + 0}')
	failed=$(grep -Eo '[0-9]+ failed' "$4" | awk '{s += $1} END {print s + 0}')
	say "$1: exit $2 in $3 s, $passed tests passed, $failed failed ($4)"
	[ "$2" = 0 ]
}
ok=0
result "this checkout's suite" "$first_rc" "$first_s" "$logs/first.log" || ok=1
result "the second copy's suite" "$second_rc" "$second_s" "$logs/second.log" || ok=1
[ "$STRESS_DEMO" = 1 ] && say "the demo ran ${demo_runs:-0} times beside them, ${demo_failed:-0} failed ($logs/demo.log)"
[ "$ok" = 0 ] && say "passed" || say "FAILED"
exit "$ok"
