"""The pure conversions of smg-servicer-tokenspeed, without TokenSpeed or a server: requests to
per-choice specs (proto3 presence rules, n > 1 expansion, seeds, constraints), TokenSpeed's output
dicts to chunks and completes (deltas, stop trimming, logprob alignment), scheduler aborts to
statuses, secret redaction, loads and the KV-events config. (That these modules import no engine is
``smg-grpc-servicer``'s ``test_conversions_are_pure_and_import_no_engine``.)"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from smg_servicer_core.errors import ConfigError, InvalidRequest, ServicerError, status_for
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_tokenspeed import convert, info, kv_events, loads
from smg_servicer_tokenspeed.convert import Choice, Limits

pytestmark = pytest.mark.unit
LIMITS = Limits(vocab_size=100, context_length=64)


def req(**kwargs: Any) -> pb.GenerateRequest:
    sampling = kwargs.pop("sampling", {})
    return pb.GenerateRequest(
        request_id=kwargs.pop("request_id", "r"),
        tokenized=pb.TokenizedInput(input_ids=kwargs.pop("ids", [1, 2, 3])),
        sampling_params=pb.SamplingParams(**sampling),
        **kwargs,
    )


def test_unset_optional_fields_are_not_sent() -> None:
    (spec,) = convert.generate_specs(req(), LIMITS)
    assert spec.sampling == {
        "ignore_eos": False,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": False,
    }
    assert spec.logprob_start_len is None
    assert spec.bootstrap is None and spec.data_parallel_rank is None
    assert (spec.rid, spec.index, spec.input_ids) == ("r", 0, [1, 2, 3])


def test_set_fields_are_sent_in_tokenspeeds_names() -> None:
    sampling = {
        "temperature": 0.5, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "frequency_penalty": 0.2,
        "presence_penalty": -0.2, "repetition_penalty": 1.1, "max_new_tokens": 9,
        "min_new_tokens": 2, "stop": ["x"], "stop_token_ids": [4], "ignore_eos": True,
        "sampling_seed": 3, "ebnf_grammar": "root ::= 'a'", "logit_bias": {"5": -1.0},
    }  # fmt: skip
    params = pb.SamplingParams(**sampling)
    params.custom_params.update({"k": "v"})
    request = req(logprob_start_len=0, return_logprob=True)
    request.sampling_params.CopyFrom(params)
    (spec,) = convert.generate_specs(request, LIMITS)
    s = spec.sampling
    assert s["temperature"] == pytest.approx(0.5)
    assert s["top_k"] == 7 and s["max_new_tokens"] == 9 and s["min_new_tokens"] == 2
    assert s["seed"] == 3 and s["ebnf"] == "root ::= 'a'" and "ebnf_grammar" not in s
    assert s["stop"] == ["x"] and s["stop_token_ids"] == [4] and s["ignore_eos"] is True
    assert s["logit_bias"] == {"5": -1.0}
    assert s["custom_params"] == {"k": "v"}
    assert spec.logprob_start_len == 0 and spec.return_logprob


@pytest.mark.parametrize("field_name", ["top_p", "top_k", "repetition_penalty"])
def test_zero_means_off_not_a_literal_zero(field_name: str) -> None:
    (spec,) = convert.generate_specs(req(sampling={field_name: 0}), LIMITS)
    assert field_name not in spec.sampling


def test_n_expands_to_children_with_offset_seeds() -> None:
    specs = convert.generate_specs(req(sampling={"n": 3, "sampling_seed": 10}), LIMITS)
    assert [s.rid for s in specs] == ["r-n0", "r-n1", "r-n2"]
    assert [s.index for s in specs] == [0, 1, 2]
    assert [s.sampling["seed"] for s in specs] == [10, 11, 12]
    greedy = convert.generate_specs(
        req(sampling={"n": 2, "sampling_seed": 10, "temperature": 0.0}), LIMITS
    )
    assert [s.sampling["seed"] for s in greedy] == [10, 10]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.GenerateRequest(request_id="r"), "tokenized input only"),
        (req(ids=[]), "the prompt is empty"),
        (req(ids=[1, 100]), "token id 100 is outside the vocabulary (size 100)"),
        (req(ids=[1] * 64), "the prompt has 64 tokens; the context holds 64"),
        (req(sampling={"max_new_tokens": 0}), "max_tokens must be at least 1, got 0"),
        (req(sampling={"top_k": -2}), "top_k must be -1 or 0 (off) or positive, got -2"),
        (req(sampling={"n": 129}), "n must be at most 128, got 129"),
        (req(sampling={"logit_bias": {"x": 1.0}}), "logit_bias keys must be token ids"),
        (req(sampling={"logit_bias": {"1": float("inf")}}), "logit_bias values must be finite"),
        (req(top_logprobs_num=21), "logprobs must be in [0, 20], got 21"),
        (req(token_ids_logprob=[100]), "token id 100 is outside the vocabulary"),
        (req(data_parallel_rank=-1), "data_parallel_rank must not be negative"),
    ],
)
def test_invalid_requests(request_: pb.GenerateRequest, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.generate_specs(request_, LIMITS)
    assert message in err.value.message


def test_bootstrap_and_rank() -> None:
    info_ = pb.KvBootstrapInfo(bootstrap_host="h", bootstrap_port=7, bootstrap_room=0)
    (spec,) = convert.generate_specs(req(kv_bootstrap_info=info_, data_parallel_rank=1), LIMITS)
    assert spec.bootstrap == ("h", 7, 0)  # room 0 is kept
    assert spec.data_parallel_rank == 1


# -- outputs ---------------------------------------------------------------------------------


def out(ids: list[int], completion: int | None = None, finish: Any = None, **meta: Any) -> Any:
    return {
        "output_ids": ids,
        "meta_info": {
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": len(ids) if completion is None else completion,
            "cached_tokens": 1,
            "weight_version": "v1",
            **meta,
        },
    }


def lp(*pairs: tuple[float, int]) -> list[tuple[float, int, None]]:
    return [(v, t, None) for v, t in pairs]


def choice(
    stream: bool = True,
    *,
    no_stop_trim: bool = False,
    return_logprob: bool = False,
    want_top: bool = False,
) -> Choice:
    return Choice(0, stream, no_stop_trim, return_logprob, want_top)


def test_frame_keeps_the_generated_tail() -> None:
    # TokenSpeed may prepend template ids: the generated ids are the last completion_tokens.
    frame = convert.frame(out([90, 91, 5, 6], completion=2))
    assert frame.ids == [5, 6]
    assert (frame.prompt_tokens, frame.cached_tokens, frame.weight_version) == (3, 1, "v1")


def test_stream_sends_deltas_of_cumulative_ids() -> None:
    c = choice()
    first = c.chunk(convert.frame(out([5])))
    assert first is not None and list(first.token_ids) == [5]
    merged = c.chunk(convert.frame(out([5, 6, 7])))  # two steps merged by the front end
    assert merged is not None and list(merged.token_ids) == [6, 7]
    assert merged.completion_tokens == 3 and merged.weight_version == "v1"
    assert c.chunk(convert.frame(out([5, 6, 7]))) is None, "nothing new, nothing sent"
    final = c.complete(convert.frame(out([5, 6, 7], finish={"type": "length", "length": 3})))
    assert final.finish_reason == "length" and not final.output_ids


def test_an_empty_first_chunk_is_still_sent() -> None:
    c = choice()
    chunk = c.chunk(convert.frame(out([], completion=0)))
    assert chunk is not None and not chunk.token_ids


@pytest.mark.parametrize("no_stop_trim", [False, True])
def test_matched_stop_token_trim(no_stop_trim: bool) -> None:
    finish = {"type": "stop", "matched": 9}
    plain = choice(stream=False, no_stop_trim=no_stop_trim)
    final = plain.complete(convert.frame(out([5, 9], finish=finish)))
    assert list(final.output_ids) == ([5, 9] if no_stop_trim else [5])
    assert final.matched_token_id == 9 and final.finish_reason == "stop"
    assert final.completion_tokens == 2
    streamed = choice(no_stop_trim=no_stop_trim)
    streamed.chunk(convert.frame(out([5])))
    last = streamed.chunk(convert.frame(out([5, 9], finish=finish)))
    if no_stop_trim:
        assert last is not None and list(last.token_ids) == [9]
    else:
        assert last is None


def test_matched_stop_string() -> None:
    final = choice(stream=False).complete(
        convert.frame(out([5], finish={"type": "stop", "matched": "END"}))
    )
    assert final.matched_stop_str == "END"


def test_logprobs_align_with_the_ids_they_belong_to() -> None:
    c = choice(return_logprob=True, want_top=True)
    tops = [[(-0.1, 5, None), (-2.0, 8, None)], None]
    chunk = c.chunk(
        convert.frame(out([5, 6], output_token_logprobs=lp((-0.1, 5), (-0.2, 6)),
                          output_top_logprobs=tops))
    )  # fmt: skip
    assert chunk is not None
    got = chunk.output_logprobs
    assert list(got.token_ids) == [5, 6]
    assert list(got.token_logprobs) == pytest.approx([-0.1, -0.2])
    assert list(got.top_logprobs[0].token_ids) == [5, 8]
    assert not got.top_logprobs[1].token_ids, "a position without top-k keeps its place"
    plain = choice(stream=False, return_logprob=True)
    finish = {"type": "stop", "matched": 6}
    final = plain.complete(
        convert.frame(out([5, 6], finish=finish, output_token_logprobs=lp((-0.1, 5), (-0.2, 6))))
    )
    assert list(final.output_ids) == [5]
    assert list(final.output_logprobs.token_ids) == [5], "the trimmed stop token's logprob goes"


def test_frames_waiting_together_make_the_chunk_the_steps_would_have_made() -> None:
    """Coalescing: three outputs read at once (ids cumulative, logprobs per output) give one
    chunk with every new id and its logprob, in order."""
    outputs = [
        out([5], completion=1, output_token_logprobs=lp((-0.1, 5))),
        out([5, 6], completion=2, output_token_logprobs=lp((-0.2, 6))),
        out([5, 6, 7], completion=3, output_token_logprobs=lp((-0.3, 7))),
    ]
    one_by_one = choice(return_logprob=True)
    steps = [one_by_one.chunk(convert.frame(o)) for o in outputs]
    together = choice(return_logprob=True)
    merged = together.chunk(convert.merged([convert.frame(o) for o in outputs]))
    assert merged is not None and all(s is not None for s in steps)
    assert list(merged.token_ids) == [t for s in steps if s for t in s.token_ids] == [5, 6, 7]
    assert list(merged.output_logprobs.token_ids) == [5, 6, 7]
    assert list(merged.output_logprobs.token_logprobs) == pytest.approx([-0.1, -0.2, -0.3])
    assert merged.completion_tokens == 3
    assert convert.merged([convert.frame(outputs[0])]) == convert.frame(outputs[0])


def test_aborted_choice_keeps_its_counts() -> None:
    c = choice()
    c.chunk(convert.frame(out([5, 6])))
    final = c.aborted()
    assert final.finish_reason == "abort" and final.completion_tokens == 2


@pytest.mark.parametrize(
    ("finish", "code"),
    [
        ({"type": "abort", "status_code": 400, "message": "too long"}, "INVALID_ARGUMENT"),
        ({"type": "abort", "status_code": 503, "message": "busy"}, "UNAVAILABLE"),
        ({"type": "abort", "status_code": 429, "message": "queue"}, "RESOURCE_EXHAUSTED"),
        ({"type": "abort", "message": "secret internals"}, "INTERNAL"),
    ],
)
def test_scheduler_aborts_map_to_statuses(finish: dict[str, Any], code: str) -> None:
    error = convert.failure(finish, "r")
    assert isinstance(error, ServicerError)
    status, message = status_for(error)
    assert status == getattr(grpc.StatusCode, code)
    if "status_code" not in finish:
        assert "secret" not in message
    assert convert.failure({"type": "length"}, "r") is None
    assert convert.failure(None, "r") is None


# -- server info ----------------------------------------------------------------------------


class Mode(Enum):
    A = "a"


@dataclass
class Inner:
    hf_token: str = "x"
    ssl_keyfile_password: str = "x"
    path: Path = Path("/m")
    mode: Mode = Mode.A
    ids: set[int] = field(default_factory=lambda: {3, 1})


@dataclass
class Args:
    model: str = "m"
    api_key: str = "x"
    token: str = "x"
    rl_control_api_key: str = "x"
    inner: Inner = field(default_factory=Inner)
    nested: list[dict[str, Any]] = field(default_factory=lambda: [{"client_secret": "x", "ok": 1}])
    ratio: float = float("inf")
    obj: Any = field(default_factory=lambda: SimpleNamespace(password_file="x", size=2))


def test_server_args_are_json_safe_and_secret_free() -> None:
    args = Args()
    args.inner.__dict__["loop"] = args  # a cycle
    result = info.server_args(args, {"engine_reasoning_parser": "qwen3"})
    text = json.dumps(result)
    assert '"x"' not in text, "no secret value at any depth"
    assert result["model"] == "m" and result["engine_reasoning_parser"] == "qwen3"
    assert result["inner"]["path"] == "/m" and result["inner"]["mode"] == "a"
    assert result["inner"]["ids"] == [1, 3]
    assert result["nested"] == [{"ok": 1}]
    assert result["ratio"] == "inf"
    assert result["obj"] == {"size": 2}


@pytest.mark.parametrize(
    ("key", "secret"),
    [("token", True), ("hf_token", True), ("API_KEY", True), ("ssl_keyfile", True),
     ("client_secret", True), ("db_password", True), ("tokenizer", False),
     ("max_tokens", False), ("model", False)],
)  # fmt: skip
def test_secret_key_names(key: str, secret: bool) -> None:
    assert info.is_secret(key) is secret


# -- loads and KV events --------------------------------------------------------------------


def snap(rank: int, running: int = 1, used: int = 50, pages: int = 100) -> Any:
    return SimpleNamespace(
        dp_rank=rank, num_running_reqs=running, num_waiting_reqs=2, num_active_pages=used // 2,
        num_used_pages=used, max_total_pages=pages,
    )  # fmt: skip


def test_loads_scale_pages_to_tokens() -> None:
    (row,) = loads.rows([snap(0)], 1, 1000, 8, None)
    assert (row.num_running_reqs, row.num_waiting_reqs, row.num_total_reqs) == (1, 2, 3)
    assert row.num_used_tokens == 500 and row.max_total_num_tokens == 1000
    assert row.token_usage == pytest.approx(0.5) and row.active_token_usage == pytest.approx(0.25)
    assert row.max_running_requests == 8


def test_a_partial_snapshot_set_reports_nothing() -> None:
    assert loads.rows([snap(0)], 2, 1000, 8, None) == []
    rows = loads.rows([snap(0), snap(1, running=3)], 2, 1000, 8, None)
    assert [r.max_running_requests for r in rows] == [4, 4]
    assert [r.dp_rank for r in loads.rows([snap(0), snap(1)], 2, 1000, 8, 1)] == [1]
    total = loads.aggregate(rows)
    assert (total.total_running_reqs, total.total_reqs) == (4, 8)
    assert loads.rows([snap(0, pages=0)], 1, 1000, 8, None)[0].token_usage == 0


def test_kv_events_config() -> None:
    assert kv_events.kv_sources(None, 1) is None
    assert kv_events.kv_sources('{"publisher": "zmq"}', 1) is None, "events not enabled"
    assert kv_events.kv_sources('{"enable_kv_cache_events": true, "publisher": "x"}', 1) is None
    sources = kv_events.kv_sources(
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", '
        '"replay_endpoint": "tcp://*:6100", "topic": "kv"}',
        2,
    )
    assert sources is not None
    assert [s.endpoint for s in sources] == ["tcp://127.0.0.1:6000", "tcp://127.0.0.1:6001"]
    assert [s.replay_endpoint for s in sources] == ["tcp://127.0.0.1:6100", "tcp://127.0.0.1:6101"]
    assert sources[0].topic == b"kv"
    for bad in ("{not json", "[1]"):
        with pytest.raises(ConfigError):
            kv_events.parse_config(bad)
    record = kv_events.engine_load(snap(0), 1000)
    assert (record.running_requests, record.num_used_tokens) == (1, 500)
