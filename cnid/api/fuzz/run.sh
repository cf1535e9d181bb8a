#!/usr/bin/env bash
# Runs this crate's fuzz targets with the shared runner (cni-core/fuzz/run.sh:
# scratch copies of the corpus, fails on a crash, a failed assertion or a hang).
#
# Usage: cnid/api/fuzz/run.sh SECONDS TARGET...   (e.g. 10 daemon_request)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
FUZZ_DIRS=$here exec "$here/../../../cni-core/fuzz/run.sh" "$@"
