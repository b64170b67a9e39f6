"""Proto -> SGLang request conversion: proto3 unset rules, validation, n > 1, finish mapping."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from smg_servicer_core.errors import InvalidRequest
from smg_servicer_core.proto import sglang_scheduler_pb2 as pb
from smg_servicer_sglang import _sglang as sg
from smg_servicer_sglang import convert
from smg_servicer_sglang.convert import ModelLimits, Output

pytestmark = pytest.mark.unit
LIMITS = ModelLimits(vocab_size=100, context_length=64)


def gen(ids: list[int] | None = None, **kwargs: object) -> pb.GenerateRequest:
    sampling = kwargs.pop("sampling", {})
    return pb.GenerateRequest(
        request_id="r",
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3] if ids is None else ids),
        sampling_params=pb.SamplingParams(**sampling),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def build(spec: convert.ReqSpec) -> object:
    return sg.build_generate(spec, LIMITS.vocab_size, None)


def one(request: pb.GenerateRequest) -> object:
    specs, prefix = convert.generate_reqs(request, LIMITS)
    assert prefix is None
    return build(specs[0])


def test_unset_fields_get_neutral_values() -> None:
    req = one(gen(sampling={"temperature": 0.7}))
    params = req.sampling_params  # type: ignore[attr-defined]
    assert params.top_p == 1.0
    assert params.top_k >= 1 << 30  # every token
    assert params.repetition_penalty == 1.0
    assert params.max_new_tokens == 64 - 3  # what the context leaves
    assert params.temperature == pytest.approx(0.7)
    assert req.logprob_start_len == -1  # type: ignore[attr-defined]
    assert list(req.input_ids) == [1, 2, 3]  # type: ignore[attr-defined]


def test_zero_temperature_is_greedy() -> None:
    params = one(gen()).sampling_params  # type: ignore[attr-defined]
    assert params.top_k == 1


def test_constraint_and_stops_map() -> None:
    req = one(gen(sampling={"regex": "[ab]+", "stop_token_ids": [5, 7], "max_new_tokens": 4}))
    params = req.sampling_params  # type: ignore[attr-defined]
    assert params.regex == "[ab]+"
    assert params.json_schema is None
    assert params.stop_token_ids == {5, 7}
    assert params.max_new_tokens == 4


def test_logprob_start_len_zero_means_unset() -> None:
    assert one(gen(return_logprob=True)).logprob_start_len == -1  # type: ignore[attr-defined]
    positioned = one(gen(return_logprob=True, logprob_start_len=1))
    assert positioned.logprob_start_len == 1  # type: ignore[attr-defined]
    assert one(gen(logprob_start_len=1)).logprob_start_len == -1  # type: ignore[attr-defined]


def test_n_builds_prefix_and_samples() -> None:
    specs, prefix_spec = convert.generate_reqs(gen(sampling={"n": 3}), LIMITS)
    reqs: list[Any] = [build(s) for s in specs]
    assert [r.rid for r in reqs] == ["r-0", "r-1", "r-2"]
    assert prefix_spec is not None
    prefix: Any = build(prefix_spec)
    assert prefix.rid == "r-prefix"
    assert prefix.sampling_params.max_new_tokens == 0
    assert all(r.sampling_params.n == 1 for r in reqs)


@pytest.mark.parametrize("n", [129, 2**31, 2**32 - 1])
def test_n_past_128_is_refused_before_any_request_is_built(n: int) -> None:
    """The reliability fuzz found ``n`` = 2**31 building that many requests (14 GB, then the
    runner's memory gone)."""
    with pytest.raises(InvalidRequest, match=f"n must be at most 128, got {n}"):
        convert.generate_reqs(gen(sampling={"n": n}), LIMITS)


@pytest.mark.parametrize(
    "bad",
    [
        gen([]),
        gen([1, 100]),
        gen([1] * 64),
        gen(sampling={"max_new_tokens": 62}),
        gen(sampling={"max_new_tokens": 0}),
        gen(sampling={"temperature": -1.0}),
        gen(sampling={"top_p": 1.2}),
        gen(sampling={"min_p": 2.0}),
        gen(sampling={"stop_token_ids": [100]}),
        gen(sampling={"stop_token_ids": list(range(33))}),
        gen(token_ids_logprob=[100]),
        gen(return_hidden_states=True),
        gen(input_embeds=[0.5]),
        gen(top_logprobs_num=-1),
        gen(return_logprob=True, logprob_start_len=3),
    ],
)
def test_invalid_requests(bad: pb.GenerateRequest) -> None:
    with pytest.raises(InvalidRequest) as err:
        specs, _ = convert.generate_reqs(bad, LIMITS)
        build(specs[0])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(err.value)


def test_a_dp_rank_must_be_one_of_the_engines() -> None:
    """SGLang's DP controller raises on a rank it does not have, and dies with every rank's
    requests: refused here, naming the range; a rank in range reaches the scheduler."""
    two = ModelLimits(vocab_size=100, context_length=64, dp_size=2)
    for rank in (2, 7, -1):
        with pytest.raises(InvalidRequest, match=rf"data_parallel_rank {rank} is outside this "
                           r"engine's DP ranks \(0 to 1\)"):  # fmt: skip
            convert.generate_reqs(gen(data_parallel_rank=rank), two)
    with pytest.raises(InvalidRequest, match=r"\(0 to 0\)"):
        convert.generate_reqs(gen(data_parallel_rank=1), LIMITS)
    with pytest.raises(InvalidRequest, match="data_parallel_rank 3"):
        embed = pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[1, 2]))
        embed.data_parallel_rank = 3
        convert.embed_req(embed, ModelLimits(100, 64, is_generation=False, dp_size=2))
    specs, _ = convert.generate_reqs(gen(data_parallel_rank=1), two)
    assert specs[0].fields["routed_dp_rank"] == 1
    specs, _ = convert.generate_reqs(gen(), two)
    assert specs[0].fields["routed_dp_rank"] is None


