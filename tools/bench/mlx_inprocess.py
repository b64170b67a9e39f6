"""mlx-lm's BatchGenerator driven in-process with smg_bench's workload: the baseline for the MLX
servicer. Prints one JSON line (output_tokens_per_s, ttft_ms_p50/p99).

    uv run python tools/bench/mlx_inprocess.py MODEL_DIR --concurrency 16 --max-tokens 128
    uv run python tools/bench/mlx_inprocess.py MODEL_DIR --driver engine ...

``--driver batchgen`` (the baseline) inserts requests synchronously between decode steps, the
moment a slot frees. ``--driver engine`` drives the servicer's own ``MlxEngine`` (engine thread,
admission between steps, asyncio consumers) with no gRPC; its consumers react within the same
process, so a replacement request is usually admitted before the next step starts, as in the
baseline. The difference between ``engine`` and the servicer is what gRPC, the servicer and a
client's reaction time across a socket add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import BatchGenerator


async def drive_engine(args: argparse.Namespace) -> dict[str, Any]:
    from inprocess import drive, prompt

    from smg_servicer_core.testing.requests import generate_request
    from smg_servicer_mlx._engine import MlxEngine
    from smg_servicer_mlx.model_info import read_model_info
    from smg_servicer_mlx.params import ModelLimits, to_params

    info = read_model_info(args.model)
    limits = ModelLimits(info.vocab_size, info.max_context, info.eos_token_ids)
    engine = MlxEngine(info)
    engine.start()
    await engine.wait_ready()

    def params(i: int, max_tokens: int) -> Any:
        # smg_bench's request, through the servicer's own conversion
        ids = prompt(i, args.prompt_len)
        request = generate_request(
            "mlx", ids, max_tokens=max_tokens, ignore_eos=True, temperature=0.0
        )
        return to_params(request, limits)

    def stream_of(label: str, max_tokens: int) -> Any:
        async def stream(i: int) -> AsyncIterator[int]:
            count = 0
            async for batch in engine.generate(f"{label}-{i}", params(i, max_tokens)):
                count += sum(out.token is not None for out in batch)
                yield count

        return stream

    try:
        await drive("warm-up", 4, 8, stream_of("warm", 16))
        report = await drive(
            "mlx-engine-inprocess",
            args.concurrency,
            args.requests,
            stream_of("bench", args.max_tokens),
        )
    finally:
        await engine.shutdown()
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--driver", choices=["batchgen", "engine"], default="batchgen")
    args = parser.parse_args()
    if args.driver == "engine":
        print(json.dumps(asyncio.run(drive_engine(args))), flush=True)
        return 0
    from inprocess import freeze_heap

    loaded: Any = load(args.model)
    generator = BatchGenerator(loaded[0], completion_batch_size=32, prefill_batch_size=8)
    freeze_heap()

    def greedy(x: Any) -> Any:
        return mx.argmax(x, axis=-1)

    def prompt(i: int) -> list[int]:
        return [(i * 13 + k) % 1000 + 10 for k in range(args.prompt_len)]

    starts: dict[int, float] = {}
    ttft: list[float] = []
    seen: set[int] = set()
    tokens = 0
    next_index, done = 0, 0
    begin = time.perf_counter()
    while done < args.requests:
        room = min(args.concurrency - (next_index - done), args.requests - next_index)
        if room > 0:
            uids = generator.insert(
                [prompt(next_index + k) for k in range(room)],
                max_tokens=[args.max_tokens] * room,
                samplers=[greedy] * room,
            )
            now = time.perf_counter()
            for uid in uids:
                starts[uid] = now
            next_index += room
        _, responses = generator.next()
        now = time.perf_counter()
        for response in responses:
            tokens += 1
            if response.uid not in seen:
                seen.add(response.uid)
                ttft.append(now - starts[response.uid])
            if response.finish_reason is not None:
                done += 1
    wall = time.perf_counter() - begin
    quantiles = statistics.quantiles(ttft, n=100, method="inclusive")
    print(
        json.dumps(
            {
                "label": "mlx-inprocess",
                "concurrency": args.concurrency,
                "requests": args.requests,
                "output_tokens": tokens,
                "output_tokens_per_s": round(tokens / wall, 1),
                "ttft_ms_p50": round(quantiles[49] * 1000, 3),
                "ttft_ms_p99": round(quantiles[98] * 1000, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
