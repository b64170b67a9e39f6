"""A fake ``AsyncLLM`` for contract tests and the servicer-cost benchmark (no vLLM needed).

:class:`FakeAsyncLLM` offers the surface the servicer uses (``generate`` with DELTA/FINAL_ONLY
outputs, ``abort``, ``errored``, ``check_health``, ``model_config``, ``vllm_config``,
``output_processor``, and per DP rank ``logger_manager``'s stat loggers and ``engine_core``'s
managed ranks, ...) and costs nothing per token unless told to sleep. Its outputs have the
attributes of vLLM's ``RequestOutput``/``CompletionOutput``; the engine-tier tests run the same
servicer against the real ``AsyncLLM``, which keeps this fake honest.

:func:`launcher_command` is vLLM's own gRPC launcher (what ``vllm serve MODEL --grpc`` runs) on
loopback, CPU-sized for the tiny test models; :func:`headless_command` the same model on the
router's ZMQ lane (:mod:`smg_servicer_vllm.headless`).
"""

import sys

from smg_servicer_vllm.releases import launcher_module
from smg_servicer_vllm.testing.fake_llm import FakeAsyncLLM

__all__ = ["FakeAsyncLLM", "cpu_flags", "headless_command", "launcher_command", "launcher_module"]


def cpu_flags(
    model: object,
    *,
    max_model_len: int = 1024,
    kv_cache_bytes: int = 128 << 20,
    log_stats: bool = False,
) -> list[str]:
    """The engine flags of the tiny test models on a CPU (:func:`launcher_command`'s), for a
    command line of another shape (``smg serve``)."""
    return _cpu_flags(model, max_model_len, kv_cache_bytes, log_stats)


def _cpu_flags(
    model: object, max_model_len: int, kv_cache_bytes: int, log_stats: bool
) -> list[str]:
    """The tiny test models on a CPU: float32, eager, ``kv_cache_bytes`` of KV cache, no stats
    logging unless ``log_stats``."""
    return [
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        *(() if log_stats else ("--disable-log-stats",)),
    ]


def launcher_command(
    model: object,
    port: int,
    *extra: str,
    max_model_len: int = 1024,
    kv_cache_bytes: int = 128 << 20,
    log_stats: bool = False,
) -> list[str]:
    """``python -m <the installed vLLM's launcher module> --model MODEL`` on 127.0.0.1:``port``,
    float32, eager, ``kv_cache_bytes`` of KV cache, no stats logging unless ``log_stats`` (what
    ``GetLoads`` reads per rank); then ``extra``."""
    return [
        sys.executable,
        "-m",
        launcher_module(),
        *_cpu_flags(model, max_model_len, kv_cache_bytes, log_stats),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def headless_command(
    model: object,
    worker_url: str,
    *extra: str,
    max_model_len: int = 1024,
    kv_cache_bytes: int = 128 << 20,
) -> list[str]:
    """``python -m smg_grpc_servicer.vllm.headless`` (the router's ZMQ lane) for the router's
    ``ipc://`` ``worker_url``, CPU-sized as :func:`launcher_command`, stats on (the router reads
    the load they carry); then ``extra``."""
    return [
        sys.executable,
        "-m",
        "smg_grpc_servicer.vllm.headless",
        *_cpu_flags(model, max_model_len, kv_cache_bytes, log_stats=True),
        "--zmq-worker-url",
        worker_url,
        *extra,
    ]
