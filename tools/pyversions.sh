#!/usr/bin/env bash
# The engine-free packages on the Pythons the seed supports besides the workspace's 3.11 (3.10,
# 3.12 and 3.13): core, kv-bridge, the facade and the sidecar's protocol and client, each in a
# fresh venv.
#
#   bash tools/pyversions.sh [3.10 3.12 3.13]
#
# 3.10: the packages' unit and contract tests (core, kv-bridge, the sidecar's protocol and
#   client) and the facade's tests that need no engine package: every engine package needs 3.11
#   (vLLM, SGLang and TokenSpeed do), so on 3.10 the facade can only say which one to install.
# 3.12, 3.13: the same, plus the facade's unit tests with the engine packages installed (no
#   engines).
# The interpreters come from pyenv (/root/.pyenv/versions/<v>.*) or `uv python find`; a missing
# one fails loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_LINK_MODE="${UV_LINK_MODE:-hardlink}" UV_NO_PROGRESS=1
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(3.10 3.12 3.13)
status=0
for version in "${versions[@]}"; do
    python="$(ls -d "${PYENV_ROOT:-/root/.pyenv}"/versions/"$version".*/bin/python 2>/dev/null | tail -1 || true)"
    [[ -n "$python" ]] || python="$(uv python find "$version" 2>/dev/null || true)"
    if [[ -z "$python" ]]; then
        echo "Python $version not found (pyenv or uv python install $version)" >&2
        exit 1
    fi
    venv=".cache/py$version"
    rm -rf "$venv"
    uv venv --quiet --python "$python" "$venv"
    packages=(-e "packages/smg-servicer-core[testing,tls,zmq,tracing]" -e packages/smg-servicer-kv-bridge
              -e packages/smg-grpc-servicer -e "packages/smg-servicer-mm-sidecar[redis]")
    facade=(packages/smg-grpc-servicer/tests -k
            "version_satisfies or vllm_redis_extra or sidecar_path_names")
    if [[ "$version" != 3.10 ]]; then
        packages+=(-e packages/smg-servicer-mlx -e packages/smg-servicer-vllm
                   -e packages/smg-servicer-sglang -e packages/smg-servicer-tokenspeed)
        facade=(packages/smg-grpc-servicer/tests -m unit)
    fi
    VIRTUAL_ENV="$venv" uv pip install --quiet "${packages[@]}" \
        'pytest>=8.3' 'pytest-asyncio>=0.24' 'pytest-timeout>=2.3' 'fakeredis>=2.20' ruff
    echo "== Python $version ($("$venv/bin/python" -V))"
    "$venv/bin/python" -c "import smg_servicer_core, smg_servicer_kv_bridge, smg_grpc_servicer, smg_servicer_mm_sidecar.protocol, smg_servicer_mm_sidecar.client"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider packages/smg-servicer-core/tests \
        packages/smg-servicer-kv-bridge/tests packages/smg-servicer-mm-sidecar/tests/test_protocol.py \
        packages/smg-servicer-mm-sidecar/tests/test_client.py || status=1
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${facade[@]}" || status=1
done
exit "$status"
