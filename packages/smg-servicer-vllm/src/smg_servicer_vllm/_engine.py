"""With :mod:`._mm_engine` and :mod:`._mm_layouts` (the multimodal side), the one module that
imports vLLM: builds its request objects, and hands the plugin vLLM's argument parser."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from smg_servicer_vllm.sampling import SamplingSpec

try:
    import vllm.version as _vllm_version
    from vllm import PoolingParams, SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
except ImportError as err:  # pragma: no cover - exercised by the lazy-import test
    raise ImportError(
        "smg-servicer-vllm needs vLLM: pip install 'smg-servicer-vllm[vllm]'"
    ) from err

__all__ = [
    "VLLM_VERSION",
    "argument_parser",
    "embed_params",
    "greedy_params",
    "prometheus_registry",
    "rendered_tokens",
    "sampling_params",
    "tokens_prompt",
]

VLLM_VERSION: str = str(getattr(_vllm_version, "__version__", "unknown"))


def sampling_params(spec: SamplingSpec, *, stream: bool, kv_transfer: dict[str, Any] | None) -> Any:
    structured = StructuredOutputsParams(**spec.structured) if spec.structured else None
    return SamplingParams(
        **spec.kwargs,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured,
        extra_args={"kv_transfer_params": kv_transfer} if kv_transfer else None,
    )


def tokens_prompt(input_ids: list[int], text: str = "", cache_salt: str = "") -> Any:
    prompt = TokensPrompt(prompt_token_ids=input_ids)
    if text:
        prompt["prompt"] = text
    if cache_salt:
        prompt["cache_salt"] = cache_salt
    return prompt


def rendered_tokens(
    engine: Any, prompt: Any, tokenization: dict[str, Any] | None
) -> tuple[Any, dict[str, Any] | None]:
    """A token prompt (:func:`tokens_prompt`) rendered for the engine here, on the event loop,
    where vLLM would send it through its renderer's thread pool (0.27+: ``AsyncLLM`` hands a raw
    prompt to ``process_inputs_async``). The call is vLLM's own for a raw prompt, its renderer's
    ``render_cmpl`` with the completion tokenize parameters and ``tokenization`` (truncation, the
    length checks), made inline: a prompt of token ids has nothing to tokenize, and the hop cost
    every request a thread switch and a second thread on the GIL. Returns what to hand
    ``generate()``: the engine input and the tokenization kwargs it still needs (None: applied);
    elsewhere (an older release, an encoder-decoder model) the prompt and ``tokenization``."""
    processor = getattr(engine, "input_processor", None)
    if not hasattr(processor, "process_inputs_async") or engine.model_config.is_encoder_decoder:
        return prompt, tokenization
    renderer = engine.renderer
    params = renderer.default_cmpl_tok_params.with_kwargs(**(tokenization or {}))
    (engine_input,) = renderer.render_cmpl([prompt], params)
    return engine_input, None


def embed_params() -> Any:
    return PoolingParams(task="embed")


def prometheus_registry() -> Any:
    """The registry vLLM's HTTP server serves on ``/metrics``: the process's default one, or the
    multi-process collection when ``PROMETHEUS_MULTIPROC_DIR`` is set (vLLM's own choice)."""
    try:
        from vllm.v1.metrics.prometheus import get_prometheus_registry  # noqa: PLC0415 - vLLM
    except ImportError:  # pragma: no cover - a release without the helper: the default registry
        return REGISTRY
    return get_prometheus_registry()


def greedy_params(max_tokens: int) -> Any:
    """Plain greedy sampling of exactly ``max_tokens`` tokens (the tests' reference runs)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def serve_subcommand() -> Any:
    """vLLM's ``serve`` subcommand (``vllm serve``: its parser, validation and dispatch, which
    runs ``run_headless`` for ``--headless``): the ZMQ-lane launcher's engine start."""
    from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: PLC0415 - vLLM's CLI: launchers

    return ServeSubcommand()


def engine_core_classes() -> tuple[Any, Any, Any]:
    """vLLM's ``EngineCore`` (whose request preparation the ZMQ-lane guard wraps),
    ``EngineCoreProc`` (whose refusal of a request during a drain it changes) and
    ``EngineShutdownState``."""
    from vllm.v1.engine.core import (  # noqa: PLC0415 - vLLM's engine core: in a core only
        EngineCore,
        EngineCoreProc,
        EngineShutdownState,
    )

    return EngineCore, EngineCoreProc, EngineShutdownState


def request_decoding() -> tuple[Any, Any]:
    """vLLM's ``MsgpackDecoder`` (whose decoding of a request the ZMQ-lane guard wraps) and
    ``EngineCoreRequest`` (the type it decodes)."""
    from vllm.v1.engine import EngineCoreRequest  # noqa: PLC0415 - vLLM's engine core: in a core
    from vllm.v1.serial_utils import MsgpackDecoder  # noqa: PLC0415 - vLLM's engine core: in a core

    return MsgpackDecoder, EngineCoreRequest


def argument_parser() -> Any:
    """vLLM's ``FlexibleArgumentParser``, the class the plugin wraps (ImportError in a vLLM
    without it: such a vLLM has no gRPC launcher we serve)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415 - vLLM, may lack it

    return FlexibleArgumentParser


def engine_config(args: Any) -> Any:
    """vLLM's config of a parsed engine command line (what its headless serve builds)."""
    from vllm import AsyncEngineArgs  # noqa: PLC0415 - vLLM's engine arguments: launchers

    return AsyncEngineArgs.from_cli_args(args).create_engine_config()
