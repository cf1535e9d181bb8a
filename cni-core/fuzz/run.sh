#!/usr/bin/env bash
# Runs fuzz targets for a fixed time each, on scratch copies of the seed
# corpus (so the corpus in git never grows), and fails if any target finds a
# crash, a failed assertion or a hang. Used by `make fuzz-smoke` and `make fuzz`
# for the targets of both fuzz crates (cni-core/fuzz, cnid/api/fuzz).
#
# Usage: cni-core/fuzz/run.sh SECONDS TARGET...
# Environment:
#   CARGO       cargo to use (default: cargo)
#   FUZZ_FLAGS  flags for `cargo fuzz run` (default: -O -a -s none)
#   FUZZ_JOBS   targets run at once (default: 1); each is one process
#   FUZZ_DIRS   the fuzz crates whose targets may be named (default: this
#               script's dir); each target runs in the one that has
#               fuzz_targets/<target>.rs, with that crate's corpus and cni.dict
#
# Crash inputs are kept in <fuzz crate>/artifacts/<target>/ (git-ignored):
# reproduce one with `cargo fuzz run <target> <file>` in the crate's parent
# (cni-core/ or cnid/api/).
set -euo pipefail

seconds=${1:?usage: run.sh SECONDS TARGET...}
shift
[ "$#" -gt 0 ] || { echo "run.sh: no targets" >&2; exit 2; }
cargo=${CARGO:-cargo}
flags=${FUZZ_FLAGS:--O -a -s none}
jobs=${FUZZ_JOBS:-1}
here=$(cd "$(dirname "$0")" && pwd)
read -r -a dirs <<<"${FUZZ_DIRS:-$here}"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The fuzz crate that has target $1.
dir_of() {
    local d
    for d in "${dirs[@]}"; do
        if [ -f "$d/fuzz_targets/$1.rs" ]; then
            (cd "$d" && pwd)
            return
        fi
    done
    echo "run.sh: no fuzz target $1 in ${dirs[*]}" >&2
    return 1
}
for t in "$@"; do dir_of "$t" >/dev/null; done

run_one() {
    local t=$1 fuzz_dir
    fuzz_dir=$(dir_of "$t")
    cp -r "$fuzz_dir/corpus/$t" "$scratch/$t"
    # -timeout: an input that takes 10 s is a bug too (a hang).
    # shellcheck disable=SC2086 # flags are words
    (cd "$fuzz_dir/.." && RUSTC_BOOTSTRAP=1 "$cargo" fuzz run $flags "$t" "$scratch/$t" -- \
        -max_total_time="$seconds" -timeout=10 -dict="$fuzz_dir/cni.dict") >"$scratch/$t.log" 2>&1
}

report() {
    local t=$1 status=$2
    if [ "$status" -eq 0 ]; then
        echo "fuzz $t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$scratch/$t.log" || echo 'no stats')"
    else
        tail -n 40 "$scratch/$t.log"
        echo "fuzz $t: FAILED (exit $status)"
        failed="$failed $t"
    fi
}

failed=
while [ "$#" -gt 0 ]; do
    batch=()
    pids=()
    while [ "$#" -gt 0 ] && [ "${#batch[@]}" -lt "$jobs" ]; do
        run_one "$1" &
        pids+=("$!")
        batch+=("$1")
        shift
    done
    for i in "${!batch[@]}"; do
        status=0
        wait "${pids[$i]}" || status=$?
        report "${batch[$i]}" "$status"
    done
done

if [ -n "$failed" ]; then
    echo "fuzz: failures in$failed (inputs in <fuzz crate>/artifacts/)" >&2
    exit 1
fi
