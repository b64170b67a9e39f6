"""The cheapest per-message path ``grpc.aio`` offers, measured: a null server (no engine, no
servicer logic) streaming ``GenerateResponse`` chunks built per message, in each variant.

    uv run python tools/bench/grpc_path_bench.py [--rounds 3] [--delay-ms 2] [--concurrency 16]

| variant | how a message leaves |
|---|---|
| ``generator`` | an async generator yields the protobuf message (what every servicer does) |
| ``write`` | ``await context.write(message)`` from a coroutine handler |
| ``bytes`` | the generator yields pre-serialised bytes, registered with an identity serializer |
| ``generator-asyncio`` | ``generator`` on asyncio's default loop instead of uvloop |
| ``bdp-probe-off`` | ``generator`` with ``grpc.http2.bdp_probe`` 0 |
| ``write-buffer-0`` | ``generator`` with ``grpc.http2.write_buffer_size`` 0 |
| ``vllm-servicer`` | our vLLM servicer over its fake engine at the same pace (what it adds) |

Each variant is a server process (pinned to CPU 0, the load generator ``smg_bench.py`` on the
others); the variants alternate within each round. One JSON line per measurement, then a
``summary`` line per variant: its server CPU per 1,000 tokens as a ratio to ``generator``'s in the
same round (median and range). ``--serve VARIANT --port-file F`` runs one server (used by the
script itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

# beside this script
from smg_bench import client_cpus_beside, cpu_list, measure, spread, spread_text

VARIANTS = (
    "generator", "write", "bytes", "generator-asyncio", "bdp-probe-off", "write-buffer-0",
    "vllm-servicer",
)  # fmt: skip
#: The channel options each options variant changes (``generator`` otherwise).
OPTIONS: dict[str, list[tuple[str, int]]] = {
    "bdp-probe-off": [("grpc.http2.bdp_probe", 0)],
    "write-buffer-0": [("grpc.http2.write_buffer_size", 0)],
}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _serve(variant: str, port_file: Path, delay_s: float) -> None:
    import grpc  # noqa: PLC0415
    import grpc.aio  # noqa: PLC0415

    from smg_servicer_core.proto import vllm_engine_pb2 as pb  # noqa: PLC0415

    chunk_field = pb.GenerateResponse.DESCRIPTOR.fields_by_name["chunk"].number
    fields = {f.name: f.number for f in pb.GenerateStreamChunk.DESCRIPTOR.fields}

    def tag(number: int, wire_type: int) -> bytes:
        return _varint(number << 3 | wire_type)

    def chunk_bytes(token: int, count: int) -> bytes:
        packed = _varint(token)
        body = (
            tag(fields["token_ids"], 2) + _varint(len(packed)) + packed
            + tag(fields["prompt_tokens"], 0) + _varint(16)
            + tag(fields["completion_tokens"], 0) + _varint(count)
        )  # fmt: skip
        return tag(chunk_field, 2) + _varint(len(body)) + body

    def chunk(token: int, count: int) -> Any:
        return pb.GenerateResponse(
            chunk=pb.GenerateStreamChunk(
                token_ids=[token], prompt_tokens=16, completion_tokens=count
            )
        )

    expected = pb.GenerateResponse.FromString(chunk_bytes(7, 3))
    assert expected == chunk(7, 3), "the hand-encoded chunk must equal the protobuf one"

    async def generator(request: Any, context: Any) -> Any:
        build = chunk_bytes if variant == "bytes" else chunk
        for i in range(request.sampling_params.max_tokens):
            await asyncio.sleep(delay_s)
            yield build(4 + i, i + 1)

    async def write(request: Any, context: Any) -> None:
        for i in range(request.sampling_params.max_tokens):
            await asyncio.sleep(delay_s)
            await context.write(chunk(4 + i, i + 1))

    async def main() -> None:
        server = grpc.aio.server(options=OPTIONS.get(variant, []))
        serializer = (lambda b: b) if variant == "bytes" else pb.GenerateResponse.SerializeToString
        handler = grpc.unary_stream_rpc_method_handler(
            write if variant == "write" else generator,
            request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=serializer,
        )
        service = "vllm.grpc.engine.VllmEngine"
        generic = grpc.method_handlers_generic_handler(service, {"Generate": handler})
        server.add_generic_rpc_handlers((generic,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_file.write_text(str(port))  # noqa: ASYNC240 - once, before serving
        await server.wait_for_termination()

    if variant == "generator-asyncio":
        asyncio.run(main())
        return
    import uvloop  # noqa: PLC0415

    uvloop.run(main())


def summary(variant: str, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """A variant's server CPU per token against the generator's, per round.

    The server's CPU clock ticks in 10 ms steps, so a round too short to register on it (zero
    on either side) gives no ratio rather than a division by zero; ``rounds_measured`` says
    how many did.
    """
    key = "server_cpu_ms_per_1k_tokens"
    ratios = [r[variant][key] / r["generator"][key] for r in rounds
              if r[variant][key] and r["generator"][key]]  # fmt: skip
    result: dict[str, Any] = {
        "summary": variant,
        f"{key}_median": statistics.median(r[variant][key] for r in rounds),
        "rounds_measured": len(ratios),
    }
    if ratios:
        result.update(spread(ratios, "ratio_to_generator_median"))
    return result


def markdown(rows: list[dict[str, Any]]) -> str:
    """A recorded run as ``tools/bench/README.md`` shows it (``tools/bench/summarize.py``),
    computed from its measurements: per variant, server CPU per 1,000 tokens (median of the
    rounds) and its ratio to ``generator``'s (median, range)."""
    measured = [r for r in rows if "summary" not in r and "label" in r]
    variants = list(dict.fromkeys(r["label"] for r in measured))
    per = {v: [r for r in measured if r["label"] == v] for v in variants}
    rounds = [{v: per[v][i] for v in variants} for i in range(min(len(p) for p in per.values()))]
    lines = [
        "| variant | server CPU ms per 1k tokens | over `generator` |",
        "|---|---|---|",
    ]
    for variant in variants:
        got = summary(variant, rounds)
        counted = got["rounds_measured"]
        ratio = spread_text(got, "ratio_to_generator_median") if counted else "-"
        lines.append(f"| {variant} | {got['server_cpu_ms_per_1k_tokens_median']:.1f} | {ratio} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
        help="these variants only (generator, the reference, always runs)",
    )  # fmt: skip
    parser.add_argument("--delay-ms", type=float, default=2.0, help="time between tokens")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--client-cpus", default=None)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.port_file, args.delay_ms / 1000)
        return 0
    from smg_servicer_core.testing.process import spawn_with_port_file  # noqa: PLC0415

    server_cpus = cpu_list(args.server_cpus) if args.server_cpus else set()
    client_cpus = client_cpus_beside(server_cpus, args.client_cpus)
    variants = ["generator", *(v for v in args.variants if v != "generator")]
    servers = {}
    try:
        for variant in variants:
            port_file = Path(tempfile.mkdtemp()) / "port"
            cmd = [sys.executable, __file__, "--serve", variant, "--port-file", str(port_file),
                   "--delay-ms", str(args.delay_ms)]  # fmt: skip
            if variant == "vllm-servicer":
                cmd = [sys.executable, "-m", "smg_servicer_vllm.testing", "--port-file",
                       str(port_file), "--token-delay-ms", str(args.delay_ms)]  # fmt: skip
            servers[variant] = spawn_with_port_file(
                cmd, port_file, cpus=server_cpus, output=None, timeout_s=120
            )
        rounds: list[dict[str, dict[str, Any]]] = []
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            got = {}
            for variant in order:
                proc, port = servers[variant]
                got[variant] = measure(
                    port, proc.pid, concurrency=args.concurrency, requests=args.requests,
                    processes=args.processes, label=variant, client_cpus=client_cpus,
                )  # fmt: skip
                print(json.dumps(got[variant]), flush=True)
            rounds.append(got)
        for variant in variants:
            print(json.dumps(summary(variant, rounds)), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
