"""The README's main command: tiny model -> MLX servicer -> real smg router -> a streamed chat.

    uv run --project tools/demo python tools/demo.py ["your prompt"]

Runs in the lean environment of ``tools/demo/pyproject.toml`` (MLX, the router, the facade; no
torch, no vLLM) on shipped code only: core's process harness and router
(``smg_servicer_core.testing``) and MLX's launch command (``smg_servicer_mlx.testing``). Builds
(once, into .cache/models under the current folder: the checkout's root) a float32 tiny Llama,
starts the MLX servicer through the facade (``python -m smg_grpc_servicer.mlx``) and the router
in front of it on 127.0.0.1, streams one chat completion and prints it with timings, then stops
both processes. The model's weights are random, so the reply is gibberish by design; the timings and
the token counts are real.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

from smg_servicer_core.testing import cached_tiny_model
from smg_servicer_core.testing.process import free_port, start_worker, wait_serving
from smg_servicer_core.testing.requests import SERVICES
from smg_servicer_core.testing.router import Router
from smg_servicer_mlx.testing import serve_command

READY_TIMEOUT_S = 60.0


def serving_after(port: int, since: float) -> float:
    """Seconds from ``since`` until the servicer's health reports SERVING (bounded)."""
    wait_serving(f"127.0.0.1:{port}", timeout_s=READY_TIMEOUT_S, interval_s=0.02)
    return time.perf_counter() - since


def stream_chat(base: str, model: str, prompt: str) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 64,
        "temperature": 0.7,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    print(f"user      {prompt}\nassistant ", end="", flush=True)
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, int] = {}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                text = choice.get("delta", {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - start
                print(text, end="", flush=True)
    total = time.perf_counter() - start
    tokens = usage.get("completion_tokens", 0)
    print(
        "\n\n(the model is random: a gibberish reply is expected; the timings are real)"
        f"\nttft      {1000 * (first or total):.1f} ms\ntotal     {1000 * total:.1f} ms"
        f"\ntokens    prompt {usage.get('prompt_tokens', 0)}, completion {tokens}"
        f" ({tokens / total:.0f} tok/s)",
        flush=True,
    )


def main() -> int:
    prompt = sys.argv[1] if len(sys.argv) > 1 else "Write a short story about the sea."
    t0 = time.perf_counter()
    # Run from the checkout's root, as the README's command is: the model is built (once) there.
    model = cached_tiny_model(Path.cwd() / ".cache" / "models")
    print(f"model     {model.name} ready in {time.perf_counter() - t0:.1f}s", flush=True)
    port = free_port()
    t1 = time.perf_counter()
    worker = start_worker(serve_command(model, port), port, SERVICES["mlx"])
    try:
        # The router starts once the servicer is SERVING: started together, they share the two
        # cores of a small machine and both take longer.
        serving_s = serving_after(port, t1)
        with Router(f"grpc://127.0.0.1:{port}") as router:
            print(
                f"servicer  grpc://127.0.0.1:{port} SERVING in {serving_s:.1f}s; router "
                f"{router.base} ready in {time.perf_counter() - t1:.1f}s",
                flush=True,
            )
            served = httpx.get(router.base + "/v1/models", timeout=10).json()["data"][0]["id"]
            stream_chat(router.base, served, prompt)
    finally:
        code = worker.stop(grace_s=15)
    print(f"stopped   worker exit {code}; total {time.perf_counter() - t0:.1f}s")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
