"""vLLM's AsyncLLM.generate driven in-process with smg_bench's workload: the baseline for the vLLM
servicer. Prints one JSON line per concurrency (output_tokens_per_s, ttft_ms_p50/p99).

    uv run python tools/bench/vllm_inprocess.py MODEL_DIR --concurrency 1 16 64 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any


async def run(llm: Any, concurrency: int, requests: int, max_tokens: int, prompt_len: int) -> dict:
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
    )
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    ttfts: list[float] = []
    held = 0
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens, held
        prompt = TokensPrompt(
            prompt_token_ids=[(i * 13 + k) % 1000 + 10 for k in range(prompt_len)]
        )
        start = time.perf_counter()
        first = None
        async for output in llm.generate(prompt, params, f"bench-{concurrency}-{i}"):
            n = len(output.outputs[0].token_ids)
            if n and first is None:
                first = time.perf_counter() - start
            tokens += n
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
        "label": "vllm-inprocess",
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_ms_p50": round(q[49] * 1000, 3),
        "ttft_ms_p99": round(q[98] * 1000, 3),
        "held_back_share": round(held / requests, 4),
    }


async def main_async(args: argparse.Namespace) -> None:
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=args.model,
            dtype="float32",
            max_model_len=1024,
            enforce_eager=True,
            kv_cache_memory_bytes=128 << 20,
            disable_log_stats=True,
        )
    )
    try:
        await run(llm, 4, 8, 16, args.prompt_len)  # warm-up
        for c in args.concurrency:
            n = max(c * 4, 16)
            print(json.dumps(await run(llm, c, n, args.max_tokens, args.prompt_len)), flush=True)
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
