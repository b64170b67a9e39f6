"""The SGLang ZMQ lane's wire without an engine process: our outputs byte for byte against the
router's own pinned encodings, the router's request (as captured from ``smg`` 1.13) decoded into
this release's structs, the checks a request gets, the control calls, and the handshake on real
ZMQ sockets. The lane end to end behind the real router: tests-integration/test_sglang_zmq_lane.py.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import msgspec
import pytest
import zmq

from smg_servicer_core.zmq_lane import ENGINE_CORE_DEAD
from smg_servicer_sglang import zmq_wire
from smg_servicer_sglang._sglang import (
    AbortReq,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    TokenizedGenerateReqInput,
)

pytestmark = pytest.mark.unit

#: ``smg`` 1.13's own test vectors (engine_zmq_client, protocol/sglang/output.rs): the plugin's
#: batch for rids a/b, b finished on token 42 with logprobs and two ranked candidates, load
#: 2/3/40/400 on engine 1; and a terminal abort for rid x with status 400.
ROUTER_BATCH = bytes.fromhex(
    "dc0013b64261746368546f6b656e4944536c696d4f757470757492a161a16292910a92141592a0a473746f7092c0"
    "c092c02a920304920102920001929092cbbfe0000000000000cbbfd0000000000000929092141501020328cd0190"
    "92c0c092909192cbbfe0000000000000cbbff0000000000000929091921516"
)
ROUTER_ABORT = bytes.fromhex(
    "dc0013b64261746368546f6b656e4944536c696d4f757470757491a178919091a561626f727491d9396e3d322069"
    "73206e6f7420736572766564206f6e207468697320776972653b20534d472066616e73206f7574206e203e203120"
    "697473656c6691c091009100910091909190000000000091cd019091909190"
)
#: What ``smg`` 1.13 sent for ``/v1/completions`` (prompt "Hello there", max_tokens 8,
#: temperature 0, ignore_eos), captured on its input socket: the sampling parameters in
#: SGLang 0.5.20's order.
ROUTER_ADD = [
    "TokenizedGenerateReqInput", "cmpl-1", None, None, [1035, 288, 830], None, None, None,
    [8, None, None, None, 0.0, 1.0, -1, 0.0, 0.0, 0.0, 1.0, 0, 1, None, None, None, None, None,
     True, True, True, False, None, None, None, None, None, None, 0, 0, False, False],
    False, -1, 0, None, False,
]  # fmt: skip
VOCAB = 4096
#: The context length the scheduler registered with (its READY answer's ``max_model_len``).
CONTEXT = 64


def test_a_scheduler_batch_is_the_routers_layout_byte_for_byte() -> None:
    out = SimpleNamespace(
        rids=["a", "b"],
        output_ids=[[10], [20, 21]],
        finished_reasons=[None, {"type": "stop", "matched": 42}],
        prompt_tokens=[3, 4],
        completion_tokens=[1, 2],
        cached_tokens=[0, 1],
        output_token_logprobs_val=[[], [-0.5, -0.25]],
        output_token_logprobs_idx=[[], [20, 21]],
        output_top_logprobs_val=[[], [[-0.5, -1.0]]],
        output_top_logprobs_idx=[[], [[21, 22]]],
    )
    load = {"num_running": 2, "num_waiting": 3, "kv_used_tokens": 40, "kv_total_tokens": 400}
    assert zmq_wire.encode(zmq_wire.token_output(out, 1, load)) == ROUTER_BATCH


def test_a_refusal_is_the_routers_abort_byte_for_byte() -> None:
    message = "n=2 is not served on this wire; SMG fans out n > 1 itself"
    abort = zmq_wire.abort_output("x", message, 400, 0, {})
    assert zmq_wire.encode(abort) == ROUTER_ABORT


def test_a_finish_keeps_its_status_and_a_multi_token_stop_is_unnamed() -> None:
    out = SimpleNamespace(
        rids=["a", "b"],
        output_ids=[[], [7]],
        finished_reasons=[
            {"type": "abort", "message": "too long", "status_code": 400},
            {"type": "stop", "matched": [1, 2]},
        ],
        prompt_tokens=[1, 1],
        completion_tokens=[0, 1],
        cached_tokens=None,
        output_token_logprobs_val=None,
        output_token_logprobs_idx=None,
        output_top_logprobs_val=None,
        output_top_logprobs_idx=None,
    )
    slim = zmq_wire.token_output(out, 0, {})
    assert slim.finished_status == [400, None]
    assert slim.finished_messages == ["too long", None]
    assert slim.finished_matched == [None, None]
    assert slim.cached_tokens == [0, 0]


def test_the_routers_request_decodes_into_this_releases_structs() -> None:
    """On 0.5.22+ (``watermark`` inserted) the sampling parameters are re-laid by name; on 0.5.20
    they pass as they are. Either way every field lands where the router meant it."""
    source, _ = _source()
    (req,) = source._decode([zmq_wire.ADD, msgspec.msgpack.encode(ROUTER_ADD)])
    assert isinstance(req, TokenizedGenerateReqInput)
    assert list(req.input_ids) == [1035, 288, 830]
    params = req.sampling_params
    assert (params.max_new_tokens, params.top_k, params.ignore_eos) == (8, 1, True)  # greedy
    assert params.stop_str_max_len == 0 and params.skip_special_tokens is True
    assert source.sender.live == {"cmpl-1"}


def test_the_layout_refuses_a_field_this_release_lacks() -> None:
    fields = [f for f in zmq_wire.ROUTER_SAMPLING_FIELDS if f != "ebnf_full_assistant"]
    layout = zmq_wire.SamplingLayout([*fields[:26], "watermark", *fields[26:]], {"watermark": 7})
    values = list(ROUTER_ADD[zmq_wire.SAMPLING_SLOT])
    relaid = layout.relay(values)
    assert relaid[26] == 7 and relaid[27:] == values[26:31]
    with pytest.raises(ValueError, match="ebnf_full_assistant"):
        layout.relay([*values[:31], True])


def _source() -> tuple[zmq_wire.RequestSource, zmq.Socket]:
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = ctx.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    sender = zmq_wire.OutputSender()
    sender.attach(push, 0, lambda: None)
    source = zmq_wire.RequestSource(ctx.socket(zmq.DEALER), sender, VOCAB, context_length=CONTEXT)
    return source, pull


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({4: [5, VOCAB]}, f"token id {VOCAB} is outside the vocabulary"),
        ({4: [-1, 5]}, "token id -1 is outside the vocabulary"),
        ({4: []}, "the prompt is empty"),
        # The one prompt rule of every lane: one token of room at least (SGLang's scheduler has
        # no such check before its own, lower, bound).
        ({4: [5] * CONTEXT}, f"the prompt has {CONTEXT} tokens; the context holds {CONTEXT}"),
        ({"n": 2}, "n=2"),
        ({"top_p": 2.0}, "top_p"),
    ],
)
def test_a_request_sglang_would_refuse_ends_at_once_with_400(change: dict, why: str) -> None:
    source, out = _source()
    request = list(ROUTER_ADD)
    params = list(ROUTER_ADD[zmq_wire.SAMPLING_SLOT])
    for key, value in change.items():
        if isinstance(key, int):
            request[key] = value
        else:
            params[zmq_wire.ROUTER_SAMPLING_FIELDS.index(key)] = value
    request[zmq_wire.SAMPLING_SLOT] = params
    assert source._decode([zmq_wire.ADD, msgspec.msgpack.encode(request)]) == []
    assert out.poll(5000)
    answer = msgspec.msgpack.decode(out.recv())
    assert answer[1:4] == [["cmpl-1"], [[]], ["abort"]] and answer[16] == [400]
    assert why in answer[4][0]
    assert source.sender.live == set()


def test_a_request_naming_an_adapter_is_refused_for_the_python_lane() -> None:
    """The scheduler takes only a registered adapter id and asserts on another (the engine dies);
    names and loads are the Python lane's, so this lane refuses any ``lora_id``."""
    source, _ = _source()
    [req] = source._decode([zmq_wire.ADD, msgspec.msgpack.encode(ROUTER_ADD)])
    assert source.refusal(req) is None
    req.lora_id = "my-adapter"
    why = source.refusal(req) or ""
    assert "'my-adapter'" in why and "Python gRPC lane" in why


