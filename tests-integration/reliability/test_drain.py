"""SIGTERM under load, through the real router: 32 streams in flight when the worker gets SIGTERM.
Every stream ends with a finish reason or an explicit error (0 silent truncations), a new call
during the drain gets UNAVAILABLE, and the worker exits 0 within its grace period.

The exit-time bound (grace + 10 s: 15 s for vLLM's launcher, 40 s for ours) is far above a healthy
drain (1-3 s: the streams are sized to finish well inside the grace period); a worker that ignored
its deadline would hang until the 30 s margin of ``wait``. The time itself (``drain_exit_s``) is a
figure in the reliability report."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from smg_it.harness import Router
from smg_it.reliability import Target, record, service_name

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

STREAMS = 32
#: The streams are sized to finish inside the shortest grace period (vLLM's launcher: 5 s).
MAX_TOKENS = 48
#: Our servicers drain for 30 s by default; vLLM's own launcher stops its server with 5 s.
GRACE_S = {"vllm": 5.0}
DEFAULT_GRACE_S = 30.0


@dataclass
class Outcome:
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    first: threading.Event = field(default_factory=threading.Event)

    @property
    def silent(self) -> bool:
        return self.finish_reason is None and self.error is None


def _stream(base: str, model: str, outcome: Outcome) -> None:
    body = {
        "model": model,
        "prompt": "Tell me a story",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as response:
            if response.status_code != 200:
                outcome.error = f"HTTP {response.status_code}"
                return
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    outcome.done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    outcome.error = str(event["error"])[:200]
                    continue
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        outcome.tokens += 1
                        outcome.first.set()
                    if choice.get("finish_reason"):
                        outcome.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as err:
        outcome.error = type(err).__name__
    finally:
        outcome.first.set()


def test_sigterm_under_load_loses_no_stream(shared: Target) -> None:
    """Ends the shared worker: the suite's conftest runs it last for each engine."""
    target, victim = shared, shared.engine
    with Router(target.worker.url) as router:
        model = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
        outcomes = [Outcome() for _ in range(STREAMS)]
        threads = [threading.Thread(target=_stream, args=(router.base, model, o)) for o in outcomes]
        for thread in threads:
            thread.start()
        for outcome in outcomes:
            assert outcome.first.wait(120), "a stream never started"
        proc = target.worker.proc
        assert proc is not None
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        refused = _new_call_during_drain(target)
        for thread in threads:
            thread.join(120)
        grace = GRACE_S.get(victim, DEFAULT_GRACE_S)
        code = proc.wait(grace + 30)
        exited_s = time.monotonic() - signalled
    silent = [o for o in outcomes if o.silent]
    finished = sum(o.finish_reason is not None for o in outcomes)
    record(
        victim,
        drain_streams=STREAMS,
        drain_finished=finished,
        drain_errors=sum(o.error is not None for o in outcomes),
        drain_silent=len(silent),
        drain_new_call=refused,
        drain_exit=code,
        drain_exit_s=round(exited_s, 2),
    )
    assert not silent, f"{len(silent)} streams ended with neither a finish reason nor an error"
    assert refused == "UNAVAILABLE", refused
    assert code == 0, target.worker.log.read_text()[-3000:]
    assert exited_s <= grace + 10, f"exited {exited_s:.1f}s after SIGTERM (grace {grace}s)"
    assert finished == STREAMS, [o.error for o in outcomes if o.error]


def _new_call_during_drain(target: Target) -> str:
    """A Generate sent straight to the worker once its health says NOT_SERVING (the drain began)."""
    with grpc.insecure_channel(target.address) as channel:
        health: Any = health_pb2_grpc.HealthStub(channel)  # pyright: ignore[reportUnknownMemberType]
        probe = health_pb2.HealthCheckRequest(service=service_name(target.engine))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if health.Check(probe, timeout=2).status != health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                break
            time.sleep(0.01)
        try:
            for _ in target.stub(channel).Generate(
                target.request([1, 2, 3], max_tokens=4), timeout=10
            ):
                pass
        except grpc.RpcError as err:
            return err.code().name  # pyright: ignore[reportAttributeAccessIssue]
    return "OK"
