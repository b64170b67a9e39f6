"""``python -m smg_servicer_vllm.testing --port P [--token-delay-ms D] [--port-file F]
[--tokenizer DIR] [--kv-endpoint E [--kv-replay-endpoint R]]``: serve ``VllmEngineServicer`` over
:class:`FakeAsyncLLM` (the servicer-cost benchmark's target; with a tokenizer, a worker the real
router takes; with a KV-event publisher to relay, the reliability suite's KV faults).

vLLM must be importable (the servicer builds vLLM's ``SamplingParams``), but no engine runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from smg_servicer_core.entry import configure_logging, run_main
from smg_servicer_core.health import HealthFrame
from smg_servicer_core.proto import vllm_engine_pb2_grpc
from smg_servicer_core.server import ExternalEngine, ServerOptions, ServiceBinding, serve
from smg_servicer_core.testing.process import announce_port
from smg_servicer_core.wire_guard import tolerant_add
from smg_servicer_vllm.testing.fake_llm import FakeAsyncLLM


async def _main(args: argparse.Namespace) -> int:
    # The servicer builds vLLM's SamplingParams: vLLM is imported when serving, not for --help.
    from smg_servicer_vllm.servicer import SERVICE_NAME, VllmEngineServicer  # noqa: PLC0415 - vLLM

    configure_logging("warning")
    kv_events = (args.kv_endpoint, args.kv_replay_endpoint) if args.kv_endpoint else None
    engine = FakeAsyncLLM(
        token_delay_s=args.token_delay_ms / 1000, kv_events=kv_events, tokenizer=args.tokenizer
    )
    servicer = VllmEngineServicer(engine, 0.0)

    def register(server: object) -> None:
        add: Any = vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        tolerant_add(add)(servicer, server)

    def announce(port: int) -> None:
        if args.port_file is not None:
            announce_port(args.port_file, port)

    code = await serve(
        [ServiceBinding(SERVICE_NAME, register)],
        HealthFrame(SERVICE_NAME),
        ExternalEngine(),
        ServerOptions(host="127.0.0.1", port=args.port),
        on_started=announce,
        in_flight=lambda: len(servicer.registry),
    )
    return code


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m smg_servicer_vllm.testing")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--port-file", type=Path, default=None)
    parser.add_argument(
        "--tokenizer",
        default="",
        help="a tokenizer directory for GetTokenizer (a router needs one)",
    )
    parser.add_argument("--kv-endpoint", default=None, help="a KV-event publisher to relay")
    parser.add_argument("--kv-replay-endpoint", default=None, help="its replay endpoint")
    args = parser.parse_args()
    run_main(lambda: _main(args), "smg-servicer-vllm-fake")


if __name__ == "__main__":
    main()
