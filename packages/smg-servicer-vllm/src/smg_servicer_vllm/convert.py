"""vLLM outputs -> proto messages. Pure and duck-typed: no vLLM import.

Shapes read (vLLM ``RequestOutput`` / ``CompletionOutput``): ``prompt_token_ids``,
``prompt_logprobs``, ``num_cached_tokens``, ``kv_transfer_params``, ``outputs[i].index``,
``.token_ids``, ``.logprobs``, ``.finish_reason``, ``.stop_reason``. A logprobs position is a
mapping ``token id -> object with .logprob and .rank`` (vLLM's dict or FlatLogprobs).

Top-N is the N entries of rank 1..N, best first; the sampled token's own logprob is always given.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from smg_servicer_core.proto import vllm_engine_pb2 as pb

logger = logging.getLogger(__name__)


def _top(position: Mapping[int, Any], n: int) -> pb.TopLogProbs:
    ranked = sorted(
        ((int(tid), lp) for tid, lp in position.items() if lp.rank is not None and lp.rank <= n),
        key=lambda item: item[1].rank,
    )
    return pb.TopLogProbs(
        values=[float(lp.logprob) for _, lp in ranked], token_ids=[tid for tid, _ in ranked]
    )


def output_logprobs(
    token_ids: Sequence[int], positions: Sequence[Mapping[int, Any]] | None, n: int
) -> pb.OutputLogProbs | None:
    if positions is None:
        return None
    message = pb.OutputLogProbs()
    for token, position in zip(token_ids, positions, strict=False):
        chosen = position.get(token)
        message.token_ids.append(token)
        message.token_logprobs.append(float(chosen.logprob) if chosen is not None else 0.0)
        message.top_logprobs.append(_top(position, n))
    return message


def input_logprobs(
    prompt_ids: Sequence[int], positions: Sequence[Mapping[int, Any] | None] | None, n: int
) -> pb.InputLogProbs | None:
    if positions is None:
        return None
    message = pb.InputLogProbs()
    for token, position in zip(prompt_ids, positions, strict=False):
        message.token_ids.append(token)
        entry = message.token_logprobs.add()
        if position is None:  # the first prompt token has no logprob
            message.top_logprobs.add()
            continue
        chosen = position.get(token)
        if chosen is not None:
            entry.value = float(chosen.logprob)
        message.top_logprobs.append(_top(position, n))
    return message


def finish_fields(completion: Any) -> dict[str, Any]:
    """``finish_reason`` plus the matched stop (token id or string) of a finished completion."""
    fields: dict[str, Any] = {"finish_reason": completion.finish_reason or "stop"}
    stop = completion.stop_reason
    if isinstance(stop, int) and not isinstance(stop, bool):
        fields["matched_token_id"] = stop
    elif isinstance(stop, str):
        fields["matched_stop_str"] = stop
    return fields


def spec_fields(completion: Any) -> dict[str, int]:
    """Speculative decoding counts of a finished completion, from vLLM's per-request metrics
    (``CompletionOutput.spec_decode_metrics``, with ``--per-request-spec-decode-metrics``):
    accepted = sum of j x histogram[j] (draft tokens accepted per verify step), drafts = the
    draft tokens proposed. Absent (a release without them, no speculation): no field."""
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return {}
    histogram = list(getattr(metrics, "histogram", None) or [])
    return {
        "spec_accepted_tokens": sum(j * int(n) for j, n in enumerate(histogram)),
        "spec_draft_tokens": int(getattr(metrics, "num_draft_tokens", 0) or 0),
    }


def kv_params_fields(params: Any) -> dict[str, Any]:
    """The response's KV-transfer params as JSON (and the legacy typed mirror when it fits)."""
    if not params:
        return {}
    fields: dict[str, Any] = {}
    try:
        fields["kv_transfer_params_json"] = json.dumps(params)
    except (TypeError, ValueError):
        logger.warning("kv_transfer_params are not JSON-serialisable; sending the legacy form")
    if isinstance(params, Mapping):
        host, port = params.get("remote_host"), params.get("remote_port")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(host, str) and isinstance(port, int) and 1 <= port <= 65535:
            fields["kv_transfer_params"] = pb.KvTransferParams(remote_host=host, remote_port=port)
    return fields