def test_embedding_model_refuses_generate() -> None:
    limits = ModelLimits(vocab_size=100, context_length=64, is_generation=False)
    with pytest.raises(InvalidRequest):
        convert.generate_reqs(gen(), limits)


def test_finish_mapping() -> None:
    assert convert.finish_reason({"type": "length", "length": 3}) == "length"
    assert convert.finish_reason({"type": "stop", "matched": 2}) == "stop"
    assert convert.finish_reason({"type": "abort"}) == "abort"
    assert convert.failure({"type": "abort"}) is None  # a plain abort is not an error
    refused = convert.failure({"type": "abort", "status_code": 400, "message": "too long"})
    assert refused is not None
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(refused) == "too long"
    busy = convert.failure({"type": "abort", "status_code": 503, "message": "busy"})
    assert busy is not None
    assert busy.code == grpc.StatusCode.UNAVAILABLE


def test_matched_stop_string_and_id() -> None:

    by_id = convert.complete([5], [], Output([5], {"type": "stop", "matched": 5}), 0)
    assert by_id.matched_token_id == 5
    by_str = convert.complete([5], [], Output([5], {"type": "stop", "matched": "END"}), 1)
    assert by_str.matched_stop_str == "END"
    assert by_str.index == 1


def test_disaggregation_and_routing_fields() -> None:
    request = gen(
        disaggregated_params=pb.DisaggregatedParams(
            bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=0
        ),
        data_parallel_rank=2,
        lora_id="adapter-1",
        require_reasoning=True,
    )
    specs, _ = convert.generate_reqs(request, ModelLimits(100, 64, dp_size=4))
    req = build(specs[0])
    assert req.bootstrap_host == "10.0.0.1"  # type: ignore[attr-defined]
    assert req.bootstrap_port == 8998  # type: ignore[attr-defined]
    assert req.bootstrap_room == 0  # type: ignore[attr-defined] - room 0 is a real room
    assert req.routed_dp_rank == 2  # type: ignore[attr-defined]
    assert req.require_reasoning is True  # type: ignore[attr-defined]
    # The request's lora_id is a key the servicer resolves (lora.Adapters.use), never handed on.
    assert req.lora_id is None  # type: ignore[attr-defined]
    resolved = sg.build_generate(specs[0], LIMITS.vocab_size, None, ("id-1", "adapter-1"))
    assert resolved.lora_id == "id-1"  # type: ignore[attr-defined]
    if "lora_name" in type(resolved).__struct_fields__:  # SGLang 0.5.23 and later
        assert resolved.lora_name == "adapter-1"  # type: ignore[attr-defined]
    plain = one(gen())
    assert plain.bootstrap_room is None  # type: ignore[attr-defined]
    assert plain.routed_dp_rank is None  # type: ignore[attr-defined]


def test_images_to_a_text_model_or_on_embed_are_refused_with_a_message_that_says_so() -> None:
    """A model that takes no images (no image rules: ``images.rules_of``) refuses them on
    Generate; Embed takes none on any model (test_images: a vision model serves Generate's)."""
    image = gen()
    image.mm_inputs.pixel_values.data = b"\x00" * 12
    image.tokenized.input_ids.extend([1, 2])
    with pytest.raises(InvalidRequest, match="model does not take images"):
        convert.generate_reqs(image, LIMITS)
    embed = pb.EmbedRequest(request_id="e", mm_inputs=image.mm_inputs)
    embed.tokenized.input_ids.extend([1, 2])
    with pytest.raises(InvalidRequest, match="images are not served on Embed"):
        convert.embed_req(embed, LIMITS)
