"""Every field of ``GetServerInfo`` and ``GetModelInfo`` on the real vLLM CPU engine, walked against
what the engine itself says (issue #40: a field comes from the engine or is left unset), on two
engines started different ways: the tiny text Llama (structured outputs on, no media) and the
tiny Idefics3 VLM (media refs processed in process, two images a prompt). The expectations are
read from vLLM's own objects here, not from our info module, so a hard-coded field fails on
one of the two."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from smg_servicer_core.proto import vllm_engine_pb2 as pb
from smg_servicer_core.testing import generate_request
from smg_servicer_core.testing.fields import (
    UNSET,
    Satisfies,
    mismatches,
    server_info_while_running,
)
from smg_servicer_vllm.mm_settings import MmSettings

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]


def _shm_namespace() -> str:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{boot}:{os.stat('/dev/shm').st_dev}"


def _or_unset(value: Any) -> Any:
    return value if value else UNSET


def _attr(obj: Any, *path: str) -> Any:
    """``obj.a.b`` or None where a vLLM release lacks a step (0.27 has no attention config)."""
    for name in path:
        obj = getattr(obj, name, None)
    return obj


def server_expected(llm: Any, servicer: Any, *, schemes: str = "") -> dict[str, Any]:
    """What ``llm`` (vLLM's ``AsyncLLM``) says each ``GetServerInfo`` field is, one request
    running and none finished since ``servicer`` started."""
    vc = llm.vllm_config
    mc = llm.model_config
    parser = _attr(vc, "structured_outputs_config", "reasoning_parser") or ""
    in_reasoning = bool(_attr(vc, "structured_outputs_config", "enable_in_reasoning"))
    mm = getattr(mc, "multimodal_config", None)
    limits = dict(getattr(mm, "limit_per_prompt", None) or {}) if mc.is_multimodal_model else {}
    limit_counts = {m: getattr(v, "count", v) for m, v in limits.items()}
    started = servicer.started_wall
    dtype = str(mc.dtype)
    return {
        "active_requests": 1,
        "is_paused": False,  # its own pause: test_vllm_engine.py's pause test
        "last_receive_timestamp": Satisfies(
            lambda t: started < t <= time.time(), "a wall time since the worker started"
        ),
        "uptime_seconds": Satisfies(
            lambda s: 0 < s <= time.time() - started + 1, "the seconds since the worker started"
        ),
        "server_type": "vllm-grpc",  # the wire's name for this servicer (the proto's comment)
        "kv_connector": UNSET,  # no --kv-transfer-config: test_kv_transfer.py sets one
        "kv_role": UNSET,
        "kv_engine_id": UNSET,
        "data_parallel_size": vc.parallel_config.data_parallel_size,
        "shm_namespace_id": _shm_namespace(),
        "kv_cache_dtype": vc.cache_config.cache_dtype,
        "block_size": vc.cache_config.block_size,
        "attention_backend": _or_unset(str(_attr(vc, "attention_config", "backend") or "")),
        "model_dtype": dtype,
        "pairing_protocol": _or_unset(os.environ.get("SMG_PAIRING_PROTOCOL", "")),
        "mm_processor": "inprocess" if schemes else UNSET,
        "mm_media_ref_schemes": schemes or UNSET,
        "mm_processor_source": "flag" if schemes else UNSET,
        "mm_device_do_normalize": bool(getattr(mm, "mm_device_do_normalize", False)),
        "max_num_seqs": vc.scheduler_config.max_num_seqs,
        "mm_item_limits": _or_unset(",".join(f"{m}={n}" for m, n in limit_counts.items() if n)),
        "multimodal_encoder_dtype": dtype.removeprefix("torch."),
        "engine_reasoning_parser": _or_unset(parser),
        "constrained_decoding_start": (
            "after_reasoning" if parser and not in_reasoning else "first_token"
        ),
        "mm_encoder_budget": (
            Satisfies(lambda n: n > 0, "a positive budget (vLLM's MultiModalBudget)")
            if mc.is_multimodal_model
            else UNSET
        ),
    }


def model_expected(llm: Any) -> dict[str, Any]:
    """What ``llm`` says each ``GetModelInfo`` field is."""
    mc = llm.model_config
    hf = mc.hf_config
    eos = getattr(hf, "eos_token_id", None)  # a VLM's top config may have none
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    # the model's sampling defaults (generation_config.json) among those the wire carries
    wire_keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    sampling = {k: v for k, v in mc.get_diff_sampling_param().items() if k in wire_keys}
    served = mc.served_model_name or mc.model
    return {
        "model_path": mc.model,
        "is_generation": getattr(mc, "runner_type", "generate") == "generate",
        "max_context_length": mc.max_model_len,
        "vocab_size": mc.get_vocab_size(),
        "supports_vision": mc.is_multimodal_model,
        "served_model_name": served[0] if isinstance(served, list | tuple) else served,
        "tokenizer_path": mc.tokenizer,
        "model_type": hf.model_type,
        "architectures": list(hf.architectures or ()),
        "eos_token_ids": eos_ids,
        "pad_token_id": _or_unset(getattr(hf, "pad_token_id", None) or 0),
        "bos_token_id": _or_unset(getattr(hf, "bos_token_id", None) or 0),
        "max_req_input_len": mc.max_model_len,
        "default_sampling_params_json": (
            Satisfies(lambda text: json.loads(text) == sampling, f"the model's {sampling}")
            if sampling
            else UNSET
        ),
    }


async def _walk(llm: Any, servicer: Any, stub: Any, schemes: str = "") -> list[str]:
    """Both answers walked while one request runs (after its first token)."""
    request = generate_request("vllm", [1, 5, 9], max_tokens=900, ignore_eos=True, stream=True)
    server = await server_info_while_running(stub, request, pb.GetServerInfoRequest())
    model = await stub.GetModelInfo(pb.GetModelInfoRequest())
    expected = server_expected(llm, servicer, schemes=schemes)
    problems = [f"server: {p}" for p in mismatches(server, expected)]
    problems += [f"model: {p}" for p in mismatches(model, model_expected(llm))]
    return problems


async def test_every_info_field_is_the_text_engines_own(vllm_stack: Any, async_llm: Any) -> None:
    servicer, stub = vllm_stack
    assert await _walk(async_llm, servicer, stub) == []


async def test_every_info_field_is_the_vision_engines_own(vlm_llm: Any, serve_llm: Any) -> None:
    settings = MmSettings(processor="inprocess", source="flag")
    async with serve_llm(vlm_llm, settings) as (servicer, stub):
        problems = await _walk(vlm_llm, servicer, stub, schemes="http,https,data,file")
    assert problems == []
