#!/usr/bin/env bash
# The whole test suite (the README's test command). Six environments:
#   1. the uv workspace (.venv): every package's unit and contract tests, the vLLM and MLX engine
#      tests, tests-integration/ (the real router in front of every engine) and tools/;
#   2. the SGLang CPU environment (.venv-sglang, tools/envs/sglang-cpu/install.sh):
#      packages/smg-servicer-sglang/tests;
#   3. the TokenSpeed CPU environment (.venv-tokenspeed, tools/envs/tokenspeed-cpu/install.sh):
#      packages/smg-servicer-tokenspeed/tests/engine;
#   4. the vLLM 0.27 CPU environment (.venv-vllm027, tools/envs/vllm027-cpu/install.sh): the
#      vLLM package's tests and the vLLM router round trip again, on an older vLLM release;
#   5. the MLX floor (.venv-mlx032): the MLX package's tests on mlx and mlx-lm 0.32.0;
#   6. the SGLang floor (.venv-sglang0520): the SGLang package's tests and the SGLang router
#      round trip on SGLang 0.5.20.
# and, beside the first, two more sessions in the workspace's environment: `video` (the vLLM video
# tests, with the functional torchvision shim on PYTHONPATH) and, last, `workspace-b` (the
# Rust-lane and SGLang metric-family tests), so that the two lanes of a 2-core machine
# end together.
# SGLang and TokenSpeed pin library versions vLLM cannot share, hence their own environments; each
# is built when missing or stale (tests-integration launches their workers from them).
# The environments, their pytest commands and paths are tools/envs/list (CI runs the same list:
# `bash tools/test.sh --list-envs` prints its jobs as JSON for .github/workflows/ci.yml).
# Extra arguments go to every pytest run (for example -x or -k). Exit non-zero if any fails.
#
#   bash tools/test.sh --fast   the developer tier: unit and contract tests only (fakes: no
#                               engine, no router), in every environment (a few minutes)
#
# The first environment (the workspace, the longest) runs in the foreground once the environments
# its jobs need are built; the others are built and run beside it, one after another, their
# output kept in .cache/test-logs/<env>.log and printed when the foreground run ends (a
# workspace run keeps about one of two cores busy). Each run's time (its build included) is
# printed last. SMG_TEST_SERIAL=1 runs them one after another in the foreground instead.
set -uo pipefail
cd "$(dirname "$0")/.."
mapfile -t envs < <(awk '$1 == "env"' tools/envs/list)
mapfile -t jobs < <(awk '$1 == "job"' tools/envs/list)
if [[ "${1:-}" == "--list-envs" ]]; then
    # One object per job: its name, environment, the install scripts it needs (its environment's
    # and those of NEEDS), the pytest command and the paths.
    awk '$1 == "env" { install[$2] = $3; run[$2] = $4; for (i = 5; i <= NF; i++) run[$2] = run[$2] " " $i }
         $1 == "job" { n++; name[n] = $2; env[n] = $3; needs[n] = $4; paths[n] = $5
                       for (i = 6; i <= NF; i++) paths[n] = paths[n] " " $i }
         END {
             printf "["
             for (j = 1; j <= n; j++) {
                 scripts = install[env[j]] == "-" ? "" : install[env[j]]
                 if (needs[j] != "-") {
                     k = split(needs[j], other, ",")
                     for (i = 1; i <= k; i++) scripts = scripts (scripts == "" ? "" : " ") install[other[i]]
                 }
                 printf "%s{\"job\":\"%s\",\"env\":\"%s\",\"installs\":\"%s\",\"run\":\"%s\",\"paths\":\"%s\"}",
                     (j > 1 ? "," : ""), name[j], env[j], scripts, run[env[j]], paths[j]
             }
             print "]"
         }' tools/envs/list
    exit 0
