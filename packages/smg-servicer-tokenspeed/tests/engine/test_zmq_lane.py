"""The router's direct ZMQ lane on TokenSpeed: ``smg launch --worker-urls ipc://… --backend
tokenspeed`` in front of our headless launcher (``python -m smg_grpc_servicer.tokenspeed.headless``)
and TokenSpeed's scheduler ranks, started by TokenSpeed's own start-up code, dialing the router
through TokenSpeed's own ``zmq_msgpack`` wire; only the GPU scheduler loop is stood in
(``smg_servicer_tokenspeed.testing.scheduler``, its messages recorded). No Python between the router
and the scheduler.

Chat and completions, streaming and not, with usage; logprobs and a grammar reaching the
scheduler; bad input (refused before the scheduler runs it: the router answers ``finish_reason``
"abort", as TokenSpeed's wire carries only the finish type); the load the router reads; a client
that disconnects (the scheduler gets the abort); SIGTERM (the stream in flight finishes, a new
request is refused, exit 0); engine death (the router is told at once, exit 1); a stop or a rank's
failure while the router is not there yet; configuration errors (exit 2)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from smg_it.conformance import check_lane
from smg_it.lane_reliability import check_reliability, key
from smg_it.tokenspeed_suite import Record, scheduler_ranks
from smg_it.zmq_lane import (
    UNDER_LOAD,
    Lane,
    aborted,
    check_a_disconnect_aborts,
    check_stream_and_non_stream_agree,
    check_the_router_sees_the_load,
    kill_mid_stream,
    sigterm_mid_stream,
    until,
)
from smg_servicer_core.testing.process import start_worker
from smg_servicer_core.zmq_lane import handshake_port
from smg_servicer_tokenspeed.testing import headless_command, standin_env

pytestmark = pytest.mark.integration

#: Longer than any wait below at the stand-in's pace (5 ms a step), inside the 1,024-token context.
LONG = 900


def ts_lane(model: Path, sockets: Path, record: Record) -> Lane:
    url = f"ipc://{sockets}/engine"
    command = headless_command(model, url, "--enable-output-logprobs", python=Path(sys.executable))
    return Lane(
        command, "tokenspeed", model, url, env=standin_env(step_ms=5, record=str(record.path))
    )


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Record:
    return Record(tmp_path_factory.mktemp("zmq-ts-record") / "record.jsonl")


@pytest.fixture(scope="module")
def lane(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, record: Record
) -> Iterator[Lane]:
    served = ts_lane(tiny_model, tmp_path_factory.mktemp("zmq-ts"), record)
    yield served
    served.stop()


def test_the_ranks_dial_the_port_the_router_derives(lane: Lane) -> None:
    assert f"tcp://127.0.0.1:{handshake_port(lane.url)}" in lane.engine.tail(100_000)
    assert "msgpack handshake: complete (engine_index=0)" in lane.engine.tail(100_000)
    worker = lane.worker()
    assert (worker["connection_mode"], worker["runtime_type"]) == ("zmq", "tokenspeed")
    assert worker["is_healthy"]
    assert worker["model_id"] == lane.model


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_and_non_stream_agree_with_usage(lane: Lane, path: str) -> None:
    check_stream_and_non_stream_agree(lane, path)


@pytest.mark.standin
def test_logprobs_and_a_grammar_reach_the_scheduler(lane: Lane, record: Record) -> None:
    """The router builds the logprob request and the grammar itself; both ride the wire: the
    scheduler's logprobs come back one per token, the schema reaches the scheduler."""
    chat = {"messages": [{"role": "user", "content": "yes or no?"}]}
    scored = lane.post("/v1/chat/completions", max_tokens=5, ignore_eos=True, logprobs=True, **chat)
    assert scored.status_code == 200, scored.text
    tokens = scored.json()["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 5
    assert record.entries("generate")[-1]["return_logprob"]
    for position, token in enumerate(tokens):  # the stand-in's: -(0.01 (position+1) + k/10)
        tenths = (-token["logprob"] - 0.01 * (position + 1)) * 10
        assert tenths == pytest.approx(round(tenths), abs=1e-4), tokens
    enum = {"type": "string", "enum": ["yes", "no"]}
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": enum}}
    constrained = lane.post("/v1/chat/completions", max_tokens=4, response_format=schema, **chat)
    assert constrained.status_code == 200, constrained.text
    (last,) = record.entries("generate")[-1:]
    assert '"enum"' in str(last["json_schema"])


@pytest.mark.standin
@pytest.mark.parametrize(
    ("path", "bad", "why"),
    [
        ("/v1/completions", {"prompt": "Hello " * 1100, "max_tokens": 4}, "the context holds"),
        (
            "/generate",
            {"input_ids": [5, 6, 10**6], "sampling_params": {"max_new_tokens": 4}},
            "outside the vocabulary",
        ),
        ("/generate", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}, "is empty"),
        (
            "/generate",  # the prompt rule of every lane: no room for one token
            {"input_ids": [5] * 1024, "sampling_params": {"max_new_tokens": 4}},
            "the context holds 1024",
        ),
    ],
    ids=["too-long", "unknown-token", "empty", "fills-context"],
)
def test_bad_input_never_reaches_the_model(
    lane: Lane, record: Record, path: str, bad: dict, why: str
) -> None:
    """The router forwards these unchecked; the rank's guard ends each before the scheduler runs
    it (TokenSpeed's own pre-finished abort), which the router answers as ``finish_reason``
    "abort" with no token: TokenSpeed's output wire carries the finish type, not a status. The
    scheduler serves on."""
    before = len(record.entries("generate"))
    refused = lane.post(path, **bad)
    assert refused.status_code == 200, refused.text
    body = refused.json()
    meta = body[0]["meta_info"] if isinstance(body, list) else body["choices"][0]
    assert meta["finish_reason"] == "abort"
    (entry,) = record.entries("generate")[before:]
    assert why in entry["validation_error"]
    assert why in lane.engine.tail(100_000)
    served = lane.post("/v1/completions", prompt="Hello", max_tokens=4)
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["finish_reason"] == "length"


