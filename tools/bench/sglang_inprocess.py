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
from collections.abc import AsyncIterator
from typing import Any

from inprocess import drive, prompt


async def run(
    engine: Any, concurrency: int, requests: int, max_tokens: int, prompt_len: int
) -> dict[str, Any]:
    params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}

    async def stream(i: int) -> AsyncIterator[int]:
        ids = prompt(i, prompt_len)
        chunks = await engine.async_generate(input_ids=ids, sampling_params=params, stream=True)
        async for chunk in chunks:
            yield int(chunk["meta_info"]["completion_tokens"])

    return await drive("sglang-inprocess", concurrency, requests, stream)


def main() -> None:
    import sglang  # pyright: ignore[reportMissingImports] - runs in the SGLang environment

    from smg_servicer_sglang.testing import ENGINE_KWARGS

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="runs per concurrency")
    parser.add_argument(
        "--requests-per-stream", type=int, default=8, help="requests = concurrency x this"
    )
    args = parser.parse_args()
    engine = sglang.Engine(model_path=args.model, **ENGINE_KWARGS)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run(engine, 4, 8, 16, args.prompt_len))  # warm-up
        for c in args.concurrency:
            n = max(c * args.requests_per_stream, 16)
            for _ in range(args.repeat):
                result = loop.run_until_complete(
                    run(engine, c, n, args.max_tokens, args.prompt_len)
                )
                print(json.dumps(result), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
