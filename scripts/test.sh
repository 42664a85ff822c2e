#!/usr/bin/env bash
# Every test: builds everything, then runs the runtime's unit and MPI tests
# (gtest) and the lit suite (dialects, passes, diagnostics, driver, and
# end-to-end multi-rank runs compared with single-rank runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup.sh"
cd "$BUILD"
ctest --output-on-failure "$@"
