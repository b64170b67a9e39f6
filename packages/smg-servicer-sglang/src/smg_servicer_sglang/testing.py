"""How to start SGLang on a CPU for tests and benchmarks (imports no SGLang).

:func:`serve_command` takes the interpreter of an environment that has SGLang: this module holds no
path of its own (the checkout's test kit says where its SGLang environment is).
"""

from __future__ import annotations

from pathlib import Path

#: SGLang's CPU code paths (``is_cpu()``); without it RotaryEmbedding imports vLLM's CUDA ops.
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}

#: Engine flags for the float32 tiny model on a CPU without AMX (torch-native attention and
#: sampling; no CUDA graphs; a 1,024-token context). ``--sleep-on-idle``: an idle SGLang scheduler
#: otherwise spins on its sockets at a core's full speed (SGLang's ``IdleSleeper`` says so), and a
#: test's worker spends most of its life idle between requests: on a 2-core machine running two
#: test lanes, every idle scheduler took CPU from the engines that had work. With it, the idle
#: scheduler waits on its request sockets (our servicer's, or the router's on the ZMQ lane:
#: ``zmq_plugin``) for up to a second at a time.
CPU_FLAGS = (
    "--device", "cpu",
    "--dtype", "float32",
    "--attention-backend", "torch_native",
    "--sampling-backend", "pytorch",
    "--context-length", "1024",
    "--max-total-tokens", "65536",
    "--disable-cuda-graph",
    "--sleep-on-idle",
    "--log-level", "warning",
)  # fmt: skip

#: A prefill or decode worker's flags on a CPU (by role): Mooncake moves the KV (its
#: non-CUDA build, over TCP; SGLang refuses ``fake`` on a prefill worker), and a decode worker
#: keeps retracted requests in CPU tensors (SGLang's default registers host memory with CUDA).
PD_CPU_FLAGS: dict[str, tuple[str, ...]] = {
    "prefill": (
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
    ),
    "decode": (
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-decode-retraction-backup", "cpu_tensor",
    ),
}  # fmt: skip

#: LoRA on a CPU for the tiny adapters (``smg_servicer_core.testing.tiny_lora``: rank 8 on
#: ``q_proj``/``v_proj``): SGLang's torch-native LoRA backend. SGLang's CPU build also needs pinned
#: memory to be a no-op (its LoRA layers ask for it unconditionally): the test environments' shim
#: does that in processes started with :data:`PIN_MEMORY_SHIM_ENV`.
LORA_CPU_FLAGS = (
    "--enable-lora",
    "--lora-backend", "torch_native",
    "--max-lora-rank", "8",
    "--lora-target-modules", "q_proj", "v_proj",
    "--max-loras-per-batch", "4",
)  # fmt: skip
LORA_ENGINE_KWARGS: dict[str, object] = {
    "enable_lora": True,
    "lora_backend": "torch_native",
    "max_lora_rank": 8,
    "lora_target_modules": ["q_proj", "v_proj"],
    "max_loras_per_batch": 4,
}
#: Turns on ``tools/envs/sglang-cpu/shims/pin_memory_shim.py`` in a process and its children.
PIN_MEMORY_SHIM_ENV = {"SMG_CPU_PIN_MEMORY_SHIM": "1"}

#: The same settings as keyword arguments of ``sglang.Engine`` (in-process references, benches).
ENGINE_KWARGS: dict[str, object] = {
    "device": "cpu",
    "dtype": "float32",
    "context_length": 1024,
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "max_total_tokens": 65536,
    "disable_cuda_graph": True,
    "sleep_on_idle": True,
    "log_level": "error",
}


def serve_command(
    model: Path,
    port: int,
    *extra: str,
    python: Path,
    mode_flag: str = "--smg-grpc-mode",
) -> list[str]:
    """``sglang serve --smg-grpc-mode`` (SGLang's own launcher, our servicer behind it) from the
    environment of ``python``; ``mode_flag="--grpc-mode"`` is the seed's spelling, which SGLang
    maps to the same mode."""
    exe = python.parent / "sglang"
    return [
        str(exe), "serve",
        "--model-path", str(model),
        *CPU_FLAGS,
        mode_flag,
        "--host", "127.0.0.1",
        "--port", str(port),
        *extra,
    ]  # fmt: skip


def launcher_command(model: Path, port: int, *flags: str, python: Path) -> list[str]:
    """``python -m smg_servicer_sglang [flags] <SGLang's flags>`` (our launcher, without SGLang's
    HTTP sidecar; ``--servicer-impl rust`` selects the Rust lane) from the environment of
    ``python``, CPU-sized as :func:`serve_command`, logging at info."""
    return [
        str(python), "-m", "smg_servicer_sglang", *flags,
        "--model-path", str(model), *CPU_FLAGS, "--log-level", "info",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def headless_command(model: Path, worker_url: str, *extra: str, python: Path) -> list[str]:
    """``python -m smg_grpc_servicer.sglang.headless`` (the router's ZMQ lane: SGLang's scheduler
    speaking to the router itself) for the router's ``ipc://`` ``worker_url``, from the
    environment of ``python``, CPU-sized as :func:`serve_command`; then ``extra``."""
    return [
        str(python), "-m", "smg_grpc_servicer.sglang.headless",
        "--zmq-worker-url", worker_url,
        "--model-path", str(model),
        *CPU_FLAGS,
        *extra,
    ]  # fmt: skip
