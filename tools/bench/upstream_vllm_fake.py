"""The implementation we replace (``smg-grpc-servicer`` from PyPI) over our fake vLLM engine.

    PYTHONPATH=.cache/bench/upstream-0.14.1 python tools/bench/upstream_vllm_fake.py \\
        --port-file F [--token-delay-ms D] [--expect-version 0.14.1]

``versus_upstream.py`` runs it. It serves upstream's ``VllmEngineServicer`` over the same
:class:`~smg_servicer_vllm.testing.FakeAsyncLLM` our fake server uses, on uvloop (as vLLM's gRPC
launcher runs it) with a plain ``grpc.aio`` server, so the two arms differ in the servicer only.
Upstream's package must come first on ``sys.path`` (the throw-away ``--target`` install); the
script refuses to run against our facade of the same import name.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any


async def _serve(args: argparse.Namespace) -> None:
    import grpc.aio  # noqa: PLC0415
    from smg_grpc_proto import vllm_engine_pb2_grpc  # noqa: PLC0415

    import smg_grpc_servicer  # noqa: PLC0415
    from smg_servicer_vllm.testing import FakeAsyncLLM  # noqa: PLC0415

    where = Path(smg_grpc_servicer.__file__).resolve()  # noqa: ASYNC240 - once, at start-up
    version = next(
        (d.version for d in metadata.distributions(path=[str(where.parents[1])])
         if d.metadata["Name"] == "smg-grpc-servicer"),
        None,
    )  # fmt: skip
    if version != args.expect_version:
        raise SystemExit(
            f"smg_grpc_servicer at {where} is version {version}, not {args.expect_version}: "
            "put the throw-away install first on PYTHONPATH"
        )
    from smg_grpc_servicer.vllm.servicer import VllmEngineServicer  # noqa: PLC0415

    engine: Any = FakeAsyncLLM(token_delay_s=args.token_delay_ms / 1000)
    # vLLM 0.32's renderer turns a TokensPrompt into the engine's input; the fake takes it as is.
    engine.renderer = SimpleNamespace(process_for_engine=lambda prompt, **_: prompt)
    servicer = VllmEngineServicer(engine, time.time())
    server = grpc.aio.server()
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)  # pyright: ignore[reportUnknownMemberType]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    args.port_file.write_text(str(port))
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--expect-version", default="0.14.1")
    args = parser.parse_args()
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        asyncio.run(_serve(args))
        return
    uvloop.run(_serve(args))


if __name__ == "__main__":
    main()