fi
fast=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    fast=(-m "unit or contract")
fi
args=("$@")
# install_env NAME: build that environment when missing or stale (its install script; the
# workspace's is `uv run`'s sync).
install_env() {
    local line env_name install
    for line in "${envs[@]}"; do
        read -r _ env_name install _ <<<"$line"
        [[ "$env_name" == "$1" && "$install" != - ]] && { bash "$install" || return 1; }
    done
    return 0
}
# Before the first environment's run: what its jobs start workers from (their NEEDS). Every
# other environment is built just before its own run, beside the first one's tests (their
# installs, ~2 min on a fresh machine, are off the first run's path).
first=$(awk '$1 == "env" { print $2; exit }' tools/envs/list)
mapfile -t needed < <(awk -v first="$first" '$1 == "job" && $3 == first && $4 != "-" {
    n = split($4, other, ","); for (i = 1; i <= n; i++) print other[i] }' tools/envs/list | sort -u)
for name in "${needed[@]}"; do install_env "$name" || exit 1; done
# One id for every pytest session of this run: an environment's jobs split over two sessions
# (the workspace's) are recorded as one run (tests-integration/smg_it/compat.py).
export SMG_TEST_RUN_ID="${SMG_TEST_RUN_ID:-$$-$(date +%s)}"
logs=.cache/test-logs
mkdir -p "$logs"
rm -f "$logs"/*.log "$logs/times"

# run_env NAME: that environment's test run over its jobs' paths; its time goes to $logs/times.
run_env() {
    local name=$1 started=$SECONDS code=0 command="" paths=() line job_env job_paths more
    local env_name env_command
    for line in "${envs[@]}"; do
        read -r _ env_name _ env_command <<<"$line"
        [[ "$env_name" == "$name" ]] && command=$env_command
    done
    for line in "${jobs[@]}"; do
        read -r _ _ job_env _ job_paths <<<"$line"
        [[ "$job_env" == "$name" ]] && read -ra more <<<"$job_paths" && paths+=("${more[@]}")
    done
    if ! install_env "$name"; then
        echo "the $name environment could not be built" >&2
        printf '%-12s %5ss  exit %s\n' "$name" "$(( SECONDS - started ))" "install" >>"$logs/times"
        return 1
    fi
    # shellcheck disable=SC2086  # the command is words: a runner, its flags, maybe env VAR=...
    $command "${paths[@]}" "${fast[@]}" "${args[@]}" || code=$?
    # --fast: an environment with no unit or contract test selected (pytest's 5) is not a failure.
    [[ ${#fast[@]} -gt 0 && $code -eq 5 ]] && code=0
    printf '%-12s %5ss  exit %s\n' "$name" "$(( SECONDS - started ))" "$code" >>"$logs/times"
    return "$code"
}

names=()
for line in "${envs[@]}"; do
    read -r _ name _ <<<"$line"
    names+=("$name")
done
status=0
if [[ "${SMG_TEST_SERIAL:-}" == 1 ]]; then
    for name in "${names[@]}"; do run_env "$name" || status=1; done
else
    # Each lane's sessions draw their ports from a range of their own (free_port in
    # smg_servicer_core.testing.process): a port one session checked free and an engine binds
    # later is never handed out by the other; .ci/run's steps beside the tests take 28000-32768.
    (   # every environment after the first, in order, beside it
        export SMG_TEST_PORT_RANGE=24000-28000
        code=0
        for name in "${names[@]:1}"; do run_env "$name" >"$logs/$name.log" 2>&1 || code=1; done
        exit "$code"
    ) &
    beside=$!
    SMG_TEST_PORT_RANGE=20000-24000 run_env "${names[0]}" || status=1
    wait "$beside" || status=1
    for name in "${names[@]:1}"; do
        printf '\n===== %s (run beside the %s run; %s)\n' "$name" "${names[0]}" "$logs/$name.log"
        cat "$logs/$name.log"
    done
fi
printf '\n%-12s %6s\n' "environment" "time"
cat "$logs/times"
exit "$status"
