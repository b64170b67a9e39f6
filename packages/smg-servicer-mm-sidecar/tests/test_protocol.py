"""Protocol v1 without Redis or vLLM: keys, fingerprint and namespace, hello, messages, codes."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from smg_servicer_mm_sidecar import protocol as p

pytestmark = pytest.mark.unit

FP = p.Fingerprint(
    model="/models/tiny-vlm",
    vllm_version="0.32.0",
    dtype="float32",
    video_backend="opencv",
    media_io_kwargs="{}",
    mm_processor_kwargs="{}",
    limit_per_prompt="audio=*,image=2,video=*",
)


def test_the_protocol_imports_without_redis_or_vllm() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('redis', 'vllm', 'torch', 'hiredis'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import smg_servicer_mm_sidecar.protocol as p\n"
        "print(p.namespace_for(p.Fingerprint(*'abcdefg')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(out.stdout.strip()) == 16


def test_the_namespace_is_16_hex_and_depends_on_every_field() -> None:
    base = p.namespace_for(FP)
    assert len(base) == 16 and int(base, 16) >= 0
    for name in p.FINGERPRINT_FIELDS:
        changed = msgspec.structs.replace(FP, **{name: getattr(FP, name) + "x"})
        assert p.namespace_for(changed) != base, name


def test_an_override_is_trimmed_and_wins() -> None:
    assert p.namespace_for(FP, "  team-a ") == "team-a"
    assert p.namespace_for(FP, "   ") == p.namespace_for(FP)


def test_limits_are_canonical() -> None:
    assert p.limit_string({}) == "*"
    assert p.limit_string({"image": None}) == "*"
    assert p.limit_string({"image": 2}) == "audio=*,image=2,video=*"
    assert p.limit_string({"video": 1, "image": 2}) == p.limit_string({"image": 2, "video": 1})
    assert p.sorted_json({"b": 1, "a": {"y": 2, "x": 1}}) == '{"a":{"x":1,"y":2},"b":1}'
    assert p.sorted_json(None) == "{}"


def test_mismatches_name_the_fields() -> None:
    other = msgspec.structs.replace(FP, dtype="bfloat16", limit_per_prompt="*")
    assert p.mismatches(FP, other) == ["dtype", "limit_per_prompt"]
    assert p.mismatches(FP, FP) == []


def test_the_keys() -> None:
    keys = p.Keys("abc")
    assert keys.hello == "smg:mm:v1:abc:hello"
    assert keys.jobs == "smg:mm:v1:abc:jobs"
    assert keys.result("j1") == "smg:mm:v1:abc:res:j1"


def test_a_hello_round_trips_through_a_bytes_hash() -> None:
    hello = p.Hello(FP, p.SCHEMA, ("data", "http", "https"), 1700000000.25, "flag", 1 << 20)
    raw = {k.encode(): v.encode() for k, v in p.hello_fields(hello).items()}
    assert p.parse_hello(raw) == hello
    for missing in ("model", "schema", "max_result_bytes"):
        assert p.parse_hello({k: v for k, v in raw.items() if k != missing.encode()}) is None
    assert p.parse_hello(raw | {b"schema": b"one"}) is None


def test_a_job_and_a_result_round_trip() -> None:
    job = p.Job(
        v=1,
        job_id="j",
        request_id="r",
        fingerprint=FP,
        prompt_token_ids=[1, 2, 3],
        prompt=None,
        items=[p.JobItem("image", "data:image/png;base64,AAAA")],
        enqueued_ms=10,
        deadline_ms=30010,
    )
    assert p.decode_job(p.encode(job)) == job
    result = p.JobResult(
        v=1,
        job_id="j",
        ok=True,
        fingerprint=FP,
        prompt_token_ids=[1, 9, 9, 3],
        mm_hashes={"image": ["h"]},
        mm_placeholders={"image": [p.Placeholder(1, 2, [True, False])]},
        mm_kwargs={"image": [b"\x00\x01blob"]},
    )
    assert p.decode_result(p.encode(result)) == result


def test_failures_have_defaults_and_bad_messages_are_protocol_errors() -> None:
    fail = p.decode_result(p.encode(p.failure("j", "fetch_failed", "no")))
    assert (fail.ok, fail.code, fail.mm_kwargs, fail.fingerprint) == (
        False,
        "fetch_failed",
        {},
        None,
    )
    with pytest.raises(p.SidecarError) as info:
        p.decode_result(b"\x01garbage")
    assert info.value.code == p.SIDECAR_PROTOCOL
    future = msgspec.msgpack.encode({"v": 2, "job_id": "j", "ok": True})
    with pytest.raises(p.SidecarError, match="schema 2"):
        p.decode_result(future)


def test_code_families_are_disjoint_and_mapped() -> None:
    families = list(p.code_sets())
    for i, a in enumerate(families):
        for b in families[i + 1 :]:
            assert not a & b
    assert {p.status_for(c) for c in p.CLIENT_CODES} == {"INVALID_ARGUMENT"}
    assert {p.status_for(c) for c in p.RETRYABLE_CODES} == {"UNAVAILABLE"}
    assert p.status_for(p.RESULT_TOO_LARGE) == "INVALID_ARGUMENT"
    assert p.client_message(p.RESULT_TOO_LARGE, "9 bytes").startswith("media_too_large: ")
    assert p.status_for(p.RESULT_PUSH_FAILED) == "UNAVAILABLE"
    assert p.status_for(p.SIDECAR_OVERLOADED) == "UNAVAILABLE"
    # the worker spent the budget: a code the router does not retry
    assert p.status_for(p.SIDECAR_TIMEOUT) == "INTERNAL"
