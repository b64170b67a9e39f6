"""A fake ``AsyncLLM`` for contract tests and the servicer-cost benchmark (no vLLM needed).

:class:`FakeAsyncLLM` offers the surface the servicer uses (``generate`` with DELTA/FINAL_ONLY
outputs, ``abort``, ``errored``, ``check_health``, ``model_config``, ``vllm_config``,
``output_processor``, and per DP rank ``logger_manager``'s stat loggers and ``engine_core``'s
managed ranks, ...) and costs nothing per token unless told to sleep. Its outputs have the
attributes of vLLM's ``RequestOutput``/``CompletionOutput``; the engine-tier tests run the same
servicer against the real ``AsyncLLM``, which keeps this fake honest.

:func:`launcher_command` is vLLM's own gRPC launcher (what ``vllm serve MODEL --grpc`` runs) on
loopback, CPU-sized for the tiny test models.
"""

import sys

from smg_servicer_vllm.releases import launcher_module
from smg_servicer_vllm.testing.fake_llm import FakeAsyncLLM

__all__ = ["FakeAsyncLLM", "launcher_command", "launcher_module"]


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
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        *(() if log_stats else ("--disable-log-stats",)),
        *extra,
    ]
