"""The router's own launcher under test (``smg serve``, which starts its workers itself): run it,
wait until a completion comes back through it, stop it and check that nothing it started is left
(tests-integration/test_rust_lane.py, test_smg_serve_zmq.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from smg_it.zmq_lane import until


@contextlib.contextmanager
def smg_serve(
    flags: Sequence[str], log: Path, env: Mapping[str, str] = {}
) -> Iterator[psutil.Popen]:
    """``python -m smg serve FLAGS`` (this environment, plus ``env``), its output in ``log``;
    whatever of it is still running when the block ends is killed."""
    with log.open("w") as out:
        serve = psutil.Popen(
            [sys.executable, "-m", "smg", "serve", *flags],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
        )  # fmt: skip
    try:
        yield serve
    finally:
        if serve.poll() is None:
            for child in serve.children(recursive=True):
                child.kill()
            serve.kill()


def completion(base: str, model: object, max_tokens: int = 4) -> httpx.Response | None:
    """A greedy completion through the router at ``base`` (None: it did not answer)."""
    body = {"model": str(model), "prompt": "Hello", "max_tokens": max_tokens}
    try:
        return httpx.post(base + "/v1/completions", json=body, timeout=30)
    except httpx.HTTPError:
        return None


def wait_answering(serve: psutil.Popen, base: str, model: object, log: Path) -> None:
    """Until a completion comes back through ``serve`` (it must not exit meanwhile)."""

    def answered() -> bool:
        reply = completion(base, model)
        return reply is not None and reply.status_code == 200

    until(lambda: answered() or serve.poll() is not None, 300, "smg serve never answered")
    assert serve.poll() is None, log.read_text(errors="replace")[-3000:]


def stop_leaving_nothing(serve: psutil.Popen) -> None:
    """SIGTERM ``serve``: it exits and every process it started is gone."""
    everything = serve.children(recursive=True)
    serve.send_signal(signal.SIGTERM)
    serve.wait(90)
    _, alive = psutil.wait_procs(everything, timeout=30)
    assert not alive, f"left running: {alive}"
