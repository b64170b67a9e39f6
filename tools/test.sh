#!/usr/bin/env bash
# The whole test suite (the README's test command). Three environments:
#   1. the uv workspace (.venv): every package's unit and contract tests, the vLLM and MLX engine
#      tests, tests-integration/ (the real router in front of every engine) and tools/;
#   2. the SGLang CPU environment (.venv-sglang, tools/envs/sglang-cpu/install.sh):
#      packages/smg-servicer-sglang/tests;
#   3. the TokenSpeed CPU environment (.venv-tokenspeed, tools/envs/tokenspeed-cpu/install.sh):
#      packages/smg-servicer-tokenspeed/tests/engine.
# SGLang and TokenSpeed pin library versions vLLM cannot share, hence their own environments; each
# is built when missing or stale (tests-integration launches their workers from them).
# The environments, their pytest commands and paths are tools/envs/list (CI runs the same list:
# `bash tools/test.sh --list-envs` prints its jobs as JSON for .github/workflows/ci.yml).
# Extra arguments go to every pytest run (for example -x or -k). Exit non-zero if any fails.
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
for line in "${envs[@]}"; do
    read -r _ _ install _ <<<"$line"
    [[ "$install" == - ]] || bash "$install" || exit 1
done
status=0
for line in "${envs[@]}"; do
    read -r _ name _ command <<<"$line"
    paths=()
    for job in "${jobs[@]}"; do
        read -r _ _ env _ job_paths <<<"$job"
        [[ "$env" == "$name" ]] && read -ra more <<<"$job_paths" && paths+=("${more[@]}")
    done
    # shellcheck disable=SC2086  # the command is words: a runner, its flags, maybe env VAR=...
    $command "${paths[@]}" "$@" || status=$?
done
exit "$status"
