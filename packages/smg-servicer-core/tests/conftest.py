from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from smg_grpc_proto.generated import mlx_engine_pb2_grpc

from smg_servicer_core.health import HealthFrame
from smg_servicer_core.testing import FakeEngine, FakeEngineServicer, RunningServer, running_server
from smg_servicer_core.testing.fake_servicer import SERVICE_NAME


@dataclass
class Stack:
    engine: FakeEngine
    health: HealthFrame
    servicer: FakeEngineServicer
    server: RunningServer
    stub: mlx_engine_pb2_grpc.MlxEngineStub


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    """A small tokenizer directory with allow-listed and forbidden files."""
    d = tmp_path / "model"
    d.mkdir()
    noise = random.Random(0).randbytes(120_000).hex()  # compresses poorly: several chunks
    (d / "tokenizer.json").write_text(f'{{"version": "1.0", "noise": "{noise}"}}')
    (d / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (d / "config.json").write_text('{"eos_token_id": [2, 0]}')
    (d / "chat_template.jinja").write_text("{{ messages }}")
    (d / "model.safetensors").write_bytes(b"\0" * 1024)  # weights never leave
    (d / "secrets.env").write_text("API_KEY=hunter2")  # nor does anything else
    return d


@pytest.fixture
async def stack(tokenizer_dir: Path) -> AsyncIterator[Stack]:
    engine = FakeEngine()
    health = HealthFrame(SERVICE_NAME)
    servicer = FakeEngineServicer(engine, health, tokenizer_path=tokenizer_dir)
    async with running_server(
        [servicer.binding()], health, engine, in_flight=lambda: len(servicer.registry)
    ) as server:
        yield Stack(
            engine, health, servicer, server, mlx_engine_pb2_grpc.MlxEngineStub(server.channel)
        )
