#!/usr/bin/env bash
# The SGLang 0.5.20 CPU test environment (.venv-sglang0520/ at the repo root, or $1): the oldest
# release smg-servicer-sglang declares (issue #28). The full SGLang suite runs on 0.5.23; this
# environment runs it again on the oldest release's wire and launch API (io_struct field order,
# run_scheduler_process's 0.5.20 signature). Built by tools/envs/sglang-release/install.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec bash "$here/../sglang-release/install.sh" 0.5.20 "${1:-$root/.venv-sglang0520}"
