"""KV events under faults, through vLLM's servicer in its own process: the publisher killed and
restarted mid-subscription, a silent replay endpoint (mid-stream and on resume), a sequence gap.
The exact status code, and no duplicate or missing sequence number delivered.

The one fault-injectable part is the publisher, so a scripted one (real ZMQ sockets, vLLM's wire)
stands in for vLLM's; ``packages/smg-servicer-vllm/tests/test_vllm_kv_events.py`` proves the
servicer relays the real engine's publisher. SGLang's servicer meets the same faults in
``packages/smg-servicer-sglang/tests/test_kv_faults.py`` (its environment).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc.aio
import pytest
import pytest_asyncio

from smg_it.reliability import record
from smg_servicer_core.proto import common_pb2, vllm_engine_pb2_grpc
from smg_servicer_core.testing.process import spawn_with_port_file
from smg_servicer_kv_bridge.testing import EXPECTED, ScriptedPublisher, kv_fault_outcomes

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


@pytest_asyncio.fixture
async def publisher() -> AsyncIterator[ScriptedPublisher]:
    async with ScriptedPublisher(style="vllm") as pub:
        yield pub


async def test_kv_faults_through_the_vllm_servicer(
    publisher: ScriptedPublisher, tmp_path: Path
) -> None:
    port_file = tmp_path / "port"
    cmd = [
        sys.executable, "-m", "smg_servicer_vllm.testing", "--port", "0",
        "--port-file", str(port_file), "--kv-endpoint", publisher.endpoint,
        "--kv-replay-endpoint", str(publisher.replay_endpoint),
    ]  # fmt: skip
    proc, port = spawn_with_port_file(cmd, port_file, timeout_s=120)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]

            def open_stream(start: int) -> object:
                request = common_pb2.SubscribeKvEventsRequest(start_sequence_number=start)
                return stub.SubscribeKvEvents(request)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]

            outcomes = await kv_fault_outcomes(open_stream, publisher)
    finally:
        proc.terminate()
        proc.wait(30)
    record("vllm", kv_outcomes=outcomes)
    assert outcomes == EXPECTED