def test_a_request_with_images_is_refused_for_the_python_lane() -> None:
    """The Python lane checks every image count the forward pass fails on; this lane hands the
    scheduler the router's struct as it is, so it refuses ``mm_inputs`` (issue #45)."""
    source, _ = _source()
    [req] = source._decode([zmq_wire.ADD, msgspec.msgpack.encode(ROUTER_ADD)])
    req.mm_inputs = {"mm_items": []}
    assert source.refusal(req) == zmq_wire.IMAGES_ON_PYTHON_LANE
    assert "Python lane" in zmq_wire.IMAGES_ON_PYTHON_LANE


def test_a_drain_refuses_new_requests_with_503() -> None:
    source, out = _source()
    source.draining = True
    assert source._decode([zmq_wire.ADD, msgspec.msgpack.encode(ROUTER_ADD)]) == []
    assert out.poll(5000)
    answer = msgspec.msgpack.decode(out.recv())
    assert answer[3] == ["abort"] and answer[16] == [503]
    assert answer[4] == [zmq_wire.SHUTTING_DOWN]


def test_aborts_and_control_calls_become_the_schedulers_own_requests() -> None:
    source, out = _source()
    aborts = source._decode([zmq_wire.ABORT, msgspec.msgpack.encode(["a", "b"])])
    assert [type(a) for a in aborts] == [AbortReq, AbortReq]
    assert [a.rid for a in aborts] == ["a", "b"]
    (flush,) = source._decode([zmq_wire.CONTROL, msgspec.msgpack.encode([7, "flush_cache", []])])
    assert isinstance(flush, FlushCacheReqInput) and flush.rid == "smg-control-7"
    profile = [zmq_wire.CONTROL, msgspec.msgpack.encode([8, "start_profile", []])]
    assert source._decode(profile) == []
    assert out.poll(5000)
    assert msgspec.msgpack.decode(out.recv()) == [
        "ControlReplySlim", 8, False, "start_profile is not served on this lane", 0
    ]  # fmt: skip


