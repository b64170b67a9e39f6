"""``sglang.Engine.async_generate`` driven in-process with smg_bench's workload: the baseline for
the SGLang servicer. Runs in the SGLang environment (``.venv-sglang``). Prints one JSON line per
concurrency (output_tokens_per_s, ttft_ms_p50/p99, held_back_share).

    SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/python tools/bench/sglang_inprocess.py MODEL_DIR \\
        --concurrency 1 16 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any


async def run(
    engine: Any, concurrency: int, requests: int, max_tokens: int, prompt_len: int
) -> dict:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    ttfts: list[float] = []
    held = 0
    tokens = 0
    params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}

    async def one(i: int) -> None:
        nonlocal tokens, held
        ids = [(i * 13 + k) % 1000 + 10 for k in range(prompt_len)]
        start = time.perf_counter()
        first = None
        count = 0
        stream = await engine.async_generate(input_ids=ids, sampling_params=params, stream=True)
        async for chunk in stream:
            count = int(chunk["meta_info"]["completion_tokens"])
            if count and first is None:
                first = time.perf_counter() - start
        tokens += count
        total = time.perf_counter() - start
        ttfts.append(first or total)
        held += int(first is not None and first > total / 2)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    begin = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - begin
    q = statistics.quantiles(ttfts, n=100, method="inclusive") if len(ttfts) > 1 else ttfts * 99
    return {
        "label": "sglang-inprocess",
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(q[49] * 1000, 3),
        "ttft_ms_p99": round(q[98] * 1000, 3),
        "held_back_share": round(held / requests, 4),
    }


def main() -> None:
    import sglang  # pyright: ignore[reportMissingImports] - runs in the SGLang environment

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per concurrency")
    args = parser.parse_args()
    engine = sglang.Engine(
        model_path=args.model,
        device="cpu",
        dtype="float32",
        context_length=1024,
        attention_backend="torch_native",
        sampling_backend="pytorch",
        max_total_tokens=65536,
        disable_cuda_graph=True,
        log_level="error",
    )
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run(engine, 4, 8, 16, args.prompt_len))  # warm-up
        for c in args.concurrency:
            n = max(c * 8, 16)
            for _ in range(args.repeat):
                result = loop.run_until_complete(
                    run(engine, c, n, args.max_tokens, args.prompt_len)
                )
                print(json.dumps(result), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
