"""A fake ``AsyncLLM`` for contract tests and the servicer-cost benchmark (no vLLM needed).

:class:`FakeAsyncLLM` offers the surface the servicer uses (``generate`` with DELTA/FINAL_ONLY
outputs, ``abort``, ``errored``, ``check_health``, ``model_config``, ``vllm_config``,
``output_processor``, ...) and costs nothing per token unless told to sleep. Its outputs have the
attributes of vLLM's ``RequestOutput``/``CompletionOutput``; the engine-tier tests run the same
servicer against the real ``AsyncLLM``, which keeps this fake honest.
"""

from smg_servicer_vllm.testing.fake_llm import FakeAsyncLLM

__all__ = ["FakeAsyncLLM"]
