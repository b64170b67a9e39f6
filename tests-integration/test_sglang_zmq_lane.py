"""The router's direct ZMQ lane on SGLang: ``smg launch --worker-urls ipc://… --backend sglang`` in
front of our headless launcher (``python -m smg_grpc_servicer.sglang.headless``) and SGLang's real
scheduler on CPU. No Python between the router and the scheduler: the ``smg-zmq`` plugin makes the
scheduler speak the router's frames itself; the launcher starts it, tells the router when it dies
and drains it on SIGTERM.

Chat and completions, streaming and not, with usage; structured output and logprobs; bad input (a
4xx, the scheduler unharmed); the load the router reads; a client that disconnects (the scheduler
stops the request); SIGTERM (the stream in flight finishes); engine death (the router is told at
once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.paths import sglang_python
from smg_it.zmq_lane import (
    TEST_DRAIN_S,
    UNDER_LOAD,
    Lane,
    check_a_disconnect_aborts,
    check_stream_and_non_stream_agree,
    check_structured_output_and_logprobs,
    check_the_router_sees_the_load,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_sglang.testing import CPU_ENV, headless_command

pytestmark = pytest.mark.integration

#: Longer than any wait below at the scheduler's CPU pace, inside the 1,024-token context.
LONG = 900
#: The stream in flight at SIGTERM: seconds of SGLang's CPU pace, well past the refusal the
#: test waits for (about a second), and all of it drained.
IN_FLIGHT = 300


def sglang_lane(model: Path, sockets: Path) -> Lane:
    url = f"ipc://{sockets}/engine"
    # info: the lane's own lines (the router's aborts, requests ended by one) are in the log.
    command = headless_command(
        model,
        url,
        *("--log-level", "info", "--zmq-drain-timeout", str(TEST_DRAIN_S)),
        python=sglang_python(),
    )
    return Lane(command, "sglang", model, url, env=CPU_ENV)


def scheduler(lane: Lane) -> psutil.Process:
    (rank,) = [p for p in lane.engine.children() if "sglang::scheduler" in " ".join(p.cmdline())]
    return rank


@pytest.fixture(scope="module")
def lane(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    served = sglang_lane(tiny_model, tmp_path_factory.mktemp("zmq-sglang"))
    yield served
    served.stop()


def test_the_scheduler_dials_the_port_the_router_derives(lane: Lane) -> None:
    assert f"tcp://127.0.0.1:{handshake_port(lane.url)}" in lane.engine.tail(100_000)
    assert "Executed general plugin: smg-zmq" in lane.engine.tail(100_000)
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("zmq", "sglang")
    assert worker["is_healthy"]
    assert worker["model_id"] == lane.model


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


def test_structured_output_and_logprobs_ride_the_lane(lane: Lane) -> None:
    check_structured_output_and_logprobs(lane)


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """The router forwards these unchecked; the plugin's check (the one prompt rule of every lane:
    core's ``validate.prompt_refusal``, the Python lane's words; SGLang's own sampling checks)
    ends the request with status 400, which the router passes on; the scheduler never sees a
    token id it could not embed (smg_it.conformance: the table every lane is held to)."""
    check_lane("zmq", "sglang", lane)


def test_the_router_sees_the_schedulers_load(lane: Lane) -> None:
    """The load every output batch carries (running, waiting, KV tokens), back to none once the
    last request has ended (its own output says so: an idle scheduler sends nothing more)."""
    check_the_router_sees_the_load(lane, LONG)


def test_a_client_that_disconnects_stops_its_request(lane: Lane) -> None:
    """The router's ABORT reaches the scheduler, which ends the request by abort (the plugin logs
    both)."""
    rid = check_a_disconnect_aborts(lane, LONG)
    assert f"request {rid} ended by abort" in lane.engine.tail(100_000)


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "zmq", "sglang")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    """SIGTERM: the stream in flight gets every token and its finish; a request that arrives
    meanwhile is not served (the scheduler refuses it with 503, the router answers an error); the
    launcher exits 0 and leaves nothing running; the router is told the worker is gone. Last in
    this module: it stops the shared lane."""
    rank = scheduler(lane)
    finishes, answers = sigterm_mid_stream(lane, IN_FLIGHT, key("zmq", "sglang"))
    assert finishes == ["length"] * UNDER_LOAD
    assert answers[-1].status_code >= 500, answers[-1].text
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs([rank], timeout=10)
    assert not alive, f"left running: {alive}"
    log = lane.engine.tail(100_000)
    assert "the worker is shutting down" in log
    assert "drained (every request finished)" in log
    until(lambda: not lane.worker()["is_healthy"], 5, "the router kept the drained worker")


def test_engine_death_is_told_to_the_router_at_once(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A killed scheduler sends nothing; the launcher tells the router for it: the stream in
    flight ends with an error, the next request fails, the router takes the worker out of
    rotation, and the launcher exits 1 with nothing left running."""
    lane = sglang_lane(tiny_model, tmp_path_factory.mktemp("zmq-sglang-death"))
    try:
        kill_mid_stream(lane, scheduler(lane), LONG, key("zmq", "sglang"))
        assert "told the router (1 output socket(s))" in lane.engine.tail(100_000)
    finally:
        lane.stop()
