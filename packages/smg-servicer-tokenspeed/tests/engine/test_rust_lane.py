"""The Rust servicer lane on TokenSpeed (``--servicer-impl rust``): the ``smg`` wheel's
``TokenSpeedGrpcServer`` in our launcher process (``python -m smg_grpc_servicer.tokenspeed``, what
``ts serve`` spawns; ``SMG_TOKENSPEED_SERVICER_IMPL=rust`` there), TokenSpeed's scheduler ranks
started by TokenSpeed's own code and speaking its msgpack ZMQ wire (only the GPU loop stood in,
its messages recorded), and the real router in front (``smg launch --worker-urls grpc://…``).

Chat and completions, streaming and not, with usage; logprobs and a grammar reaching the
scheduler; what the server reports of the model; bad input (refused, the scheduler serving on); the
load the router reads; a client that disconnects; SIGTERM (the stream in flight finishes, exit 0);
engine death (the stream ends with an error at once, exit 1, nothing left running); a
configuration the lane cannot serve (exit 2, one line)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.tokenspeed_suite import SERVICE, Record, scheduler_ranks
from smg_it.zmq_lane import (
    UNDER_LOAD,
    Lane,
    aborted,
    check_stream_and_non_stream_agree,
    check_the_router_sees_the_load,
    check_the_server_aborts_for_a_client_that_left,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.config import environment
from smg_servicer_core.proto import tokenspeed_scheduler_pb2 as pb
from smg_servicer_core.proto import tokenspeed_scheduler_pb2_grpc as pb_grpc
from smg_servicer_core.testing.process import free_port, wait_serving
from smg_servicer_tokenspeed.testing import serve_command, standin_env

pytestmark = pytest.mark.integration

#: Longer than any wait below at the stand-in's pace (5 ms a step), inside the 1,024-token context.
LONG = 900


def served(model: Path, record: Record, *flags: str, env: dict[str, str] | None = None) -> Lane:
    port = free_port()
    command = serve_command(
        model, port, "--enable-output-logprobs", *flags, python=Path(sys.executable)
    )
    environ = {**standin_env(step_ms=5, record=str(record.path)), **(env or {})}
    lane = Lane(command, "tokenspeed", model, f"grpc://127.0.0.1:{port}", env=environ)
    # The Rust server answers the router's model-info call before the ranks connect; its health
    # says SERVING once they have. Wait until the router has the worker in.
    try:
        wait_serving(f"127.0.0.1:{port}", SERVICE, timeout_s=240)
        until(lambda: lane.worker()["is_healthy"], 60, "the router never took the worker in")
    except BaseException:
        lane.stop()
        raise
    return lane


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    return Record(tmp_path_factory.mktemp("rust-ts-record") / "record.jsonl")


@pytest.fixture(scope="module")
def lane(tiny_model: Path, record: Record) -> Iterator[Lane]:
    running = served(tiny_model, record, "--servicer-impl", "rust")
    yield running
    running.stop()


def test_the_rust_servicer_serves_and_says_so(lane: Lane) -> None:
    log = lane.engine.tail(100_000)
    assert "servicer implementation: rust (flag)" in log
    assert "the Rust servicer is SERVING" in log
    assert "msgpack handshake: complete (engine_index=0)" in log
    assert "AsyncLLM" not in log
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("grpc", "tokenspeed")
    assert worker["is_healthy"] and worker["model_id"] == lane.model
    assert len(scheduler_ranks(lane.engine)) == 1


def test_model_and_server_info_are_the_models(lane: Lane, tiny_model: Path) -> None:
    """What the server was built with (the keywords the binding takes) is what it reports."""
    config = json.loads((tiny_model / "config.json").read_text())
    with grpc.insecure_channel(lane.url.removeprefix("grpc://")) as channel:
        stub = pb_grpc.TokenSpeedSchedulerStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        server = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert (info.vocab_size, info.max_context_length) == (config["vocab_size"], 1024)
    assert (info.served_model_name, info.model_type) == (str(tiny_model), "llama")
    assert sorted(info.eos_token_ids) == sorted(config["eos_token_id"])
    assert list(info.architectures) == ["LlamaForCausalLM"]
    assert server.tokenspeed_version == "0.1.1"
    assert server.server_args["max_model_len"] == 1024


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


@pytest.mark.standin
def test_logprobs_and_a_grammar_reach_the_scheduler(lane: Lane, record: Record) -> None:
    chat = {"messages": [{"role": "user", "content": "yes or no?"}]}
    scored = lane.post("/v1/chat/completions", max_tokens=5, ignore_eos=True, logprobs=True, **chat)
    assert scored.status_code == 200, scored.text
    assert len(scored.json()["choices"][0]["logprobs"]["content"]) == 5
    assert record.entries("generate")[-1]["return_logprob"]
    enum = {"type": "string", "enum": ["yes", "no"]}
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": enum}}
    constrained = lane.post("/v1/chat/completions", max_tokens=4, response_format=schema, **chat)
    assert constrained.status_code == 200, constrained.text
    assert '"enum"' in str(record.entries("generate")[-1]["json_schema"])


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """Refused by the Rust server, or by the rank's guard before the scheduler runs it (an
    abort), the scheduler unharmed (smg_it.conformance: the table every lane is held to)."""
    check_lane("rust", "tokenspeed", lane)
    assert all(r.is_running() for r in scheduler_ranks(lane.engine))


def test_the_router_sees_the_schedulers_load(lane: Lane) -> None:
    check_the_router_sees_the_load(lane, LONG)


def test_a_client_that_disconnects_stops_its_request(lane: Lane) -> None:
    """The Rust server aborts the request in the scheduler (the rank's guard logs the abort)."""
    check_the_server_aborts_for_a_client_that_left(lane, LONG, "scheduler")


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "rust", "tokenspeed")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    """Last in this module with the shared lane: it stops it."""
    started = scheduler_ranks(lane.engine)
    finishes, answers = sigterm_mid_stream(lane, 600, key("rust", "tokenspeed"), aborted)
    assert finishes == ["length"] * UNDER_LOAD
    assert answers and aborted(answers[-1]), [a.status_code for a in answers]
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, f"left running: {alive}"
    assert "drained (every request finished)" in lane.engine.tail(100_000)


def test_ts_serve_with_the_variable_and_engine_death(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """What ``ts serve`` spawns takes the lane from ``SMG_TOKENSPEED_SERVICER_IMPL``; a killed
    rank ends the stream in flight with an error at once, the launcher exits 1 and the router
    takes the worker out."""
    record = Record(tmp_path_factory.mktemp("rust-ts-death") / "record.jsonl")
    lane = served(tiny_model, record, env={"SMG_TOKENSPEED_SERVICER_IMPL": "rust"})
    try:
        assert "servicer implementation: rust (env)" in lane.engine.tail(100_000)
        (rank,) = scheduler_ranks(lane.engine)
        kill_mid_stream(lane, rank, LONG, key("rust", "tokenspeed"))
        assert "told the router (1 output socket(s))" in lane.engine.tail(100_000)
    finally:
        lane.stop()


def test_a_configuration_the_lane_cannot_serve_exits_2_in_one_line(tiny_model: Path) -> None:
    """The metrics port: the binding has none."""
    command = serve_command(
        tiny_model, free_port(), "--servicer-impl", "rust", "--metrics-port", "1",
        python=Path(sys.executable),
    )  # fmt: skip
    done = subprocess.run(
        command, check=False, env=environment(), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: --metrics-port is not served by --servicer-impl rust (the smg binding exposes no "
        "metrics)"
    ], done.stderr[-2000:]
