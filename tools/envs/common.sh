# Shared steps of the engine test environments (sourced by tools/envs/*/install.sh).
#
#   env_stale NAME VENV INPUT...   exit 0 from the caller when VENV's stamp matches the inputs
#                                  (this file included); else recreate VENV and export
#                                  VIRTUAL_ENV (the stamp is written by env_done); a
#                                  script built for several releases names the release in
#                                  ENV_RELEASE, which the stamp includes
#   env_editables ROOT MEMBER...   the workspace packages, editable, without dependencies
#   env_purelib VENV               VENV's site-packages directory
#   env_done                       record the stamp: the environment is complete
# shellcheck shell=bash

env_stale() {
    local name="$1" venv="$2"
    shift 2
    ENV_STAMP="$venv/.smg-env-stamp"
    ENV_WANT="$({ cat "$@" "${BASH_SOURCE[0]}"; [[ -z "${ENV_RELEASE:-}" ]] || echo "$ENV_RELEASE"; } |
        sha256sum | cut -d' ' -f1)"
    if [[ -f "$ENV_STAMP" && "$(cat "$ENV_STAMP")" == "$ENV_WANT" ]]; then
        echo "$name env up to date: $venv"
        exit 0
    fi
    export UV_LINK_MODE="${UV_LINK_MODE:-hardlink}" UV_NO_PROGRESS=1
    rm -rf "$venv"
    uv venv --quiet --python 3.11 "$venv"
    export VIRTUAL_ENV="$venv"
}

env_editables() {
    local root="$1" member
    shift
    local editables=()
    for member in "$@"; do editables+=(-e "$root/packages/$member"); done
    uv pip install --quiet --no-deps "${editables[@]}"
}

env_purelib() {
    "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

env_done() {
    echo "$ENV_WANT" >"$ENV_STAMP"
}
