"""vLLM's AsyncLLM.generate driven in-process with smg_bench's workload: the baseline for the vLLM
servicer. Prints one JSON line per concurrency (output_tokens_per_s, ttft_ms_p50/p99).

    uv run python tools/bench/vllm_inprocess.py MODEL_DIR --concurrency 1 16 64 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from inprocess import drive, prompt


async def run(
    llm: Any,
    concurrency: int,
    requests: int,
    max_tokens: int,
    prompt_len: int,
    *,
    label: str = "vllm-inprocess",
) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=max_tokens,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
        detokenize=False,
    )

    async def stream(i: int) -> AsyncIterator[int]:
        count = 0
        ids = TokensPrompt(prompt_token_ids=prompt(i, prompt_len))
        async for output in llm.generate(ids, params, f"bench-{concurrency}-{i}"):
            count += len(output.outputs[0].token_ids)
            yield count

    return await drive(label, concurrency, requests, stream)


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
            n = max(c * args.requests_per_stream, 16)
            for _ in range(args.repeat):
                report = await run(llm, c, n, args.max_tokens, args.prompt_len, label=args.label)
                print(json.dumps(report), flush=True)
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument(
        "--requests-per-stream", type=int, default=10, help="requests = concurrency x this"
    )
    parser.add_argument("--repeat", type=int, default=1, help="measurements per concurrency")
    parser.add_argument("--label", default="vllm-inprocess")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