def test_bad_input_gets_the_conformance_tables_answer(lane: Lane) -> None:
    """The cases above and a bad sampling value, held to the table every lane is held to
    (smg_it.conformance)."""
    check_lane("zmq", "tokenspeed", lane)


def test_the_router_sees_the_schedulers_load(lane: Lane) -> None:
    """The load every output batch carries (running, waiting, KV pages), back to none with the
    batch that finishes the last request."""
    check_the_router_sees_the_load(lane, LONG)


@pytest.mark.standin
def test_a_client_that_disconnects_stops_its_request(lane: Lane, record: Record) -> None:
    """The router's ABORT reaches the scheduler (the guard logs it, the stand-in records it)."""
    rid = check_a_disconnect_aborts(lane, LONG)
    assert rid in record.rids("abort")


def test_the_reliability_suite_holds_on_the_lane(lane: Lane) -> None:
    """Fuzzed requests, a cancel storm and a slow reader through the router
    (smg_it.lane_reliability: the Python lanes' checks in the router's terms)."""
    check_reliability(lane, "zmq", "tokenspeed")


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(lane: Lane) -> None:
    """SIGTERM: the stream in flight gets every token and its finish; a request that arrives
    meanwhile is refused (an abort, no token); the ranks stop the way TokenSpeed's loop stops,
    the launcher exits 0 and leaves nothing running; the router is told the worker is gone. Last
    in this module: it stops the shared lane."""
    started = scheduler_ranks(lane.engine)
    assert started
    finishes, answers = sigterm_mid_stream(lane, LONG, key("zmq", "tokenspeed"), aborted)
    assert finishes == ["length"] * UNDER_LOAD
    assert aborted(answers[-1]), answers[-1].text
    assert lane.engine.proc.wait(60) == 0, lane.engine.tail()
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, f"left running: {alive}"
    log = lane.engine.tail(100_000)
    assert "the worker is shutting down" in log
    assert "drained (every request finished)" in log
    until(lambda: not lane.worker()["is_healthy"], 5, "the router kept the drained worker")


def test_engine_death_is_told_to_the_router_at_once(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A killed rank sends nothing; the launcher tells the router for it: the stream in flight
    ends with an error, the next request fails, the router takes the worker out of rotation, and
    the launcher exits 1 with nothing left running."""
    record = Record(tmp_path_factory.mktemp("zmq-ts-death") / "record.jsonl")
    lane = ts_lane(tiny_model, tmp_path_factory.mktemp("zmq-ts-death"), record)
    try:
        (rank,) = scheduler_ranks(lane.engine)
        kill_mid_stream(lane, rank, LONG, key("zmq", "tokenspeed"))
        assert "told the router (1 output socket(s))" in lane.engine.tail(100_000)
    finally:
        lane.stop()


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGTERM, 0), (signal.SIGUSR1, 1)], ids=["stop", "rank-failure"]
)
def test_a_signal_before_the_router_answers(
    tiny_model: Path, tmp_path: Path, signum: int, code: int
) -> None:
    """While the rank waits for a router that is not there yet: SIGTERM is a stop (exit 0);
    SIGUSR1, what a TokenSpeed rank sends its launcher when its loop fails, is a failure (exit 1,
    not the signal's default death). Nothing is left running either way."""
    command = headless_command(tiny_model, f"ipc://{tmp_path}/nobody", python=Path(sys.executable))
    engine = start_worker(command, 0, "", standin_env())
    try:
        until(lambda: "msgpack handshake: connected" in engine.tail(), 120, engine.tail())
        everything = engine.children()
        engine.proc.send_signal(signum)
        assert engine.proc.wait(30) == code, engine.tail()
        _, alive = psutil.wait_procs(everything, timeout=10)
        assert not alive, f"left running: {alive}"
    finally:
        engine.stop(5)


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--zmq-worker-url", "tcp://127.0.0.1:5"], "--zmq-worker-url must be ipc://PATH"),
        (["--disaggregation-mode", "prefill"], "prefill/decode/encode roles are not served"),
    ],
    ids=["not-ipc", "a-role"],
)
def test_configuration_errors_exit_2_with_one_line(
    tiny_model: Path, flags: list[str], why: str
) -> None:
    command = [
        sys.executable, "-m", "smg_grpc_servicer.tokenspeed.headless",
        "--model", str(tiny_model), *flags,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert f"error: {why}" in done.stderr