def test_a_scheduler_abort_and_a_flush_reply_reach_the_router() -> None:

    source, out = _source()
    source.sender.live.add("r")
    refused = AbortReq(
        rid="r", finished_reason={"type": "abort", "message": "too long", "status_code": 400}
    )
    source.sender.send_output(refused, None)
    assert out.poll(5000)
    answer = msgspec.msgpack.decode(out.recv())
    assert (answer[1], answer[4], answer[16]) == (["r"], ["too long"], [400])
    assert source.sender.live == set()
    source.sender.send_output(
        FlushCacheReqOutput(success=True), FlushCacheReqInput(rid="smg-control-3")
    )
    assert out.poll(5000)
    assert msgspec.msgpack.decode(out.recv()) == ["ControlReplySlim", 3, True, None, 0]
    source.sender.send_dead()
    assert out.poll(5000) and out.recv() == ENGINE_CORE_DEAD


def test_the_handshake_registers_and_wires_both_sockets(tmp_path) -> None:
    ctx = zmq.Context()
    handshake, inputs = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    outputs = ctx.socket(zmq.PULL)
    port = handshake.bind_to_random_port("tcp://127.0.0.1")
    inputs.bind(f"ipc://{tmp_path}/in")
    outputs.bind(f"ipc://{tmp_path}/out")
    ready = zmq_wire.ReadyResponse(
        max_model_len=1024, num_gpu_blocks=64, block_size=1, dtype="float32",
        vllm_version="sglang-x", max_num_seqs=8, max_num_batched_tokens=4096,
        instance_id="tiny", kv_cache_size_tokens=64,
    )  # fmt: skip
    sender = zmq_wire.OutputSender()
    init = {"addresses": {"inputs": [f"ipc://{tmp_path}/in"], "outputs": [f"ipc://{tmp_path}/out"]}}

    def router_side() -> None:
        assert handshake.poll(5000)
        who, hello = handshake.recv_multipart()
        assert who == (3).to_bytes(2, "little")
        assert msgspec.msgpack.decode(hello) == {"status": "HELLO", "local": True, "headless": True}
        handshake.send_multipart([who, msgspec.msgpack.encode(init)])

    thread = threading.Thread(target=router_side)
    thread.start()
    try:
        source = zmq_wire.handshake(
            ctx, f"tcp://127.0.0.1:{port}", engine_index=3, ready=ready, sender=sender,
            probe=lambda: None, vocab_size=VOCAB,
        )  # fmt: skip
        thread.join(5)
        assert handshake.poll(5000)
        assert msgspec.msgpack.decode(handshake.recv_multipart()[1])["status"] == "READY"
        assert inputs.poll(5000)
        who, registered = inputs.recv_multipart()
        assert who == (3).to_bytes(2, "little")
        facts = msgspec.msgpack.decode(registered)
        assert (facts["max_model_len"], facts["dtype"], facts["instance_id"]) == (
            1024, "float32", "tiny"
        )  # fmt: skip
        assert len(facts) == 19  # every field the router's EngineCoreReadyResponse names
        sender.send_abort("r", "gone", None)
        assert outputs.poll(5000)
        assert msgspec.msgpack.decode(outputs.recv())[1] == ["r"]
        inputs.send_multipart([who, zmq_wire.ABORT, msgspec.msgpack.encode(["r"])])
        assert source.socket.poll(5000)
        assert [a.rid for a in source.drain(-1)] == ["r"]
        source.socket.close(linger=0)
        assert sender.socket is not None
        sender.socket.close(linger=0)
    finally:
        for sock in (handshake, inputs, outputs):
            sock.close(linger=0)
        ctx.term()


def test_no_init_is_a_timeout() -> None:
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(TimeoutError, match="no INIT"):
            zmq_wire.handshake(
                ctx, f"tcp://127.0.0.1:{port}", engine_index=0, ready=None,  # type: ignore[arg-type]
                sender=zmq_wire.OutputSender(), probe=lambda: None, vocab_size=VOCAB, wait_s=0.5,
            )  # fmt: skip
    finally:
        silent.close(linger=0)
        ctx.term()


def test_a_dtype_the_router_cannot_name_is_refused() -> None:
    assert zmq_wire.wire_dtype("torch.bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="float8"):
        zmq_wire.wire_dtype("torch.float8_e4m3fn")


def test_an_output_that_cannot_be_relayed_ends_the_request_on_both_sides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The router gets an error for it (no exception text); the scheduler, an abort at the next
    drain."""
    source, out = _source()
    source.sender.live.add("r")

    def broken(output: object, recv_obj: object) -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(source.sender, "_relay", broken)
    source.sender.send_output(SimpleNamespace(rids=["r"]), None)
    assert out.poll(5000)
    answer = msgspec.msgpack.decode(out.recv())
    assert (answer[1], answer[3]) == (["r"], ["abort"])
    assert answer[4] == ["the engine's output could not be relayed"]
    (abort,) = source.drain(-1)
    assert isinstance(abort, AbortReq)
    assert abort.rid == "r"
    assert source.drain(-1) == []
